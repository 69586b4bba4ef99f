"""A LeRobot policy behind ``hg-dagger policy serve lerobot:DIR``, in an environment where LeRobot is installed.

DIR is a ``pretrained_model`` folder as ``lerobot-train`` writes it (config.json, model.safetensors and the saved
pre/post-processors that hold its normalization). The policy class is the one registered for the config's
``type`` (ACT, diffusion, ...); its own preprocessor normalizes each observation and its postprocessor turns the
actions back into raw units. LeRobot is imported only here, when a server is started on such a folder.

Each request is one observation (metadata ``batch`` false) and stands alone: the policy is reset first, so rows
and clients never mix. A policy that predicts from the observation alone (ACT, pi0, ...) answers with its
``predict_action_chunk``: the whole chunk (``chunk_size`` actions; the client executes ``n_action_steps`` of it). A
policy that keeps an observation history (diffusion: ``_queues``) gets the observation through its own
``select_action``, which fills its history with it and queues its next ``n_action_steps`` actions; those are the
reply. Either way the chunk goes through the saved postprocessor, back to raw action units.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from hg_dagger.errors import ConfigError
from hg_dagger.policy.features import IMAGES, TASK
from hg_dagger.policy.wire import PolicyError

WEIGHTS = "model.safetensors"


def read_config(folder: str | Path) -> dict[str, Any]:
    """The folder's config.json (its policy ``type`` and features); a folder that is not a LeRobot
    ``pretrained_model`` is one line saying what is missing."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"lerobot:{folder}: no such folder (give a LeRobot pretrained_model folder, e.g. "
                          f"outputs/train/RUN/checkpoints/last/pretrained_model)")
    path = folder / "config.json"
    if not path.is_file():
        sub = folder / "pretrained_model" / "config.json"
        hint = f" (did you mean lerobot:{sub.parent}?)" if sub.is_file() else ""
        raise ConfigError(f"lerobot:{folder}: no config.json; a LeRobot pretrained_model folder holds config.json "
                          f"and {WEIGHTS}{hint}")
    try:
        cfg = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("type"), str):
        raise ConfigError(f"{path}: no policy 'type' (a LeRobot policy config names its type, e.g. \"act\")")
    return cfg


def weights_version(folder: str | Path, policy_type: str) -> str:
    """``<type>-<sha256 of the weights, 12 hex>`` (of config.json where there are no weights)."""
    folder = Path(folder).expanduser()
    path = folder / WEIGHTS if (folder / WEIGHTS).is_file() else folder / "config.json"
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return f"{policy_type}-{h.hexdigest()[:12]}"


def _shape(feature: Any) -> list[int] | None:
    shape = feature.get("shape") if isinstance(feature, dict) else None
    return [int(s) for s in shape] if isinstance(shape, list) else None


def lerobot_metadata(folder: str | Path, cfg: dict[str, Any] | None = None) -> dict[str, Any]:
    """The server metadata of a LeRobot policy folder, from its config.json alone: cameras declared in the wire's
    layout (uint8 [H, W, C]; LeRobot's configs write [C, H, W]), states as float32."""
    cfg = cfg if cfg is not None else read_config(folder)
    inputs: dict[str, dict[str, Any]] = {}
    for name, feat in (cfg.get("input_features") or {}).items():
        shape = _shape(feat)
        if shape is None:
            continue
        visual = (isinstance(feat, dict) and feat.get("type") == "VISUAL") or str(name).startswith(IMAGES)
        if visual and len(shape) == 3:
            inputs[name] = {"shape": [shape[1], shape[2], shape[0]], "dtype": "uint8"}
        else:
            inputs[name] = {"shape": shape, "dtype": "float32"}
    meta: dict[str, Any] = {
        "policy_version": weights_version(folder, cfg["type"]),
        "policy_type": cfg["type"],
        "input_features": inputs,
        "batch": False,
        "server": "hg-dagger",
        "source": f"lerobot:{Path(folder).expanduser()}",
    }
    action = _shape((cfg.get("output_features") or {}).get("action"))
    if action:
        meta["output_features"] = {"action": {"shape": action, "dtype": "float32"}}
        meta["action_dim"] = action[-1]
    for key, out in (("chunk_size", "chunk_size"), ("horizon", "chunk_size"), ("n_action_steps", "n_action_steps")):
        if isinstance(cfg.get(key), int) and out not in meta:
            meta[out] = cfg[key]
    return meta


