"""Replay verification: re-run each episode from its recorded seed with its recorded applied actions.

A fresh env of one row is built for every episode from the current task mapping, reset exactly as the
collector reset the episode's row (``env.reset(seed=[seed], env_ids=[0])``), and stepped with the stored
``applied_action`` sequence. Step t's record is its pre-action observation plus the outcome of its
action (reward, success, terminated, truncated); the first step whose record the replay does not
reproduce within the task's ``replay:`` tolerances is the divergent one. The verdict is a
``ReplayCheck`` written into a new label layer; raw data is never touched.

    results = replay_store("runs/store")                    # every committed episode, one layer each
    check = replay_episode(store, episode_id, perturb={12: delta})   # what if step 12 had been different
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract.clock import wall_stamp
from hg_dagger.contract.enums import EndReason, ReplayStatus, StepFlag
from hg_dagger.contract.schema import ReplayCheck
from hg_dagger.envs import make_env
from hg_dagger.envs.backends import BACKENDS
from hg_dagger.envs.mapping import ReplayTolerance, TaskMapping, known_tasks, load_mapping
from hg_dagger.errors import ContractError, HgDaggerError, StoreError

REPLAY_AUTHOR = "replay"
OUTCOMES = ("reward", "success", "terminated", "truncated")  # compared after stepping each step's action
# Whether a backend's episodes re-run here, and which packages a verdict names, is the backend's record
# (hg_dagger.envs.backends: replayable / not_replayable, simulator + env packages). Meta-World's hand and object
# start poses after reset come from its own seeded stream; a fresh env draws them the same way, so Meta-World
# replays like the other MuJoCo tasks.


@dataclass(frozen=True)
class ReplayResult:
    """One episode's verdict; ``version`` is the label layer it was written to (None: not written)."""

    episode_id: str
    task_id: str
    check: ReplayCheck
    version: int | None = None
    skipped: str = ""  # why nothing was written (an incomplete episode)

    def to_json(self) -> dict[str, Any]:
        return {"episode_id": self.episode_id, "task_id": self.task_id, "label_version": self.version,
                "skipped": self.skipped, **self.check.model_dump(mode="json")}


@dataclass
class ReplayReport:
    store: str
    results: list[ReplayResult] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out = {s.value: 0 for s in ReplayStatus}
        for r in self.results:
            if not r.skipped:
                out[r.check.status.value] += 1
        return out

    @property
    def mismatches(self) -> list[ReplayResult]:
        return [r for r in self.results if not r.skipped and r.check.status == ReplayStatus.REPLAY_MISMATCH]

    def summary(self) -> str:
        c = self.counts()
        checked = sum(c.values())
        skipped = sum(1 for r in self.results if r.skipped)
        written = sum(1 for r in self.results if r.version is not None)
        parts = ", ".join(f"{n} {s}" for s, n in c.items())
        return (f"{self.store}: {checked} episode(s) checked: {parts}"
                + (f"; {skipped} incomplete skipped" if skipped else "") + f"; {written} label layer(s) written")

    def to_json(self) -> dict[str, Any]:
        return {"store": self.store, "counts": self.counts(), "results": [r.to_json() for r in self.results]}


def replay_store(
    store,
    *,
    episodes: Iterable[str] | None = None,
    write: bool = True,
    author: str = REPLAY_AUTHOR,
    progress: bool = True,
    executor=None,
) -> ReplayReport:
    """Replay episodes of a store (all committed ones by default; ids or unique prefixes in ``episodes``)
    and, with ``write``, record each verdict in a new label layer by ``author``. Incomplete episodes are
    skipped when the whole store is replayed and refused when named. With a Ray ``executor``
    (learn.executor) the workers replay and this process alone writes the verdicts."""
    # deferred: the store loads zarr, and the CLI imports this module to list its commands
    from hg_dagger.store import EpisodeStore

    if not isinstance(store, EpisodeStore):
        store = EpisodeStore.open(store, mode="a" if write else "r")
    elif write and store.mode != "a":
        raise StoreError(f"{store.url}: opened read-only; replay needs mode 'a' to record its results")
    if write and not author:
        raise ContractError(f"{store.url}: replay results need an author")
    infos = _select(store, episodes)
    report = ReplayReport(store=store.url)
    remote = {}
    if executor is not None and executor.kind != "local":
        ids = [i.episode_id for i in infos if i.complete]
        remote = dict(zip(ids, executor.replay(store.url, ids), strict=True))
    bar = tqdm(infos, desc="replay", unit="ep", disable=not progress)
    try:
        for info in bar:
            if not info.complete:
                check = ReplayCheck(status=ReplayStatus.UNVERIFIED, reason="incomplete (never committed)",
                                    t_wall=wall_stamp())
                report.results.append(ReplayResult(info.episode_id, info.task_id, check,
                                                   skipped="incomplete (never committed): nothing recorded"))
                continue
            check = remote[info.episode_id] if remote else replay_episode(store, info.episode_id)
            # the latest mask stays: a stricter one (a reviewer's, an operator's discard) is never undone by a replay
            version = store.write_labels(info.episode_id, author=author, replay=check,
                                         mask=store.labels(info.episode_id).mask) if write else None
            report.results.append(ReplayResult(info.episode_id, info.task_id, check, version))
            bar.set_postfix(mismatch=len(report.mismatches), refresh=False)
    finally:
        bar.close()
    return report


