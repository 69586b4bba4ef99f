"""A full disk (a real 2 MiB tmpfs) while recording, while creating a store or a segment, and under `train --out` /
`eval --out`: one clear error naming the path, nothing committed lost, and the store opens, validates and takes
new episodes once space is freed."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from support.store import check_steps, end, record, start, step

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    EndReason,
    EpisodeEnd,
    EpisodeStart,
    ExpertCertification,
    TaskInfo,
    step_fields,
)
from hg_dagger.errors import StoreError
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

BIG_STATE = 2048  # 8 KiB of incompressible floats per step: a few episodes fill the disk


class SmallDisk:
    """A mounted tmpfs of 2 MiB and a filler file that takes its free space (and gives it back)."""

    def __init__(self, path):
        self.path = path
        self.filler = path / "filler"

    def fill(self, leave: int = 0) -> None:
        """Take all free space but `leave` bytes (about: tmpfs counts whole pages)."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while True:
                os.write(fd, b"\xa5" * 65536)
        except OSError as exc:
            assert exc.errno == 28, exc
        try:
            while True:
                os.write(fd, b"\xa5" * 4096)
        except OSError:
            pass
        os.close(fd)
        if leave:
            os.truncate(self.filler, max(0, self.filler.stat().st_size - leave))

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)


@pytest.fixture
def small_disk(tmp_path, request):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    try:
        proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"cannot mount a small tmpfs to fill ({exc})")
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {proc.stderr.strip() or proc.returncode}")
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60))
    return SmallDisk(mnt)


def _big_fields():
    return step_fields(obs={"state": ((BIG_STATE,), "float32")}, action_dim=4)


def _big_step(rng, t: int) -> dict:
    s = step(0, t)
    s["obs/state"] = rng.standard_normal(BIG_STATE).astype(np.float32)
    return s


def test_disk_full_while_recording_loses_nothing_committed_and_the_store_reopens(small_disk):
    path = small_disk.path / "store"
    store = EpisodeStore.create(path)
    with store.recorder(flush_interval_s=0.01) as rec:
        committed = {record(rec, seed, 20): seed for seed in range(3)}
    small_disk.fill(leave=400_000)
    rng = np.random.default_rng(0)
    states: dict[str, np.ndarray] = {}
    with pytest.raises(StoreError) as err:
        with EpisodeStore.open(path, mode="a").recorder(flush_interval_s=0.01, on_full="block") as rec:
            for _ in range(1000):  # far more than fits: the disk fills within a few episodes
                eid = rec.begin_episode(start(), _big_fields())
                steps = [_big_step(rng, t) for t in range(20)]
                states[eid] = np.stack([s["obs/state"] for s in steps])
                for s in steps:
                    rec.put(eid, s)
                rec.end_episode(eid, end(20))
    message = str(err.value)
    assert f"{path}: recording failed (No space left on device" in message and "\n" not in message

    again = EpisodeStore.open(path)  # opens on the still full disk
    for eid, seed in committed.items():
        assert again.info(eid).complete
        check_steps(again.read_steps(eid), seed, 20)
    for info in again.episodes(complete=True):  # episodes of the failed session that made it hold what was put
        if info.episode_id in states:
            np.testing.assert_array_equal(again.read_steps(info.episode_id, ["obs/state"])["obs/state"],
                                          states[info.episode_id])
    assert validate_store(again, images=False) == [] and again.damaged == []

    small_disk.free()
    with EpisodeStore.open(path, mode="a").recorder() as rec:
        new = record(rec, 7, 20)
    final = EpisodeStore.open(path)
    assert final.info(new).complete and set(committed) <= {i.episode_id for i in final.episodes(complete=True)}
    assert validate_store(final) == [] and final.damaged == []


