"""The operator app's control loop with and without the window, in the same run.

Task fetch_pick_place_rgb (128 px policy camera, CNN student; --student-kind picks its head), 25 Hz control, the planner-driven
synthetic operator answering gates (so handovers happen), and the 256 px live view rendered in the
control process (the app runs its ControlLoop in a process of its own). Three scenarios, each for
--seconds:

  headless   the same control process with no window (the baseline)
  app        the real MainWindow drawing every snapshot (offscreen platform unless a display is set)
  blocked    the app, with the GUI thread blocked every 2 s: 200 ms asleep, then 100 ms of Python
             busy work (which holds the interpreter lock the control thread needs)

Printed per scenario: achieved control rate against the target, tick jitter p99 (start against
schedule), missed ticks, time inside a tick p99, obs -> apply latency p50/p99, GUI frames per
second (refresh timer turns completed; the window's 30 Hz refresh), snapshots drawn per second (at
most the control rate), and each figure's ratio to the headless run.

Then the human-paced run (fetch_pick_place, the real app window, a bootstrapped first student): the
same episodes answered once by the planner-driven synthetic operator (the baseline: it answers within
a few ticks) and once by the human operator model (hg_dagger.control.human_model) at the window's
keyboard through Qt key events (ui/operator_model.py). Printed per operator, from the store's events:
requests, wait from request to take-over p50/p90 (wall seconds), the expired and declined shares,
operator seconds per correction (take-over to hand-back), corrected steps and successful episodes.

    QT_QPA_PLATFORM=offscreen python benchmarks/bench_app.py [--seconds 30] [--quick] [--json out.json]
        [--only loop|human] [--human-episodes 10] [--human-seed 0]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import tempfile
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("MUJOCO_GL", "egl")

from hg_dagger.control import live  # noqa: E402
from hg_dagger.control.build import build_session  # noqa: E402
from hg_dagger.control.loop import ControlProcess  # noqa: E402
from hg_dagger.control.run_config import load_run_config  # noqa: E402

TASK = "fetch_pick_place_rgb"


def build(store: str, seed: int, kind: str = "cnn"):
    """The session (runs in the control process)."""
    from hg_dagger.envs import make_env
    from hg_dagger.policy import Student
    from hg_dagger.store import EpisodeStore

    cfg = load_run_config(None, TASK, num_envs=1, seed=seed, **{
        "operator.type": "synthetic", "operator.return_after_steps": 25})
    env = make_env(TASK, num_envs=1, seed=seed)
    student = Student.create(env.mapping, kind=kind, seed=seed)
    s = build_session(cfg, EpisodeStore.create(store, exist_ok=True).recorder(), student, env=env)
    s.calibrate(100)
    return s


def measure(loop, seconds: float, app=None, block: bool = False) -> dict:
    """Per-tick figures over the scenario from the loop's own schedule, and GUI frames drawn."""
    frames, polls = [0], [0]
    if app is not None:
        from PyQt6 import QtCore

        app.window.reader.snapshot.connect(lambda _s: frames.__setitem__(0, frames[0] + 1))
        app.window.reader.timer.timeout.connect(lambda: polls.__setitem__(0, polls[0] + 1))
    snap0 = loop.slot.wait_for(lambda s: s.phase == "running", 120)
    assert snap0 is not None, loop.slot.read().message
    h0 = snap0.health
    t0 = time.monotonic()
    next_block = t0 + 2.0
    while time.monotonic() - t0 < seconds:
        if app is not None:
            app.processEvents(QtCore.QEventLoop.ProcessEventsFlag.AllEvents, 10)
            if block and time.monotonic() >= next_block:
                time.sleep(0.2)
                end = time.perf_counter() + 0.1
                x = 0
                while time.perf_counter() < end:
                    x += 1
                next_block += 2.0
        else:
            time.sleep(0.01)
    snap = loop.slot.read()
    h = snap.health
    elapsed = time.monotonic() - t0
    ticks = h.ticks - h0.ticks
    return {
        "target_hz": h.target_hz, "achieved_hz": ticks / elapsed, "window_hz": h.achieved_hz,
        "jitter_p99_ms": h.jitter_p99_ms, "missed_ticks": h.missed_ticks - h0.missed_ticks,
        "tick_ms_p99": h.tick_ms_p99, "latency_p50_ms": h.latency_p50_ms, "latency_p99_ms": h.latency_p99_ms,
        "gui_fps": polls[0] / elapsed if app is not None else 0.0,
        "drawn_per_s": frames[0] / elapsed if app is not None else 0.0, "episodes": snap.counters.episodes,
        "handovers": snap.counters.context_switches, "recorder_dropped": h.recorder_dropped,
    }


