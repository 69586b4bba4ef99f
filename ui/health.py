"""How well the control loop keeps time, with each figure coloured when it is out of bounds.

Bounds are deliberately simple: rate below 99 % of target (amber) or 90 % (red), tick jitter p99
above 5 ms (amber) or 20 ms (red), any missed tick (amber), latency p99 above 50 ms (amber) or
100 ms (red), a recorder queue above 1000 steps (amber), any dropped step (red: data was lost).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from PyQt6.QtWidgets import QFormLayout, QGroupBox, QLabel, QWidget

from hg_dagger.control.live import LoopHealth, Snapshot
from hg_dagger.ui import style


@dataclass(frozen=True)
class HealthBounds:
    rate_warn: float = 0.99  # share of the target rate
    rate_bad: float = 0.90
    jitter_warn_ms: float = 5.0
    jitter_bad_ms: float = 20.0
    latency_warn_ms: float = 50.0
    latency_bad_ms: float = 100.0
    queue_warn: int = 1000


def _ms(v: float) -> str:
    return "-" if not math.isfinite(v) else f"{v:.1f} ms"


def assess(h: LoopHealth, b: HealthBounds = HealthBounds()) -> dict[str, tuple[str, str]]:
    """Row name -> (text, level ok|warn|bad) for one LoopHealth."""
    out: dict[str, tuple[str, str]] = {}
    if h.target_hz > 0 and h.ticks > 0:
        share = h.achieved_hz / h.target_hz
        level = "bad" if share < b.rate_bad else "warn" if share < b.rate_warn else "ok"
    else:
        level = "ok"
    out["rate"] = (f"{h.achieved_hz:.1f} / {h.target_hz:.0f} Hz", level)
    j = h.jitter_p99_ms
    out["jitter"] = (_ms(j), "bad" if j > b.jitter_bad_ms else "warn" if j > b.jitter_warn_ms else "ok")
    out["missed"] = (str(h.missed_ticks), "warn" if h.missed_ticks > 0 else "ok")
    lat99 = h.latency_p99_ms
    lat_level = "ok"
    if math.isfinite(lat99):
        lat_level = "bad" if lat99 > b.latency_bad_ms else "warn" if lat99 > b.latency_warn_ms else "ok"
    out["latency"] = (f"{_ms(h.latency_p50_ms)} / {_ms(lat99)}", lat_level)
    out["tick"] = (_ms(h.tick_ms_p99), "ok")
    out["queue"] = (str(h.recorder_queue), "warn" if h.recorder_queue > b.queue_warn else "ok")
    out["dropped"] = (str(h.recorder_dropped), "bad" if h.recorder_dropped > 0 else "ok")
    return out


ROWS = (("rate", "Rate (achieved / target)"), ("jitter", "Jitter p99"), ("missed", "Missed ticks"),
        ("latency", "Obs -> apply p50 / p99"), ("tick", "Tick time p99"), ("queue", "Recorder queue"),
        ("dropped", "Recorder drops"))


class LoopHealthPanel(QGroupBox):
    """One row per figure; ``levels`` holds each row's current level for anyone who asks."""

    def __init__(self, parent: QWidget | None = None, bounds: HealthBounds | None = None):
        super().__init__("Loop health", parent)
        self.bounds = bounds or HealthBounds()
        self.values: dict[str, QLabel] = {}
        self.levels: dict[str, str] = {}
        form = QFormLayout(self)
        for key, title in ROWS:
            lab = QLabel("-")
            lab.setObjectName(f"health_{key}")
            self.values[key] = lab
            self.levels[key] = "ok"
            form.addRow(title, lab)
        self._last: LoopHealth | None = None

    @property
    def worst(self) -> str:
        order = {"ok": 0, "warn": 1, "bad": 2}
        return max(self.levels.values(), key=order.__getitem__)

    def show_snapshot(self, snap: Snapshot) -> None:
        h = snap.health
        if h is self._last:
            return
        self._last = h
        for key, (text, level) in assess(h, self.bounds).items():
            lab = self.values[key]
            if lab.text() != text:
                lab.setText(text)
            if self.levels[key] != level:
                self.levels[key] = level
                lab.setStyleSheet(style.level_style(level))
        self.setTitle("Loop health" if self.worst == "ok" else f"Loop health ({self.worst.upper()})")
