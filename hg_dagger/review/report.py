"""`hg-dagger report`: what a store holds for training, and what stopped every other label.

Per window: its review state, QC verdict, replay status, human labels, how many may be trained on and
which rule of the training boundary (contract.training_selection) stopped the rest. Per store: the
effort and outcome figures a data delivery is judged by - trainable human-label and context-only
ratios, corrections per failure type (gate reason), recovery success, intervention rate, e-stops, where
in an episode the first failure came, and the contribution of each round, operator and scene. Written
as report.json and a self-contained report.html (plots inlined as PNG).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    EventKind,
    LabelMask,
    RecoveryOutcome,
    ReviewStatus,
    TrainingBlock,
    TrainingRule,
    current_review,
)
from hg_dagger.contract.clock import wall_stamp
from hg_dagger.contract.labels import review_problem, window_operator
from hg_dagger.errors import HgDaggerError
from hg_dagger.review.recall import recall_figures
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import selection

_HUMAN, _EXPERT = ActionSource.HUMAN.code, ActionSource.EXPERT.code
_CONTEXT = LabelMask.CONTEXT_ONLY.code
REPORT_VERSION = "1"


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 6) if b else None


def build_report(store: EpisodeStore | str, *, rule: TrainingRule | None = None, task: str | None = None,
                 progress: bool = False) -> dict[str, Any]:
    """The report as a JSON-ready dict (complete episodes of ``task``, or all)."""
    st = store if isinstance(store, EpisodeStore) else EpisodeStore.open(str(store), mode="r")
    rule = rule or TrainingRule()
    infos = [i for i in st.episodes() if i.complete and (task is None or i.task_id == task)]
    incomplete = sum(not i.complete for i in st.episodes())
    roster = st.reviewers
    windows: list[dict[str, Any]] = []
    labels: Counter = Counter()
    steps: Counter = Counter()
    gate_reasons: Counter = Counter()
    recoveries: Counter = Counter()
    first_failure: list[float] = []
    estops = 0
    requests: Counter = Counter()  # how handover requests ended (request_end events): answered, declined, expired
    waits: list[float] = []
    rounds: dict[str, Counter] = defaultdict(Counter)
    round_infos: dict[str, list] = defaultdict(list)  # for gate recall per round
    buckets: dict[str, dict[str, Counter]] = {"operator": defaultdict(Counter), "scene": defaultdict(Counter)}
    robots: dict[str, Counter] = defaultdict(Counter)  # fleet episodes (one person, several robots) by robot
    for info in tqdm(infos, desc="report", unit="ep", disable=not progress):
        layer = st.labels(info.episode_id)
        sel = selection(st, info, rule)
        src = st.read_steps(info.episode_id, ["action_source"])["action_source"]
        n = len(src)
        human = int((src == _HUMAN).sum())
        steps.update(total=n, human=human, expert=int((src == _EXPERT).sum()),
                     context=int((layer.mask == _CONTEXT).sum()))
        if info.start.mode == CollectionMode.HUMAN_GATED:
            steps.update(gated=n, gated_corrected=human)
        for k, v in sel.counts().items():
            labels[k] += v
        human_allowed = int((sel.allowed & (src == _HUMAN)).sum())
        labels["human_allowed"] += human_allowed
        estops += sum(e.kind == EventKind.ESTOP for e in info.end.events)
        for e in info.end.events:
            if e.kind == EventKind.REQUEST_END:
                requests[e.values.get("outcome", "unknown")] += 1
                if e.values.get("outcome") == "answered" and e.values.get("wait_s") is not None:
                    waits.append(float(e.values["wait_s"]))
        if layer.windows and n:
            first_failure.append(min(w.parent_step_id for w in layer.windows) / n)
        qc_by_window = {q.window_id: q.passed for q in layer.qc}
        replay = st.replay_status(info.episode_id).value
        for w in layer.windows:
            s, e = w.handover_start, min(w.handover_end, n)
            in_w = sel.labels[s:e]
            stopped: Counter = Counter()
            for b in TrainingBlock:
                c = int(((sel.blocks[s:e] & int(b)) != 0).sum())
                if c:
                    stopped[str(b.name).lower()] = c
            d = current_review(layer.reviews, w.window_id)
            who = window_operator(w, info.start.operator)
            void = (review_problem(d, operator=who, reviewers=roster) or "") if d is not None and \
                d.status == ReviewStatus.APPROVED else ""
            gate_reasons[w.gate_reason or "(none)"] += 1
            if w.source == ActionSource.HUMAN:
                recoveries[w.outcome.value] += 1
            windows.append({
                "window_id": w.window_id, "episode_id": info.episode_id, "task": info.task_id,
                "operator": who, "source": w.source.value,
                "gate_reason": w.gate_reason, "handover": [w.handover_start, w.handover_end],
                "outcome": w.outcome.value, "review": d.status.value if d else "pending",
                "authorized": bool(d and d.replay_training_authorized) and not void,
                "reviewer": d.reviewer if d else "", "review_problem": void,
                "certified": bool(layer.certifications) and any(
                    c.step_start <= w.handover_start and w.handover_end <= c.step_end for c in layer.certifications),
                "qc_passed": qc_by_window.get(w.window_id), "replay_status": replay,
                "labels": int(in_w.sum()), "allowed": int(sel.allowed[s:e].sum()), "stopped_by": dict(stopped),
            })
        key = f"{info.start.iteration}:{info.start.policy_version or '-'}"
        round_infos[key].append(info)
        rounds[key].update(episodes=1, steps=n, labels_allowed=int(sel.allowed.sum()), human_steps=human,
                           successes=int(info.end.task_success))
        if "fleet_size" in info.start.extra:
            _robot_figures(robots[str(info.start.env_index)], info, human, len(layer.windows))
        for name, value in (("operator", info.start.operator or "(none)"), ("scene", info.start.task.scene_id or "-")):
            buckets[name][value].update(episodes=1, steps=n, human_steps=human, labels_allowed=int(sel.allowed.sum()),
                                        successes=int(info.end.task_success))
    tried = sum(v for k, v in recoveries.items() if k != RecoveryOutcome.NONE.value)
    recall = recall_figures(infos)
    by_round = sorted(round_infos.items(), key=lambda kv: int(kv[0].split(":")[0]))
    return {
        "report_version": REPORT_VERSION,
        "store": st.url,
        "task": task,
        "generated": wall_stamp(),
        "rule": rule.model_dump(),
        "reviewers": roster,
        "episodes": len(infos),
        "incomplete_episodes": incomplete,
        "steps": dict(steps),
        "labels": dict(labels),
        "requests": {**{k: requests.get(k, 0) for k in ("answered", "declined", "expired")},
                     "wait_to_take_over_p50_s": round(float(np.median(waits)), 3) if waits else None},
        "figures": {
            "trainable_human_label_ratio": _ratio(labels["human_allowed"], steps["total"]),
            "context_only_ratio": _ratio(steps["context"], steps["total"]),
            "intervention_rate": _ratio(steps["gated_corrected"], steps["gated"]),
            "recovery_success_rate": _ratio(recoveries.get(RecoveryOutcome.RECOVERY_SUCCESS.value, 0), tried),
            "estops": estops,
            "first_failure_position_mean": round(float(np.mean(first_failure)), 4) if first_failure else None,
            "success_rate": _ratio(sum(i.end.task_success for i in infos), len(infos)),
            "gate_recall": recall["recall"],
            "gate_precision": recall["precision"],
        },
        # failed student episodes some gate asked for before the failure, requests that preceded one, and
        # rounds whose student failed while no gate asked (docs/gates.md, "Gate recall")
        "gate_recall": {**recall, "rounds": [{"round": k, **recall_figures(v)} for k, v in by_round]},
        "corrections_per_gate_reason": dict(gate_reasons.most_common()),
        "recovery_outcomes": dict(recoveries),
        "rounds": [{"round": k, **v} for k, v in sorted(rounds.items(), key=lambda kv: int(kv[0].split(":")[0]))],
        "buckets": {name: {k: dict(v) for k, v in sorted(b.items())} for name, b in buckets.items()},
        "windows": windows,
        **({"robots": {k: _robot_row(v) for k, v in sorted(robots.items(), key=lambda kv: int(kv[0]))}}
           if robots else {}),
    }


def _robot_figures(c: Counter, info, human_steps: int, windows: int) -> None:
    """One fleet episode's share of its robot's row: interventions, waits and successes (docs/fleet.md)."""
    c.update(episodes=1, successes=int(info.end.task_success), human_steps=human_steps, interventions=windows)
    for e in info.end.events:
        if e.kind == EventKind.REQUEST_END:
            c["requests"] += 1
            c["requests_expired"] += int(e.values.get("outcome") == "expired")
            c["wait_ticks"] += int(e.values.get("wait_ticks") or 0)
            c["wait_ms"] += int(round(1000 * float(e.values.get("wait_s") or 0.0)))
        elif e.kind == EventKind.NOTE and e.source == "fleet":
            c["allocations"] += int(e.reason == "fleet:allocated")
            c["long_waits_flagged"] += int(e.reason == "fleet:wait_flag")


def _robot_row(c: Counter) -> dict[str, Any]:
    row: dict[str, Any] = {k: c.get(k, 0) for k in ("episodes", "successes", "interventions", "human_steps", "requests",
                                   "requests_expired", "allocations", "long_waits_flagged")}
    row["wait_s"] = round(c.get("wait_ms", 0) / 1000, 3)
    row["success_rate"] = _ratio(c.get("successes", 0), c.get("episodes", 0))
    row["wait_s_per_request"] = round(row["wait_s"] / row["requests"], 3) if row["requests"] else None
    return row


# ---------------------------------------------------------------------- HTML


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _plots(report: dict[str, Any]) -> list[tuple[str, str]]:
    import matplotlib  # deferred: heavy and optional (the app extra); only the HTML report draws plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = []
    lab = report["labels"]
    names = ["allowed"] + [str(b.name).lower() for b in TrainingBlock]
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh(names[::-1], [lab.get(k, 0) for k in names[::-1]],
            color=["tab:red"] * (len(names) - 1) + ["tab:green"])
    ax.set_xlabel("labels (a label may be stopped by several rules)")
    ax.set_title(f"{lab.get('allowed', 0)} of {lab.get('labels', 0)} labels may be trained on")
    out.append(("What stopped each label", _png(fig)))
    plt.close(fig)
    gates = report["corrections_per_gate_reason"]
    if gates:
        fig, ax = plt.subplots(figsize=(7, 0.4 * len(gates) + 1.2))
        ax.barh(list(gates)[::-1], list(gates.values())[::-1], color="tab:orange")
        ax.set_xlabel("correction windows")
        out.append(("Corrections per failure type (gate reason)", _png(fig)))
        plt.close(fig)
    rounds = report["rounds"]
    if rounds:
        fig, ax = plt.subplots(figsize=(7, 3))
        x = np.arange(len(rounds))
        ax.bar(x, [r["labels_allowed"] for r in rounds], color="tab:blue", label="labels allowed")
        ax.set_xticks(x, [r["round"] for r in rounds], rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("labels allowed")
        ax2 = ax.twinx()
        ax2.plot(x, [r["successes"] / r["episodes"] for r in rounds], "o-", color="tab:green", label="success")
        ax2.set_ylim(0, 1.05)
        ax2.set_ylabel("success rate")
        out.append(("Contribution per round (iteration:policy)", _png(fig)))
        plt.close(fig)
    return out


def _table(rows: Iterable[dict[str, Any]], cols: list[str]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_cell(r.get(c)))}</td>" for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _cell(v: Any) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {n}" for k, n in v.items()) or "-"
    if isinstance(v, list):
        return "-".join(map(str, v))
    if isinstance(v, float):
        return f"{v:.3f}"
    return "-" if v is None or v == "" else str(v)


def render_html(report: dict[str, Any]) -> str:
    """A self-contained page: figures, plots, windows with what stopped their labels, buckets."""
    figs = [{"figure": k, "value": v} for k, v in report["figures"].items()]
    plots = "".join(f"<h2>{html.escape(t)}</h2><img alt='{html.escape(t)}' src='{src}'>" for t, src in _plots(report))
    wins = [{**w, "window": w["window_id"][:12], "episode": w["episode_id"][:12]} for w in report["windows"]]
    buckets = "".join(
        f"<h2>Per {html.escape(name)}</h2>" + _table([{name: k, **v} for k, v in b.items()],
                                                     [name, "episodes", "steps", "human_steps", "labels_allowed",
                                                      "successes"])
        for name, b in report["buckets"].items())
    rule = ", ".join(f"{k}={v}" for k, v in report["rule"].items())
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>hg-dagger report</title><style>
body{{font-family:sans-serif;margin:24px;color:#222}} table{{border-collapse:collapse;margin:8px 0 20px}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}} th{{background:#f0f0f0}}
img{{max-width:100%}} .muted{{color:#777}}</style></head><body>
<h1>Training data report</h1>
<p class="muted">{html.escape(report['store'])} &middot; {report['episodes']} complete episodes
({report['incomplete_episodes']} incomplete) &middot; generated {report['generated']} &middot; rule: {html.escape(rule)}</p>
{_table(figs, ["figure", "value"])}
{plots}
{_recall_html(report)}
<h2>Correction windows</h2>
{_table(wins, ["window", "episode", "task", "operator", "source", "gate_reason", "handover", "outcome", "review",
               "authorized", "reviewer", "review_problem", "certified", "qc_passed", "replay_status", "labels",
               "allowed", "stopped_by"])}
{buckets}
</body></html>
"""


