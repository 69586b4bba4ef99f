"""Unattended runs: one summary line per round with an ETA, and the learning curve redrawn as it grows.

`hg-dagger auto` hands every finished iteration's metrics row (the line it appended to metrics.jsonl) to
a ``RoundReporter``; the reporter prints one line and rewrites ``curve.png`` from the whole metrics file,
so a run that was resumed after a kill still shows its full curve. Nothing here touches training state.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hg_dagger.contract.enums import CollectionMode


def _duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl; a line cut short by a kill is skipped. The last row per iteration wins."""
    rows: dict[int, dict[str, Any]] = {}
    p = Path(path)
    if not p.is_file():
        return []
    for line in p.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and "iteration" in row:
            rows[int(row["iteration"])] = row
    return [rows[k] for k in sorted(rows)]


def write_curve_png(metrics_path: str | Path, png_path: str | Path) -> Path | None:
    """Student-only success (and training loss) against labels over every iteration so far; written
    atomically (temp file + rename) so a reader never sees half a PNG. None when there is no row yet."""
    rows = read_metrics(metrics_path)
    if not rows:
        return None
    # matplotlib deferred: the app extra, optional
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [int((r.get("replay") or {}).get("labels", 0)) for r in rows]
    success: list[Any] = [r.get("eval_success_rate") for r in rows]  # None: no evaluation (a gap in the line)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(labels, success, marker="o", color="tab:blue", label="eval success")
    for lab, s, r in zip(labels, success, rows, strict=True):
        ax.annotate(str(r["iteration"]), (lab, s), textcoords="offset points", xytext=(0, 5), fontsize=7, ha="center")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("trainable labels in the replay")
    ax.set_ylabel("student-only success")
    ax.grid(alpha=0.3)
    ax.set_title(f"{rows[-1].get('mode', '')}: {len(rows)} iterations (numbers = iteration)", fontsize=9)
    fig.tight_layout()
    png = Path(png_path)
    tmp = png.with_name(f".{png.name}.{os.getpid()}.tmp")
    fig.savefig(tmp, dpi=80, format="png")
    plt.close(fig)
    os.replace(tmp, png)
    return png


class RoundReporter:
    """Called with each iteration's metrics row: prints a summary line with progress and ETA, redraws the curve.

    The ETA is the mean wall time of the iterations finished in this process times the ones left (a
    resumed run starts its clock again: rounds before the kill ran on another process's clock)."""

    def __init__(self, out_dir: str | Path, iterations: int, *, write: Callable[[str], None] = print,
                 png: bool = True):
        self.out = Path(out_dir)
        self.iterations = int(iterations)
        self.write = write
        self.png = png
        self.t0 = time.monotonic()
        self.done = 0

    def line(self, row: dict[str, Any], elapsed: float) -> str:
        it = int(row["iteration"])
        left = self.iterations - it - 1
        per = elapsed / max(1, self.done)
        train = row.get("train") or {}
        loss = train.get("loss_last")
        parts = [f"round {it + 1}/{self.iterations}"]
        if row.get("mode") != CollectionMode.HUMAN_GATED:
            parts.append(f"beta {row.get('beta', float('nan')):.3f}")
        parts += [
            f"labels {int((row.get('replay') or {}).get('labels', 0)):,}",
            f"eval success {row.get('eval_success_rate', float('nan')):.1%}",
        ]
        promo = row.get("promotion")
        if promo:  # both held-out figures and the decision (learn.promotion)
            inc = promo.get("incumbent_success")
            parts.append(f"{'promoted' if promo['promoted'] else 'kept the acting student'}: candidate "
                         f"{promo['candidate_success']:.1%} vs {'-' if inc is None else format(inc, '.1%')} held-out")
        if row.get("collect_success_rate") is not None:
            parts.append(f"collect success {row['collect_success_rate']:.1%}")
        if row.get("intervention_rate") is not None:  # human_gated: steps the operator drove, windows opened
            parts.append(f"intervention {row['intervention_rate']:.1%} ({row.get('windows', 0)} windows)")
        elif row.get("expert_used_rate") is not None:
            parts.append(f"expert steps {row['expert_used_rate']:.1%}")
        recover = row.get("recoverability") or {}
        if recover.get("probed"):  # can labels at the student's own failures teach it? (learn.evaluate.recoverability)
            parts.append(f"expert recovers {recover['recovered']}/{recover['probed']} failures")
        phases = row.get("label_phases") or {}
        if phases:  # which part of the task this round's labels cover
            total = sum(phases.values())
            parts.append("labels by phase " + ", ".join(f"{k} {v / total:.0%}" for k, v in phases.items()))
        if loss is not None:
            parts.append(f"loss {loss:.4g}")
        parts.append(f"{_duration(per)}/round")
        parts.append(f"ETA {_duration(per * left)}" if left > 0 else "done")
        return " | ".join(parts)

    def __call__(self, row: dict[str, Any]) -> str:
        self.done += 1
        text = self.line(row, time.monotonic() - self.t0)
        if self.png:
            write_curve_png(self.out / "metrics.jsonl", self.out / "curve.png")
        self.write(text)
        return text
