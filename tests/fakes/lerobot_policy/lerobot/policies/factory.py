"""ACT's shape of acting, with a fixed linear map for a network: ``predict_action_chunk`` computes a chunk of
``chunk_size`` actions [B, H, A] from the state; ``select_action`` queues its first ``n_action_steps`` in
``_action_queue`` (each [B, A]) and returns the first; ``reset`` empties the queue. ``from_pretrained(dir, config=)``
takes a config as LeRobot's does. The preprocessor adds the batch dimension, the postprocessor returns actions as
they are (LeRobot's own normalize and unnormalize); both take LeRobot's override keywords."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from types import SimpleNamespace

import torch


class FakeACT:
    def __init__(self, config):
        self.config = config if isinstance(config, SimpleNamespace) else SimpleNamespace(**config)
        config = vars(self.config)
        state = config["input_features"]["observation.state"]["shape"][0]
        action = config["output_features"]["action"]["shape"][0]
        g = torch.Generator().manual_seed(0)
        self.weight = torch.randn(action, state, generator=g) * 0.3
        self._action_queue: deque = deque(maxlen=config["n_action_steps"])

    @classmethod
    def from_pretrained(cls, path: str, config=None) -> FakeACT:
        return cls(config if config is not None else json.loads((Path(path) / "config.json").read_text()))

    def to(self, device):
        return self

    def eval(self):
        return self

    def reset(self) -> None:
        self._action_queue.clear()

    def predict_action_chunk(self, batch: dict) -> torch.Tensor:
        base = torch.tanh(batch["observation.state"] @ self.weight.T)  # [B, A]
        return torch.stack([base * (1.0 - 0.1 * k) for k in range(self.config.chunk_size)], dim=1)

    def select_action(self, batch: dict) -> torch.Tensor:
        if not self._action_queue:
            self._action_queue.extend(self.predict_action_chunk(batch)[:, : self.config.n_action_steps].transpose(0, 1))
        return self._action_queue.popleft()


def get_policy_class(name: str):
    if name != "act":
        raise ValueError(f"Policy type '{name}' is not available.")
    return FakeACT


def make_pre_post_processors(config, pretrained_path: str, **overrides):
    def pre(frame: dict) -> dict:
        return {k: (v.unsqueeze(0) if isinstance(v, torch.Tensor) else v) for k, v in frame.items()}

    def post(action: torch.Tensor) -> torch.Tensor:
        return action

    return pre, post
