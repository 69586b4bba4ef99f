"""hg-dagger app: the operator desktop app (falls back to the headless demo where there is no display)."""

from __future__ import annotations


def register(sub) -> None:
    from hg_dagger.contract.enums import SessionMode

    p = sub.add_parser("app", help="the operator console: watch the student, answer gates, correct, train the next "
                       "student (without a display: the headless demo)")
    p.add_argument("--task", default=None, help="task id (configs/tasks); it wins over the remembered one (the "
                   "start dialog opens on it); default: the last one used, else fetch_pick_place")
    p.add_argument("--store", help="episode store to record into (default: runs/app/<task>/store.zarr)")
    p.add_argument("--student", help="student checkpoint (default: the newest the app trained for the task; a first "
                   "one is made from planner demonstrations when there is none)")
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
    p.add_argument("--episodes", type=int, default=0, help="start this many episodes at once")
    p.add_argument("--quit-when-done", action="store_true", help="close the app when the episodes are done "
                   "(scripted runs, CI); prints the summary and validates the store")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rate", type=float, help="control rate in Hz (default: the task's)")
    p.add_argument("--control-thread", action="store_true", help="run the control loop in a thread of the app "
                   "instead of a process of its own (debugging; the window then shares the interpreter with it)")
    p.add_argument("--headless-fallback", choices=("demo", "error"), default="demo",
                   help="without a display: run the headless demo (default) or fail")
    p.set_defaults(func=_app)


def _app(args) -> int:
    from hg_dagger.errors import HgDaggerError
    from hg_dagger.ui.application import AppOptions, display_available, run_app

    if args.task:
        from hg_dagger.envs.mapping import known_tasks

        if args.task not in known_tasks():
            raise HgDaggerError(f"--task {args.task}: unknown task; known tasks: {', '.join(known_tasks())}")
    if not display_available():
        if args.headless_fallback == "error":
            raise HgDaggerError("no display (DISPLAY/WAYLAND_DISPLAY unset): run on a desktop, under Xvfb, or with "
                                "QT_QPA_PLATFORM=offscreen")
        print("no display found (DISPLAY is not set): running the headless demo instead (hg-dagger demo); "
              "open the app on a desktop with `hg-dagger app`")
        import time

        from hg_dagger.demo import run_demo

        out = time.strftime("runs/demo-%Y%m%d-%H%M%S")
        report = run_demo(out, task=args.task or "fetch_pick_place", seed=args.seed)
        print("\n".join(report.lines()))
        return 1 if report.violations else 0
    opts = AppOptions(task=args.task or "", store=args.store or "", student=args.student or "",
                      operator=args.operator or "", device=args.device or "", mode=args.mode or "",
                      name=args.name or "", robot=args.robot or "", token_file=args.token_file or "",
                      episodes=args.episodes, quit_when_done=args.quit_when_done, rate_hz=args.rate, seed=args.seed,
                      control_process=not args.control_thread)
    return run_app(opts)