def _select(store, episodes: Iterable[str] | None) -> list:
    all_infos = store.episodes()
    if episodes is None:
        return all_infos
    out = []
    for want in episodes:
        hits = [i for i in all_infos if i.episode_id == want] or [i for i in all_infos if i.episode_id.startswith(want)]
        if len(hits) != 1:
            raise StoreError(f"{store.url}: {'no episode matches' if not hits else f'{len(hits)} episodes match'} {want!r}")
        if not hits[0].complete:
            raise StoreError(f"{store.url}: episode {hits[0].episode_id} is incomplete (never committed); "
                             "it cannot be replayed or labelled")
        out.append(hits[0])
    return out


def replay_episode(store, episode_id: str, *, perturb: Mapping[int, Any] | None = None,
                   tolerance: ReplayTolerance | None = None) -> ReplayCheck:
    """Replay one committed episode and return its verdict (nothing is written).

    ``perturb`` maps a step to an offset added to that step's stored applied action before it is
    replayed: a what-if that must show as a replay_mismatch when the offset matters. ``tolerance``
    replaces the task file's ``replay:`` section."""
    info = store.info(episode_id)
    start = info.start
    if not info.complete:
        raise StoreError(f"{store.url}: episode {episode_id} is incomplete (never committed); it cannot be replayed")
    base = {"task_id": start.task.task_id, "task_version": start.task.task_version, "mapping_hash": start.mapping_hash}

    def verdict(status: ReplayStatus, reason: str = "", **kw) -> ReplayCheck:
        return ReplayCheck(status=status, reason=reason, checked_with={**base, **kw.pop("checked_with", {})},
                           t_wall=wall_stamp(), **kw)

    try:
        plan = replay_plan(info)
    except NotReplayable as exc:
        return verdict(exc.status, exc.reason)
    mapping = plan.mapping
    if tolerance is not None:
        mapping = mapping.model_copy(update={"replay": tolerance.model_dump()})
    tol = mapping.replay
    checked_with = {"seed": plan.seed, "backend": mapping.backend, "tolerance": tol.model_dump(mode="json"),
                    "packages": _packages(mapping.backend)}
    try:
        mismatch, steps = run_record(store, episode_id, mapping, plan.seed, plan.images, perturb or {})
    except NotReplayable as exc:
        return verdict(ReplayStatus.UNVERIFIED, exc.reason, checked_with=checked_with)
    if mismatch is None:
        return verdict(ReplayStatus.REPLAYABLE, steps_checked=steps, checked_with=checked_with)
    step, key, err, why = mismatch
    return verdict(ReplayStatus.REPLAY_MISMATCH, why, first_divergent_step=step, key=key,
                   error=err if math.isfinite(err) else None, steps_checked=steps, checked_with=checked_with)


class NotReplayable(Exception):
    """Why an episode cannot be re-run here, with the replay status that says so."""

    def __init__(self, reason: str, status: ReplayStatus = ReplayStatus.UNVERIFIED):
        super().__init__(reason)
        self.reason = reason
        self.status = status


@dataclass(frozen=True)
class ReplayPlan:
    """What re-running an episode needs: the current task mapping (checked against the recorded one), the
    recorded seed and the task's camera keys."""

    mapping: Any  # TaskMapping
    seed: int
    images: list[str]


