"""EmbodiChain in both directions.

EmbodiedEnv needs EmbodiChain's GPU simulator (dexsim), which cannot run here: the adapter is tested
against FakeEmbodiedEnv below, a small stand-in with EmbodiedEnv's reset/step semantics (TensorDict
obs robot/{qpos,qvel,qf}, auto-reset of finished rows inside step(), step_dt = physics_dt x
sim_steps_per_control). The LearningVecEnv direction runs EmbodiChain's real SyncCollector
(`pip install --no-deps embodichain`; its learning.rl imports without dexsim).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
import yaml
from tensordict import TensorDict

from hg_dagger.control.build import build_session
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.errors import ConfigError, EnvError

DOF = 3
MAPPING = {
    "task_id": "ec_reach",
    "backend": "embodichain",
    "backend_options": {"gym_id": "FakeReach-v0", "gym_config": "reach.json"},
    "control_hz": 25,
    "step_dt": 0.04,
    "horizon": 6,
    "observation": [
        {"name": "robot/qpos", "shape": [DOF], "dtype": "float32"},
        {"name": "robot/qvel", "shape": [DOF], "dtype": "float32"},
        {"name": "robot/qf", "shape": [DOF], "dtype": "float32"},
        {"name": "goal", "shape": [DOF], "dtype": "float32"},
    ],
    "action": {"names": ["j1", "j2", "j3"], "low": [-2.0] * DOF, "high": [2.0] * DOF},
    "human": {"axes": ["x", "y", "z"]},
    "joints": {"names": ["j1", "j2", "j3"], "obs_key": "robot/qpos"},
}


class FakeEmbodiedEnv:
    """EmbodiedEnv's contract without a simulator: absolute joint-position actions, first-order
    joints, success within 0.05 of the goal (terminates), truncation at max_episode_steps."""

    def __init__(self, num_envs: int, seed: int | None, *, physics_dt=0.01, sim_steps_per_control=4, max_episode_steps=6):
        self.num_envs, self.physics_dt, self.max_episode_steps = num_envs, physics_dt, max_episode_steps
        self.cfg = type("Cfg", (), {"sim_steps_per_control": sim_steps_per_control})()
        self.device = torch.device("cpu")
        self.single_action_space = type("Space", (), {"shape": (DOF,)})()
        self.gen = torch.Generator().manual_seed(0 if seed is None else seed)
        self.qpos = torch.zeros(num_envs, DOF)
        self.qvel = torch.zeros(num_envs, DOF)
        self.goal = torch.zeros(num_envs, DOF)
        self.elapsed = torch.zeros(num_envs, dtype=torch.long)
        self.terminal_obs: list[TensorDict] = []  # what a finished row looked like (test instrumentation)
        self.closed = False

    def _obs(self) -> TensorDict:
        robot = TensorDict({"qpos": self.qpos.clone(), "qvel": self.qvel.clone(), "qf": -self.qvel * 0.1}, batch_size=[self.num_envs])
        return TensorDict({"robot": robot, "goal": self.goal.clone(), "sensor": {}}, batch_size=[self.num_envs])

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.gen.manual_seed(seed)
        ids = (options or {}).get("reset_ids", torch.arange(self.num_envs))
        n = len(ids)
        self.qpos[ids] = torch.rand(n, DOF, generator=self.gen) - 0.5
        self.goal[ids] = torch.rand(n, DOF, generator=self.gen) - 0.5
        self.qvel[ids] = 0
        self.elapsed[ids] = 0
        return self._obs(), {}

    def step(self, action: torch.Tensor):
        assert action.dtype == torch.float32 and action.shape == (self.num_envs, DOF)
        old = self.qpos.clone()
        self.qpos += 0.5 * (action - self.qpos)
        self.qvel = (self.qpos - old) / (self.physics_dt * self.cfg.sim_steps_per_control)
        self.elapsed += 1
        obs = self._obs()
        success = (self.qpos - self.goal).norm(dim=1) < 0.05
        terminated, truncated = success.clone(), self.elapsed >= self.max_episode_steps
        done = terminated | truncated
        self.terminal_obs.append(obs.clone())
        if not getattr(self, "_replay_no_auto_reset", False) and done.any():
            obs, _ = self.reset(options={"reset_ids": done.nonzero().squeeze(-1)})
        return obs, -(self.qpos - self.goal).norm(dim=1), terminated, truncated, {"success": success}

    def close(self):
        self.closed = True


def _fake(**kw):
    return lambda mapping, num_envs, seed: FakeEmbodiedEnv(num_envs, seed, **kw)


def _mapping(tmp_path, **update):
    data = {**MAPPING, **update}
    path = tmp_path / "ec_reach.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_mapping(path)


def test_adapter_keeps_final_obs_and_marks_fresh_rows(tmp_path):
    env = make_env(_mapping(tmp_path), num_envs=3, seed=1, make_fn=_fake())
    sim = env.env
    obs, _ = env.reset(seed=1)
    assert set(obs) == {"robot/qpos", "robot/qvel", "robot/qf", "goal"} and obs["robot/qpos"].dtype == np.float32
    goal_action = obs["goal"].copy()  # drive straight at the goal: rows terminate with success
    ended = False
    for _ in range(6):
        res = env.step(goal_action)
        done = res.terminated | res.truncated
        assert np.array_equal(res.episode_start, done)
        terminal = sim.terminal_obs[-1]
        for k in obs:  # final_obs is the observation the simulator produced at the end of the step
            np.testing.assert_array_equal(res.final_obs[k], terminal.get(tuple(k.split("/"))).numpy())
        if done.any():
            ended = True
            rows = np.flatnonzero(done)
            assert res.success[rows].all() or res.truncated[rows].all()
            # the returned rows start new episodes: not the final observation, elapsed reset
            assert not np.allclose(res.obs["goal"][rows], res.final_obs["goal"][rows])
            assert (sim.elapsed[torch.as_tensor(rows)] == 0).all()
            break
        goal_action = res.obs["goal"].copy()
    assert ended


def test_without_the_adapter_embodiedenv_would_lose_the_final_obs():
    sim = FakeEmbodiedEnv(2, 0, max_episode_steps=1)
    sim.reset(seed=0)
    obs, *_ = sim.step(torch.zeros(2, DOF))
    assert not torch.equal(obs["robot", "qpos"], sim.terminal_obs[-1]["robot", "qpos"])


def test_step_dt_is_physics_dt_times_substeps(tmp_path):
    make_env(_mapping(tmp_path), num_envs=1, make_fn=_fake(physics_dt=0.01, sim_steps_per_control=4)).close()
    with pytest.raises(EnvError, match=r"physics_dt 0.005 x sim_steps_per_control 4 = 0.02"):
        make_env(_mapping(tmp_path), num_envs=1, make_fn=_fake(physics_dt=0.005))


def test_missing_observation_path_is_named(tmp_path):
    m = _mapping(tmp_path, observation=[*MAPPING["observation"], {"name": "sensor/cam/color", "shape": [8, 8, 3], "dtype": "uint8"}])
    with pytest.raises(EnvError, match="sensor/cam/color"):
        make_env(m, num_envs=1, make_fn=_fake())


def test_nan_action_never_reaches_embodiedenv(tmp_path):
    env = make_env(_mapping(tmp_path), num_envs=2, seed=0, make_fn=_fake())
    before = env.env.qpos.clone()
    with pytest.raises(EnvError, match="NaN"):
        env.step(np.array([[0, 0, 0], [0, np.nan, 0]], np.float32))
    assert torch.equal(env.env.qpos, before)


@pytest.mark.skipif(importlib.util.find_spec("dexsim") is not None, reason="dexsim installed: the real build is used")
def test_without_dexsim_the_backend_says_what_to_install(tmp_path):
    with pytest.raises(EnvError, match="dexsim_engine"):
        make_env(_mapping(tmp_path), num_envs=1)


# ---------------------------------------------------------------------------- LearningVecEnv
def _learning_rl():
    return pytest.importorskip(
        "embodichain.learning.rl.env",
        reason="optional extra: pip install --no-deps embodichain==0.3.2 (learning.rl runs without dexsim)",
    )


def test_our_vecenv_satisfies_learning_vecenv():
    rl_env = _learning_rl()
    from hg_dagger.envs.embodichain import LearningVecEnvAdapter

    adapter = LearningVecEnvAdapter(make_env("toy_reach", num_envs=4, seed=0))
    assert isinstance(adapter, rl_env.LearningVecEnv)
    obs, info = adapter.reset(seed=0)
    assert obs.shape == (4, adapter.mapping.flat_dim) and obs.dtype == torch.float32
    assert adapter.single_observation_space.shape == (6,) and adapter.single_action_space.shape == (2,)
    nxt, reward, term, trunc, info = adapter.step(torch.zeros(4, 2))
    assert reward.shape == term.shape == trunc.shape == (4,) and info["final_obs"].shape == (4, 6)
    with pytest.raises(EnvError, match="NaN"):
        adapter.step(torch.full((4, 2), float("nan")))


def test_embodichains_sync_collector_drives_our_env():
    _learning_rl()
    from embodichain.learning.rl.buffer.standard_buffer import RolloutBuffer
    from embodichain.learning.rl.collector import SyncCollector
    from embodichain.learning.rl.policies.actor_critic import ActorCritic

    from hg_dagger.envs.embodichain import LearningVecEnvAdapter
    from hg_dagger.envs.toy import MAX_SPEED

    mapping = load_mapping("toy_reach").model_copy(update={"horizon": 4})
    env = make_env(mapping, num_envs=3, seed=2)
    adapter = LearningVecEnvAdapter(env)
    torch.manual_seed(0)
    dim, act = mapping.flat_dim, mapping.action_dim
    policy = ActorCritic(dim, act, torch.device("cpu"), actor=torch.nn.Linear(dim, act), critic=torch.nn.Linear(dim, 1), initial_action_std=0.5)
    collector = SyncCollector(adapter, policy, torch.device("cpu"))
    steps = 6
    buf = RolloutBuffer(num_envs=3, rollout_len=steps, obs_dim=dim, action_dim=act, device=torch.device("cpu"))
    rollout = collector.collect(steps, rollout=buf.start_rollout())
    done = rollout["done"][:, :steps]
    assert done[:, 3].all() and not done[:, :3].any()  # horizon 4: every row truncates at step 4
    # each transition: the next obs follows from the obs and the (policy -> raw) action; never across a reset
    q_scale = 3.1416  # qpos normalization std in toy_reach.yaml
    for t in range(steps):
        q0 = rollout["obs"][:, t, :2].numpy() * q_scale
        q1 = rollout["obs"][:, t + 1, :2].numpy() * q_scale
        raw = mapping.policy_to_raw(rollout["action"][:, t].numpy())
        expected = (q0 + raw * MAX_SPEED * mapping.dt + np.pi) % (2 * np.pi) - np.pi
        keep = ~done[:, t].numpy()
        np.testing.assert_allclose(q1[keep], expected[keep], atol=1e-4)


class CameraFakeEnv(FakeEmbodiedEnv):
    """The stand-in with a 48x64 camera sensor whose picture follows the first joint."""

    def _obs(self) -> TensorDict:
        td = super()._obs()
        shade = ((self.qpos[:, 0] + 1.0) * 100).clamp(0, 255).to(torch.uint8)
        color = torch.zeros(self.num_envs, 48, 64, 3, dtype=torch.uint8)
        color[:, :, 32:, :] = shade[:, None, None, None]
        td["sensor"] = TensorDict({"cam": {"color": color}}, batch_size=[self.num_envs])
        return td


def test_view_is_the_camera_sensor_when_the_task_reads_one_else_none(tmp_path):
    from hg_dagger.envs.common import fit_image

    state_only = make_env(_mapping(tmp_path), num_envs=2, seed=0, make_fn=_fake())
    assert state_only.render_view(0, 64) is None
    observation = [*MAPPING["observation"], {"name": "sensor/cam/color", "shape": [48, 64, 3], "dtype": "uint8"}]
    env = make_env(_mapping(tmp_path, observation=observation), num_envs=2, seed=0,
                   make_fn=lambda mapping, n, seed: CameraFakeEnv(n, seed))
    obs, _ = env.reset(seed=0)
    view = env.render_view(1, 96)
    assert view.shape == (96, 96, 3) and view.dtype == np.uint8
    np.testing.assert_array_equal(view, fit_image(obs["sensor/cam/color"][1], 96))
    res = env.step(np.full((2, DOF), 0.9, np.float32))
    moved = env.render_view(1, 96)
    assert not np.array_equal(moved, view)
    np.testing.assert_array_equal(moved, fit_image(res.obs["sensor/cam/color"][1], 96))


def test_pause_in_a_batch_is_refused_where_the_backend_cannot_pause_one_env(tmp_path):
    """`wait: pause` with several envs pauses the waiting env alone; EmbodiChain steps its batch as one, so the
    session refuses it in one line before anything is recorded."""
    mapping = _mapping(tmp_path)
    with make_env(mapping, num_envs=3, seed=1, make_fn=_fake()) as env:
        assert not env.pauses_rows
        cfg = load_run_config(None, str(tmp_path / "ec_reach.yaml"), num_envs=3, **{"handover.wait": "pause"})
        with pytest.raises(ConfigError, match="embodichain backend cannot do in a batch: use num_envs 1"):
            build_session(cfg, None, None, env=env)
