"""Observations under the names of our LeRobot export, and the check of a policy's declared features against a task.

A policy trained on ``hg-dagger export --format lerobot`` reads exactly these names, so it runs unchanged:

    observation.state              float32 [S]      the task mapping's flattened keys, raw (not normalized), in
                                                    flatten order (what the export writes; ``export.names`` names
                                                    each dimension)
    observation.environment_state  float32 [E]      the mapping's ``export.environment_state`` keys (the goal)
    observation.images.<key>       uint8 [H, W, C]  each camera (``/`` in a key becomes ``.``)
    observation.<key>              as the env gives it: every other non-camera key on its own (sent only to a
                                                    policy that declares it)
    task                           str              the task's language instruction, else its id (the export's
                                                    task string)

Normalization stays the policy's own: values go out as the env delivered them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hg_dagger.errors import ConfigError

STATE = "observation.state"
ENV_STATE = "observation.environment_state"
IMAGES = "observation.images."
TASK = "task"


@dataclass(frozen=True)
class Feature:
    """One observation name of the wire: its per-observation shape and dtype, and the mapping keys it holds."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    keys: tuple[str, ...]

    @property
    def image(self) -> bool:
        return self.name.startswith(IMAGES)

    def describe(self) -> str:
        return f"{self.name} {self.dtype}{list(self.shape)}"


def task_text(mapping) -> str:
    """The task string a policy sees: the language instruction, else the task id (as the export writes it)."""
    return mapping.language_instruction or mapping.task_id


def task_features(mapping) -> dict[str, Feature]:
    """Every observation name a task can send, composed first (state, environment state), then cameras, then the
    per-key columns."""
    spec = {k.name: k for k in mapping.observation}
    state = mapping.state_keys()
    feats: dict[str, Feature] = {
        STATE: Feature(STATE, (sum(spec[k].size for k in state),), "float32", tuple(state))}
    env = list(mapping.export.environment_state)
    if env:
        feats[ENV_STATE] = Feature(ENV_STATE, (sum(spec[k].size for k in env),), "float32", tuple(env))
    for k in mapping.observation:
        if k.is_image:
            name = IMAGES + k.name.replace("/", ".")
            feats[name] = Feature(name, tuple(k.shape), "uint8", (k.name,))
    for k in mapping.observation:
        name = "observation." + k.name.replace("/", ".")
        if not k.is_image and name not in feats:
            feats[name] = Feature(name, tuple(k.shape), k.dtype, (k.name,))
    return feats


def default_names(feats: dict[str, Feature]) -> list[str]:
    """What goes out to a policy that declares nothing: the state, the environment state and the cameras."""
    return [n for n, f in feats.items() if n in (STATE, ENV_STATE) or f.image]


def wire_obs(obs: dict[str, np.ndarray], feats: dict[str, Feature], names: list[str], rows) -> dict[str, np.ndarray]:
    """The named observations of ``rows`` of a batch (arrays [len(rows), ...]); composed names are the raw keys
    concatenated as float32."""
    out = {}
    for name in names:
        f = feats[name]
        if name in (STATE, ENV_STATE):
            parts = [np.asarray(obs[k][rows]).reshape(len(rows), -1) for k in f.keys]
            out[name] = np.concatenate(parts, axis=1).astype(np.float32, copy=False)
        else:
            out[name] = np.ascontiguousarray(obs[f.keys[0]][rows])
    return out


