"""The operator app's control loop with and without the window, in the same run.

Task fetch_pick_place_rgb (128 px policy camera, CNN student), 25 Hz control, the planner-driven
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

    QT_QPA_PLATFORM=offscreen python benchmarks/bench_app.py [--seconds 30] [--quick] [--json out.json]
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


def build(store: str, seed: int):
    """The session (runs in the control process)."""
    from hg_dagger.envs import make_env
    from hg_dagger.policy import Student
    from hg_dagger.store import EpisodeStore

    cfg = load_run_config(None, TASK, num_envs=1, seed=seed, **{
        "operator.type": "synthetic", "operator.return_after_steps": 25})
    env = make_env(TASK, num_envs=1, seed=seed)
    student = Student.create(env.mapping, kind="cnn", seed=seed)
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


def scenario(kind: str, seconds: float, seed: int) -> dict:
    store = os.path.join(tempfile.mkdtemp(prefix="bench-app-"), "store.zarr")
    loop = ControlProcess(functools.partial(build, store, seed), view_size=256, store=store)
    app = window = None
    if kind != "headless":
        from PyQt6 import QtCore, QtWidgets

        from hg_dagger.ui.main_window import MainWindow

        app = QtWidgets.QApplication.instance() or QtWidgets.QApplication(["bench"])
        settings = QtCore.QSettings(os.path.join(os.path.dirname(store), "ui.ini"), QtCore.QSettings.Format.IniFormat)
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--quick", action="store_true", help="10 s per scenario")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the figures here")
    args = p.parse_args()
    seconds = 10.0 if args.quick else args.seconds
    res = {k: scenario(k, seconds, args.seed) for k in ("headless", "app", "blocked")}
    base = res["headless"]
    print(f"{TASK}, 25 Hz, 256 px live view, synthetic operator, {seconds:.0f} s per scenario, "
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
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"seconds": seconds, "results": res}, f, indent=2, default=float)


if __name__ == "__main__":
    main()
