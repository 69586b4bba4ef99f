"""Dataset versions at scale: `dataset build` and `dataset check` of a large state-only store against reading the
catalog and the same arrays with zarr alone.

The store (built with the recorder): N episodes x L steps, 31-d state, operators op0..op19, scenes scene0..scene4;
every other episode has an expert correction window over its middle third with a planner_auto certification (what
`auto` records), so half the windows' labels are trainable without a review. Issue 10 target: 10,000 episodes /
1,000,000 steps built and checked in <= 60 s and <= 2 GB peak RSS.

Each measurement runs in a fresh process (its own peak RSS, every import paid):
  baseline  - zarr alone: every segment's committed log records parsed as JSON, and rows/episode, rows/step,
              data/action_source and data/applied_action read in blocks of 65536 rows (what build reads);
  build     - datasets.build.build("bench", [store]) with splits (val 0.1, test 0.1, isolated by operator) and dedup;
  check     - datasets.read.check(manifest): the leakage check plus every store, episode and trainable sample re-checked
              against the training rule on the label layer it names.

    python benchmarks/bench_datasets.py                          # 10,000 x 100
    python benchmarks/bench_datasets.py --episodes 1000 --steps 50
    python benchmarks/bench_datasets.py --store /tmp/big --keep   # reuse a store built before
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HZ = 50.0
ACTION_DIM = 4
STATE_DIM = 31
BLOCK = 65536


def build_store(path: str, n_eps: int, ep_len: int) -> dict:
    from hg_dagger.contract import (
        ActionSource,
        CollectionMode,
        CorrectionWindow,
        EndReason,
        EpisodeEnd,
        EpisodeStart,
        TaskInfo,
        step_fields,
    )
    from hg_dagger.contract.labels import planner_certifications
    from hg_dagger.store import EpisodeStore

    f = step_fields(obs={"state": ((STATE_DIM,), "float32")}, action_dim=ACTION_DIM)
    rng = np.random.default_rng(0)
    period = int(1e9 / HZ)
    a, b = ep_len // 3, 2 * ep_len // 3
    store = EpisodeStore.create(path)
    t0 = time.perf_counter()
    with store.recorder(on_full="block") as rec:
        for i in range(n_eps):
            start = EpisodeStart(task=TaskInfo(task_id="bench_reach", scene_id=f"scene{i % 5}"),
                                 mode=CollectionMode.DAGGER_SYNC, control_hz=HZ, operator=f"op{i % 20}",
                                 policy_version=f"p{i // 1000}", iteration=i // 1000)
            eid = rec.begin_episode(start, f)
            windowed = i % 2 == 0
            for t in range(ep_len):
                expert = windowed and a <= t < b
                act = rng.uniform(-1, 1, ACTION_DIM).astype(np.float32)
                s = {"t_obs": (t + 1) * period, "t_policy": (t + 1) * period + 1000,
                     "t_action_apply": (t + 1) * period + 2000, "policy_action": act, "applied_action": act,
                     "action_source": np.uint8(ActionSource.EXPERT.code if expert else ActionSource.POLICY.code),
                     "obs/state": rng.standard_normal(STATE_DIM).astype(np.float32)}
                if expert:
                    s.update(expert_action=act, expert_valid=True, expert_used=True)
                rec.put(eid, s)
            windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=a, handover_start=a, handover_end=b,
                                        source=ActionSource.EXPERT, gate_reason=("stall", "confidence")[i % 4 == 0])
                       ] if windowed else []
            rec.end_episode(eid, EpisodeEnd(end_reason=EndReason.SUCCESS, task_success=True, num_steps=ep_len),
                            windows=windows, certifications=planner_certifications(eid, windows, "bench"))
    assert rec.stats.dropped_steps == 0
    files = [os.path.join(d, x) for d, _, fs in os.walk(path) for x in fs]
    return {"record_s": time.perf_counter() - t0, "files": len(files),
            "mb": sum(os.path.getsize(p) for p in files) / 1e6}


# ---------------------------------------------------------------------- measurements (one per process)


def run_baseline(store: str, root: str) -> dict:
    """The catalog and the arrays build reads, with zarr and json alone."""
    import zarr

    g = zarr.open_group(store, mode="r")
    records = rows = 0
    for sid in g["segments"].group_keys():
        seg = g[f"segments/{sid}"]
        meta = seg.attrs["hg_dagger_segment"]
        n, m = meta["committed_rows"], meta["committed_log"]
        records += len([json.loads(r) for r in seg["log"][:m]])
        for name in ("rows/episode", "rows/step", "data/action_source", "data/applied_action"):
            arr = seg[name]
            for lo in range(0, n, BLOCK):
                arr[lo:min(n, lo + BLOCK)]
        rows += n
    return {"rows": rows, "records": records}


def run_build(store: str, root: str) -> dict:
    from hg_dagger.datasets.build import build
    from hg_dagger.datasets.manifest import DatasetConfig
    from hg_dagger.datasets.repository import manifest_path
    from hg_dagger.datasets.splits import SplitConfig

    cfg = DatasetConfig(splits=SplitConfig(val_fraction=0.1, test_fraction=0.1, isolate=("operator",)))
    m, written = build("bench", [store], root=root, config=cfg)
    return {"samples": len(m.samples), "episodes": len(m.episodes), "trainable": m.summary["usage"]["trainable"],
            "trainable_steps": m.summary["trainable_steps"], "splits": m.summary["splits"], "written": written,
            "manifest_mb": os.path.getsize(manifest_path(root, "bench", m.version)) / 1e6}


def run_check(store: str, root: str) -> dict:
    from hg_dagger.datasets.read import check
    from hg_dagger.datasets.repository import load

    m = load(root, "bench")
    problems = check(m)
    assert not problems, problems[:3]
    return {"samples": len(m.samples), "problems": len(problems)}


RUNS = {"baseline": run_baseline, "build": run_build, "check": run_check}


def _child(kind: str, store: str, root: str) -> None:
    t0 = time.perf_counter()
    out = RUNS[kind](store, root)
    out["seconds"] = time.perf_counter() - t0
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def _measure(kind: str, store: str, root: str) -> dict:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, __file__, "--child", kind, "--store", store, "--root", root],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{kind} failed:\n{r.stderr}")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=10_000)
    ap.add_argument("--steps", type=int, default=100, help="steps per episode")
    ap.add_argument("--store", help="store path (built if missing)")
    ap.add_argument("--root", help="dataset folder (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the store")
    ap.add_argument("--json", help="also write the figures here")
    ap.add_argument("--child", choices=sorted(RUNS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child, args.store, args.root)
        return
    tmp = tempfile.mkdtemp(prefix="bench_datasets_")
    store = args.store or os.path.join(tmp, "store")
    root = args.root or os.path.join(tmp, "datasets")
    try:
        built = None
        if not os.path.exists(store):
            built = build_store(store, args.episodes, args.steps)
            print(f"store: {args.episodes} episodes x {args.steps} steps in {built['record_s']:.1f} s, "
                  f"{built['files']} files, {built['mb']:.0f} MB")
        shutil.rmtree(os.path.join(root, "bench"), ignore_errors=True)
        res = {k: _measure(k, store, root) for k in ("baseline", "build", "check")}
        base = res["baseline"]["seconds"]
        print(f"{'run':<9} {'seconds':>8} {'x baseline':>10} {'process s':>9} {'peak RSS MB':>11}")
        for k, r in res.items():
            print(f"{k:<9} {r['seconds']:8.1f} {r['seconds'] / base:10.2f} {r['process_s']:9.1f} "
                  f"{r['peak_rss_mb']:11.0f}")
        b = res["build"]
        from figures import record

        for k in ("build", "check"):
            record(f"dataset {k}, {args.episodes} episodes", res[k]["seconds"], unit="s", baseline=base,
                   baseline_name="catalog + arrays with zarr", higher_is_better=False)
        total = res["build"]["seconds"] + res["check"]["seconds"]
        record(f"dataset build + check, {args.episodes * args.steps:,} steps", total, unit="s",
               target="<= 60 s at 1,000,000 steps", met=total <= 60 if args.episodes * args.steps >= 1_000_000
               else None, higher_is_better=False)
        record(f"dataset build peak RSS, {args.episodes} episodes", res["build"]["peak_rss_mb"], unit="MB",
               target="<= 2048 MB", met=res["build"]["peak_rss_mb"] <= 2048, higher_is_better=False)
        print(f"build: {b['samples']} samples of {b['episodes']} episodes, {b['trainable']} trainable "
              f"({b['trainable_steps']} steps), splits {b['splits']}, manifest {b['manifest_mb']:.1f} MB; "
              f"load average {os.getloadavg()[0]:.1f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"store": built, **res, "episodes": args.episodes, "steps": args.steps}, fh, indent=2)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        elif args.store is None:
            print(f"kept {tmp}")


if __name__ == "__main__":
    main()
