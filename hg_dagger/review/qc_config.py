"""The thresholds of automated QC (YAML with ``kind: qc``), read by the checks (qc_checks) and `hg-dagger qc`."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from hg_dagger import config as _config
from hg_dagger.contract.model import StrictModel
from hg_dagger.errors import ConfigError


class QCConfig(StrictModel):
    """Thresholds of `hg-dagger qc` (YAML with ``kind: qc``)."""

    latency_budget_ms: float | None = Field(
        default=None, gt=0, description="largest t_action_apply - t_obs, for every episode; default: latency_periods "
        "control periods, for episodes of a live world (a robot) only")
    latency_periods: float = Field(default=2.0, gt=0, description="default budget in control periods (1/control_hz)")
    max_alignment_error_ms: float = Field(default=5.0, ge=0, description="largest robot->app clock uncertainty")
    max_interpolated_fraction: float = Field(
        default=0.5, ge=0, le=1, description="share of a window's steps that may be interpolated (handover blends)")
    max_clamped_fraction: float = Field(
        default=0.1, ge=0, le=1, description="share of a window's steps the safety monitor may have clamped")
    action_tolerance: float = Field(default=1e-5, ge=0, description="slack when comparing actions with limits")

    def budget_ns(self, control_hz: float) -> int:
        ms = self.latency_budget_ms if self.latency_budget_ms is not None else self.latency_periods * 1000.0 / control_hz
        return int(round(ms * 1e6))


def load_qc_config(path: str | Path | None) -> QCConfig:
    """The QC config in ``path`` (kind: qc), or the defaults; errors name the file and the key."""
    if path is None:
        return QCConfig()
    data = _config.read_yaml(path)
    kind = data.pop("kind", None)
    if kind != "qc":
        raise ConfigError(f"{path}: key 'kind' must be 'qc', got {kind!r}")
    return _config.validate(QCConfig, data, source=str(path))

