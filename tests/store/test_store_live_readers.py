"""Readers of a store that another process is writing (the app's Review tab, a test polling a Ray worker's
store): every read sees whole committed rows, never a torn shard, while the writer flushes every few
milliseconds. A real writer subprocess, a real zarr store. The writer blocks on a full queue, so every row
holds its own value: a fill row here would be a dropped step, not a torn read."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess]

WRITER = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, sys.argv[2])
    from support.store import end, fields, start, step
    from hg_dagger.store import EpisodeStore

    store = EpisodeStore.create(sys.argv[1])
    rec = store.recorder(flush_interval_s=0.002, on_full="block")  # a full queue under load waits: no fill rows
    deadline = time.monotonic() + float(sys.argv[3])
    seed = 0
    while time.monotonic() < deadline:
        eid = rec.begin_episode(start(), fields())
        for t in range(400):
            rec.put(eid, step(seed, t))
            if t % 20 == 0:
                time.sleep(0.001)
        rec.end_episode(eid, end(400))
        seed += 1
    rec.close()
    print(seed)
""")


def test_readers_never_see_a_torn_shard_while_a_writer_flushes(tmp_path):
    url = str(tmp_path / "store")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, url, str(Path(__file__).parents[1]), "6"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reads = 0
    seen: dict[str, int] = {}
    try:
        deadline = time.monotonic() + 60
        while not Path(url, "zarr.json").exists():
            assert writer.poll() is None, writer.communicate()[1][-2000:]
            assert time.monotonic() < deadline
            time.sleep(0.01)
        while writer.poll() is None:
            store = EpisodeStore.open(url, mode="r")
            assert not store.damaged, store.damaged  # a segment caught while the writer creates it is not damage
            for info in store.episodes():  # the row index of every segment, as the review browser reads it
                n = info.num_steps
                assert n >= seen.get(info.episode_id, 0), "a reader saw rows disappear"
                seen[info.episode_id] = n
                if n:
                    t_obs = store.read_steps(info.episode_id, ["t_obs"])["t_obs"]
                    # every row holds its own value (support.store.step): a torn read shows up as another row's
                    assert len(t_obs) >= n and t_obs[0] % 1_000_000 == 0 and np.all(np.diff(t_obs[:n]) == 10_000), (
                        f"episode {info.episode_id}: rows {np.nonzero(np.diff(t_obs[:n]) != 10_000)[0][:5]} of {n} "
                        f"read {t_obs[:n][np.nonzero(np.diff(t_obs[:n]) != 10_000)[0][:5] + 1]}")
            reads += 1
    finally:
        if writer.poll() is None:
            writer.kill()
        out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err[-2000:]
    assert reads >= 5 and int(out) >= 1
    final = EpisodeStore.open(url, mode="r")
    assert sum(i.complete for i in final.episodes()) == int(out)
