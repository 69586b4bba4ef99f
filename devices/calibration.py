"""Per-device calibration files: center offsets and ranges of each physical axis, one JSON file per device.

A device is identified by a stable key (a gamepad's SDL GUID, a SpaceMouse's vendor:product:serial),
so the same controller finds its calibration again on any USB port. They live in the config home
(``~/.config/hg-dagger/calibration``, hg_dagger.config.config_home); a device's calibration that only an
earlier version saved (``~/.config/hg_dagger/calibration``) is copied there the first time it is used.
"""

from __future__ import annotations

import json
import logging
import os
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt
from pydantic import ValidationError

from hg_dagger.config import config_home
from hg_dagger.contract.model import StrictModel
from hg_dagger.devices.errors import DeviceError

if TYPE_CHECKING:
    from hg_dagger.contract.command import HumanCommand

log = logging.getLogger(__name__)

CALIBRATION_ENV = "HG_DAGGER_CALIBRATION_DIR"
MIN_SPAN = 0.05  # an axis that moved less than this during calibration keeps its nominal range


def default_calibration_dir() -> Path:
    """$HG_DAGGER_CALIBRATION_DIR, else the config home's calibration/ (~/.config/hg-dagger/calibration)."""
    env = os.environ.get(CALIBRATION_ENV)
    return Path(env) if env else config_home() / "calibration"


def old_calibration_dir() -> Path:
    """Where versions before the config home saved calibrations (read, never written)."""
    return Path.home() / ".config" / "hg_dagger" / "calibration"


class AxisCalibration(StrictModel):
    center: float = 0.0  # resting value
    min: float = -1.0
    max: float = 1.0


class Calibration(StrictModel):
    """Calibration of one physical device; ``axes`` is keyed by the device's own axis index."""

    device_type: str
    device_key: str
    name: str = ""
    axes: dict[int, AxisCalibration] = {}

    def axis(self, index: int, nominal: AxisCalibration | None = None) -> AxisCalibration:
        return self.axes.get(index, nominal or AxisCalibration())

    @staticmethod
    def path_for(directory: str | Path, device_type: str, device_key: str) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", device_key) or "unknown"
        return Path(directory) / f"{device_type}_{safe}.json"

    def save(self, directory: str | Path) -> Path:
        path = self.path_for(directory, self.device_type, self.device_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.model_dump(mode="json"), indent=2))
        os.replace(tmp, path)  # never leave a half-written calibration behind
        return path

    @classmethod
    def load(cls, path: str | Path) -> Calibration:
        path = Path(path)
        try:
            return cls.model_validate(json.loads(path.read_text()))
        except json.JSONDecodeError as exc:
            raise DeviceError(f"{path}: calibration file is not valid JSON ({exc.msg}, line {exc.lineno})") from None
        except ValidationError as exc:
            keys = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise DeviceError(f"{path}: invalid calibration file ({keys})") from None

    @classmethod
    def find(cls, directory: str | Path, device_type: str, device_key: str) -> Calibration | None:
        """The device's calibration in ``directory``; in the default folder, one only the old folder holds is
        copied over first (the old file stays where it was)."""
        path = cls.path_for(directory, device_type, device_key)
        if path.is_file():
            return cls.load(path)
        return cls._adopt_old(Path(directory), device_type, device_key)

    @classmethod
    def _adopt_old(cls, directory: Path, device_type: str, device_key: str) -> Calibration | None:
        if os.environ.get(CALIBRATION_ENV) or directory != default_calibration_dir():
            return None  # a folder of one's own (a config's, a test's): nothing to adopt
        old = cls.path_for(old_calibration_dir(), device_type, device_key)
        if not old.is_file() or old.resolve() == cls.path_for(directory, device_type, device_key).resolve():
            return None
        cal = cls.load(old)
        try:
            new = cal.save(directory)
        except OSError as exc:
            log.warning("calibration %s: used from the old folder; could not copy it to %s (%s)", old, directory,
                        exc.strerror or exc)
            return cal
        log.info("calibration %s: copied to %s (calibrations now live in the config home; the old file is kept)",
                 old, new)
        return cal


def fit_axes(center_samples: np.ndarray, seen_min: np.ndarray, seen_max: np.ndarray) -> dict[int, AxisCalibration]:
    """Calibration from two phases: hands off (center = mean of samples), then full travel (min/max seen).

    center_samples: [k, n_axes]; seen_min/seen_max: [n_axes] extremes over both phases. An axis whose
    travel on one side is below MIN_SPAN keeps the nominal end (+-1) on that side.
    """
    center = np.asarray(center_samples, np.float64).mean(axis=0)
    out = {}
    for i, c in enumerate(center):
        lo, hi = float(seen_min[i]), float(seen_max[i])
        out[i] = AxisCalibration(
            center=float(c),
            min=lo if c - lo >= MIN_SPAN else min(-1.0, lo),
            max=hi if hi - c >= MIN_SPAN else max(1.0, hi),
        )
    return out


class CalibrationPhase(NamedTuple):
    """One step of a device's calibration: what the person is asked to do, and for how long."""

    name: str  # "center" (hands off), "range" (full travel)
    instructions: str
    seconds: float


class Calibrator(ABC):
    """A device's calibration split into phases, so a CLI loop or an app's wizard can drive it.

    ``sample`` reads the device itself (the caller must be the only one polling it); ``feed`` takes a
    sample read elsewhere (a HumanCommand from the thread that polls, or the physical axis values).
    ``finish`` fits, saves the device's calibration file and applies it to the device.
    """

    phases: tuple[CalibrationPhase, ...]

    @abstractmethod
    def sample(self, phase: str) -> None: ...

    @abstractmethod
    def feed(self, phase: str, values: HumanCommand | npt.ArrayLike) -> None: ...

    @abstractmethod
    def finish(self) -> tuple[Calibration, Path]: ...
