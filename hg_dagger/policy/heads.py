"""Student heads beyond the MSE regressor: a mixture-density (GMM) head per ensemble member, and action
chunks with temporal ensembling.

An MSE head that sees the planner hover in one state and descend in a nearly identical one learns the
average of the two, a hover that never ends. A mixture head keeps both: each member predicts
``MIXTURES`` diagonal Gaussians over the normalized action (weights, means, scales) and acts on the mean
of its most probable component, so a switch is a change of component rather than a blend. It is
stateless per step (unlike chunking with temporal ensembling, which needs the loop to tell it where
episodes and hand-backs begin), so it drops into ``act`` unchanged: the members' modes are the
per-member actions, their mean is the action and their spread is the uncertainty the confidence gate
reads, exactly as for the MSE ensemble.

A chunk head (``kind: mlp_chunk``, ACT-style) predicts the next ``CHUNK`` actions at once. It trains on
chunks of one label segment (learn.aggregate: a chunk never crosses a handover boundary or mixes label
sources; steps past the segment's end are masked out of the loss), so the hover and the descent that
follow a state are a sequence to predict, not two labels to average. In a rollout the action of a row
is the weighted mean of what its last ``CHUNK`` predictions said about the current step
(``TemporalEnsemble``), each weighed by how often training supervised a step that far ahead; a row forgets
its predictions when an episode begins in it. The uncertainty the
gate reads is the members' spread over the current step of the newest chunk.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

MIXTURES = 5  # components per member (robomimic's BC-GMM uses 5)
MIN_STD = 0.1  # normalized action units: a component never collapses onto one label (0.01 closed the loop
# at 33% where 0.1 reached 73% on the same FetchPickAndPlace labels, docs/learning.md "Student heads")
CHUNK = 10  # steps per predicted chunk (0.4 s at 25 Hz)
CHUNK_DECAY = 0.01  # temporal ensembling: an older prediction of a step weighs exp(CHUNK_DECAY) more (ACT's m)
HEADS = ("gmm", "chunk")


def split_kind(kind: str) -> tuple[str, str]:
    """'mlp' -> ('mlp', 'mse'); 'cnn_gmm' -> ('cnn', 'gmm'). The head rides in the kind, so a student
    config (``kind: mlp_gmm``) selects it everywhere a kind is read, and MSE students keep their hashes."""
    base, _, head = kind.partition("_")
    return base, head or "mse"


class GMMHead(nn.Module):
    """Wraps an ensemble trunk whose last layer is ``width(A)`` wide: [K, N, in] -> mixture parameters."""

    def __init__(self, trunk: nn.Module, action_dim: int, mixtures: int = MIXTURES):
        super().__init__()
        self.trunk = trunk
        self.m = int(mixtures)
        self.a = int(action_dim)

    @staticmethod
    def width(action_dim: int, mixtures: int = MIXTURES) -> int:
        return mixtures * (1 + 2 * action_dim)

    def params(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """logits [K, N, M], means [K, N, M, A], stds [K, N, M, A] (normalized action units)."""
        out = self.trunk(x)
        k, n = out.shape[:2]
        logits = out[..., : self.m]
        rest = out[..., self.m:].reshape(k, n, self.m, 2, self.a)
        return logits, rest[..., 0, :], F.softplus(rest[..., 1, :]) + MIN_STD

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Per-member action [K, N, A]: the mean of each member's most probable component."""
        logits, means, _ = self.params(x)
        best = logits.argmax(-1)  # [K, N]
        return torch.gather(means, 2, best[..., None, None].expand(-1, -1, 1, self.a)).squeeze(2)

    def nll(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Negative log-likelihood of ``target`` [B, A] under each member's mixture, per action dim: [K, B]."""
        logits, means, stds = self.params(x)
        z = (target[None, :, None, :] - means) / stds
        comp = -0.5 * z.pow(2).sum(-1) - stds.log().sum(-1) - 0.5 * self.a * math.log(2 * math.pi)  # [K, B, M]
        return -torch.logsumexp(torch.log_softmax(logits, -1) + comp, dim=-1) / self.a


class TemporalEnsemble:
    """Per-row memory of a rollout's last ``CHUNK`` predicted chunks; the action of a step is their weighted
    mean over that step (older predictions a little heavier, as ACT weighs them)."""

    def __init__(self, num_envs: int, horizon: int, action_dim: int, coverage: np.ndarray | None = None):
        self.n, self.h = int(num_envs), int(horizon)
        self.chunks = np.zeros((self.n, self.h, self.h, int(action_dim)), np.float32)  # [row, age, step, A]
        self.valid = np.zeros((self.n, self.h), bool)  # [row, age]: a prediction made ``age`` steps ago
        self._ages = np.arange(self.h)
        self.trust(np.ones(self.h) if coverage is None else coverage)

    def trust(self, coverage: np.ndarray) -> None:
        """Weigh a prediction made ``age`` steps ago by how often training supervised a step that far ahead
        (``coverage[age]``, the student's ``chunk_coverage``): where labels come in short segments, most far
        steps of a chunk were padding, and their predictions are not averaged in as if they had been learnt."""
        cov = np.clip(np.asarray(coverage, np.float32), 0.0, 1.0)
        self.weights = (np.exp(CHUNK_DECAY * self._ages) * cov).astype(np.float32)  # by age
        self.weights[0] = max(float(self.weights[0]), 1e-6)  # the newest chunk's own step always counts

    def forget(self, rows) -> None:
        """An episode begins in ``rows``: their earlier predictions say nothing about it."""
        self.valid[np.asarray(rows, np.int64)] = False

    def step(self, chunk: np.ndarray) -> np.ndarray:
        """Take each row's newest chunk [N, H, A] (policy space); the current action of each row [N, A]."""
        self.chunks[:, 1:] = self.chunks[:, :-1]
        self.valid[:, 1:] = self.valid[:, :-1]
        self.chunks[:, 0] = chunk
        self.valid[:, 0] = True
        now = self.chunks[:, self._ages, self._ages]  # [N, age, A]: what each prediction said about this step
        w = self.valid * self.weights  # [N, age]
        return (now * w[..., None]).sum(1) / w.sum(1, keepdims=True)
