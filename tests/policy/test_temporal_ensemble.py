"""Temporal ensembling of a served policy's chunks (``--policy-temporal-ensemble``): the policy is asked every tick and
each tick's action is ACT's weighted mean of what the recent chunks predicted for it, older predictions a little
heavier; a handover forgets them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hg_dagger.envs import load_mapping
from hg_dagger.policy import PolicyOptions, RemotePolicy
from hg_dagger.policy.heads import CHUNK_DECAY
from hg_dagger.policy.server import PolicyServer

H = 4


class Ramps:
    """Reply k (from 1) is the chunk [k + 0.1 * step for step in 0..H-1], in both action dims: every chunk says
    something different about the same tick, so the mean is checkable."""

    def __init__(self):
        self.k = 0

    def metadata(self):
        return {"policy_version": "ramps-test", "chunk_size": H, "n_action_steps": H}

    def infer(self, obs):
        self.k += 1
        step = np.arange(H, dtype=np.float32)[:, None]
        return {"actions": np.repeat(self.k + 0.1 * step, 2, axis=1) / 100}


@pytest.fixture
def server():
    s = PolicyServer(Ramps(), port=0).start()
    yield s
    s.shutdown()


def expected(t: int) -> float:
    """Tick t (from 1, reply t made now): the chunks of replies t-a, a = 0..H-1, each predicting (t-a) + 0.1 a."""
    preds = [((t - a) + 0.1 * a, math.exp(CHUNK_DECAY * a)) for a in range(H) if t - a >= 1]
    return sum(v * w for v, w in preds) / sum(w for _, w in preds) / 100


def test_each_tick_acts_on_the_weighted_mean_of_the_chunks_that_cover_it(server):
    mapping = load_mapping("toy_reach")
    obs = {k.name: np.zeros((1, *k.shape), k.dtype) for k in mapping.observation}
    with RemotePolicy(server.address, mapping, PolicyOptions(temporal_ensemble=True)) as policy:
        assert policy.action_steps == 1  # asked every tick
        policy.reset_rows([0], 1)
        got = [float(policy.act(obs).action[0, 0]) for _ in range(7)]
        np.testing.assert_allclose(got, [expected(t) for t in range(1, 8)], rtol=1e-5)
        assert policy.requests == 7
        policy.drop_chunks([0])  # a handover: the next action comes from the fresh chunk alone
        assert float(policy.act(obs).action[0, 0]) == pytest.approx(8 / 100, rel=1e-5)


def test_without_the_option_a_chunk_runs_to_its_end(server):
    mapping = load_mapping("toy_reach")
    obs = {k.name: np.zeros((1, *k.shape), k.dtype) for k in mapping.observation}
    with RemotePolicy(server.address, mapping) as policy:
        policy.reset_rows([0], 1)
        got = [float(policy.act(obs).action[0, 0]) for _ in range(H)]
        np.testing.assert_allclose(got, [(1 + 0.1 * s) / 100 for s in range(H)], rtol=1e-5)
        assert policy.requests == 1
