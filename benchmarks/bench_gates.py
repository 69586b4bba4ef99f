"""Per-tick cost of the gate engine + handover machine + safety monitor, next to a bare tick measured in
the same run.

1. Control layer alone (FetchPickAndPlace gate and safety configs, Fetch-shaped observations):
   GateEngine.update + HandoverMachine.update/smooth + SafetyMonitor.apply, p50/p99 in microseconds,
   at num_envs 1 and 64, with every env autonomous and with a quarter of them in a correction.
2. A whole tick on toy_reach: bare (student.act + env.step) vs Session.tick (gates, handover, operator,
   safety, recorder.put into a real store), p50/p99 in microseconds.
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
from hg_dagger.control.gates import GateEngine, GateInputs
from hg_dagger.control.handover import AUTO, HUMAN, SRC_HOLD, WARNING, HandoverMachine, TickInputs
from hg_dagger.control.safety import SafetyMonitor
from hg_dagger.control.session import build_session, load_gate_config, load_run_config


def pct(samples_ns) -> tuple[float, float]:
    a = np.asarray(samples_ns, np.float64) / 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def fetch_obs(rng, n):
    obs = {"observation": rng.normal(0, 0.05, (n, 25)).astype(np.float32),
           "achieved_goal": rng.normal(0, 0.05, (n, 3)).astype(np.float32),
           "desired_goal": rng.normal(0, 0.05, (n, 3)).astype(np.float32)}
    obs["observation"][:, :3] += np.array([1.34, 0.75, 0.53], np.float32)
    return obs


def control_layer(n: int, ticks: int, busy: bool) -> tuple[float, float]:
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
    times = []
    for t in range(ticks + 200):
        action = rng.uniform(-0.8, 0.8, (n, 4)).astype(np.float32)
        unc = rng.exponential(0.1, n).astype(np.float32)
        signals = {"progress": -np.abs(rng.normal(0.1, 0.01, n)), "collision_imminent": np.zeros(n),
                   "object_dropped": np.zeros(n), "contact_force": rng.uniform(0, 1, n)}
        step = np.full(n, t % 150, np.int64)
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
        if t >= 200:
            times.append(t1 - t0)
        if not busy:  # keep every env autonomous: measure the steady state, not handovers
            machine.state[:] = AUTO
            gates.rearm(np.arange(n))
    return pct(times)


def whole_tick(n: int, ticks: int):
    from hg_dagger.envs import make_env
    from hg_dagger.policy import Student
    from hg_dagger.store import EpisodeStore

    env = make_env("toy_reach", num_envs=n, seed=0)
    student = Student.create(env.mapping, seed=0)
    # bare: the student and the env, nothing else
    obs, _ = env.reset(seed=0)
    bare = []
    for t in range(ticks + 50):
        t0 = time.perf_counter_ns()
        out = student.act(obs)
        obs = env.step(out.action).obs
        if t >= 50:
            bare.append(time.perf_counter_ns() - t0)
    # gated: the session tick with gates, handover, synthetic operator, safety and recorder.put
    with tempfile.TemporaryDirectory() as tmp:
        rec = EpisodeStore.create(f"{tmp}/store").recorder()
        cfg = load_run_config(None, "toy_reach", num_envs=n)
        s = build_session(cfg, rec, student, env=env)
        s.start(10**9)
        gated = []
        for t in range(ticks + 50):
            t0 = time.perf_counter_ns()
            s.tick()
            if t >= 50:
                gated.append(time.perf_counter_ns() - t0)
        s.estop("benchmark", "end of measurement")  # ends the open episodes cleanly
        s.tick()
        rec.close()
    return pct(bare), pct(gated)


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


def main() -> None:
    import torch

    torch.set_num_threads(1)  # same for bare and gated; avoids thread oversubscription on small machines
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="fewer ticks (smoke run)")
    args = ap.parse_args()
    ticks = 200 if args.quick else args.ticks
    t_start = now_ns()
    print(f"control layer (gates + handover + safety), FetchPickAndPlace configs, {ticks} ticks")
    print(f"{'num_envs':>8} {'scenario':>22} {'p50 us':>9} {'p99 us':>9}")
    for n in (1, 64):
        for busy in (False, True):
            p50, p99 = control_layer(n, ticks, busy)
            print(f"{n:>8} {'25% in correction' if busy else 'all autonomous':>22} {p50:9.1f} {p99:9.1f}")
    print(f"\nwhole tick on toy_reach, {ticks // 2} ticks (student 5x256x256 MLP ensemble)")
    print(f"{'num_envs':>8} {'bare p50':>9} {'bare p99':>9} {'gated p50':>10} {'gated p99':>10} {'ratio p50':>9}")
    for n in (1, 64):
        (b50, b99), (g50, g99) = whole_tick(n, ticks // 2)
        print(f"{n:>8} {b50:9.0f} {b99:9.0f} {g50:10.0f} {g99:10.0f} {g50 / b50:9.2f}")
    (l50, l99), k = poll_to_applied(ticks // 4)
    print(f"\nkeyboard poll -> applied (t_action_apply - t_device), {k} human steps: p50 {l50:.0f} us, p99 {l99:.0f} us")
    print(f"\n(total {(now_ns() - t_start) / 1e9:.0f} s)")


if __name__ == "__main__":
    main()