def scenario(kind: str, seconds: float, seed: int, student_kind: str = "cnn") -> dict:
    store = os.path.join(tempfile.mkdtemp(prefix="bench-app-"), "store.zarr")
    loop = ControlProcess(functools.partial(build, store, seed, student_kind), view_size=256, store=store)
    app = window = None
    if kind != "headless":
        from PyQt6 import QtWidgets

        from hg_dagger.ui.main_window import MainWindow
        from hg_dagger.ui.settings import SettingsFile

        app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(["bench"])
        settings = SettingsFile(os.path.join(os.path.dirname(store), "app.yaml"))
        window = MainWindow(loop.slot, loop.commands, settings=settings)
        window.resize(1500, 940)
        window.show()
        app.window = window
    loop.start()
    loop.commands.put(live.StartEpisodes(1000))
    try:
        return measure(loop, seconds, app, block=kind == "blocked")
    finally:
        loop.stop()
        if window is not None:
            window.close()
            window.deleteLater()
            app.processEvents()


HUMAN_TASK = "fetch_pick_place"


def operator_run(kind: str, episodes: int, student: str, workdir: str, seed: int) -> dict:
    """``episodes`` episodes in the real app window, answered by the synthetic operator or by the human
    operator model at the window's keyboard; figures from the store's REQUEST_END events and windows."""
    from PyQt6 import QtWidgets

    from hg_dagger.ui.application import AppOptions, OperatorApp
    from hg_dagger.ui.settings import SettingsFile

    app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(["bench"])
    app.setQuitOnLastWindowClosed(False)  # as run_app: the run ends when the app says so, not with its window
    home = os.path.join(workdir, kind)
    opts = AppOptions(task=HUMAN_TASK, store=os.path.join(home, "store.zarr"), student=student,
                      operator="synthetic" if kind == "synthetic" else "device", device="keyboard", name=kind,
                      episodes=episodes, quit_when_done=True, home=home, seed=seed)
    settings = SettingsFile(os.path.join(home, "app.yaml"))
    op = OperatorApp(opts, settings)
    op.finished.connect(lambda code: app.exit(code))
    model = driver = None
    t0 = time.monotonic()
    op.start()
    if kind == "human":
        from hg_dagger.control.human_model import HumanOperatorModel
        from hg_dagger.envs import load_mapping
        from hg_dagger.ui.operator_model import ModelDriver

        model = HumanOperatorModel(load_mapping(HUMAN_TASK), seed=seed)
        driver = ModelDriver(op.window, model)
        driver.start()
    app.exec()
    wall = time.monotonic() - t0
    if driver is not None:
        driver.timer.stop()
    op.loop.join(60)  # the control process has committed and closed the store
    out = request_figures(opts.store_url)
    out.update(wall_s=wall, exit_code=op.exit_code)
    if model is not None:
        from collections import Counter

        out["model"] = {"requests_seen": len(model.facts), "looked_away": sum(f.look_away_s > 0 for f in model.facts),
                        "outcomes": dict(Counter(f.outcome for f in model.facts))}
    return out


def request_figures(store: str) -> dict:
    """Per request and per correction, from what the session recorded."""
    import numpy as np

    from hg_dagger.contract import ActionSource, EventKind
    from hg_dagger.contract.clock import NO_TIME
    from hg_dagger.store import EpisodeStore

    st = EpisodeStore.open(store)
    ends, corr_s, corrected, episodes, successes = [], [], 0, 0, 0
    for info in st.episodes(complete=True):
        if info.start.mode.value != "human_gated":
            continue
        episodes += 1
        successes += int(info.end.task_success)
        dt = float(info.start.mapping.get("step_dt", 0.04))
        ends += [e.values for e in info.end.events if e.kind == EventKind.REQUEST_END]
        for w in st.labels(info.episode_id).windows:
            if w.source != ActionSource.HUMAN:
                continue
            corrected += w.handover_end - w.handover_start
            if w.t_return != NO_TIME and w.t_handover != NO_TIME:
                corr_s.append((w.t_return - w.t_handover) / 1e9)
            else:
                corr_s.append((w.handover_end - w.handover_start) * dt)
    n = len(ends)
    waits = np.array([e.get("wait_wall_s") or e.get("wait_s") or 0.0 for e in ends if e["outcome"] == "answered"])

    def share(outcome: str) -> float:
        return sum(e["outcome"] == outcome for e in ends) / n if n else float("nan")

    return {"episodes": episodes, "successes": successes, "requests": n, "answered": int(waits.size),
            "wait_p50_s": float(np.percentile(waits, 50)) if waits.size else float("nan"),
            "wait_p90_s": float(np.percentile(waits, 90)) if waits.size else float("nan"),
            "expired_share": share("expired"), "declined_share": share("declined"),
            "corrections": len(corr_s), "operator_s_per_correction": float(np.mean(corr_s)) if corr_s else float("nan"),
            "corrected_steps": int(corrected)}


def human_paced(episodes: int, seed: int) -> dict:
    from hg_dagger.learn.rounds import bootstrap_student

    workdir = tempfile.mkdtemp(prefix="bench-app-human-")
    boot = bootstrap_student(task=HUMAN_TASK, store=os.path.join(workdir, "demos.zarr"),
                             out_dir=os.path.join(workdir, "boot"), demos=2, steps=100, seed=seed,
                             report=lambda *_: None)
    return {k: operator_run(k, episodes, boot["checkpoint"], workdir, seed) for k in ("synthetic", "human")}