class LeRobotServed:
    """A LeRobot ``PreTrainedPolicy`` loaded from a pretrained_model folder, with its saved processors."""

    def __init__(self, folder: str | Path, *, device: str = "cpu"):
        self.folder = Path(folder).expanduser()
        self.cfg = read_config(self.folder)
        self.meta = lerobot_metadata(self.folder, self.cfg)
        try:
            import torch
            from lerobot.policies.factory import get_policy_class, make_pre_post_processors
        except ImportError as exc:
            raise PolicyError(f"lerobot:{self.folder} needs LeRobot, which this Python ({sys.executable}) cannot "
                              f"import ({exc}); run `hg-dagger policy serve` in LeRobot's environment, or give "
                              f"--policy-python (or HG_DAGGER_POLICY_PYTHON) naming that environment's python") from None
        self._torch = torch
        try:
            from lerobot.configs.policies import PreTrainedConfig

            config = PreTrainedConfig.from_pretrained(str(self.folder))
            config.device = device  # the device this server runs on, not the one it was trained on
            self.policy = get_policy_class(self.cfg["type"]).from_pretrained(str(self.folder), config=config)
            self.policy.to(device)
            self.policy.eval()
            on_device = {"device_processor": {"device": device}}
            self.pre, self.post = make_pre_post_processors(
                self.policy.config, pretrained_path=str(self.folder),
                preprocessor_overrides=on_device, postprocessor_overrides=on_device)
        except Exception as exc:  # an unknown type, missing weights or processors: one line naming the folder
            raise PolicyError(f"lerobot:{self.folder}: cannot load the {self.cfg['type']} policy "
                              f"({type(exc).__name__}: {exc})") from None
        self.history = isinstance(getattr(self.policy, "_queues", None), dict)
        if self.history and isinstance(self.cfg.get("n_action_steps"), int):
            self.meta["chunk_size"] = self.cfg["n_action_steps"]  # what a reply holds
        self.inputs = dict(self.meta["input_features"])
        self.device = device

    def metadata(self) -> dict[str, Any]:
        return dict(self.meta)

    def _frame(self, obs: dict[str, Any]) -> dict[str, Any]:
        torch = self._torch
        frame: dict[str, Any] = {}
        for name, feat in self.inputs.items():
            if name not in obs:
                raise PolicyError(f"the request has no {name!r}, which the policy reads")
            arr = np.asarray(obs[name])
            if list(arr.shape) != feat["shape"]:
                raise PolicyError(f"{name} has shape {list(arr.shape)}; the policy reads {feat['shape']} (one "
                                  f"observation per request)")
            if feat["dtype"] == "uint8":  # HWC uint8 -> CHW float in [0, 1], as LeRobot's datasets give frames
                frame[name] = torch.from_numpy(np.ascontiguousarray(arr)).permute(2, 0, 1).float().div_(255.0)
            else:
                frame[name] = torch.from_numpy(np.array(arr, np.float32))
        frame[TASK] = str(obs.get(TASK, ""))
        return frame

    def infer(self, obs: dict[str, Any]) -> dict[str, Any]:
        torch = self._torch
        batch = self.pre(self._frame(obs))
        with torch.no_grad():
            self.policy.reset()  # no history from another row or client
            if self.history:
                first = self.policy.select_action(batch)  # [1, A]; the policy queued its next actions
                chunk = torch.stack([first, *self.policy._queues["action"]], dim=1)
            else:
                chunk = self.policy.predict_action_chunk(batch)  # [1, H, A]
            actions = self.post(chunk)[0]  # [H, A], raw units
        return {"actions": np.asarray(actions.detach().cpu().numpy(), np.float32)}


__all__ = ["LeRobotServed", "lerobot_metadata", "read_config", "weights_version"]