def from_wire(msg: dict[str, Any], mapping) -> tuple[dict[str, np.ndarray], bool]:
    """A request's observation back in the mapping's keys ([N, ...]; ``batched`` False: one observation, N = 1):
    the state split into its keys, the cameras by name; keys the request lacks are zeros (a policy server that
    declared what it reads never looks at them)."""
    feats = task_features(mapping)
    state = msg.get(STATE)
    if state is None:
        raise ConfigError(f"the request has no {STATE!r} (it has {', '.join(sorted(map(str, msg))) or 'nothing'})")
    state = np.asarray(state, np.float32)
    width = feats[STATE].shape[0]
    if state.shape[-1:] != (width,) or state.ndim not in (1, 2):
        raise ConfigError(f"{STATE} has shape {list(state.shape)}; task {mapping.task_id} sends [{width}] "
                          f"(or [N, {width}] batched)")
    batched = state.ndim == 2
    state = state.reshape(-1, width)
    n = state.shape[0]
    spec = {k.name: k for k in mapping.observation}
    obs: dict[str, np.ndarray] = {}
    col = 0
    for key in feats[STATE].keys:
        k = spec[key]
        obs[key] = state[:, col : col + k.size].reshape(n, *k.shape).astype(k.dtype)
        col += k.size
    for name, f in feats.items():
        key = f.keys[0]
        if not f.image or key in obs:
            continue
        if name in msg:
            arr = np.asarray(msg[name])
            want = (n, *f.shape) if batched else f.shape
            if arr.shape != want or arr.dtype != np.uint8:
                raise ConfigError(f"{name} is {arr.dtype}{list(arr.shape)}; task {mapping.task_id} sends "
                                  f"uint8{list(want)}")
            obs[key] = arr.reshape(n, *f.shape)
    for k in mapping.observation:
        if k.name not in obs:
            obs[k.name] = np.zeros((n, *k.shape), k.dtype)
    return obs, batched


def declared_inputs(meta: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The observation features a server's metadata declares (LeRobot's ``input_features`` naming: name ->
    {"shape": [...], "dtype"?, "type"?}); None when it declares none (then the defaults go out)."""
    feats = meta.get("input_features")
    if not isinstance(feats, dict) or not feats:
        return None
    return {str(k): (v if isinstance(v, dict) else {}) for k, v in feats.items()}


def declared_action_dim(meta: dict[str, Any]) -> int | None:
    """The action dimension a server declares: ``action_dim``, else ``output_features.action.shape[0]``."""
    if isinstance(meta.get("action_dim"), int | np.integer):
        return int(meta["action_dim"])
    out = meta.get("output_features")
    shape = out.get("action", {}).get("shape") if isinstance(out, dict) and isinstance(out.get("action"), dict) else None
    if isinstance(shape, list | tuple) and len(shape) >= 1:
        return int(shape[-1])
    return None


def check_features(meta: dict[str, Any], mapping, *, where: str) -> list[str]:
    """The names to send to a policy whose metadata is ``meta``, after checking what it declares against the task:
    a name the task cannot send, a wrong shape, or a different action dimension is refused in one line naming it.
    A camera declared channels-first ([C, H, W], as LeRobot's configs write them) is the same camera."""
    feats = task_features(mapping)
    task = mapping.task_id
    dim = declared_action_dim(meta)
    if dim is not None and dim != mapping.action_dim:
        raise ConfigError(f"{where}: the policy acts in {dim} action dimensions; task {task} has {mapping.action_dim} "
                          f"({', '.join(mapping.action.names)})")
    declared = declared_inputs(meta)
    if declared is None:
        return default_names(feats)
    names = []
    for name, d in declared.items():
        if name == TASK:
            continue
        f = feats.get(name)
        if f is None:
            have = ", ".join(f.describe() for f in feats.values())
            raise ConfigError(f"{where}: the policy reads {name!r}, which task {task} does not have (it sends {have})")
        shape = d.get("shape")
        if shape is not None:
            shape = tuple(int(s) for s in shape)
            chw = f.image and len(f.shape) == 3 and shape == (f.shape[2], f.shape[0], f.shape[1])
            if shape != f.shape and not chw:
                raise ConfigError(f"{where}: the policy reads {name} of shape {list(shape)}; task {task} sends "
                                  f"{list(f.shape)} ({', '.join(f.keys)})")
        names.append(name)
    if not names:
        raise ConfigError(f"{where}: the policy declares no observation it reads (input_features has only "
                          f"{', '.join(declared)})")
    return names


__all__ = ["ENV_STATE", "IMAGES", "STATE", "TASK", "Feature", "check_features", "declared_action_dim",
           "declared_inputs", "default_names", "from_wire", "task_features", "task_text", "wire_obs"]
