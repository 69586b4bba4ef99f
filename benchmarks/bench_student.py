"""Student.act() latency per head, against the MSE student measured in the same run and the 25 Hz tick.

Every kind acts on the same observations (FetchPickAndPlace's state; fetch_pick_place_rgb's 128 px camera
for the CNN kinds) as in a rollout over that many rows (a chunk head ensembles its chunks), one torch
thread, K = 5 members (3 for the CNN kinds, as bench_learning), 256x256. The kinds are measured
interleaved, call by call, so load on a shared machine falls on all of them alike.

    python benchmarks/bench_student.py [--calls 300] [--envs 1,8,64]
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hg_dagger.envs import load_mapping  # noqa: E402
from hg_dagger.policy import Student  # noqa: E402

TICK_MS = 40.0  # 25 Hz
PAIRS = {"fetch_pick_place": (("mlp", "mlp_gmm", "mlp_chunk"), 5),
         "fetch_pick_place_rgb": (("cnn", "cnn_gmm", "cnn_chunk"), 3)}


def observations(mapping, n: int, rng) -> dict[str, np.ndarray]:
    out = {}
    for k, (shape, dtype) in mapping.obs_spec().items():
        if np.dtype(dtype) == np.uint8:
            out[k] = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        else:
            out[k] = rng.normal(0, 0.1, (n, *shape)).astype(dtype)
    return out


def measure(task: str, envs: list[int], calls: int) -> list[dict]:
    mapping = load_mapping(task)
    kinds, k = PAIRS[task]
    students = {kind: Student.create(mapping, kind=kind, ensemble=k, seed=0) for kind in kinds}
    rng = np.random.default_rng(0)
    rows = []
    for n in envs:
        obs = observations(mapping, n, rng)
        for s in students.values():
            s.reset_rows(range(n), n)  # a rollout over n rows: a chunk head ensembles its chunks, as in a session
        times = {kind: [] for kind in kinds}
        for _ in range(5):  # warm-up
            for s in students.values():
                s.act(obs)
        for _ in range(calls):
            for kind, s in students.items():
                times[kind].append(s.act(obs).inference_ns / 1e6)
        base = float(np.median(times[kinds[0]]))
        for kind in kinds:
            t = np.asarray(times[kind])
            rows.append({"task": task, "kind": kind, "envs": n, "p50_ms": float(np.median(t)),
                         "p99_ms": float(np.percentile(t, 99)), "ratio_to_mse": float(np.median(t)) / base,
                         "share_of_tick_p99": float(np.percentile(t, 99)) / TICK_MS})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--envs", default="1,8,64")
    p.add_argument("--tasks", default=",".join(PAIRS))
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    envs = [int(x) for x in args.envs.split(",") if x]
    rows = [r for task in args.tasks.split(",") if task for r in measure(task, envs, args.calls)]
    print(f"{'task':>22} {'kind':>8} {'envs':>5} {'p50 ms':>8} {'p99 ms':>8} {'x MSE':>6} {'p99 / 40 ms tick':>17}")
    for r in rows:
        print(f"{r['task']:>22} {r['kind']:>8} {r['envs']:5d} {r['p50_ms']:8.2f} {r['p99_ms']:8.2f} "
              f"{r['ratio_to_mse']:6.2f} {r['share_of_tick_p99']:17.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
