"""Shared round loop of the learning benchmarks: BC, classic DAgger and human-gated DAgger on one task.

Every method goes through the project's own code paths: collection by `hg_dagger.learn.auto.Collector`
(the `hg-dagger auto` collector: expert demonstrations or beta mixing), human-gated collection by a
`Session` built with `build_session` (gates, handover machine, safety, the synthetic operator driven by
the planner), labels read back from the zarr store through the training boundary (`load_labels`), one
`Trainer` per arm, and the student alone evaluated by `closed_loop` on the same fixed-seed episodes.

Fairness rules (issue 12):
- every arm starts from the same round 0 (the same expert demonstrations, same seed, same student init);
- training steps are tied to labels (``train.steps_per_label``, the trainer's rule): after every round with new
  labels the trainer runs until its total gradient steps equal ``steps_per_label`` x the labels it holds, so
  each method gets the same budget per label; with ``train.warm_start: false`` every such round starts from
  fresh weights and runs that whole budget;
- evaluation: the same ``eval`` episodes (fixed seeds) after every round, nothing tuned per method;
- one time budget: collection (demonstrations, DAgger, gated sessions) and evaluation cut every episode at
  ``max_episode_steps`` (the task's, hg_dagger.learn.budget), so a late success is a failure in both;
- promotion (``spec["promotion"]``, every arm alike): a trained student acts and is reported only when the held-out
  evaluation on its own seeds does not say it is worse than the acting student beyond the noise.

Human effort per round, counted three ways:
- labels: trainable labels that reached the replay (expert / operator steps);
- operator seconds: a demonstration or a DAgger episode keeps a person busy for all its steps; a gated
  window from the handover request (the gate's step, ``parent_step_id``) to the hand-back
  (``handover_end``), both times step_dt (simulated time: the run is not paced in real time);
- context switches: the times a person has to turn to the robot: one per demonstration or DAgger episode,
  one per policy -> operator handover in a gated run (LazyDAgger's measure).

Gate recall per gated round (``row["gates"]``, hg_dagger.review.recall over the round's episodes): the share
of failed collection episodes in which a gate asked before the failure, the share of requests that came
before a failure, and a gate miss (the student failed, no gate asked) with its episode ids.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np


def first_reaching(labels: list[float], success: list[float], target: float) -> float | None:
    """Labels at the first point of a curve with success >= ``target`` (None: never)."""
    return next((lab for lab, s in zip(labels, success, strict=True) if s >= target - 1e-9), None)


def _gate_config(task: str, target_rate: float | None, gates: str = ""):
    """The task's gate config, its confidence calibration target set to ``target_rate`` when given."""
    from hg_dagger.control.run_config import load_gate_config

    cfg = load_gate_config(gates, task)
    if target_rate is None:
        return cfg
    out = []
    for g in cfg.gates:
        cal = getattr(g, "calibration", None)
        if cal is not None:
            g = g.model_copy(update={"calibration": cal.model_copy(update={"target_rate": target_rate})})
        out.append(g)
    return cfg.model_copy(update={"gates": out})


FAILURE_GATES = ("progress_stall", "policy_failed", "constraint", "collision", "object_drop", "signal")


