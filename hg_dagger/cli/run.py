"""hg-dagger run: a human-gated collection run (student + gates + operator + safety -> store)."""

from __future__ import annotations

import json
from pathlib import Path

from hg_dagger import config as config_io
from hg_dagger.cli import policy as policy_cli
from hg_dagger.errors import ConfigError, StoreError
from hg_dagger.learn import executor
from hg_dagger.learn.progress import RoundReporter


def register(sub) -> None:
    p = sub.add_parser("run", help="human-gated run: the student acts, gates ask the operator, corrections are recorded")
    p.add_argument("--task", help="task id (tasks/ on the config search path) or a task YAML file of your own; "
                   "default: the run config's task")
    p.add_argument("--store", help="episode store to record into (created if missing); with --rounds default OUT/store")
    p.add_argument("--operator", choices=("synthetic", "expert", "device", "human-model"),
                   help="who answers a handover: synthetic operator (planner-driven), the planner expert, a device, "
                   "the human-paced operator model (reaction times, look-aways, context switches; one person)")
    p.add_argument("--episodes", type=int, help="episodes to record")
    p.add_argument("--student", help="student checkpoint (the same as --policy PATH.pt); default: a fresh, untrained "
                   "student (seeded)")
    policy_cli.add_arguments(p)
    p.add_argument("--config", help="run config (kind: run): a YAML file or a name in run/ on the config search path; "
                   "default: run/<task id>.yaml if there is one")
    p.add_argument("--gates", help="gate config (kind: gates): a YAML file or a name in gates/ on the config search "
                   "path; default: the run config's, else the task's")
    p.add_argument("--num-envs", type=int)
    p.add_argument("--max-episode-steps", type=int, help="cut every episode after this many steps (default: the "
                   "task's horizon)")
    p.add_argument("--seed", type=int)
    p.add_argument("--wait", choices=("auto", "pause", "hold", "policy"), help="behaviour while waiting for the operator")
    p.add_argument("--calibrate-steps", type=int, help="autonomous steps to calibrate the confidence gate first")
    f = p.add_argument_group("fleet", "one person serves several simulated robots through a request queue "
                             "(docs/fleet.md)")
    f.add_argument("--robots", type=int, help="N robots (N envs of the task), one person: one robot under human "
                   "control at a time, the others' requests queue (their rows pause) while the rest run on")
    f.add_argument("--allocation", choices=("cur", "fcfs", "random"), help="how the queue is ranked (default cur: "
                   "constraint violations, then uncertainty, then risk, then waiting time)")
    f.add_argument("--wait-limit", type=float, metavar="S", help="a request nobody took within S seconds of control "
                   "time expires (handover.wait_timeout_s); with --robots the student goes on")
    f.add_argument("--flag-wait", type=float, metavar="S", help="flag a robot whose request waited S seconds "
                   "(default 10)")
    p.add_argument("--device", help="device config for --operator device (e.g. gamepad, spacemouse)")
    p.add_argument("--robot", metavar="HOST:PORT",
                   help="drive the robot behind `hg-dagger bridge serve TASK` at HOST:PORT instead of a local simulator")
    p.add_argument("--token-file", help="bridge token file for --robot (default: the run config's robot.token_file, "
                   "else the environment variable HG_DAGGER_BRIDGE_TOKEN)")
    p.add_argument("--tls-ca", metavar="FILE", help="for --robot served with --tls-cert: trust robot certificates that "
                   "chain to this PEM file (a CA, or the robot's self-signed certificate); default: robot.tls_ca")
    r = p.add_argument_group("rounds", "human-gated DAgger unattended: run, train on the certified corrections, "
                             "evaluate, repeat (resumable; one summary line per round; OUT/curve.png)")
    r.add_argument("--rounds", type=int, help="rounds of run + train + evaluate (round 0 is planner demonstrations "
                   "unless --student is given)")
    r.add_argument("--out", help="run folder for --rounds: checkpoint.pt, metrics.jsonl, loss.jsonl, curve.png")
    r.add_argument("--resume", action="store_true", help="continue the rounds in --out after a stop or a kill")
    r.add_argument("--certify", action="store_true", help="the synthetic or planner operator drives with the "
                   "planner's exact actions (noise 0) and its windows are certified (planner_auto), so rounds "
                   "train without a reviewer")
    r.add_argument("--auto-config", help="auto config (kind: auto) whose student, train, replay and eval sections "
                   "the rounds use; default configs/auto/<task>.yaml when there is one")
    r.add_argument("--eval-episodes", type=int, help="student-only evaluation episodes after each round")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    executor.add_arguments(p)
    p.set_defaults(func=_run)


