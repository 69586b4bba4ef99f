"""Run with the project's environment (.venv): record a small store, export it with `hg-dagger export`, and save
what the store holds (read with the store API, not the exporter) for the LeRobot-side comparison.

    python tests/interop/make_export.py WORKDIR      -> WORKDIR/store, WORKDIR/lerobot, WORKDIR/expected.npz
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import store_helpers as h  # noqa: E402

from hg_dagger.contract import LabelMask  # noqa: E402
from hg_dagger.store import EpisodeStore  # noqa: E402

# (seed, steps, human window): episodes of different lengths, with and without a correction window
EPISODES = [(0, 30, (5, 12)), (1, 17, None), (2, 41, (20, 33))]


def main(work: Path) -> None:
    store = EpisodeStore.create(work / "store")
    with store.recorder(on_full="block") as rec:
        eids = [h.record(rec, seed, n, image=True, window=w) for seed, n, w in EPISODES]
    out = work / "lerobot"
    subprocess.run([sys.executable, "-m", "hg_dagger", "export", str(work / "store"), "--format", "lerobot",
                    "--out", str(out), "--quiet"], check=True)
    store = EpisodeStore.open(work / "store")
    expected: dict[str, list] = {}
    for eid in eids:
        a = store.read_steps(eid, ["obs/state", "obs/rgb", "applied_action", "action_source"])
        mask = store.labels(eid).mask
        for k, v in {"state": a["obs/state"], "rgb": a["obs/rgb"], "action": a["applied_action"],
                     "action_source": a["action_source"].astype(np.int64),
                     "trainable": mask == LabelMask.TRAINABLE.code,
                     "frame_index": np.arange(len(mask))}.items():
            expected.setdefault(k, []).append(v)
    np.savez(work / "expected.npz", **{k: np.concatenate(v) for k, v in expected.items()})
    (work / "expected.json").write_text(json.dumps({
        "episode_ids": eids, "lengths": [n for _, n, _ in EPISODES], "fps": 50,
        "task": store.info(eids[0]).start.task.task_id}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
