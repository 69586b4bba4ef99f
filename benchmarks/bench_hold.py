"""How still a held robot is, per backend: hand drift after ``hold()`` next to the drift without it.

Each case: reset(seed), N steps at full speed in one direction, then (or not) ``hold()``, then 10 steps of
the hold action (motion 0, the gripper's last command; ``bridge.server.hold_action``). Drift is the
largest distance (mm) the end effector gets from where ``observe()`` saw it right after the motion (and
the hold). Both sides run in this process on the same env, one after the other, so they see the same
simulator and load. Target: <= 2 mm with hold() for every free-space case. Cases where the hand ends
pressed onto the table are listed apart: a pressed hand relaxes by the contact's give either way.
``hold()`` time is wall time of the call (it settles a scratch copy of the simulation, see pin_arm).
--write-docs replaces the "Holding position" section of docs/benchmarks.md.

    MUJOCO_GL=egl .venv/bin/python benchmarks/bench_hold.py [--quick] [--write-docs]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parent))
from figures import record  # noqa: E402

from hg_dagger.envs import make_env  # noqa: E402
from hg_dagger.envs.bridge import hold_action  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- hold:begin -->", "<!-- hold:end -->"
TARGET_MM = 2.0
HELD_STEPS = 10
# free-space directions (dx, dy, dz) at full speed; the gripper dim is added per case
DIRECTIONS = {"+x": (1, 0, 0), "-x": (-1, 0, 0), "+y": (0, 1, 0), "-y": (0, -1, 0), "+z": (0, 0, 1),
              "+x+y+z": (1, 1, 1), "-x-y+z": (-1, -1, 1)}
PRESSED = {"-z": (0, 0, -1), "+x+y-z": (1, 1, -1)}  # end on (or in) the table for Fetch
TASKS = ["fetch_reach", "fetch_pick_place", "mw_reach", "mw_pick_place", "toy_reach"]
NOTE = (
    'Reading it: without `hold()` the arm carries on with the motion it was commanded, up to 128 mm (Meta'
    "-World moves its hand's target 1 cm per step and the hand, lagging behind, keeps going until it gets"
    ' there; Fetch re-targets the gripper where it is plus the step, so momentum and gravity carry it on)'
    ". Cases that end at the edge of Fetch's reach barely move either way, hence its low medians. With `h"
    'old()` every free-space case stays under 2 mm. A hand pressed onto the table (Fetch, -z) relaxes by '
    "the contact's give, about 4 mm, with or without `hold()`: the pin never presses more than 5 mm past "
    "the measured pose. The toy arm has no momentum (its action is that step's joint velocity), so not st"
    'epping is holding. `hold()` settles a scratch copy of the simulation for 0.25 s of simulated time pe'
    "r row (twice) to find the weld's sag; its wall time grows with machine load and with `num_envs`."
)


def hand(task: str, obs: dict) -> np.ndarray:
    return np.asarray(obs["ee_pos"][0] if task.startswith("toy") else obs["observation"][0, :3], np.float64)


def drift(env, task: str, action: np.ndarray, steps: int, hold: bool, seed: int) -> tuple[float, float]:
    """(drift mm, hold() ms) of one case."""
    env.reset(seed=seed)
    for _ in range(steps):
        env.step(action)
    ms = 0.0
    if hold:
        t0 = time.perf_counter()
        env.hold()
        ms = (time.perf_counter() - t0) * 1e3
    start = hand(task, env.observe()[0])
    still = hold_action(list(env.mapping.action.names), action, 1)
    worst = max(float(np.linalg.norm(hand(task, env.step(still).obs) - start)) for _ in range(HELD_STEPS))
    return worst * 1e3, ms


def cases(task: str, quick: bool):
    if task.startswith("toy"):
        for name, a in {"+q": (1, 1), "-q": (-1, 1)}.items():
            yield name, np.array([a], np.float32), False
        return
    dirs = dict(list(DIRECTIONS.items())[:3]) if quick else DIRECTIONS
    for name, d in dirs.items():
        yield name, np.array([[*d, 1.0]], np.float32), False
    if task.startswith("fetch"):
        for name, d in PRESSED.items():
            yield name, np.array([[*d, 1.0]], np.float32), True


def run(tasks: list[str], steps_list: list[int], seeds: list[int], quick: bool) -> list[dict]:
    rows = []
    for task in tasks:
        with make_env(task, num_envs=1, seed=0) as env:
            free, pressed, hold_ms = [], [], []
            for name, action, on_table in cases(task, quick):
                for steps in steps_list:
                    for seed in seeds:
                        coast, _ = drift(env, task, action, steps, False, seed)
                        held, ms = drift(env, task, action, steps, True, seed)
                        (pressed if on_table else free).append((held, coast, name, steps, seed))
                        hold_ms.append(ms)
            rows.append({"task": task, "free": free, "pressed": pressed, "hold_ms": hold_ms})
            worst = max(free)
            print(f"{task}: {len(free)} free-space cases, held worst {worst[0]:.2f} mm ({worst[2]} x{worst[3]}), "
                  f"without hold median {np.median([c for _, c, *_ in free]):.1f} mm, "
                  f"hold() {np.median(hold_ms):.1f} ms median", flush=True)
    return rows


def table(rows: list[dict]) -> str:
    out = ["| task | free-space cases | with hold(): worst / median mm | without: worst / median mm "
           "| +x, 12 steps: with / without mm | pressed onto the table: with / without mm "
           "| hold() ms median (max) | target met |",
           "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        held = [h for h, *_ in r["free"]]
        coast = [c for _, c, *_ in r["free"]]
        plus_x = [(h, c) for h, c, name, steps, _ in r["free"] if name == "+x" and steps == 12]
        px = f"{plus_x[0][0]:.2f} / {plus_x[0][1]:.1f}" if plus_x else "n/a"
        worst_pressed: dict[str, tuple[float, float]] = {}
        for h, c, n, s, _ in r["pressed"]:
            if s == 12:
                worst_pressed[n] = max(worst_pressed.get(n, (0.0, 0.0)), (h, c))
        pr = "; ".join(f"{n} x12: {h:.2f} / {c:.2f}" for n, (h, c) in worst_pressed.items()) or "n/a"
        ms = r["hold_ms"]
        met = "yes" if max(held) <= TARGET_MM else "no"
        out.append(f"| {r['task']} | {len(held)} | {max(held):.2f} / {np.median(held):.2f} | "
                   f"{max(coast):.1f} / {np.median(coast):.1f} | {px} | {pr} | "
                   f"{np.median(ms):.1f} ({max(ms):.1f}) | {met} |")
    return "\n".join(out)


def write_docs(text: str) -> None:
    doc = DOCS.read_text()
    if BEGIN in doc and END in doc:
        head, rest = doc.split(BEGIN, 1)
        doc = head + BEGIN + "\n" + text + "\n" + END + rest.split(END, 1)[1]
    else:
        doc = doc.rstrip("\n") + "\n\n" + BEGIN + "\n" + text + "\n" + END + "\n"
    DOCS.write_text(doc)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 directions, 12 steps, one seed")
    ap.add_argument("--tasks", nargs="+", default=TASKS)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    steps_list, seeds = ([12], [3]) if args.quick else ([3, 12], [3, 4])
    t0 = time.time()
    rows = run(args.tasks, steps_list, seeds, args.quick)
    for r in rows:
        held = max(h for h, *_ in r["free"])
        coast = float(np.median([c for _, c, *_ in r["free"]]))
        record(f"hold drift {r['task']} (worst free-space case)", held, unit="mm", baseline=coast,
               baseline_name="median drift without hold()", target=f"<= {TARGET_MM:g} mm", met=held <= TARGET_MM,
               higher_is_better=False)
    text = table(rows) + "\n\n" + NOTE
    load = os.getloadavg()[0]
    header = (f"## Holding position\n\n`python benchmarks/bench_hold.py{' --quick' if args.quick else ''}` on "
              f"{platform.machine()}, {os.cpu_count()} cores (load average {load:.1f}), Python "
              f"{platform.python_version()}, {time.strftime('%Y-%m-%d')}, {time.time() - t0:.0f} s. Per case: "
              f"{'/'.join(str(s) for s in steps_list)} full-speed steps in one direction, then {HELD_STEPS} "
              f"steps of the hold action with and without `hold()` before them, seeds {seeds}; drift = the "
              f"largest distance of the end effector from where `observe()` saw it after the motion. "
              f"Free-space directions: {', '.join(DIRECTIONS) if not args.quick else '+x, -x, +y'} (toy: both joints "
              f"+/-). Target: <= {TARGET_MM:g} mm with `hold()` in every free-space case.\n")
    print()
    print(header)
    print(text)
    if args.write_docs:
        write_docs(header + "\n" + text)
        print(f"\nwrote {DOCS}")


if __name__ == "__main__":
    main()