def _recall_html(report: dict[str, Any]) -> str:
    gr = report.get("gate_recall") or {}
    rows = [{**r, "missed_episodes": ", ".join(r["missed_episodes"])} for r in gr.get("rounds", []) if r["episodes"]]
    if not rows:
        return ""
    misses = "".join(f"<p><b>Gate miss in round {html.escape(r['round'])}</b>: the student failed in "
                     f"{r['failed']} episode(s) and no gate asked: {html.escape(r['missed_episodes'])}</p>"
                     for r in rows if r["gate_miss"])
    return ("<h2>Gate recall per round (human-gated episodes)</h2><p class='muted'>recall: failed episodes in which a "
            "gate asked before the failure; precision: requests that came before a failure (docs/gates.md)</p>"
            + _table(rows, ["round", "episodes", "failed", "caught", "recall", "requests", "requests_before_failure",
                            "precision", "gate_miss", "missed_episodes"]) + misses)


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """report.json and report.html in ``out_dir`` (created; existing report files are replaced)."""
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / "report.json", "html": out / "report.html"}
        paths["json"].write_text(json.dumps(report, indent=2))
        paths["html"].write_text(render_html(report))
    except OSError as exc:
        raise HgDaggerError(f"{out}: cannot write the report ({exc.strerror or exc})") from exc
    return paths
