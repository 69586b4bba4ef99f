"""LeRobot's own recorder on the workload of bench_recorder.py, run by it in the LeRobot environment (.venv-interop).

    .venv-interop/bin/python benchmarks/lerobot_record.py FRAMES.npy STEPS EPISODE OUT.json

Records STEPS steps (31-d state, 4-d action, two 128x128 cameras taken round-robin from FRAMES.npy, as the
recorder benchmark does) with LeRobotDataset.create / add_frame / save_episode / finalize, LeRobot's defaults
(AV1 video via libsvtav1), and writes steps/s (first add_frame to finalize returning), CPU ms per step and the video
bytes per frame.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _cpu_s() -> float:
    """CPU seconds of this process (all threads, the video encoder's included) and of finished child processes."""
    r, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime


def main() -> None:
    frames_path, steps, episode, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="bench-lerobot-hf-"))
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    frames = np.load(frames_path)
    rng = np.random.default_rng(1)
    cam = {"dtype": "video", "shape": frames.shape[1:], "names": ["height", "width", "channels"]}
    features = {
        "observation.state": {"dtype": "float32", "shape": (31,), "names": None},
        "action": {"dtype": "float32", "shape": (4,), "names": None},
        "observation.images.cam_left": cam,
        "observation.images.cam_right": cam,
    }
    pool = [{"observation.state": rng.standard_normal(31).astype(np.float32),
             "action": rng.standard_normal(4).astype(np.float32)} for _ in range(256)]
    with tempfile.TemporaryDirectory(prefix="bench-lerobot-") as tmp:
        root = Path(tmp) / "ds"
        ds = LeRobotDataset.create("bench/recorder", fps=50, features=features, root=root)
        t0, c0 = time.perf_counter(), _cpu_s()
        for i in range(steps):
            s = pool[i % len(pool)]
            ds.add_frame({**s, "observation.images.cam_left": frames[i % len(frames)],
                          "observation.images.cam_right": frames[(i + len(frames) // 2) % len(frames)],
                          "task": "bench"})
            if (i + 1) % episode == 0 or i + 1 == steps:
                ds.save_episode()
        ds.finalize()
        elapsed, cpu = time.perf_counter() - t0, _cpu_s() - c0
        video = sum(p.stat().st_size for p in root.rglob("*.mp4"))
    Path(out).write_text(json.dumps({"steps": steps, "seconds": elapsed, "steps_per_s": steps / elapsed,
                                     "cpu_ms_per_step": cpu / steps * 1e3,
                                     "video_bytes_per_frame": video / (2 * steps)}))


if __name__ == "__main__":
    main()
