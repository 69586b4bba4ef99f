"""Records and stores of the rollout engine, seed for seed: an automatic-expert collection (expert_demo and
dagger_sync), a gated run with the synthetic operator, and a student-only evaluation, each reduced to a digest of
everything stored that does not depend on the clock or on random ids. The digests were computed from the
collectors as they were before the engine stepped them (docs/architecture.md, the rollout engine), so a change to
what any mode stores fails here."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from hg_dagger.control.build import build_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.experts import make_expert
from hg_dagger.learn.auto import Collector
from hg_dagger.learn.evaluate import EvalConfig, closed_loop
from hg_dagger.policy import Student
from hg_dagger.store import EpisodeStore

# what the clock or a random id decides: left out of the digest
_VOLATILE_FIELDS = {"t_obs", "t_policy", "t_action_apply", "t_device", "inference_ns", "transport_ns"}


def _scrub(v):
    if isinstance(v, dict):
        return {k: _scrub(x) for k, x in sorted(v.items()) if not _volatile(k)}
    if isinstance(v, list):
        return [_scrub(x) for x in v]
    if isinstance(v, float):
        return round(v, 5)
    return v


def _volatile(key: str) -> bool:
    return (key.startswith("t_") or key.endswith("_ns") or key.endswith("_id") or key.endswith("_ids")
            or key.endswith("_wall_s") or key in ("versions", "created", "created_at", "recorded_at", "wall_time", "waited_s", "id"))


def _array_digest(a: np.ndarray) -> str:
    a = np.asarray(a)
    if a.dtype.kind == "f":
        a = np.round(a.astype(np.float64), 4)
        a[a == 0] = 0.0  # -0.0 and 0.0 alike
    return hashlib.sha256(np.ascontiguousarray(a).tobytes() + str(a.shape).encode()).hexdigest()[:16]


def store_digest(path, *, cut_at: int | None = None) -> tuple[int, str]:
    """``cut_at``: episodes cut at this many steps get back the last step's truncated flag of the collector before
    the engine (False: it ended the episode without saying so in the step; the engine's one cut says truncated,
    as the session's always did)."""
    store = EpisodeStore.open(str(path))
    rows = []
    for info in store.episodes():
        d = store.read_steps(info.episode_id)
        if cut_at is not None and info.num_steps == cut_at and info.end.end_reason.value == "timeout":
            assert d["truncated"][-1] and not d["truncated"][:-1].any(), "the cut step says truncated"
            d["truncated"] = d["truncated"].copy()
            d["truncated"][-1] = False
        layer = store.labels(info.episode_id)
        rows.append({
            "start": _scrub(info.start.model_dump(mode="json")), "end": _scrub(info.end.model_dump(mode="json")),
            "complete": info.complete,
            "steps": {k: _array_digest(v) for k, v in sorted(d.items()) if k not in _VOLATILE_FIELDS},
            "labels": [_array_digest(layer.mask), _array_digest(layer.target)],
        })
    rows.sort(key=lambda r: json.dumps([r["start"].get("mode"), r["start"].get("initial_state"),
                                        r["start"].get("env_index")], sort_keys=True))
    text = json.dumps(rows, sort_keys=True)
    return len(rows), hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def student():
    return Student.create(load_mapping("toy_reach"), seed=0, ensemble=3, hidden=(32, 32))


def _auto(tmp_path, student, mode, beta):
    mapping = load_mapping("toy_reach")
    path = tmp_path / f"auto_{mode}"
    store = EpisodeStore.create(str(path))
    with make_env(mapping, num_envs=3, seed=0) as env:
        rec = store.recorder()
        col = Collector(env, make_expert("toy_reach", "planner", mapping=mapping), rec, mode=mode, seed=11,
                        certify=True, max_episode_steps=30)
        col.set_policy(student, iteration=1, beta=beta)
        col.run(episodes=7, reset_seed=40)
        rec.close()
    assert col.stats.safety_clamps == 0
    return store_digest(path, cut_at=30)


def _gated(tmp_path, student, n):
    cfg = load_run_config(None, "toy_reach", num_envs=n, calibrate_steps=0, seed=5, max_episode_steps=40)
    path = tmp_path / f"gated_{n}"
    rec = EpisodeStore.create(str(path)).recorder(flush_interval_s=0.05)
    with make_env("toy_reach", num_envs=n, seed=0) as env:
        session = build_session(cfg, rec, student, env=env)
        summary = session.run(5, progress=False)
        rec.close()
    return summary, store_digest(path)


GOLDEN = {
    "auto_expert_demo": (7, "f5ee585366006a3e1ec118c4876d49650f7355241225989fcc2c4b88967af73f"),
    "auto_dagger_sync": (7, "68d2f1f756a87688de8a833809c5aa7114019c30aae438de757c729a2b73ac05"),
    "gated_1": (5, "14cb7075b6b45e1054ede1b6fd7ce25450be86fef075d0e2db506aaf0ff8d256"),
    "gated_2": (5, "3b0f874e632fce77e472c5fc344f1bc7b12ddcbd2d0d795684ab863d219a223b"),
    "eval": "5070ee87f6e748cf8d2b920b210930abd8e2a56afe0e45ba759e1c7786c36bc3",
}


def test_auto_collection_stores_what_it_stored_before_the_engine(tmp_path, student):
    """Expert actions on toy_reach stay inside its safety limits, so the monitor changes no stored step here."""
    assert _auto(tmp_path, student, "expert_demo", 1.0) == GOLDEN["auto_expert_demo"]
    assert _auto(tmp_path, student, "dagger_sync", 0.5) == GOLDEN["auto_dagger_sync"]


@pytest.mark.parametrize("n", [1, 2])
def test_gated_run_stores_what_it_stored_before_the_engine(tmp_path, student, n):
    summary, digest = _gated(tmp_path, student, n)
    assert summary.episodes == 5 and summary.windows > 0, "the synthetic operator corrected something"
    assert digest == GOLDEN[f"gated_{n}"]


def test_evaluation_results_are_what_they_were_before_the_engine(student):
    mapping = load_mapping("toy_reach")
    with make_env(mapping, num_envs=3, seed=5) as env:
        res = closed_loop(student, env, EvalConfig(episodes=5, num_envs=3, seed=5, max_steps=30))
    text = json.dumps(_scrub(res), sort_keys=True)
    assert hashlib.sha256(text.encode()).hexdigest() == GOLDEN["eval"]
