"""`hg-dagger report --dataset NAME@vN`: the store report's figures (hg_dagger.review.report) over one dataset
version's episodes and samples, plus its usage classes, splits and the contribution of each version and round.
The dict has the store report's keys, so review.report.render_html and write_report produce the page."""

from __future__ import annotations

import html
from collections import Counter, defaultdict
from typing import Any

import numpy as np

from hg_dagger.contract import ActionSource, CollectionMode, LabelMask, RecoveryOutcome, TrainingBlock
from hg_dagger.contract.clock import wall_stamp
from hg_dagger.contract.enums import Usage
from hg_dagger.datasets.manifest import USAGES, Manifest, read_manifest
from hg_dagger.datasets.read import OpenStores
from hg_dagger.datasets.repository import manifest_path, versions

_HUMAN = ActionSource.HUMAN.code
_CONTEXT = LabelMask.CONTEXT_ONLY.code


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 6) if b else None


def dataset_report(manifest: Manifest, root) -> dict[str, Any]:
    opened = OpenStores()
    by_ep: dict[str, list] = defaultdict(list)
    for s in manifest.samples:
        by_ep[s.key].append(s)
    steps: Counter = Counter()
    labels: Counter = Counter()
    gates: Counter = Counter()
    recoveries: Counter = Counter()
    first_failure: list[float] = []
    rounds: dict[str, Counter] = defaultdict(Counter)
    buckets: dict[str, dict[str, Counter]] = {"operator": defaultdict(Counter), "scene": defaultdict(Counter)}
    windows = []
    for e in manifest.episodes:
        if not e.complete:
            continue
        st = opened.get(manifest.store_url(e.store))
        samples = by_ep[e.key]
        ep_sample = next((s for s in samples if s.kind == "episode"), None)
        layer = st.labels(e.episode_id, ep_sample.label_version if ep_sample else None)
        src = st.read_steps(e.episode_id, ["action_source"])["action_source"]
        n = len(src)
        human = int((src == _HUMAN).sum())
        trainable = sum(b - a for s in samples if s.usage == Usage.TRAINABLE for a, b in s.runs)
        trainable_human = sum(int((src[a:b] == _HUMAN).sum()) for s in samples if s.usage == Usage.TRAINABLE
                              for a, b in s.runs)
        steps.update(total=n, human=human, context=int((layer.mask == _CONTEXT).sum()))
        if e.mode == CollectionMode.HUMAN_GATED.value:
            steps.update(gated=n, gated_corrected=human)
        labels.update(labels=sum(s.labels for s in samples if s.kind != "episode"), allowed=trainable,
                      human_allowed=trainable_human)
        for s in samples:
            if s.usage != Usage.TRAINABLE:
                for b in s.blocks:
                    labels[b] += s.labels
        if layer.windows and n:
            first_failure.append(min(w.parent_step_id for w in layer.windows) / n)
        outcome = {w.window_id: w.outcome.value for w in layer.windows}
        for s in samples:
            if s.kind != "window":
                continue
            gates[s.gate_reason or "(none)"] += 1
            if s.source == ActionSource.HUMAN.value:
                recoveries[outcome.get(s.window_id, RecoveryOutcome.NONE.value)] += 1
            windows.append({"window_id": s.window_id, "episode_id": e.episode_id, "task": e.task,
                            "operator": s.operator, "source": s.source, "gate_reason": s.gate_reason,
                            "handover": list(s.steps), "outcome": outcome.get(s.window_id, ""), "usage": s.usage,
                            "split": s.split, "why": s.why, "labels": s.labels, "allowed": s.allowed,
                            "stopped_by": {b: s.labels for b in s.blocks}})
        key = f"{e.iteration}:{e.policy_version or '-'}"
        rounds[key].update(episodes=1, steps=n, labels_allowed=trainable, human_steps=human,
                           successes=int(e.task_success))
        for name, value in (("operator", e.operator or "(none)"), ("scene", e.scene or "-")):
            buckets[name][value].update(episodes=1, steps=n, human_steps=human, labels_allowed=trainable,
                                        successes=int(e.task_success))
    tried = sum(v for k, v in recoveries.items() if k != RecoveryOutcome.NONE.value)
    complete = [e for e in manifest.episodes if e.complete]
    per_version = []
    for v in versions(root, manifest.name):
        if v > manifest.version:
            break
        m = manifest if v == manifest.version else read_manifest(manifest_path(root, manifest.name, v))
        per_version.append({"version": f"v{v}", "samples": len(m.samples),
                            "trainable": m.summary.get("usage", {}).get(Usage.TRAINABLE, 0),
                            "trainable_steps": m.summary.get("trainable_steps", 0),
                            "added": m.summary.get("added", 0), "changed": m.summary.get("changed", 0)})
    return {
        "report_version": "1",
        "store": ", ".join(s.url for s in manifest.stores),
        "dataset": {"ref": manifest.ref, "hash": manifest.hash, "usage": manifest.summary.get("usage", {}),
                    "splits": manifest.summary.get("splits", {}), "versions": per_version,
                    "usage_per_split": {sp: dict(Counter(s.usage for s in manifest.samples if s.split == sp))
                                        for sp in sorted({s.split for s in manifest.samples})}},
        "task": manifest.config.selection.task,
        "generated": wall_stamp(),
        "rule": manifest.config.selection.rule.model_dump(),
        "episodes": len(complete),
        "incomplete_episodes": len(manifest.episodes) - len(complete),
        "steps": dict(steps),
        "labels": {k: labels.get(k, 0) for k in ["labels", "allowed", "human_allowed"]
                   + [str(b.name).lower() for b in TrainingBlock]},
        "figures": {
            "trainable_human_label_ratio": _ratio(labels["human_allowed"], steps["total"]),
            "context_only_ratio": _ratio(steps["context"], steps["total"]),
            "intervention_rate": _ratio(steps["gated_corrected"], steps["gated"]),
            "recovery_success_rate": _ratio(recoveries.get(RecoveryOutcome.RECOVERY_SUCCESS.value, 0), tried),
            "estops": sum(e.estops for e in complete),
            "first_failure_position_mean": round(float(np.mean(first_failure)), 4) if first_failure else None,
            "success_rate": _ratio(sum(e.task_success for e in complete), len(complete)),
        },
        "corrections_per_gate_reason": dict(gates.most_common()),
        "recovery_outcomes": dict(recoveries),
        "rounds": [{"round": k, **v} for k, v in sorted(rounds.items(), key=lambda kv: int(kv[0].split(":")[0]))],
        "buckets": {name: {k: dict(v) for k, v in sorted(b.items())} for name, b in buckets.items()},
        "windows": windows,
    }


