"""The shipped FetchPickAndPlace gates on real MuJoCo: a student that never reaches for the block is asked about
within about a second of the grace, not after the three seconds the reach used to need."""

from __future__ import annotations

import pytest

from hg_dagger.contract.enums import EventKind
from hg_dagger.control.build import build_session
from hg_dagger.control.expert_runs import HoldStill
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import make_env
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.simulation]


def test_a_student_that_stays_put_is_asked_about_soon_after_the_grace(tmp_path):
    cfg = load_run_config(None, "fetch_pick_place", num_envs=2, calibrate_steps=0, seed=3,
                          **{"operator.return_after_steps": 5})
    rec = EpisodeStore.create(str(tmp_path / "store")).recorder(flush_interval_s=0.05)
    env = make_env("fetch_pick_place", num_envs=2, seed=3)
    session = build_session(cfg, rec, HoldStill(env.mapping.action_dim), env=env)
    try:
        session.run(2, progress=False)
    finally:
        rec.close()
    m = env.mapping
    grace = round(1.0 / m.dt)  # the shipped grace after a reset: 1 s
    for info in EpisodeStore.open(str(tmp_path / "store")).episodes():
        first = next(e for e in info.end.events if e.kind == EventKind.GATE_TRIGGER)
        assert {"progress_eta", "progress_stall"} & set(first.reason.split("+")), first.reason
        assert first.step <= grace + round(1.2 / m.dt), first.step  # within the stall gate's 1.2 s of the grace
