"""Gate thresholds from data: ThriftyDAgger's quantile rule and its settings (a gate's ``calibration`` section),
shared by the gate engine's live calibration and the calibration stored with a student (learn.gate_calibration)."""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import Field

from hg_dagger.contract.model import StrictModel


class Calibration(StrictModel):
    """ThriftyDAgger's rule: set the trigger to the (1 - target_rate) quantile of the uncertainty seen
    in recent autonomous data, so about ``target_rate`` of autonomous steps would ask for a person."""

    target_rate: float = Field(gt=0.0, lt=1.0)
    warn_rate: float | None = Field(default=None, gt=0.0, lt=1.0, description="warn quantile rate; default 2 x target")
    warn_band: float = Field(default=0.2, gt=0.0, lt=1.0, description="the warning sits at least this fraction of "
                             "the trigger below it, so amber always comes before a request")
    min_samples: int = Field(default=200, ge=1)
    window: int = Field(default=5000, ge=1, description="recent autonomous steps kept for calibration")



class CalibrationRefused(ValueError):
    """The samples cannot set a usable gate (no spread, nothing finite): the gate keeps its thresholds."""


def quantile_thresholds(scores: np.ndarray, cal: Calibration) -> dict[str, Any]:
    """The quantile rule with a warning that leads: trigger = the (1 - target_rate) quantile of ``scores``, warn
    the lower of the (1 - warn_rate) quantile and trigger x (1 - warn_band), so the band is never empty. The
    measured spread comes with it (min, p50, p90, max), and the result must lie inside it: samples without
    spread or a trigger outside the range they span are refused (CalibrationRefused names why)."""
    u = np.asarray(scores, np.float64)
    u = u[np.isfinite(u)]
    if u.size == 0:
        raise CalibrationRefused("no finite samples")
    lo, hi = float(u.min()), float(u.max())
    spread = {"min": lo, "p50": float(np.quantile(u, 0.5)), "p90": float(np.quantile(u, 0.9)), "max": hi}
    trig = calibrate_threshold(u, cal.target_rate)
    warn = min(calibrate_threshold(u, cal.warn_rate or min(0.99, 2 * cal.target_rate)), trig * (1 - cal.warn_band))
    if hi - lo <= 1e-6 * max(1.0, abs(hi)):
        raise CalibrationRefused(f"the {u.size} samples do not vary (all {hi:.3g}): no quantile separates them")
    if not (lo <= trig <= hi) or trig <= 0:
        raise CalibrationRefused(f"trigger {trig:.3g} lies outside the measured range {lo:.3g}..{hi:.3g}")
    return {"trigger": trig, "warn": max(warn, 0.0), "samples": int(u.size), "target_rate": cal.target_rate,
            "uncertainty": spread}


def calibrate_threshold(uncertainty: np.ndarray, target_rate: float) -> float:
    """ThriftyDAgger's quantile rule: the threshold above which ``target_rate`` of the samples lie."""
    u = np.asarray(uncertainty, np.float64)
    u = u[np.isfinite(u)]
    if u.size == 0:
        raise ValueError("no finite uncertainty samples to calibrate from")
    if not 0.0 < target_rate < 1.0:
        raise ValueError(f"target_rate must be in (0, 1), got {target_rate}")
    return float(np.quantile(u, 1.0 - target_rate))
