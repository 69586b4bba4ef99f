"""What trainers without a label mask need from `hg-dagger export --format lerobot`, read back with pyarrow and
PyAV (LeRobot's own `lerobot-train` runs on the same exports in tests/interop): observation.state and
observation.environment_state named by the task mapping, `--labels trainable` (only training-allowed labels,
one episode per run, cut at window boundaries, action = the label target), video that decodes to the store's
frames within a stated PSNR, and bad input that fails with one line and writes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.store import end, human_window, step

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    EpisodeStart,
    LabelTarget,
    TaskInfo,
    step_fields,
)
from hg_dagger.contract.labels import planner_certifications
from hg_dagger.datasets import export_lerobot, select
from hg_dagger.envs.mapping import load_mapping
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import selection

pytestmark = [pytest.mark.subprocess]

FPS = 25.0
H, W = 48, 64
VIDEO_PSNR_DB = 32.0  # every decoded frame at least this close to the store's (H.264 crf 18 / AV1 crf 30, yuv420p)
FAKE_AV = Path(__file__).parents[1] / "fakes" / "av_without_encoders"


def _frame(t: int) -> np.ndarray:
    """A smooth camera-like frame: gradients and a soft blob that moves with t."""
    y, x = np.mgrid[0:H, 0:W].astype(np.float64)
    blob = np.exp(-((x - 10 - t) ** 2 + (y - 20 - 8 * np.sin(t / 5)) ** 2) / 40.0)
    rgb = np.stack([60 + 120 * x / W + 70 * blob, 80 + 100 * y / H + 0 * x, 150 - 60 * blob], -1)
    return np.clip(rgb, 0, 255).astype(np.uint8)


def _toy_step(t: int, source=ActionSource.POLICY, *, image=False, expert=False) -> dict:
    s = {k: v for k, v in step(0, t, source=source).items() if not k.startswith("obs/") and k != "applied_action"}
    s["applied_action"] = np.array([t / 100, -t / 100], np.float32)
    s |= {"obs/qpos": np.array([t, t + 0.5], np.float32), "obs/ee_pos": np.array([-t, 1.0], np.float32),
          "obs/target": np.array([0.25, t / 10], np.float32)}
    s.pop("policy_action")
    if source == ActionSource.HUMAN:
        s["human_command"] = np.zeros(7, np.float32)
    if expert:
        s |= {"expert_action": np.array([100 + t, 200 + t], np.float32), "expert_valid": True}
    if image:
        s["obs/rgb"] = _frame(t)
    return s


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """toy_reach episodes recorded under the shipped mapping: A has two adjacent human windows [5, 10) and
    [10, 15) and an expert window [20, 26) (the policy acts, the expert labels), all certified; B has a human window
    nobody reviewed or certified (labels, but not allowed); C has none."""
    mapping = load_mapping("toy_reach")
    obs = mapping.obs_spec() | {"rgb": ((H, W, 3), "uint8")}
    fields = step_fields(obs=obs, action_dim=2)

    path = tmp_path_factory.mktemp("labels") / "store"
    s = EpisodeStore.create(path)
    ids = []
    with s.recorder(on_full="block") as rec:
        for name, n in (("A", 30), ("B", 20), ("C", 12)):
            eid = rec.begin_episode(EpisodeStart(
                task=TaskInfo(task_id="toy_reach"), mode=CollectionMode.HUMAN_GATED, control_hz=FPS,
                mapping=mapping.as_metadata(), mapping_hash=mapping.hash, policy_version=f"pv-{name}",
                iteration=ord(name) - 65, beta=0.5 if name == "A" else None), fields)
            windows = []
            for t in range(n):
                human = (name == "A" and 5 <= t < 15) or (name == "B" and 3 <= t < 9)
                rec.put(eid, _toy_step(t, ActionSource.HUMAN if human else ActionSource.POLICY, image=True,
                                       expert=name == "A" and 20 <= t < 26))
            if name == "A":
                windows = [human_window(eid, 5, 10), human_window(eid, 10, 15),
                           CorrectionWindow(parent_episode_id=eid, parent_step_id=19, handover_start=20,
                                            handover_end=26, source=ActionSource.EXPERT)]
            elif name == "B":
                windows = [human_window(eid, 3, 9)]
            rec.end_episode(eid, end(n), windows=windows)
            ids.append(eid)
    s = EpisodeStore.open(path, mode="a")
    s.write_labels(ids[0], author="test", certifications=planner_certifications(ids[0], s.labels(ids[0]).windows, "ik"))
    return EpisodeStore.open(path), ids


def _table(out) -> dict:
    files = sorted((out / "data").glob("chunk-*/file-*.parquet"))
    import pyarrow as pa

    t = pa.concat_tables([pq.read_table(f) for f in files])
    return {c: t[c].to_pylist() for c in t.column_names}


def test_state_and_goal_are_named_by_the_task_mapping(store, tmp_path):
    s, ids = store
    export_lerobot(select(s), tmp_path / "all")
    info = json.loads((tmp_path / "all" / "meta" / "info.json").read_text())
    f = info["features"]
    assert f["observation.state"] == {"dtype": "float32", "shape": [6],
                                      "names": ["shoulder", "elbow", "ee_x", "ee_y", "target_x", "target_y"]}
    assert f["observation.environment_state"]["names"] == ["target_x", "target_y"]
    assert f["observation.images.rgb"]["dtype"] == "image" and f["action"]["names"] == ["shoulder_vel", "elbow_vel"]
    assert {"observation.qpos", "observation.ee_pos", "observation.target"} <= set(f)  # the per-key columns stay
    d = _table(tmp_path / "all")
    a = s.read_steps(ids[0], ["obs/qpos", "obs/ee_pos", "obs/target"])
    np.testing.assert_array_equal(np.array(d["observation.state"][:30], np.float32),
                                  np.concatenate([a["obs/qpos"], a["obs/ee_pos"], a["obs/target"]], 1))
    np.testing.assert_array_equal(np.array(d["observation.environment_state"][:30], np.float32), a["obs/target"])
    assert len(d["index"]) == 62 and info["hg_dagger"]["labels"] == "all"  # the default: the full record
    # continuity: one stretch per episode, counting up across the export
    assert d["continuity_id"] == [0] * 30 + [1] * 20 + [2] * 12


def test_labels_trainable_writes_only_allowed_runs_with_the_label_target(store, tmp_path):
    s, ids = store
    allowed = {eid: selection(s, s.info(eid)).allowed for eid in ids}
    assert allowed[ids[0]].sum() == 16 and not allowed[ids[1]].any()  # B's window: labels, never reviewed
    summary = export_lerobot(select(s), tmp_path / "tr", labels="trainable")
    eps = pq.read_table(tmp_path / "tr" / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    # adjacent windows stay two episodes; the expert window is a third; B and C give none
    spans = list(zip(eps["hg_dagger/episode_id"], eps["hg_dagger/first_step"], eps["hg_dagger/end_step"], strict=True))
    assert spans == [(ids[0], 5, 10), (ids[0], 10, 15), (ids[0], 20, 26)]
    assert eps["length"] == [5, 5, 6] and eps["dataset_from_index"] == [0, 5, 10]
    assert summary.episodes == 3 and summary.frames == 16 == summary.trainable_frames
    d = _table(tmp_path / "tr")
    assert d["episode_index"] == [0] * 5 + [1] * 5 + [2] * 6
    assert d["frame_index"] == list(range(5)) * 2 + list(range(6)) and d["index"] == list(range(16))
    assert all(d["trainable"]) and all(d["segment_accepted"])
    steps = list(range(5, 15)) + list(range(20, 26))
    a = s.read_steps(ids[0], ["applied_action", "expert_action", "obs/rgb"])
    want = np.concatenate([a["applied_action"][5:15], a["expert_action"][20:26]])  # the label target
    np.testing.assert_array_equal(np.array(d["action"], np.float32), want)
    assert d["label_target"][10:] == [LabelTarget.EXPERT_ACTION.code] * 6
    np.testing.assert_array_equal(np.array(d["expert_action"][10:], np.float32), a["expert_action"][20:26])
    import io

    from PIL import Image

    for row, t in enumerate(steps):
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(d["observation.images.rgb"][row]["bytes"]))),
                                      a["obs/rgb"][t])
    info = json.loads((tmp_path / "tr" / "meta" / "info.json").read_text())
    assert info["hg_dagger"]["labels"] == "trainable" and info["total_frames"] == 16
    stats = json.loads((tmp_path / "tr" / "meta" / "stats.json").read_text())
    np.testing.assert_allclose(stats["action"]["q50"], np.quantile(want, 0.5, axis=0), rtol=1e-6)
    assert stats["action"]["count"] == [16]


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "hg_dagger", "export", *map(str, args), "--quiet"],
                          capture_output=True, text=True, timeout=300, env=env)


def test_no_allowed_label_a_folder_holding_an_export_and_a_missing_codec_are_one_line(store, tmp_path):
    s, ids = store
    r = _cli(s.url, "--format", "lerobot", "--labels", "trainable", "--episodes", ids[1], ids[2], "--out",
             tmp_path / "x" / "y")
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "none of the 2 episode(s) has a label training may use" in r.stderr
    assert list(tmp_path.iterdir()) == []  # neither the export, its temporary sibling nor the parents made for it
    assert _cli(s.url, "--format", "lerobot", "--out", tmp_path / "done").returncode == 0
    for fmt in ("lerobot", "ods"):
        r = _cli(s.url, "--format", fmt, "--out", tmp_path / "done")
        assert r.returncode == 2 and r.stderr.count("\n") == 1
        assert f"{tmp_path / 'done'}: holds a LeRobot export already" in r.stderr, r.stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(FAKE_AV), os.environ.get("PYTHONPATH", "")]))
    for codec, encoder in (("h264", "libx264"), ("av1", "libsvtav1")):
        r = _cli(s.url, "--format", "lerobot", "--video", codec, "--out", tmp_path / "v", env=env)
        assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
        assert f"--video {codec}: this machine's PyAV" in r.stderr and f"no {encoder} encoder" in r.stderr
    r = _cli(s.url, "--format", "ods", "--video", "h264", "--out", tmp_path / "v")
    assert r.returncode == 2 and "--video is for --format lerobot" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["done"]


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_video_decodes_to_the_store_frames_within_the_stated_psnr(store, tmp_path, codec):
    av = pytest.importorskip("av")
    s, ids = store
    export_lerobot(select(s), tmp_path / "v", video=codec)
    info = json.loads((tmp_path / "v" / "meta" / "info.json").read_text())
    feat = info["features"]["observation.images.rgb"]
    assert feat["dtype"] == "video" and feat["info"]["video.codec"] == codec and info["video_path"]
    assert "observation.images.rgb" not in _table(tmp_path / "v")  # frames live in the mp4 files
    eps = pq.read_table(tmp_path / "v" / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    worst = np.inf
    for e, eid in enumerate(ids):
        path = tmp_path / "v" / info["video_path"].format(video_key="observation.images.rgb",
                                                          chunk_index=eps["videos/observation.images.rgb/chunk_index"][e],
                                                          file_index=eps["videos/observation.images.rgb/file_index"][e])
        want = s.read_steps(eid, ["obs/rgb"])["obs/rgb"]
        with av.open(str(path)) as c:
            if codec == "h264":
                assert c.streams.video[0].codec_context.name in ("h264", "libx264")
            frames = [(f.to_ndarray(format="rgb24"), float(f.pts * f.time_base)) for f in c.decode(video=0)]
        assert len(frames) == len(want) == eps["length"][e]  # every frame
        for t, (got, ts) in enumerate(frames):
            assert abs(ts - t / FPS) < 1e-4  # frame times equal the rows' timestamps
            mse = np.mean((got.astype(np.float64) - want[t]) ** 2)
            worst = min(worst, 10 * np.log10(255.0 ** 2 / max(mse, 1e-12)))
        assert eps["videos/observation.images.rgb/to_timestamp"][e] == pytest.approx(len(want) / FPS)
    assert worst >= VIDEO_PSNR_DB, f"{codec}: worst frame {worst:.1f} dB"


def test_export_naming_is_checked_and_stays_out_of_the_mapping_hash(tmp_path):
    import yaml

    from hg_dagger.envs.mapping import TASKS_DIR
    from hg_dagger.errors import ConfigError

    data = yaml.safe_load((TASKS_DIR / "toy_reach.yaml").read_text())
    shipped = load_mapping("toy_reach")
    plain = tmp_path / "plain.yaml"
    plain.write_text(yaml.safe_dump({k: v for k, v in data.items() if k != "export"}))
    assert load_mapping(plain).hash == shipped.hash  # naming changes no recorded value
    assert load_mapping(plain).dim_names("qpos") == ["qpos_0", "qpos_1"]
    for export, message in [
        ({"names": {"qpos": ["a"]}}, "export.names.qpos has 1 names; the key has 2 values"),
        ({"names": {"nope": ["a"]}}, "export.names names 'nope', not an observation key"),
        ({"environment_state": ["goal"]}, "export.environment_state names 'goal', not a flattened observation key"),
        ({"names": {"qpos": ["x", "y"], "ee_pos": ["x", "z"]}}, "'x' names two dimensions of the state"),
    ]:
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump(data | {"export": export}))
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_mapping(bad)
