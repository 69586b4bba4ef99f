"""Run with the project's environment (.venv): record a small store, export it with `hg-dagger export`, and save
what the store holds (read with the store API, not the exporter) for the LeRobot-side comparison.

    python tests/interop/make_export.py WORKDIR      -> WORKDIR/store, WORKDIR/lerobot, WORKDIR/expected.npz

For `lerobot-train` (test_lerobot_train.py) it also writes WORKDIR/lerobot_state, the full export of a toy_reach
store recorded by `hg-dagger run` (state, goal as environment state), and WORKDIR/lerobot_camera, a
`--labels trainable` export of the camera store (its windows certified, as an automatic planner's are, so their
labels may train: every export holds the training boundary), WORKDIR/lerobot_video, the same with the camera as
H.264 video (`--video h264`), with WORKDIR/train.json listing what the store says each holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import support.store as h  # noqa: E402

from hg_dagger.contract.labels import planner_certifications  # noqa: E402
from hg_dagger.store import EpisodeStore  # noqa: E402
from hg_dagger.store.trainable import selection  # noqa: E402

# (seed, steps, human window): episodes of different lengths, with and without a correction window
EPISODES = [(0, 30, (5, 12)), (1, 17, None), (2, 41, (20, 33))]


def main(work: Path) -> None:
    store = EpisodeStore.create(work / "store")
    with store.recorder(on_full="block") as rec:
        eids = [h.record(rec, seed, n, image=True, window=w) for seed, n, w in EPISODES]
    store = EpisodeStore.open(work / "store", mode="a")
    for eid in eids:  # certified, as an automatic planner's windows are: their labels may train
        store.write_labels(eid, author="interop", certifications=planner_certifications(
            eid, store.labels(eid).windows, "interop"))
    out = work / "lerobot"
    subprocess.run([sys.executable, "-m", "hg_dagger", "export", str(work / "store"), "--format", "lerobot",
                    "--out", str(out), "--quiet"], check=True)
    store = EpisodeStore.open(work / "store")
    expected: dict[str, list] = {}
    for eid in eids:
        a = store.read_steps(eid, ["obs/state", "obs/rgb", "applied_action", "action_source"])
        allowed = selection(store, store.info(eid)).allowed  # the training boundary, the export's `trainable`
        for k, v in {"state": a["obs/state"], "rgb": a["obs/rgb"], "action": a["applied_action"],
                     "action_source": a["action_source"].astype(np.int64),
                     "trainable": allowed,
                     "frame_index": np.arange(len(allowed))}.items():
            expected.setdefault(k, []).append(v)
    np.savez(work / "expected.npz", **{k: np.concatenate(v) for k, v in expected.items()})
    (work / "expected.json").write_text(json.dumps({
        "episode_ids": eids, "lengths": [n for _, n, _ in EPISODES], "fps": 50,
        "task": store.info(eids[0]).start.task.task_id}))
    _train_exports(work, eids)


def _export(*args) -> None:
    subprocess.run([sys.executable, "-m", "hg_dagger", "export", *map(str, args), "--quiet"], check=True)


def _train_exports(work: Path, camera_eids: list[str]) -> None:
    """The exports lerobot-train runs on: a toy_reach store as recorded (every step), and the camera store's
    training-allowed labels only (its human windows certified in main())."""
    subprocess.run([sys.executable, "-m", "hg_dagger", "run", "--task", "toy_reach", "--operator", "expert",
                    "--episodes", "3", "--max-episode-steps", "60", "--seed", "0", "--store", str(work / "toy_store"),
                    "--quiet"], check=True)
    _export(work / "toy_store", "--format", "lerobot", "--out", work / "lerobot_state")
    store = EpisodeStore.open(work / "store")  # its windows certified in main()
    allowed = {eid: [int(x) for x in np.flatnonzero(selection(store, store.info(eid)).allowed)] for eid in camera_eids}
    _export(work / "store", "--format", "lerobot", "--labels", "trainable", "--out", work / "lerobot_camera")
    _export(work / "store", "--format", "lerobot", "--labels", "trainable", "--video", "h264",
            "--out", work / "lerobot_video")
    _export(work / "store", "--format", "rlinf", "--out", work / "rlinf" / "rank_0" / "id_0")
    toy = EpisodeStore.open(work / "toy_store")
    (work / "train.json").write_text(json.dumps({
        "state_frames": sum(i.num_steps for i in toy.episodes(complete=True)),
        "camera_allowed": allowed}))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
