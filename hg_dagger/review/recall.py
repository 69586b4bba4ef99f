"""Gate recall and precision from what a store recorded (docs/gates.md, "Gate recall").

Read from the episodes' committed events alone, so `hg-dagger report`, the learning benchmark and any
later reader compute the same figures from the same store:

- a **student episode** is one collected human-gated (the gates ran while the student drove);
- it **failed** when its outcome says so (``EpisodeEnd.task_success`` false);
- its **failure point** is the step of its first failure-marking event - a gate trigger by a gate that
  fires once the task has already failed (``policy_failed``) - or, without one, the episode's end;
- a **request** is a gate trigger (GATE_TRIGGER from the gate engine) by any gate but the operator's own
  take-over (a person reaching for the device is not a gate asking);
- a request **preceded a failure** when its episode failed and it came before the failure point.

recall = failed episodes with a request before their failure point / failed episodes; precision =
requests that preceded a failure / requests. A round whose student failed while no gate asked at all is
a **gate miss**, reported with its failed episodes, not a round with nothing to learn.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hg_dagger.contract import CollectionMode, EventKind

NOT_A_REQUEST = frozenset({"operator"})  # a take-over, not a gate's request
FAILURE_MARKING = frozenset({"policy_failed"})  # gates whose trigger says the task has already failed


def _gates(reason: str) -> set[str]:
    return {g for g in reason.split("+") if g}


def is_request(event) -> bool:
    return event.kind == EventKind.GATE_TRIGGER and bool(_gates(event.reason) - NOT_A_REQUEST)


def failure_step(info) -> int | None:
    """The failure point of a failed episode (None for a successful one)."""
    if info.end.task_success:
        return None
    marks = [e.step for e in info.end.events
             if e.kind == EventKind.GATE_TRIGGER and _gates(e.reason) & FAILURE_MARKING]
    return min(marks) if marks else int(info.end.num_steps)


def episode_recall(info) -> dict[str, Any]:
    """One episode: failed, its failure point, its requests and how many came before the failure."""
    fail = failure_step(info)
    steps = [e.step for e in info.end.events if is_request(e)]
    before = sum(s < fail for s in steps) if fail is not None else 0
    return {"episode_id": info.episode_id, "failed": fail is not None, "failure_step": fail,
            "requests": len(steps), "requests_before_failure": before, "caught": fail is not None and before > 0}


def recall_figures(infos: Iterable) -> dict[str, Any]:
    """Recall, precision and gate misses over the student (human-gated) episodes among ``infos``."""
    eps = [episode_recall(i) for i in infos if i.start.mode == CollectionMode.HUMAN_GATED]
    failed = [e for e in eps if e["failed"]]
    requests = sum(e["requests"] for e in eps)
    preceded = sum(e["requests_before_failure"] for e in eps)
    caught = sum(e["caught"] for e in failed)
    return {
        "episodes": len(eps), "failed": len(failed), "caught": caught,
        "recall": round(caught / len(failed), 6) if failed else None,
        "requests": requests, "requests_before_failure": preceded,
        "precision": round(preceded / requests, 6) if requests else None,
        "gate_miss": bool(failed) and requests == 0,  # the student failed and no gate asked at all
        "missed_episodes": [e["episode_id"] for e in failed if not e["caught"]],
    }


def describe(fig: dict[str, Any]) -> str:
    """One line for a log or a table cell."""
    if not fig["episodes"]:
        return "no student episodes"
    rec = "-" if fig["recall"] is None else f"{fig['recall']:.0%}"
    pre = "-" if fig["precision"] is None else f"{fig['precision']:.0%}"
    text = (f"recall {rec} ({fig['caught']}/{fig['failed']} failed episodes asked for), precision {pre} "
            f"({fig['requests_before_failure']}/{fig['requests']} requests before a failure)")
    if fig["gate_miss"]:
        text += f"; GATE MISS: no gate asked, failed episodes {', '.join(fig['missed_episodes'])}"
    return text