def render_dataset_html(report: dict[str, Any]) -> str:
    """The store report's page with a section on the version: usage classes per split and per version."""
    # deferred: review.report imports zarr; the CLI lists its commands without it
    from hg_dagger.review.report import render_html

    page = render_html(report)
    d = report["dataset"]
    rows = "".join(f"<tr><td>{html.escape(sp)}</td>" + "".join(f"<td>{u.get(k, 0)}</td>" for k in USAGES) + "</tr>"
                   for sp, u in d["usage_per_split"].items())
    vers = "".join(f"<tr><td>{v['version']}</td><td>{v['samples']}</td><td>{v['trainable']}</td>"
                   f"<td>{v['trainable_steps']}</td><td>{v['added']}</td><td>{v['changed']}</td></tr>"
                   for v in d["versions"])
    section = (f"<h2>Dataset {html.escape(d['ref'])}</h2><p class='muted'>hash {d['hash']}</p>"
               f"<h3>Samples per split and usage class</h3><table><tr><th>split</th>"
               + "".join(f"<th>{u}</th>" for u in USAGES) + f"</tr>{rows}</table>"
               "<h3>Contribution per version</h3><table><tr><th>version</th><th>samples</th><th>trainable</th>"
               f"<th>trainable steps</th><th>added</th><th>changed</th></tr>{vers}</table>")
    return page.replace("<h1>Training data report</h1>", f"<h1>Training data report</h1>{section}", 1)