def replay_plan(info) -> ReplayPlan:
    """The mapping and seed to re-run a committed episode with, or NotReplayable saying why it cannot be.

    The one home of the rules on which episodes replay (replay verification and the review's re-rendered
    scene both follow them)."""
    start = info.start
    bridge = start.extra.get("robot_bridge")
    if bridge is not None:
        where = bridge.get("endpoint", "") if isinstance(bridge, dict) else ""
        raise NotReplayable("recorded on a robot over the robot bridge" + (f" ({where})" if where else ""),
                            ReplayStatus.VIDEO_ONLY)
    seed = start.initial_state.get("seed")
    if seed is None:
        raise NotReplayable("no recorded initial state")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise NotReplayable(f"recorded initial_state seed {seed!r} is not an integer")
    try:
        if start.task.task_id in known_tasks() or not start.mapping:
            mapping = load_mapping(start.task.task_id)
        else:  # a task file of the user's, not shipped: the mapping the episode recorded (its hash is checked)
            mapping = TaskMapping.from_metadata(start.mapping)
    except HgDaggerError as exc:
        raise NotReplayable(f"task not available here: {exc}") from None
    if mapping.task_version != start.task.task_version or mapping.hash != start.mapping_hash:
        raise NotReplayable(f"task {mapping.task_id} changed since recording (recorded version {start.task.task_version} "
                            f"mapping {start.mapping_hash or '-'}, now version {mapping.task_version} mapping "
                            f"{mapping.hash}): not replayed")
    images = [k.name for k in mapping.observation if np.dtype(k.dtype) == np.uint8 and len(k.shape) == 3]
    if len(images) == len(mapping.observation):
        raise NotReplayable("camera-only observations", ReplayStatus.VIDEO_ONLY)
    if mapping.backend not in BACKENDS:
        raise NotReplayable(f"the {mapping.backend} backend is not installed here")
    spec = BACKENDS.get(mapping.backend)
    if not spec.replayable:
        raise NotReplayable(spec.not_replayable)
    if info.end.dropped_steps:
        raise NotReplayable(f"{info.end.dropped_steps} step(s) dropped by the recorder")
    if info.num_steps == 0:
        raise NotReplayable("no steps recorded")
    return ReplayPlan(mapping=mapping, seed=int(seed), images=images)


def branch_actions(store, episode_id: str) -> np.ndarray:
    """The applied actions that lead from the seed's reset to the first step of a branch episode (one that
    continues another from a step of it: a rewind), its parents' in order; none for an episode of its own."""
    chain = []
    start = store.info(episode_id).start
    while start.parent_episode_id is not None:
        parent, step = start.parent_episode_id, int(start.parent_step_id or 0)
        try:
            acts = store.read_steps(parent, ["applied_action"])["applied_action"][:step]
        except HgDaggerError as exc:
            raise NotReplayable(f"branch of episode {parent}, which cannot be read: {exc}") from None
        chain.append(np.asarray(acts, np.float32))
        start = store.info(parent).start
    chain.reverse()
    return np.concatenate(chain) if chain else np.zeros((0, 0), np.float32)


