"""Fair learning comparison (issue 12): BC, classic DAgger and human-gated DAgger on one task, over seeds.

    python benchmarks/bench_learning.py --quick --out runs/bench_learning_quick      # toy_reach, 3 seeds, minutes
    python benchmarks/bench_learning.py --task fetch_pick_place --seeds 3 --out runs/bench_learning_fpp

Same student (architecture and initial weights per seed), same round 0 (expert demonstrations), same
gradient steps per label (``--steps-per-label``), same fixed-seed evaluation episodes after every round, and one
time budget for every episode of every arm (the task's, hg_dagger.learn.budget; ``--budget``). After each round
a trained student takes over only if a held-out evaluation (seeds 200000 on, ``--promotion-episodes``) does not
say it is worse beyond the noise (hg_dagger.learn.promotion); the reported success is the acting student's. The
summary compares gated against BC per seed at BC's final labels and at BC's final operator-seconds.
Human-gated DAgger uses the synthetic operator (the planner through ``raw_to_human``, certified with
``operator.certification: planner_auto``) and the task's gates; ``gated_human`` answers the same gates with the
human operator model at the keyboard, in real time (reaction times, look-aways, declines, key-level steering;
one env). Human effort is counted as labels,
operator seconds and context switches (benchmarks/learning_common.py says how).

Writes OUT/results.json (every round of every arm and seed, and the summary), OUT/learning_curve.png
(success against labels: mean over seeds, bars = min..max over seeds) and OUT/<method>_s<seed>/curve.jsonl
as each arm runs. Arms run in ``--jobs`` spawned processes. Gated arms also report gate recall per round
(hg_dagger.review.recall: failed collection episodes a gate asked for before the failure, requests that
came before a failure, gate misses with their episodes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from learning_common import first_reaching, run_arm  # noqa: E402

METHODS = ("bc", "dagger", "gated", "gated_risk", "gated_human")
DEFAULT_METHODS = ("bc", "dagger", "gated")
LABEL = {"bc": "BC", "dagger": "classic DAgger", "gated": "human-gated DAgger",
         "gated_risk": "human-gated + risk gate", "gated_human": "human-gated, human-paced"}

# Settings per task. quick = toy_reach sized for about 10 minutes on 2 shared cores.
PRESETS = {
    "toy_reach": {
        "num_envs": 8, "rounds": 6, "warm_episodes": 8, "episodes_per_round": 8,
        "beta_decay": 0.5, "steps_per_label": 4.0,
        "student": {"kind": "mlp", "ensemble": 5, "hidden": [64, 64]},
        "train": {"batch_size": 256, "lr": 2e-3},
        "eval": {"episodes": 40, "num_envs": 20, "seed": 100_000},
        "gated": {"num_envs": 4, "calibrate_steps": 200, "target_rate": 0.1},
    },
    "fetch_pick_place": {
        "num_envs": 6, "rounds": 8, "warm_episodes": 6, "episodes_per_round": 6,
        "beta_decay": 0.5, "steps_per_label": 3.3,
        "student": {"kind": "mlp", "ensemble": 5, "hidden": [256, 256]},
        "train": {"batch_size": 256, "lr": 1e-3},
        "eval": {"episodes": 50, "num_envs": 10, "seed": 100_000},
        "gated": {"num_envs": 3, "calibrate_steps": 300, "target_rate": 0.1},
    },
    # Fetch with its 128 px camera and the CNN student (a shared CNN per camera, the state beside it): every
    # step renders and every gradient step runs the CNN, so rounds, batches and evaluation are smaller.
    "fetch_pick_place_rgb": {
        "num_envs": 6, "rounds": 4, "warm_episodes": 6, "episodes_per_round": 6,
        "beta_decay": 0.5, "steps_per_label": 3.3,
        "student": {"kind": "cnn", "ensemble": 3, "hidden": [256, 256]},
        "train": {"batch_size": 64, "lr": 1e-3},
        "eval": {"episodes": 30, "num_envs": 10, "seed": 100_000},
        "gated": {"num_envs": 3, "calibrate_steps": 300, "target_rate": 0.1},
    },
    # Meta-World push-v3 (80 Hz): the planner pushes the puck within about 2 s; its time budget (configs/run) is
    # 200 steps (2.5 s), as Fetch's is 80, so labels are the push rather than the hold after it.
    "mw_push": {
        "num_envs": 6, "rounds": 5, "warm_episodes": 6, "episodes_per_round": 6,
        "beta_decay": 0.5, "steps_per_label": 3.3,
        "student": {"kind": "mlp", "ensemble": 5, "hidden": [256, 256]},
        "train": {"batch_size": 256, "lr": 1e-3},
        "eval": {"episodes": 30, "num_envs": 10, "seed": 100_000},
        "gated": {"num_envs": 3, "calibrate_steps": 300, "target_rate": 0.1},
    },
}


def arm_spec(task: str, seed: int, **over) -> dict:
    """One arm's settings: the task's preset with ``over`` on top. Every episode of every arm - demonstrations,
    DAgger and gated collection, the reported and the promotion evaluations - is cut at one time budget, the
    task's (hg_dagger.learn.budget: configs/run/<task>.yaml max_episode_steps), unless ``budget`` is given."""
    from hg_dagger.learn.budget import task_budget

    base = PRESETS.get(task) or PRESETS["fetch_pick_place"]
    spec = json.loads(json.dumps(base))
    spec.update(task=task, seed=seed)
    budget = over.pop("budget", None) or task_budget(task)
    spec["max_episode_steps"] = spec["eval"]["max_steps"] = int(budget)
    promo = over.pop("promotion_episodes", None)
    spec["promotion"] = None if promo == 0 else {
        "episodes": int(promo or over.get("eval_episodes") or spec["eval"]["episodes"]), "seed": 200_000,
        "confidence": 0.95}
    for k, v in over.items():
        if v is None:
            continue
        if k in ("eval_episodes",):
            spec["eval"]["episodes"] = v
        elif k in ("target_rate", "gates"):
            spec["gated"][k] = v
        elif k == "gated_episodes":
            spec["gated"]["episodes_per_round"] = v
        elif k == "gated_windows":
            spec["gated"]["windows_per_round"] = v
        elif k == "gated_windows_schedule":
            spec["gated"]["windows_schedule"] = [int(x) for x in v]
        else:
            spec[k] = v
    return spec


