"""Student-only evaluation: closed-loop rollouts and offline action prediction on held-out windows.

Closed-loop evaluation builds nothing but the env, the student and the task's safety monitor (the rollout
engine, control.engine, student-only): no expert, no device, no gate, no operator.
Seeds are fixed, so two evaluations of one policy see the same initial states.

Definitions (docs/learning.md): an episode succeeds when the task's success condition holds at its
last step; its first-failure step (failed episodes only) is the step after which the task progress
signal never improves again (the episode length when the env reports no progress signal); scene
buckets come from info["scene_id"] when the env reports one, else from the initial task progress
(terciles over the evaluation's episodes: near / mid / far).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field
from tqdm import tqdm

from hg_dagger.contract import LabelMask
from hg_dagger.contract.model import StrictModel
from hg_dagger.control.engine import Engine, EpisodeRows, EvalStats, StudentOnly, TakeOver, Trace, task_safety
from hg_dagger.control.safety import SafetyMonitor
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.errors import ConfigError
from hg_dagger.learn.budget import task_budget


class EvalConfig(StrictModel):
    episodes: int = Field(default=20, gt=0)
    num_envs: int = Field(default=10, gt=0)
    seed: int = 100_000  # far from collection seeds: evaluation states are not training states
    max_steps: int | None = Field(default=None, gt=0, description="stop an episode here (default: the task time "
                                  "budget, learn.budget: the run config's max_episode_steps, else the horizon)")


def closed_loop(student, env, config: EvalConfig, *, progress: bool = False, trace: list | None = None,
                seeds: Sequence[int] | None = None, safety=None) -> dict[str, Any]:
    """Roll the student alone in ``env`` (the rollout engine, student-only) until ``config.episodes`` episodes
    finished, its actions through the task's safety monitor as in a session (``safety``: a SafetyConfig).

    Episode k starts from a reset with seed ``config.seed + k`` (or ``seeds[k]``, an executor's share), in
    whichever row is free: its result does not depend on how episodes are spread over rows or workers.
    ``trace`` (a list), when given, receives (obs, applied action) of every step, for audits and tests.
    """
    seeds = [int(s) for s in seeds] if seeds is not None else [config.seed + k for k in range(config.episodes)]
    stats = EvalStats(env.num_envs, seeds)
    bar = tqdm(total=len(seeds), desc="eval", disable=not progress, leave=False)
    stats.on_episode = lambda: bar.update(1)
    sinks = [stats] if trace is None else [stats, Trace(trace)]
    try:
        ticks = _rollout(student, env, StudentOnly(), seeds, config.max_steps or task_budget(env.mapping), safety,
                         sinks)
    finally:
        bar.close()
    return summarize(sorted(stats.episodes, key=lambda e: e["index"]), steps=ticks)


def _rollout(student, env, arbiter, seeds: list[int], limit: int, safety, sinks: list) -> int:
    """The rollout engine over one episode per seed, every action through the task's safety monitor (``safety``: a
    SafetyConfig, default the task's); returns the ticks it stepped."""
    monitor = SafetyMonitor(safety if safety is not None else task_safety(env.mapping.task_id),
                            num_envs=env.num_envs, action_dim=env.mapping.action_dim)
    engine = Engine(env, student, arbiter, monitor, rows=EpisodeRows(env.num_envs, seeds=seeds, limit=limit),
                    sinks=sinks)
    engine.run(episodes=len(seeds))
    return engine.ticks


def recoverability(student, expert, env, episodes: list[dict[str, Any]], *, max_episodes: int = 10,
                   limit: int | None = None, safety=None) -> dict[str, Any]:
    """Of a closed-loop evaluation's failed episodes (``episodes``: its ``per_episode``), the share that the expert
    completes when it takes over at the student's first-failure step (at the latest half way through the horizon, so
    the expert always has half an episode), replayed from the same seed with the same student (the rollout engine,
    ``TakeOver``). A recoverable failure is one that labels at the student's own states can teach; an unrecoverable
    one is a state the student must learn not to reach (docs/learning.md).

    Up to ``max_episodes`` failures are probed, the earliest seeds first; ``env`` should be the evaluation's env
    (the same rows, so the student's replayed steps match its evaluated ones)."""
    failed = [e for e in episodes if not e["success"]]
    probed = sorted(failed, key=lambda e: e["index"])[:max(0, int(max_episodes))]
    out: dict[str, Any] = {"failed": len(failed), "probed": len(probed), "recovered": 0, "rate": None,
                           "per_episode": []}
    if not probed:
        return out
    limit = limit or env.mapping.horizon
    seeds = [int(e["seed"]) for e in probed]
    latest = limit - limit // 2
    switch = {int(e["seed"]): min(int(e["first_failure_step"]), latest) for e in probed}
    stats = EvalStats(env.num_envs, seeds)
    _rollout(student, env, TakeOver(expert, env.mapping, switch), seeds, limit, safety, [stats])
    for e in sorted(stats.episodes, key=lambda e: e["index"]):
        out["per_episode"].append({"seed": e["seed"], "switch_step": switch[e["seed"]], "recovered": e["success"],
                                   "length": e["length"]})
    out["recovered"] = sum(e["recovered"] for e in out["per_episode"])
    out["rate"] = out["recovered"] / len(probed)
    return out


def summarize(episodes: list[dict[str, Any]], *, steps: int = 0) -> dict[str, Any]:
    ok = np.array([e["success"] for e in episodes], dtype=bool)
    lengths = np.array([e["length"] for e in episodes], dtype=np.float64)
    fails = [e["first_failure_step"] for e in episodes if e["first_failure_step"] is not None]
    _assign_buckets(episodes)
    buckets: dict[str, dict[str, Any]] = {}
    for name in sorted({e["bucket"] for e in episodes}):
        sel = [e for e in episodes if e["bucket"] == name]
        buckets[name] = {"episodes": len(sel), "success_rate": float(np.mean([e["success"] for e in sel]))}
    return {
        "episodes": len(episodes),
        "success_rate": float(ok.mean()) if len(ok) else 0.0,
        "episode_length_mean": float(lengths.mean()) if len(lengths) else 0.0,
        "episode_length_success_mean": float(lengths[ok].mean()) if ok.any() else None,
        "first_failure_step_mean": float(np.mean(fails)) if fails else None,
        "buckets": buckets,
        "env_steps": int(steps),
        "per_episode": episodes,
    }


def _assign_buckets(episodes: list[dict[str, Any]]) -> None:
    if all(e.get("scene") is not None for e in episodes):
        for e in episodes:
            e["bucket"] = f"scene:{e['scene']}"
        return
    init = np.array([np.nan if e["initial_progress"] is None else e["initial_progress"] for e in episodes])
    if np.isnan(init).all():
        for e in episodes:
            e["bucket"] = "all"
        return
    # progress is "higher is better" (e.g. minus the distance): the lowest tercile is the farthest start
    lo, hi = np.nanquantile(init, [1 / 3, 2 / 3])
    for e, p in zip(episodes, init, strict=True):
        e["bucket"] = "unknown" if np.isnan(p) else ("far" if p < lo else "mid" if p < hi else "near")


def offline(student, store, mapping, *, holdout_fraction: float = 0.0, episodes=None,
            trained_on: set[str] | frozenset[str] = frozenset()) -> dict[str, Any]:
    """Action-prediction error of the student on trainable labels of held-out episodes.

    Episodes in ``trained_on`` (the checkpoint's replay) are never scored, whatever their split.
    """
    # deferred: learn.train and store.trainable import torch and zarr; the CLI lists its commands without them
    from hg_dagger.learn.train import training_episodes
    from hg_dagger.store.trainable import load_labels

    infos = episodes if episodes is not None else training_episodes(
        store, mapping, holdout_fraction=holdout_fraction, held=True)
    skipped = sum(i.episode_id in trained_on for i in infos)
    infos = [i for i in infos if i.episode_id not in trained_on]
    keys = list(mapping.obs_spec())
    errs, conf, n_windows = [], [], 0
    for info in infos:
        ep = load_labels(store, info, keys)
        if not len(ep):
            continue
        if hasattr(student, "drop_chunks"):  # a chunking policy: each label's action from its own observation
            student.reset_rows(range(len(ep)), len(ep))
        out = student.act(ep.obs)
        pol_err = np.abs(mapping.raw_to_policy(out.action) - mapping.raw_to_policy(ep.target))
        errs.append(pol_err)
        conf.append(out.confidence)
        n_windows += len(np.unique(ep.segment))
    if not errs:
        return {"episodes": 0, "labels": 0, "segments": 0, "mae": None, "mse": None, "skipped_trained": skipped}
    e = np.concatenate(errs)
    return {
        "episodes": len(errs), "labels": int(len(e)), "segments": n_windows,
        "mae": float(e.mean()), "mse": float((e**2).mean()),
        "mae_per_dim": e.mean(0).round(6).tolist(),
        "confidence_mean": float(np.concatenate(conf).mean()),
        "label_mask_used": LabelMask.TRAINABLE.value, "skipped_trained": skipped,
    }


def write_report(result: dict[str, Any], out_dir: str | Path, *, title: str = "student-only evaluation") -> dict[str, Path]:
    """eval.json plus eval.png (success per scene bucket and episode-length histogram)."""
    # matplotlib deferred: the app extra, optional
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "eval.json"
    json_path.write_text(json.dumps(result, indent=2, default=_jsonable))
    png = out / "eval.png"
    cl = result.get("closed_loop")
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    if cl:
        names = list(cl["buckets"])
        axes[0].bar(names, [cl["buckets"][b]["success_rate"] for b in names], color="tab:green")
        axes[0].set_ylim(0, 1)
        axes[0].set_title(f"success {cl['success_rate']:.0%} over {cl['episodes']} episodes")
        axes[0].set_ylabel("success rate")
        lengths = [e["length"] for e in cl["per_episode"]]
        colors = ["tab:green" if e["success"] else "tab:red" for e in cl["per_episode"]]
        axes[1].scatter(range(len(lengths)), lengths, c=colors, s=12)
        axes[1].set_xlabel("episode")
        axes[1].set_ylabel("length (steps)")
        axes[1].set_title("episode length (green = success)")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)
    return {"json": json_path, "png": png}


