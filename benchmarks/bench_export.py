"""Exports at scale: `hg-dagger export` of a large store against reading the same arrays with zarr alone.

Two stores, built with the recorder:
  state  - N episodes x L steps, 31-d state only, a human correction window in every other episode
           (issue 10 target: 10,000 episodes / 1,000,000 steps exported in <= 60 s and <= 2 GB peak RSS);
  camera - M episodes x K steps with two 128x128 RGB cameras (synthetic frames: moving gradients, which
           compress about like rendered frames), reported in frames per second.

Each measurement runs in a fresh process (so each peak RSS is its own and every import is paid):
  baseline   - open the store with zarr alone and read every array the export reads (committed rows of each
               segment, in blocks of 16384 rows: obs/*, applied_action, expert_action, expert_valid,
               action_source, reward, valid, terminated, truncated, success, rows/*), nothing else;
  lerobot    - export_lerobot(select(store), out): LeRobot v3.0 parquet (camera frames as PNG);
  ods        - export_ods(select(store), out): memory-mapped TensorDict;
  rlinf      - export_rlinf(select(store), out): the trainable runs only (--formats lerobot,ods,rlinf).

    python benchmarks/bench_export.py                              # 10,000 x 100 state, 1,000 x 50 camera
    python benchmarks/bench_export.py --episodes 1000 --cam-episodes 100
    python benchmarks/bench_export.py --only state --json out.json
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
CAM = 128
BLOCK_ROWS = 16384
READ_FIELDS = ("applied_action", "expert_action", "expert_valid", "action_source", "reward", "valid", "terminated",
               "truncated", "success")


def build(path: str, n_eps: int, ep_len: int, cameras: bool) -> dict:
    """A store of n_eps episodes of ep_len steps; every other episode has a human window over its middle third."""
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
    from hg_dagger.store import EpisodeStore

    obs = {"state": ((STATE_DIM,), "float32")}
    if cameras:
        obs |= {"front": ((CAM, CAM, 3), "uint8"), "wrist": ((CAM, CAM, 3), "uint8")}
    f = step_fields(obs=obs, action_dim=ACTION_DIM)
    rng = np.random.default_rng(0)
    period = int(1e9 / HZ)
    a, b = ep_len // 3, 2 * ep_len // 3
    yy, xx = np.mgrid[0:CAM, 0:CAM]
    store = EpisodeStore.create(path)
    t0 = time.perf_counter()
    with store.recorder(on_full="block") as rec:
        for i in range(n_eps):
            eid = rec.begin_episode(EpisodeStart(task=TaskInfo(task_id="bench_reach"), mode=CollectionMode.HUMAN_GATED,
                                                 control_hz=HZ, operator="op"), f)
            windowed = i % 2 == 0
            for t in range(ep_len):
                human = windowed and a <= t < b
                s = {"t_obs": (t + 1) * period, "t_policy": (t + 1) * period + 1000,
                     "t_action_apply": (t + 1) * period + 2000,
                     "policy_action": rng.uniform(-1, 1, ACTION_DIM).astype(np.float32),
                     "applied_action": rng.uniform(-1, 1, ACTION_DIM).astype(np.float32),
                     "action_source": np.uint8(ActionSource.HUMAN.code if human else ActionSource.POLICY.code),
                     "obs/state": rng.standard_normal(STATE_DIM).astype(np.float32)}
                if human:
                    s["human_command"] = rng.uniform(-1, 1, 7).astype(np.float32)
                if cameras:
                    for k, cam in enumerate(("front", "wrist")):
                        base = (xx + 2 * yy + 3 * t + 17 * i + 50 * k) % 256
                        s[f"obs/{cam}"] = np.stack([base, (base + 85) % 256, (255 - base)], -1).astype(np.uint8)
                rec.put(eid, s)
            windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=a - 1, handover_start=a, handover_end=b,
                                        source=ActionSource.HUMAN)] if windowed else []
            rec.end_episode(eid, EpisodeEnd(end_reason=EndReason.SUCCESS, task_success=True, num_steps=ep_len),
                            windows=windows)
    assert rec.stats.dropped_steps == 0
    record_s = time.perf_counter() - t0
    _review(path)
    return {"record_s": record_s, **_disk(path)}


def _review(path: str) -> None:
    """A reviewer (not the operator) approves and authorizes every window and QC passes it, as `hg-dagger review
    approve` and `hg-dagger qc` leave a store: the labels every export offers as training data."""
    from hg_dagger.contract import QCResult, ReviewDecision, ReviewStatus
    from hg_dagger.store import EpisodeStore

    store = EpisodeStore.open(path, mode="a")
    for info in store.episodes():
        layer = store.labels(info.episode_id)
        if not layer.windows:
            continue
        reviews = [ReviewDecision(window_id=w.window_id, reviewer="reviewer", status=ReviewStatus.APPROVED,
                                  replay_training_authorized=True) for w in layer.windows]
        qc = [QCResult(episode_id=info.episode_id, passed=True)] + [
            QCResult(episode_id=info.episode_id, window_id=w.window_id, passed=True) for w in layer.windows]
        store.write_labels(info.episode_id, author="reviewer", reviews=reviews, qc=qc)


def _disk(path: str) -> dict:
    files = [os.path.join(d, x) for d, _, fs in os.walk(path) for x in fs]
    return {"files": len(files), "mb": sum(os.path.getsize(p) for p in files) / 1e6}


# ---------------------------------------------------------------------- measurements (one per process)


def run_baseline(store: str, out: str) -> dict:
    """Read every array the export reads, committed rows only, with zarr alone."""
    import zarr

    root = zarr.open_group(store, mode="r")
    rows = 0
    for sid in root["segments"].group_keys():
        seg = root[f"segments/{sid}"]
        n = seg.attrs["hg_dagger_segment"]["committed_rows"]
        names = [f"data/obs/{k}" for k in seg["data/obs"].array_keys()] + [f"data/{k}" for k in READ_FIELDS]
        for name in names + ["rows/episode", "rows/step"]:
            arr = seg[name]
            for lo in range(0, n, BLOCK_ROWS):  # in blocks, as the export reads: memory stays bounded
                arr[lo:min(n, lo + BLOCK_ROWS)]
        rows += n
    return {"rows": rows}


def run_lerobot(store: str, out: str) -> dict:
    from hg_dagger.datasets import export_lerobot, select
    from hg_dagger.store import EpisodeStore

    s = export_lerobot(select(EpisodeStore.open(store)), out)
    return {"rows": s.frames, "episodes": s.episodes, "files": s.files, "mb": s.bytes / 1e6}


def run_ods(store: str, out: str) -> dict:
    from hg_dagger.datasets import export_ods, select
    from hg_dagger.store import EpisodeStore

    s = export_ods(select(EpisodeStore.open(store)), out)
    return {"rows": s.frames, "episodes": s.episodes, "files": s.files, "mb": s.bytes / 1e6}


def run_rlinf(store: str, out: str) -> dict:
    from hg_dagger.datasets import export_rlinf, select
    from hg_dagger.store import EpisodeStore

    s = export_rlinf(select(EpisodeStore.open(store)), out)
    return {"rows": s.frames, "episodes": s.episodes, "files": s.files, "mb": s.bytes / 1e6}


KINDS = {"baseline": run_baseline, "lerobot": run_lerobot, "ods": run_ods, "rlinf": run_rlinf}


def child(kind: str, store: str, out: str) -> None:
    t0 = time.perf_counter()
    r = KINDS[kind](store, out)
    r["seconds"] = time.perf_counter() - t0
    r["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(r))


def measure(kind: str, store: str, out: str) -> dict:
    """Run one measurement in a fresh interpreter; wall time includes its imports (what a CLI call pays)."""
    if os.path.exists(out):
        shutil.rmtree(out)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, __file__, "--child", kind, store, out], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if p.returncode:
        raise SystemExit(f"{kind} failed:\n{p.stderr}")
    r = json.loads(p.stdout.strip().splitlines()[-1])
    r["wall_s"] = wall
    return r


def report(title: str, steps: int, frames_per_step: int, res: dict) -> None:
    base = res["baseline"]["wall_s"]
    print(f"\n{title}")
    print(f"{'measurement':12} {'wall s':>8} {'in-proc s':>10} {'x base':>7} {'steps/s':>10} {'frames/s':>10} "
          f"{'peak RSS MB':>12} {'output MB':>10} {'files':>6}")
    for kind, r in res.items():
        fps = f"{steps * frames_per_step / r['wall_s']:10,.0f}" if frames_per_step else f"{'':>10}"
        print(f"{kind:12} {r['wall_s']:8.1f} {r['seconds']:10.1f} {r['wall_s'] / base:7.2f} "
              f"{steps / r['wall_s']:10,.0f} {fps} {r['peak_rss_mb']:12.0f} {r.get('mb', 0):10.1f} "
              f"{r.get('files', ''):>6}")
    from figures import record

    for kind, r in res.items():
        if kind == "baseline":
            continue
        record(f"export {kind}, {title.split(':')[0]}: {'frames' if frames_per_step else 'steps'}/s",
               steps * max(frames_per_step, 1) / r["wall_s"], unit="/s",
               baseline=steps * max(frames_per_step, 1) / base, baseline_name="zarr read alone")
        if not frames_per_step:
            record(f"export {kind}, {title.split(':')[0]}: peak RSS", r["peak_rss_mb"], unit="MB",
                   target="<= 2048 MB", met=r["peak_rss_mb"] <= 2048, higher_is_better=False)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=10_000, help="state-only episodes (default 10000)")
    ap.add_argument("--episode-steps", type=int, default=100, help="steps per state-only episode (default 100)")
    ap.add_argument("--cam-episodes", type=int, default=1000, help="episodes with two cameras (default 1000)")
    ap.add_argument("--cam-steps", type=int, default=50, help="steps per camera episode (default 50)")
    ap.add_argument("--only", choices=("state", "camera"), help="run one of the two stores")
    ap.add_argument("--formats", default="lerobot,ods",
                    help="formats to export, of lerobot, ods, rlinf (default lerobot,ods)")
    ap.add_argument("--dir", help="where to build the stores (default: a temporary directory, removed afterwards)")
    ap.add_argument("--json", help="also write the figures to this file")
    args = ap.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    tmp = args.dir or tempfile.mkdtemp(prefix="bench_export_")
    out: dict = {"cpu_count": os.cpu_count(), "load_start": os.getloadavg()[0]}
    print(f"cpu cores {os.cpu_count()}, load average {out['load_start']:.1f}")
    try:
        plans = []
        if args.only in (None, "state"):
            plans.append(("state", args.episodes, args.episode_steps, False))
        if args.only in (None, "camera"):
            plans.append(("camera", args.cam_episodes, args.cam_steps, True))
        for name, n, length, cams in plans:
            path = os.path.join(tmp, f"{name}.zarr")
            if os.path.exists(path):
                shutil.rmtree(path)
            b = build(path, n, length, cams)
            print(f"{name}: {n} episodes x {length} steps recorded in {b['record_s']:.1f} s, {b['files']} files, "
                  f"{b['mb']:.1f} MB", flush=True)
            res = {}
            for kind in ["baseline", *formats]:
                res[kind] = measure(kind, path, os.path.join(tmp, f"{name}-{kind}"))
                assert kind in ("baseline", "rlinf") or res[kind]["rows"] == n * length, res[kind]
                print(f"  {kind}: {res[kind]['wall_s']:.1f} s, peak RSS {res[kind]['peak_rss_mb']:.0f} MB", flush=True)
                if kind != "baseline":
                    shutil.rmtree(os.path.join(tmp, f"{name}-{kind}"), ignore_errors=True)
            out[name] = {"episodes": n, "steps": length, "build": b, "results": res}
            report(f"{name}: {n:,} episodes x {length} steps ({n * length:,} steps)", n * length, 2 if cams else 0, res)
        out["load_end"] = os.getloadavg()[0]
        print(f"\nload average at the start {out['load_start']:.1f}, at the end {out['load_end']:.1f}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=2)
            print(f"figures written to {args.json}")
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
