"""Calibration as a step-by-step model that an app's device panel drives, and that the CLI runs blocking.

    wizard = CalibrationWizard(device, center_s=2, range_s=6)   # device connected
    every frame: wizard.tick()        # reads the device once; or wizard.feed(cmd) with a command polled elsewhere
    show wizard.phase, wizard.instructions, wizard.progress (0..1 within the phase)
    when wizard.phase == "done": wizard.result(), wizard.path

The phases and the fitting are the device's own (``Device.calibrator``), so the file written here is
the one ``hg-dagger device calibrate`` writes. ``tick()`` reads the device: call it from the thread
that owns the device, while nothing else polls it. A phase ends when its time is up and it has at
least one sample. Failures (device unplugged) end in phase "failed" with ``error`` set, not an exception.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy.typing as npt

from hg_dagger.devices.calibration import Calibration, Calibrator
from hg_dagger.devices.errors import DeviceError

if TYPE_CHECKING:
    from hg_dagger.contract.command import HumanCommand

DONE = "done"
FAILED = "failed"
CANCELLED = "cancelled"


class Calibratable(Protocol):
    """What the wizard needs of a device (a ``devices.base.Device``): its config and its calibrator."""

    config: Any

    def calibrator(self, **options: Any) -> Calibrator | None: ...


class CalibrationWizard:
    def __init__(self, device: Calibratable, *, clock: Callable[[], float] = time.monotonic, **options: Any):
        """``options`` go to the device's calibrator (gamepad: center_s, range_s; SpaceMouse: center_s)."""
        self.device = device
        self._clock = clock
        self.calibrator = device.calibrator(**options)
        self.phases = tuple(self.calibrator.phases) if self.calibrator is not None else ()
        self._index = 0
        self._samples = 0
        self._phase_start = clock()
        self._state = "" if self.phases else DONE
        self._result: Calibration | None = None
        self.path: Path | None = None
        self.error: str | None = None

    # -- what the panel shows --------------------------------------------------------------------
    @property
    def phase(self) -> str:
        """The current phase's name ("center", "range"), or "done", "failed", "cancelled"."""
        return self._state or self.phases[self._index].name

    @property
    def finished(self) -> bool:
        return bool(self._state)

    @property
    def instructions(self) -> str:
        if self._state == DONE:
            if self.path is None:
                return f"{self.device.config.type} needs no calibration."
            return f"Calibration saved to {self.path}"
        if self._state == FAILED:
            return f"Calibration failed: {self.error}"
        if self._state == CANCELLED:
            return "Calibration cancelled; nothing saved."
        return self.phases[self._index].instructions

    @property
    def progress(self) -> float:
        """Share of the current phase's time elapsed, 0..1 (1 once finished)."""
        if self._state:
            return 1.0
        seconds = self.phases[self._index].seconds
        if seconds <= 0:
            return 1.0 if self._samples else 0.0
        return min(1.0, max(0.0, (self._clock() - self._phase_start) / seconds))

    @property
    def phase_number(self) -> tuple[int, int]:
        """(1-based number of the current phase, number of phases), for "step 1 of 2"."""
        return (len(self.phases) if self._state else self._index + 1, len(self.phases))

    # -- driving it -----------------------------------------------------------------------------
    def tick(self) -> str:
        """Read the device once and move on when the phase's time is up; returns the phase."""
        if not self._state:
            self._record(lambda name: self._calibrator().sample(name))
        return self.phase

    def feed(self, command_or_raw: HumanCommand | npt.ArrayLike) -> str:
        """Take one sample read elsewhere: a HumanCommand of this device, or its physical axis values."""
        if not self._state:
            self._record(lambda name: self._calibrator().feed(name, command_or_raw))
        return self.phase

    def cancel(self) -> None:
        if not self._state:
            self._state = CANCELLED

    def result(self) -> Calibration | None:
        """The saved calibration (None for a device that needs none); DeviceError if it failed or is not done."""
        if self._state == DONE:
            return self._result
        if self._state == FAILED:
            raise DeviceError(self.error)
        raise DeviceError(f"calibration is {self.phase!r}, not done")

    def run(self, *, prompt: Callable[[str], None] = print, period_s: float = 0.01) -> Calibration | None:
        """Blocking loop for the command line: prompt each phase's instructions, sample every ``period_s``."""
        shown = None
        while not self._state:
            if shown != self._index:
                shown = self._index
                prompt(self.instructions)
            self.tick()
            if not self._state and self._index == shown:  # go on at once when a new phase starts
                time.sleep(period_s)
        if self._state == DONE and self.path is not None:
            prompt(self.instructions)
        return self.result()

    def _record(self, take: Callable[[str], None]) -> None:
        try:
            take(self.phases[self._index].name)
            self._samples += 1
            if self._clock() - self._phase_start >= self.phases[self._index].seconds:
                self._next()
        except DeviceError as exc:
            self.error = str(exc)
            self._state = FAILED

    def _calibrator(self) -> Calibrator:
        # phases to sample, feed or finish come only from a calibrator: with none, the wizard starts done
        assert self.calibrator is not None
        return self.calibrator

    def _next(self) -> None:
        if self._index + 1 < len(self.phases):
            self._index += 1
            self._samples = 0
            self._phase_start = self._clock()
            return
        self._result, self.path = self._calibrator().finish()
        self._state = DONE
