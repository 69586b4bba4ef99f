"""The novelty gate against a real store of planner demonstrations on toy_reach (`hg-dagger run --operator expert`):
the demonstrations' own states score low and stay quiet, states far from them trigger; a missing reference, a
store without successes and an observation that does not fit the reference's state are one line each."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from hg_dagger.contract.enums import EventKind
from hg_dagger.control import GateConfig, GateEngine, GateInputs
from hg_dagger.control.run_config import load_gate_config
from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.store import EpisodeStore

pytestmark = pytest.mark.subprocess


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    """Four successful planner demonstrations of toy_reach, recorded by the CLI into a real store."""
    path = tmp_path_factory.mktemp("novelty") / "demos.zarr"
    res = subprocess.run([sys.executable, "-m", "hg_dagger", "run", "--task", "toy_reach", "--operator", "expert",
                          "--episodes", "4", "--max-episode-steps", "60", "--store", str(path), "--quiet"],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")})
    assert res.returncode == 0, res.stderr[-2000:]
    return path


def _engine(reference, n: int, **kw) -> GateEngine:
    cfg = GateConfig.model_validate({"gates": [{"type": "novelty", "reference": str(reference), "debounce_ticks": 1,
                                                **kw}]})
    return GateEngine(cfg, num_envs=n, step_dt=0.04, action_dim=2)


def _inputs(obs, n: int) -> GateInputs:
    return GateInputs(step=np.full(n, 50, np.int64), t_ns=0, action=np.zeros((n, 2), np.float32),
                      uncertainty=np.full(n, np.nan, np.float32), obs=obs)


def _demo_obs(store_path):
    store = EpisodeStore.open(store_path)
    mapping = load_mapping("toy_reach")
    keys = mapping.state_keys()
    info = [i for i in store.episodes() if i.end.task_success][-1]
    d = store.read_steps(info.episode_id, [f"obs/{k}" for k in keys])
    return {k: d[f"obs/{k}"] for k in keys}


def test_states_of_the_training_data_stay_quiet_and_states_far_from_it_trigger(demos):
    obs = _demo_obs(demos)
    n = len(next(iter(obs.values())))
    engine = _engine(demos, n)
    near = engine.gates[0].reference.distance(obs) / engine.gates[0].reference.unit
    assert np.median(near) < 0.5 and (near > 2.0).mean() <= 0.05  # the demonstrations' own states
    out = engine.update(_inputs(obs, n), np.ones(n, bool))
    assert (out.level < 2).mean() >= 0.95
    far = {k: v + np.float32(3.0) for k, v in obs.items()}  # every coordinate 3 units off (the arm reaches 1)
    engine.rearm(np.arange(n))
    out = engine.update(_inputs(far, n), np.ones(n, bool))
    trig = [ev for _, ev in out.events if ev.kind == EventKind.GATE_TRIGGER]
    assert len(trig) == n and all(ev.reason == "novelty" for ev in trig)
    assert all(ev.values["novelty"]["novelty"] > 2.0 for ev in trig)
    assert trig[0].values["novelty"]["reference_states"] == engine.gates[0].reference.size


def test_the_score_grows_with_the_distance_from_the_data(demos):
    obs = _demo_obs(demos)
    one = {k: v[20:21] for k, v in obs.items()}
    engine = _engine(demos, 1)
    ref = engine.gates[0].reference
    scores = [float(ref.distance({k: v + np.float32(s) for k, v in one.items()})[0]) for s in (0.0, 0.5, 1.0, 2.0)]
    assert scores == sorted(scores) and scores[-1] > 4 * max(scores[0], ref.unit)


def test_bad_references_and_states_are_one_line(demos, tmp_path):
    with pytest.raises(ConfigError, match=r"reference .*nowhere.zarr: no such store") as e:
        _engine(tmp_path / "nowhere.zarr", 1)
    assert "\n" not in str(e.value)
    (tmp_path / "plain").mkdir()
    with pytest.raises(ConfigError, match="not an episode store"):
        _engine(tmp_path / "plain", 1)
    engine = _engine(demos, 1)
    obs = {k: v[:1] for k, v in _demo_obs(demos).items()}
    obs["qpos"] = np.zeros((1, 3), np.float32)  # a state of another robot
    with pytest.raises(ConfigError, match="does not fit the reference's state|dimensions") as e:
        engine.update(_inputs(obs, 1), np.ones(1, bool))
    assert "\n" not in str(e.value)
    gates = tmp_path / "gates.yaml"
    gates.write_text("kind: gates\nname: n\ntask: toy_reach\ngates:\n  - {type: novelty}\n")
    with pytest.raises(HgDaggerError, match="reference") as e:
        load_gate_config(str(gates), "toy_reach")
    assert "\n" not in str(e.value)