def _jsonable(x):
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def evaluate(
    checkpoint: str | Path,
    task: str,
    out_dir: str | Path,
    *,
    config: EvalConfig | None = None,
    store_url: str | None = None,
    holdout_fraction: float = 0.0,
    progress: bool = True,
    executor=None,
    policy_options=None,
) -> dict[str, Any]:
    """`hg-dagger eval`: closed-loop policy-only rollouts (+ offline error on held-out windows of a store);
    with a Ray ``executor`` (learn.executor) the closed-loop episodes run on its workers, same seeds.
    ``checkpoint`` is any policy spec (policy.sources): a student checkpoint, ws://HOST:PORT or lerobot:DIR."""
    # deferred: policy and store import torch and zarr; the CLI lists its commands without them
    from hg_dagger.policy import close_policy, open_policy, policy_source

    cfg = config or EvalConfig()
    spec = str(checkpoint)
    remote = policy_source(spec).remote
    if remote and executor is not None and executor.kind != "local":
        raise ConfigError(f"--executor {executor.kind} ships the built-in student to its workers; --policy {spec} "
                          "evaluates with --executor local")
    mapping = load_mapping(task)
    student = open_policy(spec, mapping, policy_options)
    try:
        result: dict[str, Any] = {"checkpoint": spec, "policy_version": student.version, "task": task,
                                  "seed": cfg.seed}
        if executor is not None and executor.kind != "local":
            result["closed_loop"] = executor.evaluate(student, task, cfg)  # id or file, as given
            result["executor"] = executor.describe()
        else:
            with make_env(mapping, num_envs=min(cfg.num_envs, cfg.episodes), seed=cfg.seed) as env:
                result["closed_loop"] = closed_loop(student, env, cfg, progress=progress)
        if store_url:
            from hg_dagger.policy import read_checkpoint
            from hg_dagger.store import EpisodeStore

            trained_on: set[str] = set()
            if not remote:  # a student checkpoint knows the episodes it was trained on: never scored
                train = read_checkpoint(spec)["extra"].get("train") or {}
                trained_on = {e for e, _ in train.get("replay", {}).get("episodes", [])}
            result["offline"] = offline(student, EpisodeStore.open(store_url, mode="r"), mapping,
                                        holdout_fraction=holdout_fraction, trained_on=trained_on)
    finally:
        close_policy(student)
    paths = write_report(result, out_dir, title=f"{task} - {student.version}")
    result["files"] = {k: str(v) for k, v in paths.items()}
    return result
