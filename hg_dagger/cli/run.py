"""hg-dagger run: a human-gated collection run (student + gates + operator + safety -> store)."""

from __future__ import annotations

import json

from hg_dagger.errors import ConfigError, StoreError
from hg_dagger.learn import executor


def register(sub) -> None:
    p = sub.add_parser("run", help="human-gated run: the student acts, gates ask the operator, corrections are recorded")
    p.add_argument("--task", required=True, help="task id (configs/tasks)")
    p.add_argument("--store", required=True, help="episode store to record into (created if missing)")
    p.add_argument("--operator", choices=("synthetic", "expert", "device"),
                   help="who answers a handover: synthetic operator (planner-driven), the planner expert, a device")
    p.add_argument("--episodes", type=int, help="episodes to record")
    p.add_argument("--student", help="student checkpoint; default: a fresh, untrained student (seeded)")
    p.add_argument("--config", help="run config (kind: run); default: configs/run/<task>.yaml if present")
    p.add_argument("--gates", help="gate config name in configs/gates or a path; default: the task's")
    p.add_argument("--num-envs", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--wait", choices=("pause", "hold", "policy"), help="behaviour while waiting for the operator")
    p.add_argument("--calibrate-steps", type=int, help="autonomous steps to calibrate the confidence gate first")
    p.add_argument("--device", help="device config for --operator device (e.g. gamepad, spacemouse)")
    p.add_argument("--robot", metavar="HOST:PORT",
                   help="drive the robot behind `hg-dagger bridge serve TASK` at HOST:PORT instead of a local simulator")
    p.add_argument("--token-file", help="bridge token file for --robot (default: the run config's robot.token_file, "
                   "else the environment variable HG_DAGGER_BRIDGE_TOKEN)")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    executor.add_arguments(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import load_run_config, parse_endpoint
    from hg_dagger.store.layout import local_path

    where = local_path(args.store)
    if where is not None and where.exists() and not where.is_dir():
        raise StoreError(f"--store {args.store}: is a file, not an episode store (give a store folder or a new path)")

    overrides = {
        "operator.type": args.operator, "episodes": args.episodes, "gates": args.gates, "num_envs": args.num_envs,
        "seed": args.seed, "handover.wait": args.wait, "calibrate_steps": args.calibrate_steps,
        "operator.device": args.device,
    }
    if args.robot is not None:
        if args.num_envs is not None:
            raise ConfigError("--num-envs does not apply with --robot: the robot's batch size is set by "
                              "`hg-dagger bridge serve --num-envs`")
        overrides["robot.host"], overrides["robot.port"] = parse_endpoint(args.robot)
    if args.token_file is not None:
        if args.robot is None and load_run_config(args.config, args.task, **overrides).robot is None:
            raise ConfigError("--token-file is for a robot run: give --robot HOST:PORT (or a robot section in the "
                              "run config)")
        overrides["robot.token_file"] = args.token_file
    cfg = load_run_config(args.config, args.task, **overrides)
    if args.executor == "ray" and (cfg.robot is not None or cfg.operator.type == "device"):
        raise ConfigError("--executor ray runs simulated envs with the synthetic or expert operator; a robot or a "
                          "device operator runs with --executor local")
    with executor.from_args(args) as ex:
        summary = run_gated(cfg, args.store, student_path=args.student, progress=not args.quiet, executor=ex)
    d = summary.as_dict()
    d.pop("episode_ids")
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(f"{args.store}: {d['episodes']} episodes ({d['successes']} successful), {d['steps']} steps, "
              f"{d['windows']} correction windows, {d['human_steps']} operator steps, "
              f"{d['safety_clamps']} safety clamps" + (f"; stopped by {d['stopped_by']}" if d["stopped_by"] else ""))
    return 0