def print_human(res: dict, episodes: int) -> None:
    from figures import record

    print(f"\n{HUMAN_TASK}, the app window, {episodes} episodes per operator (bootstrapped first student), "
          f"load {os.getloadavg()[0]:.1f}")
    cols = ("requests", "wait_p50_s", "wait_p90_s", "expired_share", "declined_share", "corrections",
            "operator_s_per_correction", "corrected_steps", "successes", "wall_s")
    print(f"{'operator':10s} " + " ".join(f"{c:>26s}" for c in cols))
    for k, r in res.items():
        print(f"{k:10s} " + " ".join(f"{float(r[c]):26.2f}" for c in cols))
    if "model" in res["human"]:
        print("human model:", res["human"]["model"])
    h, b = res["human"], res["synthetic"]
    record("app human-paced: wait until take-over p50", h["wait_p50_s"], unit="s", baseline=b["wait_p50_s"],
           baseline_name="synthetic operator", higher_is_better=False)
    record("app human-paced: wait until take-over p90", h["wait_p90_s"], unit="s", baseline=b["wait_p90_s"],
           baseline_name="synthetic operator", higher_is_better=False)
    record("app human-paced: expired share of requests", h["expired_share"], baseline=b["expired_share"],
           baseline_name="synthetic operator", target="0", met=h["expired_share"] == 0, higher_is_better=False)
    record("app human-paced: declined share of requests", h["declined_share"], baseline=b["declined_share"],
           baseline_name="synthetic operator", higher_is_better=False)
    record("app human-paced: operator seconds per correction", h["operator_s_per_correction"], unit="s",
           baseline=b["operator_s_per_correction"], baseline_name="synthetic operator", higher_is_better=False)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--quick", action="store_true", help="10 s per scenario, 4 episodes per operator")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures here")
    p.add_argument("--only", choices=("loop", "human"), help="run only the loop scenarios or the human-paced run")
    p.add_argument("--human-episodes", type=int, default=10, help="episodes per operator in the human-paced run")
    p.add_argument("--human-seed", type=int, default=0, help="the human operator model's seed")
    p.add_argument("--student-kind", default="cnn", help="the loop scenarios' student (cnn, cnn_gmm, cnn_chunk)")
    args = p.parse_args()
    seconds = 10.0 if args.quick else args.seconds
    episodes = 4 if args.quick else args.human_episodes
    out: dict = {"seconds": seconds}
    if args.only != "human":
        out["results"] = loop_scenarios(seconds, args.seed, args.student_kind)
    if args.only != "loop":
        out["human_paced"] = human_paced(episodes, args.human_seed)
        print_human(out["human_paced"], episodes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=float)


def loop_scenarios(seconds: float, seed: int, student_kind: str = "cnn") -> dict:
    res = {k: scenario(k, seconds, seed, student_kind) for k in ("headless", "app", "blocked")}
    base = res["headless"]
    print(f"{TASK}, 25 Hz, 256 px live view, {student_kind} student, synthetic operator, {seconds:.0f} s per scenario, "
          f"load {os.getloadavg()[0]:.1f}")
    cols = ("achieved_hz", "jitter_p99_ms", "missed_ticks", "tick_ms_p99", "latency_p50_ms", "latency_p99_ms",
            "gui_fps", "drawn_per_s", "handovers")
    print(f"{'scenario':10s} " + " ".join(f"{c:>15s}" for c in cols))
    for k, r in res.items():
        print(f"{k:10s} " + " ".join(f"{r[c]:15.2f}" for c in cols))
    for k in ("app", "blocked"):
        r = res[k]
        print(f"{k} / headless: rate {r['achieved_hz'] / base['achieved_hz']:.3f}, "
              f"jitter p99 {r['jitter_p99_ms'] / max(base['jitter_p99_ms'], 1e-9):.2f}x, "
              f"rate vs target {100 * r['achieved_hz'] / r['target_hz']:.1f}%")
    from figures import record

    for k in ("app", "blocked"):
        r = res[k]
        record(f"app {k}: achieved rate", r["achieved_hz"], unit="Hz", baseline=base["achieved_hz"],
               baseline_name="headless loop", target=">= 99% of 25 Hz", met=r["achieved_hz"] >= 0.99 * r["target_hz"])
        record(f"app {k}: tick jitter p99", r["jitter_p99_ms"], unit="ms", baseline=base["jitter_p99_ms"],
               baseline_name="headless loop", target="<= 5 ms", met=r["jitter_p99_ms"] <= 5.0, higher_is_better=False)
        record(f"app {k}: missed ticks", r["missed_ticks"], baseline=base["missed_ticks"], baseline_name="headless loop",
               target="0", met=r["missed_ticks"] == 0, higher_is_better=False)
    record("app: GUI frames drawn", res["app"]["gui_fps"], unit="fps", target=">= 20 fps",
           met=res["app"]["gui_fps"] >= 20)
    return res


if __name__ == "__main__":
    main()