def test_disk_full_while_a_segment_is_created_leaves_no_trace_that_breaks_the_store(small_disk):
    path = small_disk.path / "store"
    store = EpisodeStore.create(path)
    with store.recorder() as rec:
        first = record(rec, 0, 10)
    segments_before = sorted(p.name for p in (path / "segments").iterdir())
    small_disk.fill()
    with pytest.raises(StoreError, match=f"{path}: recording failed \\(No space left on device"):
        with EpisodeStore.open(path, mode="a").recorder() as rec:
            record(rec, 1, 10)
    assert sorted(p.name for p in (path / "segments").iterdir()) == segments_before  # the cut-off one was removed
    small_disk.free()
    reopened = EpisodeStore.open(path, mode="a")
    assert reopened.warnings == [] and validate_store(reopened) == []
    with reopened.recorder() as rec:
        second = record(rec, 1, 10)
    final = EpisodeStore.open(path)
    assert [i.episode_id for i in final.episodes(complete=True)] in ([first, second], [second, first])
    assert validate_store(final) == []


def _cli(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hg_dagger", *args], capture_output=True, text=True,
                          timeout=timeout)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    return errors[0]


def _trainable_store(path) -> None:
    """Four toy_reach episodes, each with a planner-certified expert window of 10 valid expert labels."""
    from hg_dagger.envs import load_mapping, make_env
    from hg_dagger.envs.toy import toy_ik_action

    mapping = load_mapping("toy_reach")
    fields = step_fields(mapping.obs_spec(), mapping.action_dim)
    with EpisodeStore.create(path).recorder() as rec:
        for e in range(4):
            env = make_env(mapping, num_envs=1, seed=e)
            obs, _ = env.reset(seed=e)
            eid = rec.begin_episode(EpisodeStart(task=TaskInfo(task_id="toy_reach"), mode=CollectionMode.DAGGER_SYNC,
                                                 control_hz=mapping.control_hz, mapping_hash=mapping.hash,
                                                 policy_version="test"), fields)
            for _ in range(20):
                a = toy_ik_action(obs)[0]
                rec.put(eid, {**{f"obs/{k}": obs[k][0] for k in obs}, "expert_action": a, "expert_valid": True,
                              "expert_used": True, "applied_action": a,
                              "action_source": np.uint8(ActionSource.EXPERT.code)})
                obs = env.step(a[None]).obs
            window = CorrectionWindow(parent_episode_id=eid, parent_step_id=5, handover_start=5, handover_end=15,
                                      source=ActionSource.EXPERT)
            cert = ExpertCertification(episode_id=eid, step_start=5, step_end=15, certifier="planner:toy_ik",
                                       method="planner_auto", executability_verified=True)
            rec.end_episode(eid, EpisodeEnd(end_reason=EndReason.TIMEOUT, task_success=False, num_steps=20),
                            windows=[window], certifications=[cert])
            env.close()


def test_cli_on_a_full_disk_says_so_in_one_line_naming_the_path(small_disk, tmp_path):
    from hg_dagger.envs import load_mapping
    from hg_dagger.policy import Student

    source = tmp_path / "source"
    _trainable_store(source)
    checkpoint = tmp_path / "student.pt"
    Student.create(load_mapping("toy_reach"), ensemble=2, hidden=(16,)).save(checkpoint)
    small_disk.fill()

    new_store = small_disk.path / "new_store"
    line = _one_error_line(_cli("run", "--task", "toy_reach", "--store", str(new_store), "--episodes", "1", "--quiet"))
    assert f"{new_store}: cannot create an episode store here (No space left on device" in line

    out = small_disk.path / "trained"
    line = _one_error_line(_cli("train", "--store", str(source), "--task", "toy_reach", "--out", str(out),
                                "--steps", "5", "--ensemble", "2", "--quiet"))
    assert str(out) in line and "No space left on device" in line
    assert not (out / "student.pt").exists() and not list(out.glob(".student.pt.tmp*"))

    out = small_disk.path / "evaluated"
    line = _one_error_line(_cli("eval", "--checkpoint", str(checkpoint), "--task", "toy_reach", "--out", str(out),
                                "--episodes", "1", "--num-envs", "1", "--max-steps", "5", "--quiet"))
    assert str(out) in line and "No space left on device" in line

    small_disk.free()  # with space again, the same store path is created and recorded into
    proc = _cli("run", "--task", "toy_reach", "--store", str(new_store), "--episodes", "1", "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert validate_store(EpisodeStore.open(new_store)) == []
