"""Per-tick cost of the gate engine + handover machine + safety monitor, next to a bare tick measured in
the same run.

1. Control layer alone (FetchPickAndPlace gate and safety configs, Fetch-shaped observations):
   GateEngine.update + HandoverMachine.update/smooth + SafetyMonitor.apply, p50/p99 in microseconds,
   at num_envs 1 and 64, with every env autonomous and with a quarter of them in a correction.
2. A whole tick on toy_reach: bare (student.act + env.step) vs Session.tick (gates, handover, operator,
   safety, recorder.put into a real store), p50/p99 in microseconds, measured in alternating blocks.
3. Device poll-to-applied latency (t_action_apply - t_device) with the keyboard device held down.

    python benchmarks/bench_gates.py [--ticks 2000] [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.enums import ActionSource
from hg_dagger.contract.labels import TrainingRule
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_scores import GateInputs
from hg_dagger.control.gate_specs import GateConfig, OperatorGate
from hg_dagger.control.gates import GateEngine
from hg_dagger.control.handover import AUTO, HUMAN, SRC_HOLD, WARNING, HandoverMachine, TickInputs
from hg_dagger.control.run_config import load_gate_config, load_run_config
from hg_dagger.control.safety import SafetyMonitor

UNREVIEWED = TrainingRule(require_review=False, require_qc=False)  # learning(): windows stand in for approved ones


def pct(samples_ns) -> tuple[float, float]:
    a = np.asarray(samples_ns, np.float64) / 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def fetch_obs(rng, n):
    obs = {"observation": rng.normal(0, 0.05, (n, 25)).astype(np.float32),
           "achieved_goal": rng.normal(0, 0.05, (n, 3)).astype(np.float32),
           "desired_goal": rng.normal(0, 0.05, (n, 3)).astype(np.float32)}
    obs["observation"][:, :3] += np.array([1.34, 0.75, 0.53], np.float32)
    return obs


def control_layer(n: int, ticks: int, busy: bool) -> tuple[float, float, float]:
    cfg = load_run_config(None, "fetch_pick_place", num_envs=n)
    gates = GateEngine(load_gate_config(cfg.gates, "fetch_pick_place"), num_envs=n, step_dt=0.04, action_dim=4)
    machine = HandoverMachine(cfg.handover, num_envs=n, action_dim=4, step_dt=0.04)
    safety = SafetyMonitor(cfg.safety, num_envs=n, action_dim=4)
    rng = np.random.default_rng(0)
    obs = fetch_obs(rng, n)
    human = np.zeros(n, bool)
    if busy:
        human[: max(1, n // 4)] = True
        machine.state[human] = HUMAN
    times, cpu = [], []
    for t in range(ticks + 200):
        action = rng.uniform(-0.8, 0.8, (n, 4)).astype(np.float32)
        unc = rng.exponential(0.1, n).astype(np.float32)
        signals = {"progress": -np.abs(rng.normal(0.1, 0.01, n)), "collision_imminent": np.zeros(n),
                   "object_dropped": np.zeros(n), "contact_force": rng.uniform(0, 1, n)}
        step = np.full(n, t % 150, np.int64)
        c0 = time.thread_time_ns()
        t0 = time.perf_counter_ns()
        armed = (machine.state == AUTO) | (machine.state == WARNING)
        g = gates.update(GateInputs(step=step, t_ns=t0, action=action, uncertainty=unc, obs=obs, signals=signals,
                                    takeover=np.zeros(n, bool), prev_applied=safety.prev, prev_ok=safety.prev_ok), armed)
        d = machine.update(TickInputs(step=step, t_ns=t0, gate_level=g.level, engaged=human, device_ok=np.ones(n, bool),
                                      return_button=np.zeros(n, bool), agree=np.zeros(n, bool),
                                      confident=gates.confident(), estop=np.zeros(n, bool), gate_trip=gates.trip,
                                      t_warn=gates.t_warn, t_gate=gates.t_gate))
        gates.rearm(d.rearm)
        target = np.where((d.source == SRC_HOLD)[:, None], safety.hold(), action)
        cmd, _ = machine.smooth(target, safety.prev, safety.prev_ok)
        res = safety.apply(cmd, obs)
        safety.commit(res.applied)
        t1 = time.perf_counter_ns()
        c1 = time.thread_time_ns()
        if t >= 200:
            times.append(t1 - t0)
            cpu.append(c1 - c0)
        if not busy:  # keep every env autonomous: measure the steady state, not handovers
            machine.state[:] = AUTO
            gates.rearm(np.arange(n))
    return (*pct(times), pct(cpu)[0])


QUIET_S = 0.05  # before each block of whole_tick: neither loop starts inside the other's background work


def whole_tick(n: int, ticks: int, quiet: bool = False, block: int = 50):
    """Bare ticks (student.act + env.step on an env of its own) and session ticks, in alternating blocks of
    ``block`` ticks: both see the same moments of a noisy machine, so their ratio does not drift with it. Each
    block starts after a pause in which the session's recorder thread catches up, so that a bare block does not
    pay for the session's writing; within a session block the writer runs beside the ticks as it does live."""
    from hg_dagger.control.loop_health import steady_collector
    from hg_dagger.envs import make_env
    from hg_dagger.policy import Student, one_inference_thread
    from hg_dagger.store import EpisodeStore

    one_inference_thread()  # as `hg-dagger run` and the app's control process run the student (bare loop too)
    bare_env = make_env("toy_reach", num_envs=n, seed=0)
    env = make_env("toy_reach", num_envs=n, seed=0)
    student = Student.create(env.mapping, seed=0)
    obs, _ = bare_env.reset(seed=0)
    alone = []  # the bare loop before any session exists: the session's background writer cannot touch it
    for t in range(ticks // 2 + 20):
        t0 = time.perf_counter_ns()
        obs = bare_env.step(student.act(obs).action).obs
        if t >= 20:
            alone.append(time.perf_counter_ns() - t0)
    bare, gated = [], []
    with tempfile.TemporaryDirectory() as tmp:
        rec = EpisodeStore.create(f"{tmp}/store").recorder()
        over = {"gates": GateConfig(name="operator_only", gates=[OperatorGate()])} if quiet else {}
        cfg = load_run_config(None, "toy_reach", num_envs=n, **over)
        s = build_session(cfg, rec, student, env=env)
        s.start(10**9)
        steady_collector()  # the app's control process settles so once its session is built (bare loop too)
        for b in range(-1, -(-ticks // block)):  # block -1 warms both up
            time.sleep(QUIET_S)  # the session's writer thread finishes what the last block handed it
            for _ in range(block):  # bare: the student and the env, nothing else
                t0 = time.perf_counter_ns()
                out = student.act(obs)
                obs = bare_env.step(out.action).obs
                if b >= 0:
                    bare.append(time.perf_counter_ns() - t0)
            time.sleep(QUIET_S)
            for _ in range(block):  # the session tick: gates, handover, operator, safety, recorder.put
                t0 = time.perf_counter_ns()
                s.tick()
                if b >= 0:
                    gated.append(time.perf_counter_ns() - t0)
        s.estop("benchmark", "end of measurement")  # ends the open episodes cleanly
        s.tick()
        rec.close()
    bare_env.close()
    return pct(bare), pct(gated), pct(alone)[0]


def poll_to_applied(ticks: int):
    from hg_dagger.devices import Keyboard
    from hg_dagger.envs import make_env
    from hg_dagger.policy import Student
    from hg_dagger.store import EpisodeStore

    with tempfile.TemporaryDirectory() as tmp:
        store = EpisodeStore.create(f"{tmp}/store")
        rec = store.recorder()
        kb = Keyboard()
        kb.connect()
        env = make_env("toy_reach", num_envs=1, seed=0)
        cfg = load_run_config(None, "toy_reach", num_envs=1, **{"operator.type": "device"})
        s = build_session(cfg, rec, Student.create(env.mapping, seed=0), env=env, operators=[kb])
        s.start(10**9)
        kb.press("space")
        kb.press("w")
        for _ in range(ticks):
            s.tick()
        s.estop("benchmark", "end of measurement")
        s.tick()
        rec.close()
        lat = []
        for info in store.episodes():
            d = store.read_steps(info.episode_id, ["t_device", "t_action_apply", "action_source"])
            h = d["action_source"] == ActionSource.HUMAN.code
            lat += list(d["t_action_apply"][h] - d["t_device"][h])
    return pct(lat), len(lat)


# --------------------------------------------------------------------------------------------
# Learning efficiency at an equal label budget (--learning)
# --------------------------------------------------------------------------------------------


def learning(out: str, budget: int, seed: int, train_steps: int, eval_episodes: int, gated_episodes: int) -> dict:
    """BC vs classic DAgger (planner expert) vs human-gated DAgger (synthetic operator driven by the planner)
    on FetchPickAndPlace, each with at most ``budget`` labels from the expert / operator."""
    import json
    from pathlib import Path

    import torch

    from hg_dagger.contract.enums import LabelMask
    from hg_dagger.envs import load_mapping, make_env
    from hg_dagger.learn.auto import AutoConfig, AutoRun
    from hg_dagger.learn.evaluate import EvalConfig, closed_loop
    from hg_dagger.learn.train import TrainConfig, Trainer, store_loader
    from hg_dagger.store import EpisodeStore
    from hg_dagger.store.trainable import load_labels

    task, horizon = "fetch_pick_place", 150
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train = {"steps": train_steps, "batch_size": 256, "lr": 1e-3, "seed": seed}
    ev = {"episodes": eval_episodes, "num_envs": 10, "seed": 100_000}
    results: dict = {"budget": budget, "train_steps": train_steps, "eval_episodes": eval_episodes}

    def auto(name, **kw):
        cfg = AutoConfig(task=task, certification="planner_auto", seed=seed, num_envs=5, train=train, eval=ev, **kw)
        t0 = time.time()
        rows = AutoRun(cfg, out / name).run(progress=False)
        curve = [{"labels": int(r["replay"]["labels"]), "success": r["eval_success_rate"]} for r in rows]
        return {"curve": curve, "success": rows[-1]["eval_success_rate"], "seconds": time.time() - t0}

    half = budget // horizon // 2
    results["bc"] = auto("bc", mode="expert_demo", iterations=1, episodes_per_iteration=2 * half)
    results["bc"]["labels"] = 2 * half * horizon
    print("BC:", json.dumps(results["bc"]), flush=True)
    results["dagger"] = auto("dagger", mode="dagger_sync", iterations=4, episodes_per_iteration=max(1, half // 2),
                             beta={"kind": "exponential", "beta0": 1.0, "decay": 0.5})
    results["dagger"]["labels"] = 4 * max(1, half // 2) * horizon
    print("DAgger:", json.dumps(results["dagger"]), flush=True)

    # human-gated: BC warm start on half the budget, then gated rounds until the human labels fill the rest
    t0 = time.time()
    warm = auto("gated_warmstart", mode="expert_demo", iterations=1, episodes_per_iteration=half)
    mapping = load_mapping(task)
    store_url = str(out / "gated_warmstart" / "store")
    store = EpisodeStore.open(store_url, mode="a")
    trainer = Trainer.resume(out / "gated_warmstart" / "checkpoint.pt", mapping, store_loader(store, mapping),
                             TrainConfig(**train))
    labels = half * horizon
    curve = [{"labels": labels, "success": warm["success"]}]
    rounds = []
    keys = list(mapping.obs_spec())
    torch.set_num_threads(1)
    env_eval = make_env(task, num_envs=10, seed=100_000)
    r = 0
    while labels < budget and r < 6:
        cfg = load_run_config(None, task, num_envs=4, seed=seed + 1000 * (r + 1), calibrate_steps=200)
        rec = store.recorder()
        env = make_env(task, num_envs=4, seed=seed + r)
        session = build_session(cfg, rec, trainer.student, env=env)
        cal = session.calibrate(200)
        summary = session.run(gated_episodes, progress=False)
        rec.close()
        env.close()
        store = EpisodeStore.open(store_url, mode="a")
        new = [store.info(e) for e in summary.episode_ids]
        human = sum(int((store.labels(i.episode_id).mask == LabelMask.TRAINABLE.code).sum()) for i in new)
        labels += human
        # the noisy synthetic operator stands in for a person whose windows a reviewer approved: no review here
        trainer.replay.add(load_labels(store, i, keys, UNREVIEWED) for i in new)
        trainer.iteration += 1
        trainer.fit(log_path=out / "gated_loss.jsonl", progress=False, info={"round": r})
        e = closed_loop(trainer.student, env_eval, EvalConfig(**ev))
        row = {"round": r, "labels": labels, "human_labels": human, "success": e["success_rate"],
               "collect_episodes": summary.episodes, "collect_success": summary.successes / max(1, summary.episodes),
               "interventions_per_episode": summary.windows / max(1, summary.episodes),
               "context_switches": summary.context_switches, "gate_triggers": summary.gate_triggers,
               "human_labels_per_success": human / max(1, summary.successes), "calibration": cal}
        rounds.append(row)
        curve.append({"labels": labels, "success": e["success_rate"]})
        print("gated round:", json.dumps(row, default=str), flush=True)
        r += 1
    env_eval.close()
    results["gated"] = {"curve": curve, "success": curve[-1]["success"], "labels": labels, "rounds": rounds,
                        "seconds": time.time() - t0}
    (out / "learning.json").write_text(json.dumps(results, indent=2, default=str))
    return results


def main() -> None:
    import torch

    torch.set_num_threads(1)  # same for bare and gated; avoids thread oversubscription on small machines
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="fewer ticks (smoke run)")
    ap.add_argument("--learning", metavar="OUT", help="instead: BC vs DAgger vs human-gated at an equal label budget")
    ap.add_argument("--budget", type=int, default=3000, help="labels per method (--learning)")
    ap.add_argument("--train-steps", type=int, default=1000)
    ap.add_argument("--eval-episodes", type=int, default=30)
    ap.add_argument("--gated-episodes", type=int, default=8, help="episodes per human-gated round")
    args = ap.parse_args()
    if args.learning:
        res = learning(args.learning, args.budget, 0, args.train_steps, args.eval_episodes, args.gated_episodes)
        print(f"{'method':>12} {'labels':>7} {'eval success':>12}")
        for k in ("bc", "dagger", "gated"):
            print(f"{k:>12} {res[k]['labels']:>7} {res[k]['success']:>12.2f}")
        return
    from figures import record

    from hg_dagger.control.loop_health import control_process_settings

    control_process_settings()  # this process runs its session as the app's control process does
    ticks = 200 if args.quick else args.ticks
    t_start = now_ns()
    print(f"control layer (gates + handover + safety), FetchPickAndPlace configs, {ticks} ticks")
    print(f"{'num_envs':>8} {'scenario':>22} {'p50 us':>9} {'p99 us':>9} {'CPU p50 us':>10}")
    for n in (1, 64):
        for busy in (False, True):
            p50, p99, c50 = control_layer(n, ticks, busy)
            print(f"{n:>8} {'25% in correction' if busy else 'all autonomous':>22} {p50:9.1f} {p99:9.1f} {c50:10.1f}")
    print(f"\nwhole tick on toy_reach, {ticks // 2} ticks (student 5x256x256 MLP ensemble), microseconds")
    print("bare = student.act + env.step; session = Session.tick with recorder.put into a real store")
    print(f"{'num_envs':>8} {'session gates':>24} {'bare p50':>9} {'bare p99':>9} {'sess p50':>9} {'sess p99':>9} "
          f"{'ratio p50':>9} {'bare alone p50':>14}")
    for n in (1, 64):
        for quiet in (True, False):
            (b50, b99), (g50, g99), alone = whole_tick(n, ticks // 2, quiet)
            label = "operator only (no handover)" if quiet else "toy_reach (synthetic op.)"
            print(f"{n:>8} {label:>24} {b50:9.0f} {b99:9.0f} {g50:9.0f} {g99:9.0f} {g50 / b50:9.2f} {alone:14.0f}")
            record(f"session tick toy_reach x{n}, {label}: p50", g50, unit="us", baseline=b50,
                   baseline_name="student.act + env.step", higher_is_better=False)
    (l50, l99), k = poll_to_applied(ticks // 4)
    print(f"\nkeyboard poll -> applied (t_action_apply - t_device), {k} human steps: p50 {l50:.0f} us, p99 {l99:.0f} us")
    record("keyboard poll -> applied p99", l99, unit="us", target="<= 40000 us (one 25 Hz tick)", met=l99 <= 40_000,
           higher_is_better=False)
    print(f"\n(total {(now_ns() - t_start) / 1e9:.0f} s)")


if __name__ == "__main__":
    main()
