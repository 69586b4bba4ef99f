"""hg-dagger app: the operator desktop app. Without a display it runs what was asked headless or refuses with one
line (docs/decisions.md, "`hg-dagger app` without a display"): alone it runs the headless demo, a scripted run runs
its real window offscreen, anything else needs a person at a window."""

from __future__ import annotations

import os
import time

from hg_dagger.cli import policy as policy_cli
from hg_dagger.contract.enums import SessionMode
from hg_dagger.demo import run_demo
from hg_dagger.envs.mapping import known_tasks, load_mapping
from hg_dagger.errors import ConfigError, HgDaggerError

# what `hg-dagger app` may be given beyond --task and --seed (the two the headless demo honours)
ASKED = ("store", "student", "policy", "policy_python", "operator", "device", "mode", "name", "robot", "token_file", "episodes",
         "quit_when_done", "rate", "control_thread", "config", "gates", "robots", "allocation", "wait_limit", "flag_wait")
NO_PERSON = ("synthetic", "expert", "none")


def register(sub) -> None:
    p = sub.add_parser("app", help="the operator console: watch the student, answer gates, correct, train the next "
                       "student (without a display: the headless demo, or a scripted run offscreen)")
    p.add_argument("--task", default=None, help="task id (tasks/ on the config search path) or a task YAML file of "
                   "your own; it wins over the remembered one (the start dialog opens on it); default: the run "
                   "config's task, else the last one used, else fetch_pick_place")
    p.add_argument("--config", help="run config (kind: run): a YAML file or a name in run/ on the config search path; "
                   "default: run/<task id>.yaml if there is one; the options here win over it")
    p.add_argument("--gates", help="gate config (kind: gates): a YAML file or a name in gates/ on the config search "
                   "path; default: the run config's, else the task's")
    p.add_argument("--store", help="episode store to record into (default: runs/app/<task>/store.zarr)")
    p.add_argument("--policy", metavar="SPEC", help=policy_cli.SPEC_HELP + " (default: the newest student the app "
                   "trained for the task; a first one is made from planner demonstrations when there is none)")
    p.add_argument("--student", help="a student checkpoint: the same as --policy PATH.pt")
    policy_cli.add_arguments(p, spec=False)
    p.add_argument("--operator", choices=("device", "synthetic", "expert", "none"), default=None,
                   help="who answers gates: a person on a device (default), the planner-driven synthetic operator, "
                   "the planner expert, nobody (student only)")
    p.add_argument("--device", default=None, help="device for --operator device: keyboard (in the window, default), "
                   "gamepad, spacemouse, or a config path")
    p.add_argument("--mode", choices=[m.value for m in SessionMode], default=None)
    p.add_argument("--name", help="operator pseudonym (asked at start when missing)")
    p.add_argument("--robot", metavar="HOST:PORT", help="drive the robot behind `hg-dagger bridge serve` instead of "
                   "the embedded simulator")
    p.add_argument("--token-file", help="bridge token file for --robot")
    f = p.add_argument_group("fleet", "one person serves several simulated robots through a request queue "
                             "(docs/fleet.md)")
    f.add_argument("--robots", type=int, help="N simulated robots (N envs of the task), one person: a grid of live "
                   "views with the request queue; P takes the top request, 1-N a robot, X stops the robot on screen")
    f.add_argument("--allocation", choices=("cur", "fcfs", "random"), help="how the queue is ranked (default cur: "
                   "constraint violations, then uncertainty, then risk, then waiting time)")
    f.add_argument("--wait-limit", type=float, metavar="S", help="a request nobody took within S seconds of control "
                   "time expires and the student goes on (default: requests wait for the person)")
    f.add_argument("--flag-wait", type=float, metavar="S", help="flag a robot whose request waited S seconds "
                   "(default 10)")
    p.add_argument("--episodes", type=int, default=0, help="start this many episodes at once")
    p.add_argument("--quit-when-done", action="store_true", help="close the app when the episodes are done "
                   "(scripted runs, CI); prints the summary and validates the store")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, help="control rate in Hz (default: the task's)")
    p.add_argument("--control-thread", action="store_true", help="run the control loop in a thread of the app "
                   "instead of a process of its own (debugging; the window then shares the interpreter with it)")
    p.add_argument("--headless-fallback", choices=("demo", "error"), default="demo",
                   help="without a display, `hg-dagger app` alone runs the headless demo (default) or fails; a "
                   "scripted run (--quit-when-done --episodes N --operator synthetic|expert|none) runs offscreen; "
                   "anything else asked is refused")
    p.set_defaults(func=_app)


