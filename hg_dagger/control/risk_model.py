"""The learned failure estimate behind the risk gate (ThriftyDAgger's risk half), fit on recorded outcomes."""

from __future__ import annotations

import numpy as np

from hg_dagger.errors import ConfigError


class RiskModel:
    """P(failure | state) as a one-hidden-layer MLP in numpy (cheap on the hot path, no torch import).

    Features are the observation keys it was fit on, flattened in order and standardized with the
    training data's mean/std; ``fit`` is full-batch Adam on the class-balanced logistic loss with an L2
    penalty (``l2``): a few hundred recorded states must not give saturated, overconfident risks, or the
    quantile calibration has nothing to separate."""

    def __init__(self, keys: list[str], mean: np.ndarray, std: np.ndarray, w1: np.ndarray, b1: np.ndarray,
                 w2: np.ndarray, b2: np.ndarray):
        self.keys, self.mean, self.std = list(keys), mean.astype(np.float32), std.astype(np.float32)
        self.w1, self.b1, self.w2, self.b2 = (a.astype(np.float32) for a in (w1, b1, w2, b2))

    @staticmethod
    def features(obs: dict[str, np.ndarray], keys: list[str]) -> np.ndarray:
        return np.concatenate([np.asarray(obs[k], np.float32).reshape(len(obs[k]), -1) for k in keys], axis=1)

    @classmethod
    def fit(cls, obs: dict[str, np.ndarray], failed: np.ndarray, *, keys: list[str] | None = None, hidden: int = 32,
            steps: int = 200, lr: float = 1e-2, l2: float = 1e-2, seed: int = 0) -> RiskModel:
        keys = list(keys or obs)
        x = cls.features(obs, keys).astype(np.float64)
        y = np.asarray(failed, np.float64).ravel()
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(f"risk model: {len(x)} states and {len(y)} outcomes")
        mean, std = x.mean(0), x.std(0) + 1e-6
        z = (x - mean) / std
        rng = np.random.default_rng(seed)
        params = [rng.normal(0, 1 / np.sqrt(z.shape[1]), (z.shape[1], hidden)), np.zeros(hidden),
                  rng.normal(0, 1 / np.sqrt(hidden), (hidden,)), np.zeros(1)]
        pos = y.mean()
        w = np.where(y > 0.5, 0.5 / max(pos, 1e-6), 0.5 / max(1 - pos, 1e-6)) / len(y)  # balanced classes
        m = [np.zeros_like(p) for p in params]
        v = [np.zeros_like(p) for p in params]
        for t in range(1, steps + 1):
            w1, b1, w2, b2 = params
            h = np.tanh(z @ w1 + b1)
            p = 1.0 / (1.0 + np.exp(-(h @ w2 + b2)))
            d = (p - y) * w  # d loss / d logit
            dh = np.outer(d, w2) * (1 - h**2)
            grads = [z.T @ dh + l2 * w1, dh.sum(0), h.T @ d + l2 * w2, np.array([d.sum()])]
            for i, g in enumerate(grads):
                m[i] = 0.9 * m[i] + 0.1 * g
                v[i] = 0.999 * v[i] + 0.001 * g * g
                params[i] = params[i] - lr * (m[i] / (1 - 0.9**t)) / (np.sqrt(v[i] / (1 - 0.999**t)) + 1e-8)
        return cls(keys, mean, std, *params)

    def predict(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        z = (self.features(obs, self.keys) - self.mean) / self.std
        logit = np.tanh(z @ self.w1 + self.b1) @ self.w2 + self.b2
        return (1.0 / (1.0 + np.exp(-np.clip(logit, -30, 30)))).astype(np.float32)

    def save(self, path) -> None:
        with open(path, "wb") as f:
            np.savez(f, keys=np.array(self.keys), mean=self.mean, std=self.std, w1=self.w1, b1=self.b1, w2=self.w2,
                     b2=self.b2)

    @classmethod
    def load(cls, path) -> RiskModel:
        try:
            with np.load(path) as d:
                return cls([str(k) for k in d["keys"]], d["mean"], d["std"], d["w1"], d["b1"], d["w2"], d["b2"])
        except (OSError, KeyError, ValueError) as exc:
            raise ConfigError(f"{path}: not a risk model file ({type(exc).__name__}: {exc})") from None

