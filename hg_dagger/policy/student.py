"""The student policy: a small torch ensemble that acts on batched observations.

K members (an MLP for state tasks; a shared CNN encoder with K MLP heads for camera tasks)
predict the action in the task's normalized policy space; their mean is the action and their
spread is the per-env uncertainty the gates use. ``act`` returns actions in the RAW action space
(through ``mapping.policy_to_raw``), so a student is a drop-in action source beside people and
experts. Every output carries ``student.version``: a content hash of the weights plus the round.
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hg_dagger.errors import ConfigError, ContractError
from hg_dagger.policy.checkpoint_file import check_mapping, first_line, read_checkpoint, save_checkpoint
from hg_dagger.policy.heads import CHUNK, GMMHead, TemporalEnsemble, split_kind

# <encoder>[_<head>]: heads beyond MSE live in policy/heads.py
KINDS = ("mlp", "cnn", "mlp_gmm", "cnn_gmm", "mlp_chunk", "cnn_chunk")


def one_inference_thread() -> None:
    """One intra-op thread for a control loop's student: its batches are small, so a second thread gains nothing,
    and one waiting on a core that another thread holds (the recorder, the env) turns a 1 ms act() into tens of
    milliseconds. Set by the loops that own their process (the app's control process, `hg-dagger run`)."""
    torch.set_num_threads(1)


@contextmanager
def one_inference_thread_while() -> Iterator[None]:
    """``one_inference_thread`` for a rollout inside a process that also trains (``auto``, the benchmarks): under
    load, a batch of 8 acted in 0.3 ms on one thread and 6.5 ms on two. The trainer's threads come back after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class PolicyOutput:
    action: np.ndarray  # float32 [N, A], raw action space
    uncertainty: np.ndarray  # float32 [N], ensemble disagreement (normalized units)
    confidence: np.ndarray  # float32 [N], in [0, 1]
    inference_ns: int  # wall time of the whole act() call
    policy_action: np.ndarray | None = None  # float32 [N, A], policy space (before policy_to_raw)


@dataclass
class StudentSpec:
    """Architecture; stored in checkpoints so a student rebuilds without its config file."""

    kind: str = "mlp"
    ensemble: int = 5
    hidden: tuple[int, ...] = (256, 256)
    state_dim: int = 0
    action_dim: int = 0
    image_keys: tuple[str, ...] = ()
    image_shape: tuple[int, ...] = ()  # (H, W, C) of every camera
    cnn_channels: tuple[int, ...] = (16, 32, 32, 32)
    cnn_features: int = 64

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in self.__dict__.items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StudentSpec:
        kw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}
        return cls(**kw)


class EnsembleLinear(nn.Module):
    """K independent linear layers applied in one batched matmul: [K, N, in] -> [K, N, out]."""

    def __init__(self, k: int, n_in: int, n_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(k, n_in, n_out))
        self.bias = nn.Parameter(torch.empty(k, 1, n_out))
        bound = 1.0 / math.sqrt(n_in)
        nn.init.uniform_(self.weight, -bound, bound)
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(self.bias, x, self.weight)


_ACT_BUFFERS: weakref.WeakKeyDictionary[nn.Module, dict[tuple[int, int], list[torch.Tensor]]] = weakref.WeakKeyDictionary()


class EnsembleMLP(nn.Module):
    def __init__(self, k: int, n_in: int, hidden: tuple[int, ...], n_out: int):
        super().__init__()
        sizes = [n_in, *hidden, n_out]
        self.layers = nn.ModuleList(EnsembleLinear(k, a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, in] (shared by all members) or [K, N, in] -> [K, N, out]."""
        if x.dim() == 2:
            x = x.unsqueeze(0).expand(self.k, -1, -1)
        if torch.is_inference_mode_enabled():
            return self._infer(x)
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x

    def _infer(self, x: torch.Tensor) -> torch.Tensor:
        """Acting: the hidden layers write into buffers kept per thread and batch size. Fresh activations every
        tick landed wherever the allocator put them between the control loop's own arrays, and reading them cold
        made ``act`` inside a session ~10% slower than alone (docs/benchmarks.md). The result is a new tensor."""
        bufs = self._buffers_for(threading.get_ident(), x.shape[1])
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            if i == last:
                return torch.baddbmm(layer.bias, x, layer.weight)
            x = torch.relu_(torch.baddbmm(layer.bias, x, layer.weight, out=bufs[i]))
        return x

    def _buffers_for(self, thread: int, rows: int) -> list[torch.Tensor]:
        cache = _ACT_BUFFERS.setdefault(self, {})  # not an attribute: pickles and state dicts stay as they were
        bufs = cache.get((thread, rows))
        if bufs is None or any(b.dtype != layer.weight.dtype for b, layer in zip(bufs, self.layers, strict=False)):
            if len(cache) > 8:  # batch sizes come and go (evaluation, calibration): keep the newest few
                cache.clear()
            bufs = cache[(thread, rows)] = [torch.empty(self.k, rows, layer.weight.shape[2], dtype=layer.weight.dtype)
                                            for layer in self.layers[:-1]]
        return bufs


class ConvEncoder(nn.Module):
    """A small strided CNN for uint8 HxWxC frames -> a feature vector."""

    def __init__(self, image_shape: tuple[int, ...], channels: tuple[int, ...], features: int):
        super().__init__()
        _, _, c_in = image_shape
        layers: list[nn.Module] = []
        for c in channels:
            layers += [nn.Conv2d(c_in, c, kernel_size=3, stride=2, padding=1), nn.ReLU()]
            c_in = c
        self.conv = nn.Sequential(*layers)
        self.proj = nn.Linear(c_in, features)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = img.permute(0, 3, 1, 2).float().div_(255.0)
        x = self.conv(x).mean(dim=(2, 3))
        return torch.relu(self.proj(x))


def image_keys_of(obs_spec: dict[str, tuple[tuple[int, ...], Any]]) -> list[str]:
    return [k for k, (shape, dtype) in obs_spec.items() if np.dtype(dtype) == np.uint8 and len(shape) == 3]


class StudentNet(nn.Module):
    """Normalization buffers + (optional) image encoder + ensemble MLP, all in one state_dict."""

    def __init__(self, spec: StudentSpec):
        super().__init__()
        self.spec = spec
        n_in = spec.state_dim
        self.encoders = nn.ModuleDict()
        for key in spec.image_keys:
            self.encoders[key] = ConvEncoder(spec.image_shape, spec.cnn_channels, spec.cnn_features)
            n_in += spec.cnn_features
        head = split_kind(spec.kind)[1]
        self.horizon = CHUNK if head == "chunk" else 1  # actions predicted per step (a chunk head: several)
        self.head: GMMHead | EnsembleMLP
        if head == "gmm":
            self.head = GMMHead(EnsembleMLP(spec.ensemble, n_in, spec.hidden, GMMHead.width(spec.action_dim)),
                                spec.action_dim)
        else:
            self.head = EnsembleMLP(spec.ensemble, n_in, spec.hidden, spec.action_dim * self.horizon)
        self.register_buffer("obs_mean", torch.zeros(spec.state_dim))
        self.register_buffer("obs_std", torch.ones(spec.state_dim))
        self.register_buffer("act_mean", torch.zeros(spec.action_dim))
        self.register_buffer("act_std", torch.ones(spec.action_dim))
        self.register_buffer("uncertainty_ref", torch.ones(()))
        if self.horizon > 1:  # share of training rows whose chunk target reached each step ahead (set by training)
            self.register_buffer("chunk_coverage", torch.ones(self.horizon))

    def features(self, state: torch.Tensor, images: dict[str, torch.Tensor]) -> torch.Tensor:
        x = normalize_state(state, self.obs_mean, self.obs_std)
        if self.spec.image_keys:
            x = torch.cat([x] + [self.encoders[k](images[k]) for k in self.spec.image_keys], dim=-1)
        return x

    def chunks(self, state: torch.Tensor, images: dict[str, torch.Tensor]) -> torch.Tensor:
        """Normalized per-member predictions of the next ``horizon`` actions [K, N, H, A] (H = 1 but for a chunk
        head)."""
        return self.as_chunks(self.head(self.features(state, images)))

    def as_chunks(self, z: torch.Tensor) -> torch.Tensor:
        """The head's output [K, N, H * A] -> [K, N, H, A]."""
        return z.reshape(*z.shape[:2], self.horizon, self.spec.action_dim)

    def forward(self, state: torch.Tensor, images: dict[str, torch.Tensor]) -> torch.Tensor:
        """Normalized per-member predictions of the current action [K, N, A]."""
        if self.horizon > 1:
            return self.chunks(state, images)[:, :, 0]
        return self.head(self.features(state, images))

    def member_loss(self, state: torch.Tensor, images: dict[str, torch.Tensor], z_target: torch.Tensor,
                    valid: torch.Tensor | None = None) -> torch.Tensor:
        """Per-member, per-row training loss [K, B] against normalized targets: the squared error over [B, A],
        the mixture's negative log-likelihood for a GMM head, or for a chunk head the squared error over the
        chunk's valid steps (targets [B, H, A], ``valid`` [B, H]; the current step is always valid)."""
        if self.horizon > 1:
            err = ((self.chunks(state, images) - z_target.unsqueeze(0)) ** 2).mean(-1)  # [K, B, H]
            assert valid is not None  # a chunk head's loss needs its valid steps
            w = valid.to(err.dtype).unsqueeze(0)
            return (err * w).sum(-1) / w.sum(-1).clamp(min=1.0)
        x = self.features(state, images)
        if isinstance(self.head, GMMHead):
            return self.head.nll(x, z_target)
        return ((self.head(x) - z_target.unsqueeze(0)) ** 2).mean(-1)


@dataclass
class Lineage:
    """One training round: what it started from and what it saw."""

    round: int
    parent_version: str
    version: str = ""
    info: dict[str, Any] = field(default_factory=dict)


class Student:
    """A trained (or fresh) student bound to one task mapping."""

    def __init__(self, mapping, spec: StudentSpec, *, seed: int = 0, round: int = 0):
        self.mapping = mapping
        self.spec = spec
        with torch.random.fork_rng(devices=[]):  # seeded init without touching the caller's RNG
            torch.manual_seed(seed)
            self.net = StudentNet(spec)
        self.net.eval()
        self.round = int(round)
        self.seed = int(seed)
        self.lineage: list[dict[str, Any]] = []
        self._version: str | None = None
        # the gate thresholds calibrated for these weights (policy.checkpoint stores them with the student):
        # {"confidence": {"trigger", "warn", "samples", "target_rate", "uncertainty": {min, p50, p90, max}}}
        self.gate_thresholds: dict[str, Any] = {}
        self._rollout: TemporalEnsemble | None = None  # a chunk head's per-row memory in a rollout

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(cls, mapping, kind: str = "mlp", ensemble: int = 5, seed: int = 0,
               hidden: tuple[int, ...] = (256, 256), **cnn) -> Student:
        if kind not in KINDS:
            raise ConfigError(f"student kind {kind!r} is unknown; known kinds: {', '.join(KINDS)}")
        if int(ensemble) < 1:
            raise ConfigError(f"student ensemble must be >= 1, got {ensemble}")
        spec_obs = mapping.obs_spec()
        images = image_keys_of(spec_obs)
        encoder = split_kind(kind)[0]
        if encoder == "mlp" and images:
            images = []  # a state-only student on a camera task ignores the cameras
        if encoder == "cnn" and not images:
            raise ConfigError(f"student kind {kind!r} needs a camera observation; task {mapping.task_id} has none "
                              f"(keys: {', '.join(spec_obs)})")
        shapes = {tuple(spec_obs[k][0]) for k in images}
        if len(shapes) > 1:
            raise ConfigError(f"task {mapping.task_id}: cameras of different shapes {sorted(shapes)} are not supported")
        spec = StudentSpec(
            kind=kind, ensemble=int(ensemble), hidden=tuple(int(h) for h in hidden),
            state_dim=state_dim_of(mapping), action_dim=int(mapping.action_dim),
            image_keys=tuple(images), image_shape=tuple(shapes.pop()) if shapes else (), **cnn,
        )
        return cls(mapping, spec, seed=seed)

    @classmethod
    def load(cls, source: str | os.PathLike | bytes, mapping) -> Student:
        """A Student from a checkpoint file or snapshot bytes; refuses a different mapping."""
        where = "<bytes>" if isinstance(source, bytes) else str(source)
        data = read_checkpoint(source)
        check_mapping(data, mapping, where=where)
        try:
            student = cls(mapping, StudentSpec.from_dict(data["spec"]), seed=data["seed"], round=data["round"])
        except (TypeError, ValueError, KeyError, RuntimeError) as exc:
            raise ConfigError(f"{where}: corrupt student checkpoint (stored spec unusable: {first_line(exc)})") from None
        try:
            student.net.load_state_dict(data["state_dict"])
        except RuntimeError as exc:
            raise ConfigError(f"{where}: weights do not match the stored architecture "
                              f"({' '.join(str(exc).split())[:300]})") from None
        student.lineage = list(data["lineage"])
        student.weights_changed()
        if student.version != data["version"]:
            raise ContractError(f"{where}: weights hash to {student.version}, the file says {data['version']} "
                                f"(corrupt?)")
        stored = (data.get("extra") or {}).get("gate_thresholds")
        student.gate_thresholds = dict(stored) if isinstance(stored, dict) else {}
        return student

    def save(self, path, **extra) -> None:
        save_checkpoint(path, self, **extra)

    # ------------------------------------------------------------------ identity

    @property
    def version(self) -> str:
        if self._version is None:
            self._version = f"{self.content_hash()[:12]}-r{self.round}"
        return self._version

    def content_hash(self) -> str:
        h = hashlib.sha256()
        h.update(repr(sorted(self.spec.as_dict().items())).encode())
        for name, t in sorted(self.net.state_dict().items()):
            h.update(name.encode())
            h.update(t.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()

    def weights_changed(self) -> None:
        """Call after any in-place change of the weights; the version is recomputed on demand, and thresholds
        calibrated for the old weights no longer hold."""
        self._version = None
        self.gate_thresholds = {}
        if self._rollout is not None:  # chunks of the old weights say nothing about the new ones' actions
            self._rollout.forget(np.arange(self._rollout.n))
            self._rollout.trust(self.net.chunk_coverage.numpy())

    def finish_round(self, info: dict[str, Any]) -> str:
        """Close a training round: bump the round, record lineage, return the new version."""
        parent = self.version
        self.round += 1
        self.weights_changed()
        self.lineage.append(Lineage(self.round, parent, self.version, dict(info)).__dict__)
        return self.version

    def reset_weights(self, seed: int) -> None:
        """Fresh initial weights (same architecture and parameter objects) drawn with ``seed``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            fresh = StudentNet(self.spec)
        self.net.load_state_dict(fresh.state_dict())
        self.weights_changed()

    # ------------------------------------------------------------------ inputs

    def encode(self, obs: dict[str, np.ndarray]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Observation dict -> (flat normalized-by-mapping state, raw uint8 images) tensors."""
        state = torch.from_numpy(np.ascontiguousarray(self.mapping.flatten_obs(obs), dtype=np.float32))
        if state.shape[-1] != self.spec.state_dim:
            raise ConfigError(f"task {self.mapping.task_id}: flattened observation has {state.shape[-1]} values, "
                              f"the student expects {self.spec.state_dim}")
        images = {k: torch.from_numpy(np.ascontiguousarray(obs[k])) for k in self.spec.image_keys}
        return state, images

    def set_normalization(self, states: np.ndarray, policy_actions: np.ndarray) -> None:
        """Per-dimension mean/std of training inputs and targets (policy space)."""
        for name, data in (("obs", states), ("act", policy_actions)):
            data = torch.as_tensor(np.asarray(data, dtype=np.float32))
            mean = data.mean(0) if len(data) else torch.zeros(data.shape[-1])
            std = data.std(0, unbiased=False) if len(data) > 1 else torch.ones(data.shape[-1])
            getattr(self.net, f"{name}_mean").copy_(mean)
            getattr(self.net, f"{name}_std").copy_(torch.clamp(std, min=1e-3))
        self.weights_changed()

    # ------------------------------------------------------------------ acting

    def reset_rows(self, rows, num_envs: int) -> None:
        """Episodes begin in ``rows`` of a rollout over ``num_envs`` rows (the engine and the session say so).
        A chunk head then forgets those rows' earlier chunks; from here on ``act`` on ``num_envs`` rows
        ensembles each row's chunks over time. Other heads act on each step alone: nothing to forget."""
        if self.net.horizon <= 1:
            return
        if self._rollout is None or self._rollout.n != num_envs:
            self._rollout = TemporalEnsemble(num_envs, self.net.horizon, self.spec.action_dim,
                                             self.net.chunk_coverage.numpy())
        self._rollout.forget(rows)

    def predict_members(self, state: torch.Tensor, images: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-member actions in policy space [K, N, A] (differentiable)."""
        z = self.net(state, images)
        return to_policy_units(z, self.net.act_mean, self.net.act_std)

    def acting(self) -> AbstractContextManager[None]:
        """How a rollout runs this student (the engine enters it around a run): on one intra-op thread."""
        return one_inference_thread_while()

    @torch.inference_mode()
    def act(self, obs: dict[str, np.ndarray]) -> PolicyOutput:
        """The ensemble's mean action, its spread and confidence. Only the network runs in torch: each torch call
        hands the interpreter lock to the recorder's threads, so the small arithmetic around it is numpy's."""
        t0 = time.perf_counter_ns()
        net = self.net
        act_std, act_mean = net.act_std.numpy(), net.act_mean.numpy()
        out = net.head(self._act_input(obs))
        if net.horizon > 1:
            chunks = net.as_chunks(out).numpy()  # normalized [K, N, H, A]
            z = chunks[:, :, 0]
            chunk = to_policy_units(chunks.mean(0), act_mean, act_std)
        else:
            z = out.numpy()  # normalized [K, N, A]
        if z.shape[0] > 1:
            unc = z.std(0).mean(-1, dtype=np.float32)
        else:
            unc = np.zeros(z.shape[1], np.float32)
        conf = np.exp(-unc / net.uncertainty_ref.numpy())
        if net.horizon > 1:
            rollout = self._rollout
            now = rollout.step(chunk) if rollout is not None and rollout.n == len(chunk) else chunk[:, 0]
            policy = np.asarray(now, np.float32)
        else:
            policy = to_policy_units(z.mean(0), act_mean, act_std).astype(np.float32, copy=False)
        raw = np.asarray(self.mapping.policy_to_raw(policy), dtype=np.float32)
        return PolicyOutput(
            action=raw,
            uncertainty=unc.astype(np.float32, copy=False),
            confidence=conf.astype(np.float32, copy=False),
            inference_ns=time.perf_counter_ns() - t0,
            policy_action=policy,
        )

    def _act_input(self, obs: dict[str, np.ndarray]) -> torch.Tensor:
        """The head's input for acting. A state-only student's is normalized and repeated for each member in
        numpy, [K, N, in]: each torch call hands the interpreter lock to the recorder's threads, and those small
        calls took longer inside a session than the network's layers did (docs/benchmarks.md)."""
        state, images = self.encode(obs)
        if self.spec.image_keys:
            return self.net.features(state, images)
        x = normalize_state(state.numpy(), self.net.obs_mean.numpy(), self.net.obs_std.numpy())
        return torch.from_numpy(np.repeat(x[None], self.spec.ensemble, axis=0))

    @torch.inference_mode()
    def calibrate_confidence(self, obs: dict[str, np.ndarray], quantile: float = 0.95) -> float:
        """Set the uncertainty that maps to confidence exp(-1): the given quantile over in-distribution obs."""
        state, images = self.encode(obs)
        z = self.net(state, images)
        unc = z.std(0, unbiased=False).mean(-1) if z.shape[0] > 1 else torch.zeros(1)
        ref = float(torch.quantile(unc, quantile)) if unc.numel() else 1.0
        self.net.uncertainty_ref.fill_(max(ref, 1e-6))
        self.weights_changed()
        return ref


def normalize_state(state, mean, std):
    """A flat state (torch for training, numpy for acting) in the network's input units."""
    return (state - mean) / std


def to_policy_units(z, mean, std):
    """A normalized action (torch for training, numpy for acting) in the policy's units."""
    return z * std + mean


def state_dim_of(mapping) -> int:
    """Width of mapping.flatten_obs for one observation (probed with a zero observation)."""
    zero = {k: np.zeros((1, *shape), dtype=dtype) for k, (shape, dtype) in mapping.obs_spec().items()}
    return int(np.asarray(mapping.flatten_obs(zero)).shape[-1])