def run_record(store, episode_id, mapping, seed: int, images: list[str], perturb: Mapping[int, Any] | None = None,
               *, view: Callable[[int, Any], None] | None = None):
    """Step a fresh one-row env through the record; (step, key, error, reason) of the first divergence or None,
    and the number of steps reproduced before it.

    ``view(t, env)`` is called while the env holds step t's state, before step t's action (the moment step
    t's observation was taken). With a view the whole record is stepped, past the first divergence (a
    reviewer sees the scene of every step), unless the simulator ended the episode early. An episode the
    collector cut (end reason timeout, e.g. a run's max_episode_steps) records a truncation at its last step
    that the simulator, with its own horizon, does not reproduce: that one is the cut, not a divergence."""
    obs_keys = [k.name for k in mapping.observation]
    fields = store.fields(episode_id)
    wanted = ["applied_action", "valid", "step_flags", *(f"obs/{k}" for k in obs_keys), *OUTCOMES]
    missing = [f for f in ("applied_action", *(f"obs/{k}" for k in obs_keys)) if f not in fields]
    if missing:
        raise NotReplayable(f"stored fields missing: {', '.join(missing)}")
    rec = store.read_steps(episode_id, [f for f in wanted if f in fields])
    actions = np.array(rec["applied_action"], np.float32)
    n = len(actions)
    for step, delta in (perturb or {}).items():
        if not 0 <= int(step) < n:
            raise ContractError(f"episode {episode_id}: perturbed step {step} outside its {n} steps")
        actions[int(step)] = actions[int(step)] + np.asarray(delta, np.float32)
    if actions.shape[1:] != (mapping.action_dim,):
        raise NotReplayable(f"applied_action has shape {list(actions.shape[1:])}, the task takes {mapping.action_dim}")
    valid = rec.get("valid", np.ones(n, bool)).astype(bool)
    stale = (rec.get("step_flags", np.zeros(n, np.uint16)).astype(np.int64) & int(StepFlag.SENSOR_LOSS)) != 0
    compare_obs = valid & ~stale  # a stale or invalid sample is not what the simulator held
    bad_action = np.flatnonzero(~np.isfinite(actions).all(axis=1))
    if len(bad_action):
        raise NotReplayable(f"applied_action is NaN at step {int(bad_action[0])}: the record cannot drive a replay")
    tol = mapping.replay
    cut = store.info(episode_id).end.end_reason == EndReason.TIMEOUT
    try:
        env = make_env(mapping, num_envs=1, seed=seed)
    except HgDaggerError as exc:
        raise NotReplayable(f"the {mapping.backend} simulator is not available here: {exc}") from None
    first: tuple | None = None  # (step, key, error, reason) of the first divergence

    def diverged(found) -> bool:
        """Note a divergence; True when the walk stops here (no view asks for the rest)."""
        nonlocal first
        if first is None:
            first = found
        return view is None

    try:
        obs, _ = env.reset(seed=[seed], env_ids=[0])
        for action in branch_actions(store, episode_id):  # a branch begins where its parents left off
            obs = env.step(action[None]).obs
        for t in range(n):
            if view is not None:
                view(t, env)
            if compare_obs[t] and first is None:
                stop = False  # an observation diverged and no view asks for the rest
                for key in obs_keys:
                    err, limit = _difference(obs[key][0], rec[f"obs/{key}"][t], key, key in images, tol)
                    if err > limit:
                        stop = diverged((t, f"obs/{key}", err, _why(t, f"obs/{key}", err, limit)))
                        break
                if stop:
                    break
            result = env.step(actions[t : t + 1])
            outcome = {"reward": result.reward, "success": result.success,
                       "terminated": result.terminated, "truncated": result.truncated}
            for key in OUTCOMES if first is None else ():
                if key not in rec or outcome[key] is None:
                    continue
                got, want = np.asarray(outcome[key])[0], rec[key][t]
                if key == "reward":
                    err = abs(float(got) - float(want))
                    limit = tol.obs_atol + tol.obs_rtol * abs(float(want))
                else:
                    err, limit = float(bool(got) != bool(want)), 0.0
                    if key == "truncated" and cut and t == n - 1 and bool(want):
                        err = 0.0  # the collector's cut
                if not err <= limit:
                    diverged((t, key, err, _why(t, key, err, limit)))
                    break
            if first is not None and view is None:
                break
            ended = bool(result.terminated[0] or result.truncated[0])
            if ended and t < n - 1:
                diverged((t, "terminated" if result.terminated[0] else "truncated", 1.0,
                          f"step {t}: the replay ended the episode here, the record goes on to step {n - 1}"))
                break
            obs = result.obs
    except HgDaggerError as exc:
        raise NotReplayable(f"the simulator refused the record: {exc}") from None
    finally:
        env.close()
    return first, (n if first is None else first[0])


def _difference(got, want, key: str, image: bool, tol) -> tuple[float, float]:
    """Largest element difference beyond the stored value and the tolerance it is held to."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return math.inf, 0.0
    if image:
        return float(np.abs(got.astype(np.int16) - want.astype(np.int16)).max(initial=0)), float(tol.image_atol)
    g, w = got.astype(np.float64), want.astype(np.float64)
    atol = tol.keys.get(key, tol.obs_atol)
    excess = np.abs(g - w) - tol.obs_rtol * np.abs(w)
    if not (np.isfinite(g) == np.isfinite(w)).all():
        return math.inf, atol
    finite = np.isfinite(w)
    return float(excess[finite].max(initial=0.0)), atol


def _why(step: int, key: str, err: float, limit: float) -> str:
    return f"step {step}: {key} differs by {err:.3g} (tolerance {limit:.3g})"


def _packages(backend: str) -> dict[str, str]:
    out = {}
    spec = BACKENDS.get(backend) if backend in BACKENDS else None
    for name in dict.fromkeys(("hg-dagger", "numpy", *(spec.packages if spec is not None else ()))):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = ""
    return out
