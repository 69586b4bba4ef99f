"""Helpers for the store tests: deterministic episodes whose every value can be recomputed and checked."""

from __future__ import annotations

import numpy as np

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    EndReason,
    EpisodeEnd,
    EpisodeStart,
    TaskInfo,
    step_fields,
)

ACTION_DIM = 4


def fields(image: bool = False, state_dim: int = 31):
    obs = {"state": ((state_dim,), "float32")}
    if image:
        obs["rgb"] = ((16, 16, 3), "uint8")
    return step_fields(obs=obs, action_dim=ACTION_DIM)


def start(task: str = "toy_reach", mode: CollectionMode = CollectionMode.HUMAN_GATED, **kw) -> EpisodeStart:
    return EpisodeStart(task=TaskInfo(task_id=task), mode=mode, control_hz=50.0, **kw)


def step(seed: int, t: int, *, image: bool = False, source: ActionSource = ActionSource.POLICY, state_dim: int = 31):
    """Step t of episode `seed`: values are a pure function of (seed, t)."""
    base = 1_000_000 * (seed + 1) + 10_000 * t
    s = {
        "t_obs": base,
        "t_policy": base + 100,
        "t_action_apply": base + 200,
        "policy_action": np.full(ACTION_DIM, seed + t / 1000, np.float32),
        "applied_action": np.full(ACTION_DIM, seed - t / 1000, np.float32),
        "action_source": np.uint8(source.code),
        "obs/state": np.arange(state_dim, dtype=np.float32) + seed * 100 + t,
        "reward": np.float32(t),
    }
    if source == ActionSource.HUMAN:
        s["human_command"] = np.full(7, (seed + t) / 100, np.float32)  # the contract: human steps keep the raw command
    if source == ActionSource.EXPERT:
        s["expert_action"] = np.full(ACTION_DIM, seed + t / 100, np.float32)  # and expert steps the expert's
    if image:
        s["obs/rgb"] = np.full((16, 16, 3), (seed * 7 + t) % 256, np.uint8)
    return s


def end(num_steps: int, reason: EndReason = EndReason.SUCCESS) -> EpisodeEnd:
    return EpisodeEnd(end_reason=reason, task_success=reason == EndReason.SUCCESS, num_steps=num_steps)


def human_window(eid: str, s: int, e: int) -> CorrectionWindow:
    return CorrectionWindow(parent_episode_id=eid, parent_step_id=max(0, s - 1), handover_start=s, handover_end=e,
                            source=ActionSource.HUMAN)


def record(rec, seed: int, n: int, *, image: bool = False, window: tuple[int, int] | None = None, **start_kw) -> str:
    """One full episode; steps inside `window` are human-driven and covered by a human correction window."""
    eid = rec.begin_episode(start(**start_kw), fields(image))
    for t in range(n):
        src = ActionSource.HUMAN if window and window[0] <= t < window[1] else ActionSource.POLICY
        rec.put(eid, step(seed, t, image=image, source=src))
    windows = [human_window(eid, *window)] if window else []
    rec.end_episode(eid, end(n), windows=windows)
    return eid


CHECKED_FIELDS = ["t_obs", "applied_action", "obs/state"]


def check_steps(data, seed: int, n: int, *, image: bool = False) -> None:
    """data (a loaded TensorDict, or store.read_steps output) holds exactly steps 0..n-1 of episode `seed`."""

    def get(name):
        if isinstance(data, dict):
            return np.asarray(data[name])
        return data[tuple(name.split("/"))].numpy()

    names = CHECKED_FIELDS + (["obs/rgb"] if image else [])
    got = {name: get(name) for name in names}
    assert all(len(v) == n for v in got.values()), ({k: len(v) for k, v in got.items()}, n)
    for t in range(n):
        want = step(seed, t, image=image)
        for name in names:
            np.testing.assert_array_equal(got[name][t], want[name], err_msg=f"seed {seed} step {t} field {name}")
