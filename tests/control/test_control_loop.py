"""The control thread of the app, headless: fixed-rate ticks of the real session, snapshots, commands."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract import EndReason, LabelMask
from hg_dagger.control import live
from hg_dagger.control.build import build_session
from hg_dagger.control.loop import ControlLoop
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import make_env
from hg_dagger.errors import HgDaggerError
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

WAIT = 120.0


def toy_builder(store: str, *, operator: str = "synthetic", calibrate: int = 200, **overrides):
    overrides.setdefault("episode_gap_s", 0)  # episodes back to back (the pause between them: test_session_waiting)

    def build():
        cfg = load_run_config(None, "toy_reach", num_envs=1, seed=1, **{"operator.type": operator, **overrides})
        env = make_env("toy_reach", num_envs=1, seed=1)
        s = build_session(cfg, EpisodeStore.create(store, exist_ok=True).recorder(),
                          Student.create(env.mapping, seed=0), env=env)
        if calibrate:
            s.calibrate(calibrate)
        return s

    return build


@pytest.fixture
def loop_factory():
    loops = []

    def make(build, **kw) -> ControlLoop:
        loop = ControlLoop(build, **kw).start()
        loops.append(loop)
        return loop

    yield make
    for loop in loops:
        loop.stop()


def test_synthetic_run_publishes_snapshots_and_leaves_a_valid_store(tmp_path, loop_factory):
    store = str(tmp_path / "s.zarr")
    loop = loop_factory(toy_builder(store), rate_hz=200, store=store)
    loop.commands.put(live.StartEpisodes(2))
    seen = []
    human = loop.slot.wait_for(lambda s: seen.append(s) or s.control_state == "human" or s.phase == "error", WAIT)
    assert human is not None and human.phase == "running", seen[-1].message
    assert human.policy_action.shape == (2,) and human.applied_action.shape == (2,)
    assert np.isfinite(human.human_action).all(), "the operator's command is shown while it drives"
    assert human.action_source in ("human", "safety_controller") and human.device.kind == "synthetic"
    assert human.t_request_ns is not None and human.t_obs <= human.t_action_apply
    assert human.frame is not None and human.frame.shape == (256, 256, 3) and human.frame.dtype == np.uint8
    done = loop.slot.wait_for(lambda s: s.counters.episodes >= 2 and s.phase == "idle", WAIT)
    assert done is not None and done.counters.windows >= 1 and done.counters.human_steps > 0
    assert done.health.ticks > 0 and done.health.target_hz == 200 and done.health.achieved_hz > 0
    assert done.rounds and done.rounds[-1]["episodes"] == 2
    assert done.control_state == "autonomous" and done.t_request_ns is None, "between episodes nothing is stale"
    assert np.all(np.diff([s.seq for s in seen]) >= 0), "snapshots arrive in order"
    loop.stop()
    assert loop.slot.read().phase == "stopped"
    st = EpisodeStore.open(store)
    assert len(st.episodes()) == 2 and list(validate_store(st)) == []


def test_pause_estop_and_operator_verdicts(tmp_path, loop_factory):
    store = str(tmp_path / "s.zarr")
    loop = loop_factory(toy_builder(store, operator="device", calibrate=0, **{"operator.device": "keyboard"}),
                        rate_hz=100, store=store, view_hz=0)
    loop.commands.put(live.StartEpisodes(5))
    s = loop.slot.wait_for(lambda s: s.phase == "running" and s.episode_step >= 3, WAIT)
    assert s is not None and s.frame is None, "view_hz 0: no rendering"
    loop.commands.put(live.Pause(True))
    paused = loop.slot.wait_for(lambda s: s.phase == "paused", WAIT)
    later = loop.slot.wait_for(lambda s: s.seq >= paused.seq + 10, WAIT)
    assert later.episode_step == paused.episode_step, "no step while paused"
    loop.commands.put(live.Pause(False))
    loop.commands.put(live.MarkOutcome(success=True))
    s = loop.slot.wait_for(lambda s: s.counters.episodes == 1, WAIT)
    assert s.counters.successes == 1
    loop.commands.put(live.DiscardEpisode("bumped the table"))
    s = loop.slot.wait_for(lambda s: s.counters.episodes == 2, WAIT)
    assert s.counters.discarded == 1
    loop.commands.put(live.EStop("app", "test e-stop"))
    s = loop.slot.wait_for(lambda s: s.phase == "estopped", WAIT)
    assert s.estop == ("app", "test e-stop") and s.control_state == "safe_stop"
    loop.commands.put(live.StartEpisodes(1))  # refused while latched: said, not raised
    s = loop.slot.wait_for(lambda s: "latched" in s.message, WAIT)
    assert s is not None and s.phase == "estopped"
    loop.commands.put(live.ClearEStop(by="op-7"))
    s = loop.slot.wait_for(lambda s: s.phase == "idle", WAIT)
    assert s.estop is None
    loop.stop()
    infos = EpisodeStore.open(store).episodes()
    reasons = [i.end.end_reason for i in infos]
    assert EndReason.SUCCESS in reasons and EndReason.OPERATOR_ABORT in reasons and EndReason.SAFETY_STOP in reasons
    st = EpisodeStore.open(store)
    discarded = [i for i in infos if any(e.values.get("discarded") for e in i.end.events)]
    assert len(discarded) == 1 and discarded[0].end.end_reason == EndReason.OPERATOR_ABORT
    layer = st.labels(discarded[0].episode_id)  # undoable in the sitting: a label layer keeps it out of training
    assert layer.author.startswith("operator:") and not (layer.mask == LabelMask.TRAINABLE.code).any()
    assert list(validate_store(st)) == []


def test_a_build_error_is_shown_not_raised(tmp_path, loop_factory):
    def build():
        raise HgDaggerError("configs/tasks/nope.yaml: no such task")

    loop = loop_factory(build)
    s = loop.slot.wait_for(lambda s: s.phase == "error", WAIT)
    assert s is not None and "nope.yaml" in s.message
    loop.join(10)
    assert not loop.alive


def test_unknown_command_is_refused_at_the_queue():
    with pytest.raises(TypeError):
        live.CommandQueue().put("start")


def test_the_tick_decides_on_an_observation_sampled_at_its_start(tmp_path, loop_factory):
    """A simulator is frozen between ticks: observe() gives the same state stamped now, so the live loop's
    obs -> apply latency is the tick's own work, not the wait for the next slot."""
    build = toy_builder(str(tmp_path / "direct.zarr"), calibrate=0)
    s = build()
    s.start(1)
    s.tick()
    before_obs, before_t = {k: v.copy() for k, v in s.obs.items()}, s.t_obs.copy()
    assert s.refresh_obs()
    assert all(np.array_equal(before_obs[k], s.obs[k]) for k in before_obs)
    assert s.t_obs[0] > before_t[0]
    s.close_all("test")
    s.rec.close()
    s.env.close()

    store = str(tmp_path / "s.zarr")
    loop = loop_factory(toy_builder(store, calibrate=0), rate_hz=20, store=store, view_hz=0)
    loop.commands.put(live.StartEpisodes(1))
    snap = loop.slot.wait_for(lambda s: s.phase == "running" and s.health.ticks >= 30, WAIT)
    assert snap is not None
    assert snap.health.latency_p50_ms < 25.0, "a 50 ms period: the obs must not wait a whole slot"


@pytest.mark.subprocess
def test_a_settled_control_process_keeps_its_built_objects_out_of_collections(tmp_path):
    """steady_collector in a process of its own (it changes the whole process): what existed is frozen, and
    cycles made afterwards are still collected."""
    import subprocess
    import sys

    code = (
        "import gc, weakref\n"
        "from hg_dagger.control.loop_health import steady_collector\n"
        "built = [[i] for i in range(1000)]\n"
        "steady_collector()\n"
        "assert gc.get_freeze_count() >= 1000, gc.get_freeze_count()\n"
        "class Node: pass\n"
        "a = Node(); a.me = a; gone = weakref.ref(a); del a\n"
        "gc.collect()\n"
        "assert gone() is None, 'a cycle made after settling was not collected'\n"
        "print('ok', gc.get_threshold()[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "50000"]
