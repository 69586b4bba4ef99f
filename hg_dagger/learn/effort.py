"""Human effort of a human-gated round, counted as docs/learning.md defines it.

Operator seconds: a correction window keeps a person busy from the handover request (the gate's step,
``parent_step_id``) to the hand-back (``handover_end``), in simulated time (steps x step_dt): a run that is
not paced in real time still counts what a person would have spent.
"""

from __future__ import annotations

from collections.abc import Iterable


def operator_seconds(store, infos: Iterable, step_dt: float) -> float:
    """Request-to-hand-back time of every correction window in the episodes ``infos`` (EpisodeInfo)."""
    return float(sum((w.handover_end - w.parent_step_id) * step_dt
                     for info in infos for w in store.labels(info.episode_id).windows))
