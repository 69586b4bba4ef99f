"""query_expert: validation, conversion to raw space, per-row failure isolation, latency.

The experts that misbehave here wrap the real toy IK expert and fail on chosen env rows, the way a
third-party expert (a remote planner, a solver that does not converge for one state) would.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

from hg_dagger.envs import load_mapping, make_env
from hg_dagger.envs.mapping import TaskMapping
from hg_dagger.errors import ContractError
from hg_dagger.experts import ExpertActionProvider, ExpertQuery, make_expert, query_expert
from hg_dagger.experts.toy import ToyIKExpert

pytestmark = [pytest.mark.simulation]

N = 6


@pytest.fixture
def toy():
    env = make_env("toy_reach", num_envs=N, seed=7)
    obs, info = env.reset(seed=7)
    return env, obs


class FaultyExpert:
    """The real toy expert, failing in a chosen way whenever a chosen env id is in the batch."""

    def __init__(self, mapping, bad_env: int, fault: str, sleep_s: float = 0.5):
        self.inner = ToyIKExpert(mapping)
        self.output_space = "raw"
        self.bad_env, self.fault, self.sleep_s = bad_env, fault, sleep_s
        self.calls = 0
        self.lock = threading.Lock()

    def reset(self, env_ids, obs, info):
        self.inner.reset(env_ids, obs, info)

    def act(self, obs, *, env_ids):
        with self.lock:
            self.calls += 1
        q = self.inner.act(obs, env_ids=env_ids)
        ids = list(np.asarray(env_ids))
        if self.bad_env in ids:
            if self.fault == "raise":
                raise RuntimeError(f"IK diverged for env {self.bad_env}")
            if self.fault == "hang":
                time.sleep(self.sleep_s)
            if self.fault == "nan":
                q.action[ids.index(self.bad_env)] = np.nan
            if self.fault == "inf":
                q.action[ids.index(self.bad_env), 0] = np.inf
        return q


def reference(obs, env):
    return ToyIKExpert(env.mapping).act(obs, env_ids=np.arange(N)).action


def test_real_expert_satisfies_the_protocol_and_reports_latency(toy):
    env, obs = toy
    expert = make_expert("toy_reach")
    assert isinstance(expert, ExpertActionProvider)
    q = query_expert(expert, obs, np.arange(N), env.mapping)
    assert q.action.dtype == np.float32 and q.action.shape == (N, 2)
    assert q.valid.all() and q.invalid_reason == {}
    np.testing.assert_allclose(q.action, env.mapping.expert_to_raw(reference(obs, env)))
    assert q.metadata["latency_ns"] >= q.metadata["expert_ns"] > 0
    assert q.metadata["output_space"] == "raw"


@pytest.mark.parametrize("fault", ["raise", "nan", "inf"])
def test_one_faulty_row_is_invalid_and_the_others_keep_their_labels(toy, fault):
    env, obs = toy
    bad = 3
    q = query_expert(FaultyExpert(env.mapping, bad, fault), obs, np.arange(N), env.mapping)
    expect_valid = np.arange(N) != bad
    np.testing.assert_array_equal(q.valid, expect_valid)
    assert set(q.invalid_reason) == {bad}
    word = {"raise": "IK diverged", "nan": "non-finite", "inf": "non-finite"}[fault]
    assert word in q.invalid_reason[bad]
    assert np.isnan(q.action[bad]).all()  # an invalid label can never be executed by accident
    np.testing.assert_allclose(q.action[expect_valid], reference(obs, env)[expect_valid])
    assert q.metadata["isolated"] == (fault == "raise")


def test_a_hanging_row_times_out_alone(toy):
    env, obs = toy
    bad = 1
    expert = FaultyExpert(env.mapping, bad, "hang", sleep_s=1.0)
    q = query_expert(expert, obs, np.arange(N), env.mapping, timeout_s=0.1)
    assert not q.valid[bad] and q.valid[np.arange(N) != bad].all()
    assert "timed out after 0.1 s" in q.invalid_reason[bad]
    np.testing.assert_allclose(q.action[np.arange(N) != bad], reference(obs, env)[np.arange(N) != bad])
    assert q.metadata["latency_ns"] >= 100_000_000  # it did wait for the deadline
    assert expert.calls == 1 + N  # the batch, then each row once


def test_rows_are_env_ids_not_positions(toy):
    env, obs = toy
    sub = {k: v[[4, 5]] for k, v in obs.items()}
    q = query_expert(FaultyExpert(env.mapping, 5, "raise"), sub, [4, 5], env.mapping)
    np.testing.assert_array_equal(q.valid, [True, False])
    assert list(q.invalid_reason) == [5]


class Returns:
    """An expert returning whatever it is told to (to exercise the output validation)."""

    output_space = "raw"

    def __init__(self, make):
        self.make = make

    def reset(self, env_ids, obs, info):
        pass

    def act(self, obs, *, env_ids):
        return self.make(len(env_ids))


@pytest.mark.parametrize(
    ("make", "word"),
    [
        (lambda n: ExpertQuery(np.zeros((n + 1, 2), np.float32), np.ones(n + 1, bool)), "shape"),
        (lambda n: ExpertQuery(np.zeros((n, 3), np.float32), np.ones(n, bool)), "shape"),
        (lambda n: ExpertQuery(np.zeros((n, 2), np.int64), np.ones(n, bool)), "dtype"),
        (lambda n: ExpertQuery(np.zeros((n, 2), np.float32), np.ones(n, np.int8)), "valid"),
        (lambda n: ExpertQuery(torch.zeros(n, 2, device="meta"), np.ones(n, bool)), "device meta"),
        (lambda n: ExpertQuery([[0.0, 0.0]] * n, np.ones(n, bool)), "type list"),
        (lambda n: np.zeros((n, 2)), "expected ExpertQuery"),
    ],
)
def test_malformed_answers_invalidate_the_batch_or_raise_when_strict(toy, make, word):
    env, obs = toy
    q = query_expert(Returns(make), obs, np.arange(N), env.mapping)
    assert not q.valid.any()
    assert all(word in r for r in q.invalid_reason.values()), q.invalid_reason
    with pytest.raises(ContractError, match=word):
        query_expert(Returns(make), obs, np.arange(N), env.mapping, strict=True)


def test_float64_and_cpu_tensors_are_accepted(toy):
    env, obs = toy
    ref = reference(obs, env)
    for conv in (lambda a: a.astype(np.float64), torch.from_numpy):
        expert = Returns(lambda n, conv=conv: ExpertQuery(conv(ref.copy()), np.ones(n, bool)))
        q = query_expert(expert, obs, np.arange(N), env.mapping)
        assert q.valid.all() and q.action.dtype == np.float32
        np.testing.assert_allclose(q.action, ref, rtol=1e-6)


def test_caller_mistakes_raise(toy):
    env, obs = toy
    with pytest.raises(ContractError, match="obs\\['qpos'\\] has"):
        query_expert(make_expert("toy_reach"), obs, np.arange(N - 1), env.mapping)
    bad = Returns(lambda n: None)
    bad.output_space = "joint"
    with pytest.raises(ContractError, match="output_space"):
        query_expert(bad, obs, np.arange(N), env.mapping)


def _scaled_toy_mapping() -> TaskMapping:
    d = load_mapping("toy_reach").model_dump(mode="json")
    d["policy"] = {"low": [-1.0], "high": [1.0], "scale": [0.5], "offset": [0.1]}
    d["expert"] = {"scale": [2.0], "offset": [0.0]}
    return TaskMapping.model_validate(d)


@pytest.mark.parametrize(("space", "expected"), [("policy", [0.35, -0.15]), ("raw", [1.0, -1.0])])
def test_output_space_selects_the_mapping_conversion(toy, space, expected):
    _, obs = toy
    m = _scaled_toy_mapping()
    expert = Returns(lambda n: ExpertQuery(np.tile([[0.5, -0.5]], (n, 1)).astype(np.float32), np.ones(n, bool)))
    expert.output_space = space
    q = query_expert(expert, obs, np.arange(N), m)
    # policy: 0.1 + 0.5 * a ; raw (expert scale 2): 2 * a, clipped to the raw bounds [-1, 1]
    np.testing.assert_allclose(q.action, np.tile(expected, (N, 1)), atol=1e-6)


def test_confidence_is_checked_and_clipped(toy):
    env, obs = toy

    def make(n):
        conf = np.linspace(-0.5, 1.5, n).astype(np.float32)
        conf[0] = np.nan
        return ExpertQuery(np.zeros((n, 2), np.float32), np.ones(n, bool), confidence=conf)

    q = query_expert(Returns(make), obs, np.arange(N), env.mapping)
    assert np.isnan(q.confidence[0])
    assert np.nanmin(q.confidence) >= 0.0 and np.nanmax(q.confidence) == 1.0


def test_with_fallback_replaces_only_invalid_rows(toy):
    env, obs = toy
    q = query_expert(FaultyExpert(env.mapping, 2, "nan"), obs, np.arange(N), env.mapping)
    safe = np.full((N, 2), 0.25, np.float32)
    out = q.with_fallback(safe)
    np.testing.assert_array_equal(out[2], safe[2])
    np.testing.assert_allclose(out[[0, 1, 3, 4, 5]], q.action[[0, 1, 3, 4, 5]])
    env.step(out)  # executable: no NaN reaches the env


def test_expert_flags_unreachable_targets(toy):
    env, obs = toy
    obs = {k: v.copy() for k, v in obs.items()}
    obs["target"][0] = [2.0, 0.0]  # links total 1.0 m
    q = query_expert(make_expert("toy_reach"), obs, np.arange(N), env.mapping)
    assert not q.valid[0] and "beyond the arm's reach" in q.invalid_reason[0]
    assert q.valid[1:].all()


def test_an_empty_batch_asks_nobody(toy):
    env, obs = toy
    expert = FaultyExpert(env.mapping, 0, "raise")
    q = query_expert(expert, {k: v[:0] for k, v in obs.items()}, [], env.mapping)
    assert q.action.shape == (0, 2) and q.valid.shape == (0,) and expert.calls == 0


def test_unknown_kinds_and_tasks_are_named():
    from hg_dagger.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown expert kind 'oracle'"):
        make_expert("toy_reach", kind="oracle")
    with pytest.raises(ConfigError, match="no planner expert for task 'cartpole'"):
        make_expert("cartpole")
    with pytest.raises(ConfigError, match="needs demos"):
        make_expert("toy_reach", kind="demo")
    assert make_expert("fetch_pick_place_rgb").task == "pick_place"  # the camera variant, same planner
