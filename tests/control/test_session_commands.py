"""Per-episode commands hit exactly the episode they name, whatever ran meanwhile: the real toy_reach session in
the live control loop, episodes back to back with the synthetic operator correcting every one, a real store."""

from __future__ import annotations

import numpy as np
import pytest

from hg_dagger.contract.enums import EndReason, LabelMask, ReviewStatus
from hg_dagger.contract.labels import TrainingBlock, operator_rejected, training_selection
from hg_dagger.control import live
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.loop import ControlLoop
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import make_env
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore, validate_store

WAIT = 120.0
TRAINABLE = LabelMask.TRAINABLE.code
EAGER = GateConfig(name="eager", gates=[ConfidenceGate(trigger=1e-9, warn=None, debounce_ticks=1)])


def _build(store: str):
    def build():
        cfg = load_run_config(None, "toy_reach", num_envs=1, seed=3, calibrate_steps=0, gates=EAGER,
                              max_episode_steps=100, episode_gap_s=0,
                              **{"operator.type": "synthetic", "operator.return_after_steps": 10})
        env = make_env("toy_reach", num_envs=1, seed=3)
        return build_session(cfg, EpisodeStore.create(store, exist_ok=True).recorder(flush_interval_s=0.05),
                             Student.create(env.mapping, seed=0, ensemble=3, hidden=(32, 32)), env=env)

    return build


def _settled(loop: ControlLoop, snap_pred) -> live.Snapshot:
    """Once a snapshot satisfies ``snap_pred`` (the command was handled), the first one published after every
    store action was written (their messages reach the next snapshot) that satisfies it."""
    assert loop.slot.wait_for(snap_pred, WAIT) is not None, loop.slot.read().message
    assert loop.slot.wait_for(lambda s: loop.settled(), WAIT) is not None
    seq = loop.slot.read().seq
    snap = loop.slot.wait_for(lambda s: s.seq > seq + 1 and snap_pred(s), WAIT)
    assert snap is not None, loop.slot.read().message
    return snap


def _trainable(store: EpisodeStore, eid: str, version: int | None = None) -> int:
    return int((store.labels(eid, version).mask == TRAINABLE).sum())


@pytest.fixture
def loop(tmp_path):
    store = str(tmp_path / "s.zarr")
    lp = ControlLoop(_build(store), rate_hz=100, view_hz=0, store=store).start()
    yield lp, store
    lp.stop()


