"""A replay buffer of toy_reach-shaped expert labels, for trainer tests that need labels but no store."""

from __future__ import annotations

import numpy as np

from hg_dagger.contract import ActionSource, LabelMask, LabelTarget
from hg_dagger.learn.aggregate import LabelBuffer, LabelBufferConfig
from hg_dagger.store.trainable import extract_labels

OBS_KEYS = ["qpos", "ee_pos", "target"]


def toy_replay(n: int = 200, seed: int = 0, episode_id: str = "e") -> LabelBuffer:
    """``n`` trainable expert labels of one episode: the action points from the hand to the target (tanh)."""
    rng = np.random.default_rng(seed)
    data = {f"obs/{k}": rng.normal(0, 0.1, (n, 2)) for k in OBS_KEYS}
    target = np.tanh(data["obs/target"] - data["obs/ee_pos"]).astype(np.float32)
    data.update(expert_action=target, applied_action=target,
                action_source=np.full(n, ActionSource.EXPERT.code, np.uint8),
                label_mask=np.full(n, LabelMask.TRAINABLE.code, np.uint8),
                label_target=np.full(n, LabelTarget.EXPERT_ACTION.code, np.uint8))
    replay = LabelBuffer(LabelBufferConfig())
    replay.add([extract_labels(data, episode_id=episode_id, obs_keys=OBS_KEYS)])
    return replay