def risk_data(store, infos, keys: list[str], horizon: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Training data for the risk gate from recorded gated episodes: every step the policy ran, labelled 1
    when, within ``horizon`` steps, a failure gate (not the novelty gate) asked for the operator or the
    episode ended in failure; 0 otherwise (ThriftyDAgger's risk: failing from this state if left alone)."""
    from hg_dagger.contract.enums import ActionSource

    obs: dict[str, list[np.ndarray]] = {k: [] for k in keys}
    ys = []
    for info in infos:
        d = store.read_steps(info.episode_id, ["action_source", *(f"obs/{k}" for k in keys)])
        n = len(d["action_source"])
        bad = np.zeros(n + horizon + 1, bool)
        for w in store.labels(info.episode_id).windows:
            if any(g in w.gate_reason for g in FAILURE_GATES):
                bad[w.parent_step_id] = True
        if not (info.end is not None and info.end.task_success):
            bad[n - 1] = True
        # y[t] = any bad event in (t, t + horizon]
        c = np.concatenate([[0], np.cumsum(bad)])
        t = np.arange(n)
        y = (c[np.minimum(t + horizon + 1, len(bad))] - c[t + 1]) > 0
        pol = d["action_source"] == ActionSource.POLICY.code
        for k in keys:
            obs[k].append(d[f"obs/{k}"][pol])
        ys.append(y[pol])
    if not ys:
        return {k: np.zeros((0,)) for k in keys}, np.zeros(0, bool)
    return {k: np.concatenate(v) for k, v in obs.items()}, np.concatenate(ys)


def lead_times(infos, dt: float) -> list[float]:
    """Seconds from a gate's first request to the failure point, for each failed student episode it caught."""
    from hg_dagger.review.recall import failure_step, is_request

    out = []
    for info in infos:
        fail = failure_step(info) if info.end is not None else None
        if fail is None:
            continue
        steps = [e.step for e in info.end.events if is_request(e) and e.step < fail]
        if steps:
            out.append((fail - min(steps)) * dt)
    return out


def _new_episodes(store, ids: list[str]) -> list:
    if hasattr(store, "refresh"):
        store.refresh()
    infos = {i.episode_id: i for i in store.episodes()}
    missing = [e for e in ids if e not in infos or not infos[e].complete]
    if missing:
        raise RuntimeError(f"episodes {missing[:3]} are not complete in the store")
    return [infos[e] for e in ids]


def _watch(session, episodes: int, windows: int | None, batch: int):
    """A gated round's student episodes: ``episodes`` of them, or with ``windows`` whole batches until the round
    holds that many correction windows (at most ``episodes``). The session's summary counts every batch."""
    if not windows:
        return session.run(episodes, progress=False)
    done = 0
    while True:
        k = min(batch, episodes - done)
        summary = session.run(k, progress=False)
        done += k
        if done >= episodes or summary.windows >= windows:
            return summary


def _round_windows(g: dict, r: int) -> int | None:
    """Round ``r``'s window cap (r >= 1): ``windows_schedule`` from round 1 on, its last value for later rounds
    (0: none), else ``windows_per_round``."""
    sched = g.get("windows_schedule")
    if sched:
        return int(sched[min(r, len(sched)) - 1]) or None
    return g.get("windows_per_round")


def run_arm(method: str, spec: dict[str, Any], out: str | Path, log=print) -> dict[str, Any]:
    """One learning curve: ``method`` in bc | dagger | gated, ``spec`` as built by bench_learning.arm_spec.

    Returns {"method", "seed", "rounds": [per-round cumulative figures], "seconds"}; writes
    OUT/curve.jsonl as it grows (one line per round)."""
    import torch

    from hg_dagger.contract.labels import TrainingRule
    from hg_dagger.control.build import build_session
    from hg_dagger.control.run_config import load_run_config
    from hg_dagger.envs import load_mapping, make_env
    from hg_dagger.experts import make_expert
    from hg_dagger.learn.aggregate import LabelBuffer, LabelBufferConfig
    from hg_dagger.learn.auto import Collector
    from hg_dagger.learn.effort import operator_seconds
    from hg_dagger.learn.evaluate import EvalConfig, closed_loop
    from hg_dagger.learn.promotion import Promoter
    from hg_dagger.learn.train import TrainConfig, Trainer
    from hg_dagger.policy import Student
    from hg_dagger.review.recall import describe, recall_figures
    from hg_dagger.store import EpisodeStore
    from hg_dagger.store.trainable import load_labels

    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    curve_path = out / "curve.jsonl"
    curve_path.unlink(missing_ok=True)
    task, seed = spec["task"], int(spec["seed"])
    mapping = load_mapping(task)
    dt = mapping.dt
    keys = list(mapping.obs_spec())
    sc = spec["student"]
    student = Student.create(mapping, kind=sc["kind"], ensemble=sc["ensemble"], hidden=tuple(sc["hidden"]), seed=seed)
    train = TrainConfig(**{**spec["train"], "seed": seed, "steps_per_label": spec["steps_per_label"]})
    trainer = Trainer(student, train, LabelBuffer(LabelBufferConfig(**spec.get("replay", {})), seed=seed))
    store = EpisodeStore.create(out / "store")
    expert = make_expert(task, kind="planner", mapping=mapping)
    ev = EvalConfig(**spec["eval"])
    totals = {"labels": 0, "operator_s": 0.0, "context_switches": 0, "episodes": 0}
    rows: list[dict[str, Any]] = []
    gated_infos: list = []
    t_start = time.perf_counter()

    # the human-paced arm's windows are a person's: they train as if a reviewer approved every one of them
    rule = TrainingRule(require_review=False, require_qc=False) if method == "gated_human" else None

    def add(infos) -> int:
        eps = [load_labels(store, i, keys, rule) for i in infos]
        trainer.replay.add(eps)
        return sum(len(e) for e in eps)

    with make_env(task, num_envs=min(ev.num_envs, ev.episodes), seed=ev.seed) as env_eval:
        promo = spec.get("promotion")
        promoter = None
        if promo:  # held-out seeds of its own: choosing on them leaves the reported figure unbiased
            held = EvalConfig(episodes=promo["episodes"], num_envs=ev.num_envs, seed=promo["seed"],
                              max_steps=ev.max_steps)
            promoter = Promoter(lambda s: closed_loop(s, env_eval, held), promo.get("confidence", 0.95))
        reported: dict[str, dict] = {}  # policy version -> its evaluation (the same seeds give the same result)
        for r in range(int(spec["rounds"])):
            t0 = time.perf_counter()
            row: dict[str, Any] = {"round": r}
            gated = method in ("gated", "gated_risk", "gated_human") and r > 0
            if not gated:  # round 0 of every arm, and every round of bc / dagger: the auto collector
                mode = "expert_demo" if (method != "dagger" or r == 0) else "dagger_sync"
                beta = 1.0 if mode == "expert_demo" else float(spec["beta_decay"]) ** r
                episodes = int(spec["warm_episodes"] if r == 0 else spec["episodes_per_round"])
                rec = store.recorder(flush_interval_s=2.0, queue_steps=1 << 16)
                with make_env(task, num_envs=spec["num_envs"], seed=seed) as env:
                    col = Collector(env, expert, rec, mode=mode, seed=seed * 1000 + r,
                                    max_episode_steps=spec.get("max_episode_steps"), certify=True)
                    col.set_policy(trainer.student, iteration=r, beta=beta)
                    try:
                        stats = col.run(episodes=episodes, reset_seed=seed + 7919 * (r + 1) * spec["num_envs"])
                    finally:
                        rec.close()
                infos = _new_episodes(store, stats.episode_ids)
                labels = add(infos)
                steps = sum(i.num_steps for i in infos)
                row.update(mode=mode, beta=beta, episodes=len(infos), env_steps=steps, new_labels=labels,
                           operator_s=steps * dt, context_switches=len(infos),
                           intervention_rate=(stats.expert_used / stats.steps) if stats.steps else 0.0,
                           collect_success=float(np.mean(stats.successes)) if stats.successes else None)
            else:
                g = spec["gated"]
                watched = int(g.get("episodes_per_round") or spec["episodes_per_round"])
                gate_cfg = _gate_config(task, g.get("target_rate"), g.get("gates", ""))
                risk_states = None
                if method == "gated_risk":  # the novelty gate plus a risk gate fit on this arm's outcomes so far
                    gate_cfg, risk_states, row["risk"] = _with_risk_gate(gate_cfg, store, gated_infos, keys, g, out, r)
                # sessions cut their episodes at the task time budget, where evaluation stops (learn.budget)
                over = {"operator.certification": "planner_auto", "operator.noise_std": 0.0, "gates": gate_cfg,
                        "max_episode_steps": spec["max_episode_steps"]}
                if method == "gated_human":  # a person at the keyboard: one env, the device operator
                    over = {"operator.type": "device", "operator.device": "keyboard", "operator.name": "human-model",
                            "gates": gate_cfg, "max_episode_steps": spec["max_episode_steps"]}
                over.update(g.get("overrides", {}))
                cfg = load_run_config(None, task, num_envs=1 if method == "gated_human" else g["num_envs"],
                                      seed=seed + 1000 * r, calibrate_steps=g["calibrate_steps"], **over)
                rec = store.recorder(flush_interval_s=2.0, queue_steps=1 << 16)
                if method == "gated_human":
                    summary, cal, row["human_model"] = _human_paced_round(
                        cfg, rec, str(store.url), trainer.student, expert, mapping, seed + r, g["calibrate_steps"],
                        watched, seed=seed * 1000 + r)
                else:
                    with make_env(task, num_envs=g["num_envs"], seed=seed + r) as env:
                        session = build_session(cfg, rec, trainer.student, env=env, expert=expert)
                        try:
                            cal = session.calibrate(g["calibrate_steps"]) if g["calibrate_steps"] else None
                            if risk_states is not None:
                                gate = next(x for x in session.gates.gates if x.name == "risk")
                                row["risk"]["calibration"] = session.gates.calibrate_gate(
                                    "risk", gate.model.predict(risk_states))
                            summary = _watch(session, watched, _round_windows(g, r), g["num_envs"])
                        finally:
                            rec.close()
                infos = _new_episodes(store, summary.episode_ids)
                gated_infos += infos
                labels = add(infos)
                op_s = operator_seconds(store, infos, dt)
                row.update(mode="gated", episodes=len(infos), env_steps=summary.steps, new_labels=labels,
                           operator_s=op_s, context_switches=summary.context_switches, windows=summary.windows,
                           windows_cap=_round_windows(g, r), watched_cap=watched,
                           gate_triggers=summary.gate_triggers,
                           intervention_rate=summary.human_steps / max(1, summary.steps),
                           collect_success=summary.successes / max(1, summary.episodes),
                           calibration=cal, gates=recall_figures(infos), lead_s=lead_times(infos, dt))
            totals["labels"] += labels
            totals["operator_s"] += row["operator_s"]
            totals["context_switches"] += row["context_switches"]
            totals["episodes"] += row["episodes"]
            fit = None
            if labels:  # the trainer's per-label budget (train.steps_per_label) sets the round's steps
                trainer.iteration = r + 1
                if promoter is not None:
                    promoter.before_fit(trainer.student)
                fit = trainer.fit(progress=False, info={"round": r, "method": method})
                if promoter is not None:  # the candidate takes over only if not worse beyond the held-out noise
                    row["promotion"] = promoter.judge(trainer.student, {"round": r})
            e = reported.get(trainer.student.version) or closed_loop(trainer.student, env_eval, ev)
            reported[trainer.student.version] = e
            row.update(labels=totals["labels"], operator_s_total=totals["operator_s"],
                       context_switches_total=totals["context_switches"], episodes_total=totals["episodes"],
                       grad_steps=trainer.total_steps, train_loss=fit["loss_last"] if fit else None,
                       success=float(e["success_rate"]), eval_length=float(e["episode_length_mean"]),
                       policy_version=trainer.student.version, seconds=time.perf_counter() - t0)
            rows.append(row)
            with open(curve_path, "a") as f:
                f.write(json.dumps({"method": method, "seed": seed, **row}, default=str) + "\n")
            log(f"  {method} seed {seed} round {r}: {totals['labels']} labels, {row['operator_s']:.0f} operator-s, "
                f"{row['context_switches']} switches, intervention {row['intervention_rate']:.1%}, "
                f"{trainer.total_steps} grad steps -> success {e['success_rate']:.0%} ({row['seconds']:.0f} s)")
            if "promotion" in row:
                d = row["promotion"]
                log(f"  {method} seed {seed} round {r} promotion: {'PROMOTED' if d['promoted'] else 'KEPT the acting'}"
                    f" student: {d['reason']}")
            if "gates" in row:
                log(f"  {method} seed {seed} round {r} gates: {describe(row['gates'])}")
    return {"method": method, "seed": seed, "rounds": rows, "seconds": time.perf_counter() - t_start}


def _human_paced_round(cfg, rec, store_url: str, student, expert, mapping, env_seed: int, calibrate_steps: int,
                       episodes: int, *, seed: int):
    """One round answered by the human operator model (hg_dagger.control.human_model) at the keyboard device, in
    real time: the app's control loop without its window, the model reading the loop's Snapshots as a person
    reads the console and pressing keys as the window's keyboard bridge would send them. Reaction times,
    look-aways, declined requests and imprecise steering are the model's; the world waits while a request waits
    (the run config's handover.wait). Returns (the session's summary, the gate calibration, what the person did)."""
    from types import SimpleNamespace

    from hg_dagger.control import live
    from hg_dagger.control.build import build_session
    from hg_dagger.control.human_model import DECLINE, HumanOperatorModel, summarize
    from hg_dagger.control.loop import ControlLoop
    from hg_dagger.envs import make_env

    held: dict = {}

    def build():
        env = make_env(mapping.task_id, num_envs=1, seed=env_seed)
        session = build_session(cfg, rec, student, env=env, expert=expert)
        held["cal"] = session.calibrate(calibrate_steps) if calibrate_steps else None
        return session

    loop = ControlLoop(build, store=store_url)
    model = HumanOperatorModel(mapping, seed=seed)  # its own planner: the person's intent, apart from the session's
    loop.start()
    started = False
    try:
        while loop.alive:
            snap = loop.slot.read()
            if snap.phase == "error":
                raise RuntimeError(f"human-paced round: {snap.message}")
            if not started and not snap.loading and snap.phase == "idle" and loop.session is not None:
                loop.commands.put(live.StartEpisodes(episodes))
                started = True
            elif started and snap.phase == "idle" and snap.counters.episodes >= episodes:
                break
            for a in model.step(snap, time.monotonic()):
                if a.key != DECLINE:
                    loop.commands.put(live.KeyEvent(a.key, a.down))
                elif a.down and snap.control_state == "handover_requested":  # as the window's decline key does
                    loop.commands.put(live.DeclineRequest())
            time.sleep(0.02)
    finally:
        for a in model.release_all(time.monotonic()):
            if a.key != DECLINE:
                loop.commands.put(live.KeyEvent(a.key, a.down))
        loop.stop()
        if loop.session is None:  # never built: the loop closed nothing
            rec.close()
    if loop.error:
        raise RuntimeError(f"human-paced round: {loop.error}")
    return SimpleNamespace(**loop.summary), held.get("cal"), summarize(model.facts)


def _with_risk_gate(gate_cfg, store, infos, keys, g: dict, out: Path, r: int):
    """gate_cfg plus a risk gate whose model is fit on the gated episodes so far (none yet: no risk gate),
    calibrated to the same target rate on the policy's recorded states."""
    from hg_dagger.control.gate_specs import RiskGate
    from hg_dagger.control.risk_model import RiskModel

    # fit on four fifths of the episodes, calibrate on the rest: the risk of states it was fit on is biased low/high
    held = [i for k, i in enumerate(infos) if k % 5 == 4]
    fit_on = [i for k, i in enumerate(infos) if k % 5 != 4]
    obs, failed = risk_data(store, fit_on, keys, int(g.get("risk_horizon", 25)))
    cal_obs, _ = risk_data(store, held, keys, int(g.get("risk_horizon", 25)))
    info = {"samples": int(len(failed)), "failure_rate": float(failed.mean()) if len(failed) else None,
            "calibration_samples": int(len(next(iter(cal_obs.values()))))}
    if len(failed) < 100 or failed.all() or not failed.any() or info["calibration_samples"] < 20:
        return gate_cfg, None, info
    model = RiskModel.fit(obs, failed, keys=keys, seed=r)
    path = out / f"risk_r{r}.npz"
    model.save(path)
    target = g.get("target_rate") or 0.1
    gate = RiskGate(name="risk", model=str(path), trigger=0.5, hysteresis=0.15, debounce_ticks=2,
                    calibration={"target_rate": target, "min_samples": 20})
    return gate_cfg.model_copy(update={"gates": [*gate_cfg.gates, gate]}), cal_obs, info
