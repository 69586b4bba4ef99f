"""Reading a store's trainable labels: the rows of an episode that the contract lets a trainer use.

Every reader that trains or counts training labels (train, auto, evaluation, report, dataset builds, exports) reads
them here, so the training boundary (contract.training_selection under the store's reviewer roster) is applied in one
place, below every layer that uses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hg_dagger.contract import LabelMask, LabelTarget, TrainingRule, TrainingSelection
from hg_dagger.contract.enums import INTERVENTION_SOURCES
from hg_dagger.contract.labels import training_selection
from hg_dagger.errors import ContractError
from hg_dagger.store.store import EpisodeInfo, EpisodeStore

_TRAINABLE = LabelMask.TRAINABLE.code
_TARGET_FIELD = {LabelTarget.EXPERT_ACTION.code: "expert_action", LabelTarget.APPLIED_ACTION.code: "applied_action"}
LABEL_FIELDS = ("expert_action", "applied_action", "action_source")  # read besides obs and the label layer


@dataclass
class EpisodeLabels:
    """The trainable rows of one episode."""

    episode_id: str
    iteration: int
    success: bool
    num_steps: int
    obs: dict[str, np.ndarray]  # key -> [n, ...] (pre-action observation of each labelled step)
    target: np.ndarray  # float32 [n, A], raw action space
    step: np.ndarray  # int64 [n]
    segment: np.ndarray  # int64 [n], segment within the episode: consecutive steps labelled from one source
    intervention: np.ndarray  # bool [n], the correcting action was the one executed
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.step)


def _get(data: Mapping[str, Any], name: str) -> np.ndarray:
    value = data[name]
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def extract_labels(
    data: Mapping[str, Any], *, episode_id: str, obs_keys: Iterable[str], iteration: int = 0, success: bool = False
) -> EpisodeLabels:
    """Trainable rows of one loaded episode (flat field names: "obs/<key>", "label_mask", ...)."""
    mask = _get(data, "label_mask")
    target_code = _get(data, "label_target")
    rows = np.flatnonzero(mask == _TRAINABLE)
    n_steps = len(mask)
    codes = target_code[rows]
    unknown = rows[~np.isin(codes, list(_TARGET_FIELD))]
    if len(unknown):
        raise ContractError(f"episode {episode_id} step {int(unknown[0])}: trainable row without a label target "
                            f"(label_target code {int(target_code[unknown[0]])})")
    target = np.empty((len(rows), _get(data, "applied_action").shape[-1]), dtype=np.float32)
    for code, name in _TARGET_FIELD.items():
        sel = codes == code
        if sel.any():
            target[sel] = _get(data, name)[rows[sel]]
    bad = rows[~np.isfinite(target).all(-1)]
    if len(bad):
        raise ContractError(f"episode {episode_id} step {int(bad[0])}: trainable label target is NaN/inf "
                            f"(field {_TARGET_FIELD[int(target_code[bad[0]])]})")
    starts = np.ones(len(rows), dtype=bool)  # a segment: consecutive trainable steps labelled from one source
    starts[1:] = (np.diff(rows) != 1) | (codes[1:] != codes[:-1])
    source = _get(data, "action_source")[rows]
    return EpisodeLabels(
        episode_id=episode_id,
        iteration=int(iteration),
        success=bool(success),
        num_steps=int(n_steps),
        obs={k: np.ascontiguousarray(_get(data, f"obs/{k}")[rows]) for k in obs_keys},
        target=target,
        step=rows.astype(np.int64),
        segment=(np.cumsum(starts) - 1).astype(np.int64),
        intervention=np.isin(source, INTERVENTION_SOURCES),
    )


def selection(store: EpisodeStore, info: EpisodeInfo, rule: TrainingRule | None = None) -> TrainingSelection:
    """The contract's training boundary (contract.training_selection) for a stored episode's latest label layer,
    under the store's reviewer roster."""
    layer = store.labels(info.episode_id)
    return training_selection(
        mask=layer.mask, windows=layer.windows, certifications=layer.certifications, reviews=layer.reviews,
        qc=layer.qc, replay_status=store.replay_status(info.episode_id), operator=info.start.operator,
        policy_version=info.start.policy_version, rule=rule, reviewers=store.reviewers)


def load_labels(store: EpisodeStore, info: EpisodeInfo, obs_keys: Iterable[str], rule: TrainingRule | None = None) -> EpisodeLabels:
    """The rows of a stored episode that may be trained on (EpisodeInfo from ``store.episodes()``): its
    trainable labels that pass the training boundary ``rule`` (the contract's defaults if None)."""
    keys = list(obs_keys)
    td = store.load(info.episode_id, fields=[f"obs/{k}" for k in keys] + list(LABEL_FIELDS))
    flat = flatten_td(td)
    allowed = selection(store, info, rule).allowed
    flat["label_mask"] = np.where(allowed, flat["label_mask"], LabelMask.CONTEXT_ONLY.code).astype(np.uint8)
    return extract_labels(
        flat, episode_id=info.episode_id, obs_keys=keys, iteration=info.start.iteration,
        success=bool(info.end.task_success) if info.end is not None else False,
    )


def flatten_td(td: Any) -> dict[str, np.ndarray]:
    """A TensorDict (possibly nested, e.g. td["obs", "rgb"]) or dict as flat "a/b" -> numpy arrays."""
    out: dict[str, np.ndarray] = {}
    keys = td.keys(include_nested=True, leaves_only=True) if hasattr(td, "batch_size") else td.keys()
    for key in keys:
        name = "/".join(key) if isinstance(key, tuple) else key
        value = td[key]
        out[name] = value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    return out