@pytest.mark.slow
def test_discard_undo_and_flag_hit_exactly_the_episode_they_name(loop):
    lp, store = loop
    lp.commands.put(live.StartEpisodes(8))  # headroom: the pause below lands mid-run
    x = lp.slot.wait_for(lambda s: s.episode_id is not None, WAIT).episode_id
    y = lp.slot.wait_for(lambda s: s.episode_id not in (None, x), WAIT).episode_id  # x was replaced by y
    lp.commands.put(live.MarkOutcome(True, episode_id=x))
    refused = lp.slot.wait_for(lambda s: "already ended" in s.message, WAIT)
    assert refused is not None and x[:12] in refused.message, "a verdict on an ended episode is refused, said"
    lp.commands.put(live.DiscardEpisode("wrong scene", episode_id=x))  # the dialog opened on x answers late
    lp.slot.wait_for(lambda s: s.episode_id not in (None, x, y), WAIT)
    lp.commands.put(live.Pause(True))  # nothing steps now: the running episode can end only by a command
    paused = lp.slot.wait_for(lambda s: s.phase == "paused", WAIT)
    z = paused.episode_id
    assert z not in (None, x, y)
    lp.commands.put(live.DiscardEpisode("bumped the table", episode_id=z))
    ended = lp.slot.wait_for(lambda s: s.ended_episode_id == z, WAIT)
    assert ended.phase == "paused" and ended.episode_id != z, "discarding the running episode ends it now"
    lp.commands.put(live.Pause(False))
    done = _settled(lp, lambda s: s.phase == "idle" and s.counters.episodes == 8)
    assert done.discarded_this_sitting == (x, z) and done.counters.discarded == 2
    lp.commands.put(live.UndoDiscard(x))
    undone = _settled(lp, lambda s: s.discarded_this_sitting == (z,))
    assert "undone" in undone.message
    window = undone.last_window_id
    assert window is not None, "the synthetic operator corrected every episode"
    lp.commands.put(live.FlagCorrection(window, "I overshot"))
    flagged = _settled(lp, lambda s: "flagged" in s.message)
    assert window[:12] in flagged.message
    lp.commands.put(live.DiscardEpisode("blurry", episode_id=y))
    _settled(lp, lambda s: s.discarded_this_sitting == (z, y))
    lp.stop()

    st = EpisodeStore.open(store)
    assert not validate_store(st)
    infos = {i.episode_id: i for i in st.episodes()}
    assert len(infos) == 8 and {x, y, z} <= set(infos)
    versions = [st.labels(x, v) for v in st.label_versions(x)]
    assert _trainable(st, x, 1) > 0 and not (versions[1].mask == TRAINABLE).any(), "the late discard hit x"
    assert versions[1].author.startswith("operator:")
    assert np.array_equal(st.labels(x).mask, versions[0].mask), "the undo gives x its labels back"
    assert infos[z].end.end_reason == EndReason.OPERATOR_ABORT and any(e.values.get("discarded")
                                                                       for e in infos[z].end.events)
    assert st.labels(z).author.startswith("operator:") and _trainable(st, z) == 0
    from hg_dagger.review.replay import replay_store

    assert _trainable(st, y, 1) > 0 and _trainable(st, y) == 0
    replay_store(EpisodeStore.open(store, mode="a"), episodes=[y], author="replay-check", progress=False)
    st.refresh()
    assert st.labels(y).author == "replay-check" and _trainable(st, y) == 0, "a replay result keeps the discard"
    others = [e for e in infos if e not in (x, y, z)]
    assert all(_trainable(st, e) == _trainable(st, e, 1) for e in others) and any(_trainable(st, e) for e in others), \
        "every other episode stays as trainable as it was recorded"
    owner = next(e for e in infos if any(w.window_id == window for w in st.labels(e).windows))
    layer = st.labels(owner)
    w = next(w for w in layer.windows if w.window_id == window)
    rejection = operator_rejected(layer.reviews, window, w.operator or infos[owner].start.operator)
    assert rejection is not None and rejection.status == ReviewStatus.REJECTED and rejection.notes == "I overshot"
    sel = training_selection(mask=layer.mask, windows=layer.windows, certifications=layer.certifications,
                             reviews=layer.reviews, qc=layer.qc, replay_status=st.replay_status(owner),
                             operator=infos[owner].start.operator, policy_version=infos[owner].start.policy_version)
    inside = slice(w.handover_start, w.handover_end)
    assert sel.labels[inside].any() and not sel.allowed[inside].any()
    assert ((sel.blocks[inside][sel.labels[inside]] & int(TrainingBlock.REJECTED)) != 0).all()


def test_commands_without_a_target_say_why_and_change_nothing(loop):
    lp, _store = loop
    assert lp.slot.wait_for(lambda s: s.phase == "idle", WAIT) is not None
    lp.commands.put(live.DeclineRequest())
    assert lp.slot.wait_for(lambda s: "no request is waiting" in s.message, WAIT) is not None
    lp.commands.put(live.UndoDiscard("0123456789abcdef"))
    assert lp.slot.wait_for(lambda s: "not discarded in this sitting" in s.message, WAIT) is not None
    lp.commands.put(live.DiscardEpisode("nothing runs"))
    assert lp.slot.wait_for(lambda s: "no running episode to discard" in s.message, WAIT) is not None
    lp.commands.put(live.ResetEpisode(episode_id="0123456789abcdef"))
    snap = lp.slot.wait_for(lambda s: "already ended" in s.message, WAIT)
    assert snap is not None and snap.counters.episodes == 0 and snap.discarded_this_sitting == ()