def _run(args) -> int:
    # deferred: these load the session, run config, devices, experts, torch and zarr; every command imports this
    # module, so `--help` loads no torch or zarr and eval no session, run config, device or expert (test_eval.py)
    from hg_dagger.control.build import run_gated
    from hg_dagger.control.run_config import gates_for, load_run_config, parse_endpoint
    from hg_dagger.store.layout import local_path

    if args.task is None and args.config is None:
        raise ConfigError("run needs --task TASK (a task id or a task YAML file) or --config RUN (a run config "
                          "that names its task)")

    rounds = args.rounds is not None
    for flag in ("out", "resume", "certify", "auto_config", "eval_episodes"):
        if not rounds and getattr(args, flag) not in (None, False):
            raise ConfigError(f"--{flag.replace('_', '-')} is for --rounds N (a multi-round run)")
    if rounds and args.out is None:
        raise ConfigError("--rounds needs --out DIR: the run folder (checkpoint.pt, metrics.jsonl, curve.png), "
                          "which --resume continues")
    if args.store is None and not rounds:
        raise ConfigError("run needs --store STORE: the episode store to record into")
    where = local_path(args.store) if args.store else None
    if where is not None and where.exists() and not where.is_dir():
        raise StoreError(f"--store {args.store}: is a file, not an episode store (give a store folder or a new path)")

    fleet = args.robots is not None
    for flag in ("allocation", "flag_wait"):
        if not fleet and getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')} is for --robots N (one person, several robots)")
    if fleet and (args.robots < 1 or args.num_envs is not None or args.robot is not None or args.rounds is not None):
        raise ConfigError("--robots N: give N >= 1 simulated robots, without --num-envs, --robot or --rounds")
    overrides = {
        "operator.type": None if args.operator is None else args.operator.replace("-", "_"),
        "episodes": args.episodes, "gates": args.gates, "num_envs": args.num_envs,
        "seed": args.seed, "handover.wait": args.wait, "calibrate_steps": args.calibrate_steps,
        "operator.device": args.device, "max_episode_steps": args.max_episode_steps,
        "handover.wait_timeout_s": args.wait_limit,
    }
    if fleet:
        overrides.update({"num_envs": args.robots, "fleet.allocation": args.allocation or "cur",
                          "fleet.flag_wait_s": args.flag_wait, "handover.wait": args.wait or "pause"})
        if args.wait_limit is not None:
            overrides["handover.on_wait_timeout"] = "policy"  # an expired request lets the student go on
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
    if args.tls_ca is not None:
        if args.robot is None and load_run_config(args.config, args.task, **overrides).robot is None:
            raise ConfigError("--tls-ca is for a robot run: give --robot HOST:PORT (or a robot section in the run config)")
        overrides["robot.tls_ca"] = args.tls_ca
    if args.certify:
        overrides.update({"operator.certification": "planner_auto", "operator.noise_std": 0.0})
    cfg = load_run_config(args.config, args.task, **overrides)
    gates_for(cfg.gates, cfg.task)  # a bad gate file is one line before any store is touched
    if rounds:
        return _rounds(args, cfg)
    if args.executor == "ray" and cfg.fleet is not None:
        raise ConfigError("--robots: one person serves the fleet in one process; run it with --executor local")
    if args.executor == "ray" and (cfg.robot is not None or cfg.operator.type == "device"):
        raise ConfigError("--executor ray runs simulated envs with the synthetic or expert operator; a robot or a "
                          "device operator runs with --executor local")
    from hg_dagger.policy import one_inference_thread

    one_inference_thread()  # this process is the control loop
    with executor.from_args(args) as ex:
        summary = run_gated(cfg, args.store, policy=policy_cli.policy_spec(args), progress=not args.quiet,
                            policy_options=policy_cli.policy_options(args), executor=ex)
    d = summary.as_dict()
    d.pop("episode_ids")
    if args.json:
        print(json.dumps(d, indent=2))
    else:
        print(f"{args.store}: {d['episodes']} episodes ({d['successes']} successful), {d['steps']} steps, "
              f"{d['windows']} correction windows, {d['human_steps']} operator steps, "
              f"{d['safety_clamps']} safety clamps" + (f"; stopped by {d['stopped_by']}" if d["stopped_by"] else ""))
        if "fleet" in d and cfg.fleet is not None:
            fl = d["fleet"]
            print(f"fleet of {cfg.num_envs} ({cfg.fleet.allocation}): {fl['allocations']} allocations, "
                  f"{fl['context_switches']} context switches, queue up to {fl['queue_max']}, "
                  f"{d['requests_expired']} requests expired, {fl['flagged']} long waits flagged")
    return 0


def _rounds(args, cfg) -> int:
    """`run --rounds N`: `auto` in mode human_gated around this run config."""
    # deferred: these load the run config, torch and zarr; every command imports this module (see _run)
    from hg_dagger.control.run_config import task_name
    from hg_dagger.learn.auto import AutoConfig, AutoRun, load_config

    if args.rounds < 1:
        raise ConfigError(f"--rounds {args.rounds}: give at least 1")
    if cfg.operator.certification == "none":
        raise ConfigError("--rounds trains on the operator's corrections with no reviewer in between, so they must "
                          "be certified: pass --certify (the planner operator, noise 0, windows certified "
                          "planner_auto), or review each round's windows and train with `hg-dagger train`")
    path = args.auto_config or config_io.find("auto", task_name(cfg.task))
    base = load_config(path, task=cfg.task) if path else AutoConfig(task=cfg.task)
    data = base.model_dump(by_alias=True, include={"expert", "student", "train", "replay", "eval", "recorder_queue_steps",
                                                   "recorder_flush_s", "dataset_versions"})
    if args.eval_episodes is not None:
        data["eval"]["episodes"] = args.eval_episodes
    auto = config_io.validate(AutoConfig, {
        **data, "task": cfg.task, "mode": "human_gated", "gated": cfg, "iterations": args.rounds,
        "episodes_per_iteration": cfg.episodes, "num_envs": cfg.num_envs, "seed": cfg.seed,
        "certification": cfg.operator.certification, "initial_student": policy_cli.trainable_spec(args, "--rounds")},
        source="run --rounds")
    ex = executor.from_args(args)
    run = AutoRun(auto, args.out, args.store, executor=ex)
    run.on_round = RoundReporter(args.out, auto.iterations, write=lambda line: print(line, flush=True))
    with ex:
        rows = run.run(resume=args.resume, progress=not args.quiet)
    if not rows:
        print(f"{args.out}: nothing to do, all {args.rounds} rounds are done")
        return 0
    last = rows[-1]
    print(f"{args.out}: rounds {rows[0]['iteration']}..{last['iteration']} done; student {last['policy_version']}: "
          f"eval success {last['eval_success_rate']:.1%} on {last['replay']['labels']} labels; "
          f"curve {Path(args.out) / 'curve.png'}")
    return 0
