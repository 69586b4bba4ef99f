"""kill -9 at random moments: the store always reopens, validates clean, committed episodes are complete and
exact, interrupted ones are marked incomplete and hold a correct prefix. Real subprocesses, real SIGKILL."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from support.store import CHECKED_FIELDS, check_steps, record

from hg_dagger.contract import EndReason, LabelMask
from hg_dagger.errors import StoreError
from hg_dagger.store import EpisodeStore, validate_store

pytestmark = [pytest.mark.subprocess]

CHILD = r"""
import random, sys
sys.path.insert(0, sys.argv[2])
from support.store import end, fields, start, step
from hg_dagger.contract import ActionSource
from hg_dagger.store import EpisodeStore
rng = random.Random(int(sys.argv[3]))
store = EpisodeStore.create(sys.argv[1], exist_ok=True)
print("CREATED", flush=True)
rec = store.recorder(flush_interval_s=0.05, queue_steps=100000, on_full="block")
print("READY", flush=True)
seed = 0
while True:
    eps = []
    for _ in range(2):  # two episodes at once: their rows interleave in the segment
        seed += 1
        st = start()
        eid = st.episode_id
        n = rng.randint(1, 60)
        # announced with its planned length before begin_episode: the store can never hold an unannounced
        # episode, and a complete one must have exactly this length even if the kill came before ENDED
        print("BEGUN", eid, seed, n, flush=True)
        rec.begin_episode(st, fields(image=True))
        eps.append((eid, seed, n))
    for t in range(max(n for _, _, n in eps)):
        for eid, s, n in eps:
            if t < n:
                rec.put(eid, step(s, t, image=True))
    for eid, s, n in eps:
        rec.end_episode(eid, end(n))
        print("ENDED", eid, s, n, flush=True)
    print("COMMITTED", rec.stats.committed_episodes, flush=True)
"""

TESTS = str(Path(__file__).parents[1])


def _run_and_kill(path: Path, seed: int, wait_for: str | None, delay: float) -> list[str]:
    """Start the child, wait until it prints a line starting with `wait_for` (None: no wait), then kill -9."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(path), TESTS, str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    if wait_for:
        deadline = time.monotonic() + 60
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith(wait_for) and line.strip() != "COMMITTED 0" or time.monotonic() > deadline:
                break
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    # read through the text wrapper: lines it buffered past the one we waited for must not be lost
    # (communicate() reads the raw pipe and would skip them)
    out, err = proc.stdout.read(), proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, err[-2000:]
    return lines + out.split("\n")[:-1]  # the last piece is empty or a line torn by the kill


def _check_after_crash(path: Path, lines: list[str]) -> int:
    announced = [p for p in (line.split() for line in lines) if p and p[0] == "BEGUN" and len(p) == 4]
    begun = {p[1]: int(p[2]) for p in announced}
    planned = {p[1]: int(p[3]) for p in announced}
    ended = [(p[1], int(p[2]), int(p[3])) for p in (line.split() for line in lines) if p and p[0] == "ENDED"]
    committed = max([int(line.split()[1]) for line in lines if line.startswith("COMMITTED")], default=0)
    if "CREATED" not in {line.split()[0] for line in lines if line}:
        if not path.exists():
            return 0
        try:
            store = EpisodeStore.open(path)
        except StoreError:
            assert not (path / "zarr.json").exists()  # creation never reached its single root write
            return 0
    store = EpisodeStore.open(path)
    assert validate_store(store) == []
    infos = {i.episode_id: i for i in store.episodes()}
    assert set(infos) <= set(begun), "the store holds an episode the writer never began"
    for eid, _, n in ended[:committed]:  # the recorder reported these committed before the kill
        assert infos[eid].complete and infos[eid].num_steps == n
    for eid, info in infos.items():
        check_steps(store.read_steps(eid, CHECKED_FIELDS + ["obs/rgb"]), begun[eid], info.num_steps, image=True)
        mask = store.labels(eid).mask
        assert len(mask) == info.num_steps
        if info.complete:
            # the writer may commit an episode before the child prints ENDED: a kill between the two is
            # legal, so the planned length (announced before the episode began) is the reference
            assert info.num_steps == planned[eid]
            assert info.end.end_reason == EndReason.SUCCESS
            assert (mask == LabelMask.CONTEXT_ONLY.code).all()
        else:
            assert info.end.end_reason == EndReason.INCOMPLETE
            assert (mask == LabelMask.EXCLUDED.code).all()
    return len(infos)


def test_sigkill_at_random_points(tmp_path):
    rng = random.Random(1234)
    seen_complete = seen_incomplete = 0
    # (wait for, max delay): anywhere from process start (store creation included), just after the recorder
    # started, and while episodes stream and commit
    plan = [(None, 3.0), ("READY", 0.5)] + [("COMMITTED", 0.8)] * 4
    for trial, (wait_for, max_delay) in enumerate(plan):
        path = tmp_path / f"store{trial}"
        lines = _run_and_kill(path, trial, wait_for, rng.uniform(0.0, max_delay))
        _check_after_crash(path, lines)
        if (path / "zarr.json").exists():
            infos = EpisodeStore.open(path).episodes()
            seen_complete += sum(i.complete for i in infos if i.num_steps != 5)
            seen_incomplete += sum(not i.complete for i in infos)
    # the kills landed while episodes were being written
    assert seen_complete > 0 and seen_incomplete > 0, (seen_complete, seen_incomplete)


def test_repeated_crashes_into_one_store(tmp_path, n_kills=2):
    """Sessions killed one after another write to the same store; all stay readable, and it stays writable."""
    path = tmp_path / "store"
    EpisodeStore.create(path)
    all_lines = []
    for k in range(n_kills):
        all_lines += _run_and_kill(path, 100 + k, "COMMITTED", delay=0.1 + 0.2 * k)
    store = EpisodeStore.open(path)
    assert validate_store(store) == []
    assert len(store.segments) >= n_kills
    begun = {p[1]: int(p[2]) for p in (line.split() for line in all_lines) if p and p[0] == "BEGUN" and len(p) == 4}
    for info in store.episodes():
        data = store.read_steps(info.episode_id, CHECKED_FIELDS + ["obs/rgb"])
        check_steps(data, begun[info.episode_id], info.num_steps, image=True)
    before = len(store.episodes())
    assert np.unique([i.episode_id for i in store.episodes()]).size == before
    store = EpisodeStore.open(path, mode="a")
    with store.recorder(flush_interval_s=0.05) as rec:
        eid = record(rec, 999, 5, image=True)
    after = EpisodeStore.open(path)
    assert after.info(eid).complete and len(after.episodes()) == before + 1
    assert validate_store(after) == []