def check_configs(args) -> str | None:
    """The task, run config and gate config the command line names, checked before any window or store: a bad one
    is one line naming the file and key. Returns the task (the run config's when --task is not given)."""
    # deferred: the run config loads for `app` only; `eval` and the rest run without it (tests/learn/test_eval.py)
    from hg_dagger.control.run_config import gates_for, is_task_file, load_run_config

    task = args.task
    if task is not None:
        if is_task_file(task):
            load_mapping(task)
        elif task not in known_tasks():
            raise HgDaggerError(f"--task {task}: unknown task; known tasks: {', '.join(known_tasks())} (or give a "
                                "task YAML file)")
    if args.config:
        cfg = load_run_config(args.config, task, gates=args.gates)
        task = task or cfg.task
        gates_for(cfg.gates, cfg.task)
    elif args.gates:
        gates_for(args.gates, task or "")
    return task


def asked(args) -> list[str]:
    """The options given beyond --task and --seed, as typed."""
    return [f"--{k.replace('_', '-')}" for k in ASKED if getattr(args, k, None) not in (None, False, 0, "")]


def headless_plan(args) -> str:
    """What `hg-dagger app` does without a display: "demo" (nothing but --task/--seed asked), "offscreen" (a
    scripted run: it needs no person, so its window runs offscreen), else a ConfigError: one line."""
    if args.headless_fallback == "error":
        raise HgDaggerError("no display (DISPLAY/WAYLAND_DISPLAY unset): run on a desktop, under Xvfb, or with "
                            "QT_QPA_PLATFORM=offscreen")
    given = asked(args)
    if not given:
        return "demo"
    if args.quit_when_done and args.episodes > 0 and args.operator in NO_PERSON:
        return "offscreen"
    raise ConfigError(f"no display (DISPLAY/WAYLAND_DISPLAY unset) for `hg-dagger app {' '.join(given)}`: open it "
                      "on a desktop or under Xvfb (xvfb-run -a hg-dagger app ...); without a display only a scripted "
                      "run works (--quit-when-done --episodes N --operator synthetic|expert|none), or record the same "
                      "session with `hg-dagger run`")


def _app(args) -> int:
    # deferred: ui.application imports Qt; the CLI lists its commands without it
    from hg_dagger.ui.application import AppOptions, display_available, run_app

    task = check_configs(args)
    fleet_options(args)
    if not display_available():
        if headless_plan(args) == "demo":
            return _demo(task, args.seed)
        print("no display: running the scripted session offscreen (QT_QPA_PLATFORM=offscreen)", flush=True)
        os.environ["QT_QPA_PLATFORM"] = "offscreen"
    opts = AppOptions(task=task or "", store=args.store or "", student=policy_cli.policy_spec(args) or "",
                      policy_options=policy_cli.policy_options(args),
                      operator=args.operator or "", device=args.device or "", mode=args.mode or "",
                      name=args.name or "", robot=args.robot or "", token_file=args.token_file or "",
                      episodes=args.episodes, quit_when_done=args.quit_when_done, rate_hz=args.rate, seed=args.seed,
                      control_process=not args.control_thread, config=args.config or "", gates=args.gates or "",
                      robots=args.robots or 1, allocation=args.allocation or "", wait_limit=args.wait_limit,
                      flag_wait=args.flag_wait)
    return run_app(opts)


def fleet_options(args) -> None:
    """--robots and its options, checked before any window: one line for what does not fit."""
    if args.robots is None:
        for flag in ("allocation", "wait_limit", "flag_wait"):
            if getattr(args, flag) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')} is for --robots N (one person, several robots)")
        return
    if args.robots < 1:
        raise ConfigError(f"--robots {args.robots}: give N >= 1 simulated robots")
    if args.robots > 9:
        raise ConfigError(f"--robots {args.robots}: the fleet view takes robots by the keys 1-9; give at most 9")
    if args.robots > 1 and args.robot:
        raise ConfigError("--robots N simulates N robots; it does not combine with --robot HOST:PORT")
    for flag in ("wait_limit", "flag_wait"):
        v = getattr(args, flag)
        if v is not None and v <= 0:
            raise ConfigError(f"--{flag.replace('_', '-')} {v}: give a positive number of seconds")


def _demo(task: str | None, seed: int) -> int:
    """`hg-dagger app` alone without a display: the headless demo (`make run`'s fallback), said first."""
    out = time.strftime("runs/demo-%Y%m%d-%H%M%S")
    print(f"no display found (DISPLAY is not set): running the headless demo instead (hg-dagger demo --out {out}); "
          "open the app on a desktop with `hg-dagger app`", flush=True)
    report = run_demo(out, task=task or "fetch_pick_place", seed=seed)
    print("\n".join(report.lines()))
    return 1 if report.violations else 0