def _arm(method: str, spec: dict, out: str) -> dict:
    return run_arm(method, spec, Path(out) / f"{method}_s{spec['seed']}", log=lambda s: print(s, flush=True))


def arms_from_curves(out: Path, rounds: int | None) -> list[dict]:
    """The arms recorded so far under OUT (each arm's curve.jsonl grows one line per round): a run stopped
    at a deadline is still reported; arms with fewer than ``rounds`` rounds are marked partial."""
    arms = []
    for path in sorted(out.glob("*_s*/curve.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        if not rows:
            continue
        arms.append({"method": rows[0]["method"], "seed": rows[0]["seed"], "rounds": rows,
                     "seconds": float(sum(r["seconds"] for r in rows)),
                     "partial": rounds is not None and len(rows) < rounds})
    return arms


def summarize(arms: list[dict], target: float) -> dict:
    """Per method: the curve's mean and spread over seeds, effort totals, labels to reach ``target``."""
    out = {}
    for m in METHODS:
        runs = sorted((a for a in arms if a["method"] == m), key=lambda a: a["seed"])
        if not runs:
            continue
        n = min(len(a["rounds"]) for a in runs)

        def col(key, runs=runs, n=n):
            return np.array([[a["rounds"][i][key] for i in range(n)] for a in runs], np.float64)

        lab, suc = col("labels"), col("success")
        last = [a["rounds"][n - 1] for a in runs]
        out[m] = {
            "seeds": [a["seed"] for a in runs],
            "labels_mean": lab.mean(0).tolist(), "labels_std": lab.std(0).tolist(),
            "success_mean": suc.mean(0).tolist(), "success_std": suc.std(0).tolist(),
            "success_min": suc.min(0).tolist(), "success_max": suc.max(0).tolist(),
            "operator_s_mean": col("operator_s_total").mean(0).tolist(),
            "context_switches_mean": col("context_switches_total").mean(0).tolist(),
            "grad_steps_mean": col("grad_steps").mean(0).tolist(),
            "final_success_mean": float(suc[:, -1].mean()), "final_success_std": float(suc[:, -1].std()),
            "final_labels_mean": float(lab[:, -1].mean()),
            "final_operator_s_mean": float(np.mean([r["operator_s_total"] for r in last])),
            "final_context_switches_mean": float(np.mean([r["context_switches_total"] for r in last])),
            "last_round_intervention_rate_mean": float(np.mean([r["intervention_rate"] for r in last])),
            "labels_to_target": [first_reaching([r["labels"] for r in a["rounds"]],
                                                [r["success"] for r in a["rounds"]], target) for a in runs],
            "seconds": float(np.mean([a["seconds"] for a in runs])),
            "promoted_per_round": [sum(bool(a["rounds"][i].get("promotion", {}).get("promoted", True)) for a in runs)
                                   for i in range(n)],
            "candidate_success_mean": [_mean_or_none([a["rounds"][i].get("promotion", {}).get("candidate_success")
                                                      for a in runs]) for i in range(n)],
            "collect_success_mean": [_mean_or_none([a["rounds"][i].get("collect_success") for a in runs])
                                     for i in range(n)],
            "new_labels_mean": col("new_labels").mean(0).tolist(),
            "operator_s_round_mean": col("operator_s").mean(0).tolist(),
            "windows_round_mean": [_mean_or_none([a["rounds"][i].get("windows") for a in runs]) for i in range(n)],
            "episodes_round_mean": col("episodes").mean(0).tolist(),
            "intervention_round_mean": col("intervention_rate").mean(0).tolist(),
            **_gate_recall(runs, n),
        }
    if "gated" in out and "bc" in out:
        g, b = out["gated"]["labels_to_target"], out["bc"]["labels_to_target"]
        ratios = [gi / bi if gi is not None and bi else None for gi, bi in zip(g, b, strict=False)]
        out["gated_over_bc_labels_at_target"] = ratios
        out["gated_vs_bc"] = compare(arms, "gated", "bc")
    return out


def at_budget(xs: list[float], ys: list[float], x: float) -> float | None:
    """A curve's value at budget ``x``: the last point whose cost is within it (None: even the first is over)."""
    vals = [y for xi, y in zip(xs, ys, strict=True) if xi <= x + 1e-9]
    return vals[-1] if vals else None


def compare(arms: list[dict], a: str, b: str) -> dict:
    """Arm ``a`` against arm ``b`` per seed: at ``b``'s final labels and at its final operator-seconds (the best
    point of ``a`` within each budget, and ``b``'s), and what ``a`` spent to first reach ``b``'s final success."""
    by = {(x["method"], x["seed"]): x["rounds"] for x in arms}
    rows = []
    for seed in sorted({s for m, s in by if m == a and (b, s) in by}):
        ra, rb = by[(a, seed)], by[(b, seed)]
        final_b = rb[-1]
        lab_a, ops_a, suc_a = ([r[k] for r in ra] for k in ("labels", "operator_s_total", "success"))
        lab_b, ops_b, suc_b = ([r[k] for r in rb] for k in ("labels", "operator_s_total", "success"))
        reach = next((i for i, y in enumerate(suc_a) if y >= final_b["success"] - 1e-9), None)
        rows.append({
            "seed": seed, "b_final_success": final_b["success"], "b_final_labels": final_b["labels"],
            "b_final_operator_s": final_b["operator_s_total"], "a_final_success": suc_a[-1],
            "a_final_labels": lab_a[-1], "a_final_operator_s": ops_a[-1],
            "a_at_b_labels": at_budget(lab_a, suc_a, final_b["labels"]),
            "b_at_a_labels": at_budget(lab_b, suc_b, lab_a[-1]),
            "a_at_b_operator_s": at_budget(ops_a, suc_a, final_b["operator_s_total"]),
            "b_at_a_operator_s": at_budget(ops_b, suc_b, ops_a[-1]),
            "a_operator_s_to_b_final": None if reach is None else ops_a[reach],
            "a_operator_s_ratio_to_b_final": None if reach is None else ops_a[reach] / final_b["operator_s_total"],
            "a_labels_to_b_final": None if reach is None else lab_a[reach],
        })
    mean = {k: _mean_or_none([r[k] for r in rows]) for k in rows[0] if k != "seed"} if rows else {}
    return {"a": a, "b": b, "per_seed": rows, "mean": mean}


def _mean_or_none(values: list) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _gate_recall(runs: list[dict], n: int) -> dict:
    """Per round over seeds (gated rounds only; None where no episode failed or no gate asked): recall and
    precision pooled over the seeds' episodes, and every gate miss (the student failed, no gate asked)."""
    figs = [[a["rounds"][i].get("gates") for a in runs] for i in range(n)]
    if not any(f for col in figs for f in col):
        return {}

    def pooled(col, num, den):
        d = sum(f[den] for f in col if f)
        return sum(f[num] for f in col if f) / d if d else None

    recall = [pooled(col, "caught", "failed") for col in figs]
    leads = [[x for a in runs for x in a["rounds"][i].get("lead_s", [])] for i in range(n)]
    return {
        "gate_lead_s_median_per_round": [float(np.median(v)) if v else None for v in leads],
        "gate_recall_per_round": recall,
        "gate_precision_per_round": [pooled(col, "requests_before_failure", "requests") for col in figs],
        "gate_failed_per_round": [sum(f["failed"] for f in col if f) for col in figs],
        "gate_recall_from_round_1": pooled([f for col in figs[1:] for f in col], "caught", "failed"),
        "gate_misses": [{"seed": a["seed"], "round": i, "episodes": f["missed_episodes"]}
                        for i, col in enumerate(figs) for a, f in zip(runs, col, strict=True) if f and f["gate_miss"]],
    }


def plot(summary: dict, path: Path, title: str) -> None:
    """Success against human labels (left) and against operator-seconds (right), mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for m, color in zip(METHODS, ("tab:gray", "tab:blue", "tab:red", "tab:orange", "tab:purple"), strict=True):
        s = summary.get(m)
        if not s:
            continue
        y = np.array(s["success_mean"])
        lo, hi = y - np.array(s["success_min"]), np.array(s["success_max"]) - y
        for ax, x, xerr in ((axes[0], s["labels_mean"], s["labels_std"]), (axes[1], s["operator_s_mean"], None)):
            ax.errorbar(np.array(x), y, yerr=[lo, hi], xerr=xerr, marker="o", capsize=3, color=color,
                        label=f"{LABEL[m]} (n={len(s['seeds'])} seeds)")
    axes[0].set_xlabel("human labels (mean over seeds; x bars = std)")
    axes[1].set_xlabel("operator-seconds (mean over seeds)")
    axes[0].set_ylabel("student-only success (mean; bars = min..max)")
    for ax in axes:
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    axes[1].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def print_table(summary: dict, target: float) -> None:
    print(f"\n{'method':>20} {'labels':>8} {'operator s':>10} {'switches':>8} {'success':>13} "
          f"{'last-round interv.':>18} {'labels to ' + format(target, '.0%'):>16}")
    for m in METHODS:
        s = summary.get(m)
        if not s:
            continue
        reach = ", ".join("-" if v is None else str(int(v)) for v in s["labels_to_target"])
        print(f"{LABEL[m]:>20} {s['final_labels_mean']:8.0f} {s['final_operator_s_mean']:10.1f} "
              f"{s['final_context_switches_mean']:8.1f} {s['final_success_mean']:7.0%} ±{s['final_success_std']:4.0%} "
              f"{s['last_round_intervention_rate_mean']:18.1%} {reach:>16}")
    for m in METHODS:
        s = summary.get(m)
        if s:
            print(f"{LABEL[m]} per round: " + ", ".join(
                f"{lab:.0f} -> {suc:.0%}" for lab, suc in zip(s["labels_mean"], s["success_mean"], strict=True)))
    pct = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    for m in METHODS:
        s = summary.get(m)
        if not s or "gate_recall_per_round" not in s:
            continue
        print(f"{LABEL[m]} gate recall / precision per round (failed collection episodes, all seeds): " + ", ".join(
            f"r{i} {pct(r)} / {pct(p)} ({f} failed)" for i, (r, p, f) in enumerate(zip(
                s["gate_recall_per_round"], s["gate_precision_per_round"], s["gate_failed_per_round"], strict=True))
            if i > 0) + f"; recall from round 1 on: {pct(s['gate_recall_from_round_1'])}")
        lead = s.get("gate_lead_s_median_per_round") or []
        print(f"{LABEL[m]} gate lead time (median s from the first request to the failure point) per round: "
              + ", ".join(f"r{i} {'-' if v is None else format(v, '.1f')}" for i, v in enumerate(lead) if i > 0))
        for miss in s["gate_misses"]:
            print(f"{LABEL[m]} GATE MISS seed {miss['seed']} round {miss['round']}: the student failed and no gate "
                  f"asked (episodes {', '.join(miss['episodes'])})")


def print_rounds(summary: dict) -> None:
    """Per round and method (means over seeds): success, labels, operator-seconds, collection success, how many
    seeds promoted the round's student and the candidates' held-out success."""
    pct = lambda v: "-" if v is None else f"{v:.0%}"  # noqa: E731
    for m in METHODS:
        s = summary.get(m)
        if not s:
            continue
        print(f"\n{LABEL[m]}: round | success | labels | operator-s | collect success | promoted (seeds) | "
              f"candidate held-out | gate recall | precision | lead s | windows | episodes | intervention")
        rec = s.get("gate_recall_per_round") or [None] * len(s["success_mean"])
        pre = s.get("gate_precision_per_round") or [None] * len(s["success_mean"])
        lead = s.get("gate_lead_s_median_per_round") or [None] * len(s["success_mean"])
        win = s.get("windows_round_mean") or [None] * len(s["success_mean"])
        for i in range(len(s["success_mean"])):
            print(f"  {i} | {s['success_mean'][i]:.0%} | {s['labels_mean'][i]:.0f} | {s['operator_s_mean'][i]:.1f} | "
                  f"{pct(s['collect_success_mean'][i])} | {s['promoted_per_round'][i]}/{len(s['seeds'])} | "
                  f"{pct(s['candidate_success_mean'][i])} | {pct(rec[i])} | {pct(pre[i])} | "
                  f"{'-' if lead[i] is None else format(lead[i], '.1f')} | "
                  f"{'-' if win[i] is None else format(win[i], '.1f')} | {s['episodes_round_mean'][i]:.1f} | "
                  f"{s['intervention_round_mean'][i]:.1%}")
    c = summary.get("gated_vs_bc")
    if c and c["per_seed"]:
        print("\ngated against BC per seed (BC final: success / labels / operator-s; gated at BC's labels, at BC's "
              "operator-s; gated's operator-s to BC's final success):")
        for r in c["per_seed"]:
            ratio = r["a_operator_s_ratio_to_b_final"]
            print(f"  seed {r['seed']}: BC {r['b_final_success']:.0%} / {r['b_final_labels']:.0f} / "
                  f"{r['b_final_operator_s']:.1f}; gated {pct(r['a_at_b_labels'])} at BC's labels, "
                  f"{pct(r['a_at_b_operator_s'])} at BC's operator-s, BC {pct(r['b_at_a_operator_s'])} at gated's "
                  f"{r['a_final_operator_s']:.1f} operator-s; gated reaches BC's final with "
                  f"{'never' if ratio is None else format(ratio, '.2f') + 'x'} BC's operator-s")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="toy_reach, 3 seeds, about 10 minutes on 2 cores")
    p.add_argument("--task", default=None, help="task id (default: toy_reach with --quick, else fetch_pick_place)")
    p.add_argument("--seeds", default="3", help="a count (3 = seeds 0,1,2) or a comma list (0,4,7; one seed: 2,)")
    p.add_argument("--out", default=None, help="output folder (default: runs/bench_learning_<task>)")
    p.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                   help="comma list of bc, dagger, gated, gated_risk (gated plus the learned risk gate), "
                        "gated_human (gated, answered in real time by the human operator model at the keyboard)")
    p.add_argument("--rounds", type=int)
    p.add_argument("--episodes-per-round", type=int)
    p.add_argument("--gated-episodes", type=int,
                   help="gated: student episodes watched per round (default: --episodes-per-round); labels, "
                        "operator-seconds and context switches count what they cost")
    p.add_argument("--gated-windows", type=int,
                   help="gated, gated_risk: stop watching a round once it holds this many correction windows (whole "
                        "batches of episodes, at most --gated-episodes): few episodes while the student fails often, "
                        "many once failures are rare")
    p.add_argument("--gated-windows-schedule",
                   help="gated, gated_risk: --gated-windows per round, a comma list from round 1 on (the last value "
                        "holds for later rounds; 0: no window cap that round), e.g. 20,10")
    p.add_argument("--warm-episodes", type=int, help="round 0 demonstrations (the same for every arm)")
    p.add_argument("--steps-per-label", type=float, help="gradient steps per label (same for every arm)")
    p.add_argument("--eval-episodes", type=int)
    p.add_argument("--promotion-episodes", type=int,
                   help="held-out episodes (seeds 200000 on) that decide whether a trained student takes over "
                        "(default: --eval-episodes; 0: every trained student takes over, as before)")
    p.add_argument("--budget", type=int, help="steps every episode has, in collection and evaluation alike "
                   "(default: the task time budget, configs/run/<task>.yaml max_episode_steps)")
    p.add_argument("--target-rate", type=float, help="gated: the confidence gate's calibrated intervention rate")
    p.add_argument("--gates", help="gated: a gate config (name in configs/gates or a path; default: the task's)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="spec_set",
                   help="every arm: a student, train or replay setting, e.g. student.ensemble=3 or "
                   "replay.intervention_weight=3 (YAML value; repeatable)")
    p.add_argument("--gated-set", action="append", default=[], metavar="KEY=VALUE",
                   help="gated: a run-config option for the sessions, e.g. handover.auto_return.agree_ticks=16 "
                   "(YAML value; repeatable)")
    p.add_argument("--target", type=float, default=None, help="success level for 'labels to reach' (quick 0.9, else 0.95)")
    p.add_argument("--jobs", type=int, default=2, help="arms in parallel processes")
    p.add_argument("--report", action="store_true",
                   help="run nothing: rebuild results.json and the curve from OUT/*/curve.jsonl (e.g. a run cut short)")
    args = p.parse_args(argv)
    task = args.task or ("toy_reach" if args.quick else "fetch_pick_place")
    seeds = list(range(int(args.seeds))) if "," not in args.seeds else [int(s) for s in args.seeds.split(",") if s]
    if not seeds:
        p.error(f"--seeds {args.seeds}: no seeds to run (a count of seeds, or seeds separated by commas: 0,1,2 or 5,)")
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        p.error(f"--methods: unknown {bad}; choose from {', '.join(METHODS)}")
    target = args.target if args.target is not None else (0.9 if task == "toy_reach" else 0.95)
    out = Path(args.out or f"runs/bench_learning_{task}")
    out.mkdir(parents=True, exist_ok=True)
    over = {"rounds": args.rounds, "episodes_per_round": args.episodes_per_round, "warm_episodes": args.warm_episodes,
            "steps_per_label": args.steps_per_label, "eval_episodes": args.eval_episodes,
            "target_rate": args.target_rate, "gates": args.gates, "gated_episodes": args.gated_episodes,
            "gated_windows": args.gated_windows, "promotion_episodes": args.promotion_episodes,
            "gated_windows_schedule": [x for x in (args.gated_windows_schedule or "").split(",") if x.strip()] or None,
            "budget": args.budget}
    def pairs(items: list[str], flag: str) -> dict:
        out = {}
        for item in items:
            key, eq, value = item.partition("=")
            if not eq or not key:
                p.error(f"{flag} {item!r}: give KEY=VALUE")
            out[key] = yaml.safe_load(value)
        return out

    sets, spec_sets = pairs(args.gated_set, "--gated-set"), pairs(args.spec_set, "--set")
    for key in spec_sets:
        if key.split(".")[0] not in ("student", "train", "replay") or "." not in key:
            p.error(f"--set {key}: give student.X, train.X or replay.X")
    specs = [(m, arm_spec(task, s, **over)) for s in seeds for m in methods]
    for _, spec in specs:
        spec["gated"]["overrides"] = {**spec["gated"].get("overrides", {}), **sets}
        for key, value in spec_sets.items():
            section, name = key.split(".", 1)
            spec.setdefault(section, {})[name] = value
    print(f"bench_learning: {task}, methods {methods}, seeds {seeds}, {len(specs)} arms in {args.jobs} processes; "
          f"out {out}", flush=True)
    t0 = time.perf_counter()
    if args.report:
        arms = arms_from_curves(out, specs[0][1]["rounds"])
        if not arms:
            p.error(f"--report: no */curve.jsonl under {out}")
        specs = [(a["method"], {**specs[0][1], "seed": a["seed"]}) for a in arms]
        seeds = sorted({a["seed"] for a in arms})
        return _report(args, argv, task, seeds, target, specs, arms, out, t0)
    taken = [f"{m}_s{spec['seed']}" for m, spec in specs if (out / f"{m}_s{spec['seed']}" / "store").exists()]
    if taken:
        p.error(f"{out} already holds {', '.join(taken)}: choose another --out, or --report to summarize them")
    arms = []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs), mp_context=get_context("spawn")) as pool:
        futs = {pool.submit(_arm, m, spec, str(out)): (m, spec["seed"]) for m, spec in specs}
        for f in as_completed(futs):
            arms.append(f.result())
            m, s = futs[f]
            print(f"done {m} seed {s}: {len(arms)}/{len(specs)} arms, {time.perf_counter() - t0:.0f} s", flush=True)
    return _report(args, argv, task, seeds, target, specs, arms, out, t0)


def _report(args, argv, task, seeds, target, specs, arms, out: Path, t0: float) -> int:
    summary = summarize(arms, target)
    result = {"argv": sys.argv[1:] if argv is None else list(argv), "task": task, "seeds": seeds, "target": target,
              "spec": specs[0][1], "partial_arms": [f"{a['method']}_s{a['seed']}" for a in arms if a.get("partial")],
              "summary": summary, "arms": arms, "seconds": time.perf_counter() - t0}
    (out / "results.json").write_text(json.dumps(result, indent=2, default=str))
    plot(summary, out / "learning_curve.png", f"{task}: success vs human labels and operator-seconds, "
         f"{len(seeds)} seeds, {specs[0][1]['steps_per_label']:g} grad steps/label, "
         f"{specs[0][1]['eval']['episodes']} eval episodes")
    print_table(summary, target)
    print_rounds(summary)
    if "gated_over_bc_labels_at_target" in summary:
        print(f"gated / BC labels to reach {target:.0%} per seed: "
              + ", ".join("-" if r is None else f"{r:.2f}" for r in summary["gated_over_bc_labels_at_target"]))
    print(f"results: {out / 'results.json'}, curve: {out / 'learning_curve.png'} ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
