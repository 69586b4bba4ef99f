"""hg-dagger train | eval | auto"""

from __future__ import annotations

import json

from hg_dagger.cli import policy as policy_cli
from hg_dagger.contract.enums import CollectionMode
from hg_dagger.errors import ConfigError
from hg_dagger.learn import executor
from hg_dagger.learn.evaluate import EvalConfig, evaluate
from hg_dagger.learn.progress import RoundReporter


def register(sub) -> None:
    t = sub.add_parser("train", help="train the student on the trainable labels of a store (BC / DAgger loss)")
    t.add_argument("--store", help="episode store (path or fsspec URL); optional with --dataset")
    t.add_argument("--dataset", metavar="NAME@vN", help="train on exactly this dataset version's trainable samples "
                   "(hg-dagger dataset build; NAME alone: the latest; or a manifest file)")
    t.add_argument("--datasets-root", help="dataset folder (default: the folder 'datasets' beside --store)")
    t.add_argument("--task", required=True, help="task id (configs/tasks) or task YAML")
    t.add_argument("--out", required=True, help="output folder: student.pt, loss.jsonl, train.json")
    t.add_argument("--config", help="auto config (kind: auto) whose student/train/replay sections to use")
    t.add_argument("--resume", help="checkpoint to continue from (weights, optimizer, replay state)")
    t.add_argument("--steps", type=int, help="gradient steps")
    t.add_argument("--seed", type=int)
    t.add_argument("--kind", choices=("mlp", "cnn"))
    t.add_argument("--ensemble", type=int)
    t.add_argument("--intervention-weight", help="IWR weight of correction rows: a number or 'balanced'")
    t.add_argument("--holdout-fraction", type=float, help="share of episodes kept out for `eval --store`")
    t.add_argument("--include-unreviewed", action="store_true",
                   help="also train on windows no reviewer approved and authorized (experiments; recorded in train.json)")
    t.add_argument("--skip-qc", action="store_true", help="do not require passing QC results (experiments; recorded)")
    t.add_argument("--include-replay-mismatch", action="store_true",
                   help="also train on episodes whose replay diverged (experiments; recorded)")
    t.add_argument("--quiet", action="store_true", help="no progress bars")
    t.set_defaults(func=_train)

    e = sub.add_parser("eval", help="evaluate a policy alone (no expert, no person): closed loop + held-out windows")
    which = e.add_mutually_exclusive_group(required=True)
    which.add_argument("--policy", metavar="SPEC", help=policy_cli.SPEC_HELP)
    which.add_argument("--checkpoint", help="a student checkpoint (the same as --policy PATH.pt)")
    policy_cli.add_arguments(e, spec=False)
    e.add_argument("--task", required=True)
    e.add_argument("--out", required=True, help="output folder: eval.json, eval.png")
    e.add_argument("--episodes", type=int, default=20)
    e.add_argument("--num-envs", type=int, default=10)
    e.add_argument("--seed", type=int, default=100_000)
    e.add_argument("--max-steps", type=int, help="cut episodes (default: the task horizon)")
    e.add_argument("--store", help="also score action prediction on held-out episodes of this store")
    e.add_argument("--holdout-fraction", type=float, default=0.0)
    e.add_argument("--quiet", action="store_true")
    executor.add_arguments(e)
    e.set_defaults(func=_eval)

    a = sub.add_parser("auto", help="automatic-expert DAgger: collect with beta mixing, aggregate, train, evaluate")
    a.add_argument("--config", required=True, help="configs/auto/*.yaml (kind: auto)")
    a.add_argument("--out", required=True, help="run folder: checkpoint.pt, metrics.jsonl, loss.jsonl")
    a.add_argument("--store", help="episode store (default: OUT/store)")
    a.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    a.add_argument("--iterations", type=int)
    a.add_argument("--mode", choices=[m.value for m in CollectionMode if m is not CollectionMode.EVAL])
    a.add_argument("--num-envs", type=int)
    a.add_argument("--seed", type=int)
    a.add_argument("--quiet", action="store_true")
    executor.add_arguments(a)
    a.set_defaults(func=_auto)


def _train(args) -> int:
    # deferred: these modules import torch and zarr; the CLI lists its commands without them
    from hg_dagger.learn.aggregate import LabelBufferConfig
    from hg_dagger.learn.auto import AutoConfig, load_config
    from hg_dagger.learn.train import train_from_store

    base = load_config(args.config, task=args.task) if args.config else AutoConfig(task=args.task)
    student = base.student.model_copy(update={k: v for k, v in (("kind", args.kind), ("ensemble", args.ensemble))
                                             if v is not None})
    train = base.train.model_copy(update={k: v for k, v in (("steps", args.steps), ("seed", args.seed)) if v is not None})
    replay = base.replay.model_dump()
    if args.intervention_weight is not None:
        iw = args.intervention_weight
        replay["intervention_weight"] = iw if iw == "balanced" else float(iw)
    if args.holdout_fraction is not None:
        replay["holdout_fraction"] = args.holdout_fraction
    rule = replay.get("authorization") or {}
    for flag, key in (("include_unreviewed", "require_review"), ("skip_qc", "require_qc"),
                      ("include_replay_mismatch", "exclude_replay_mismatch")):
        if getattr(args, flag):
            rule[key] = False
    replay["authorization"] = rule
    if args.store is None and args.dataset is None:
        raise ConfigError("train needs --store STORE or --dataset NAME@vN")
    result = train_from_store(args.store, args.task, args.out, student_cfg=student, train_cfg=train,
                              replay_cfg=LabelBufferConfig.model_validate(replay), resume=args.resume,
                              progress=not args.quiet, dataset=args.dataset, datasets_root=args.datasets_root)
    from hg_dagger.learn.train import describe_selection

    if "dataset" in result:
        print(f"dataset {result['dataset']['ref']} (hash {result['dataset']['hash'][:12]}): "
              f"{result['selection']['samples']} trainable samples")
    print(f"labels: {describe_selection(result['selection'])}")
    print(f"trained {result['version']} on {result['labels']} labels; loss {result['loss_first']:.4f} -> "
          f"{result['loss_last']:.4f}; checkpoint {result['checkpoint']}")
    if result.get("gate_calibration"):
        print(result["gate_calibration"]["message"])
    return 0


def _eval(args) -> int:
    cfg = EvalConfig(episodes=args.episodes, num_envs=args.num_envs, seed=args.seed, max_steps=args.max_steps)
    with executor.from_args(args) as ex:
        spec = policy_cli.policy_spec(args, "checkpoint")
        assert spec is not None  # the parser requires --policy or --checkpoint
        result = evaluate(spec, args.task, args.out, config=cfg,
                          store_url=args.store, policy_options=policy_cli.policy_options(args),
                          holdout_fraction=args.holdout_fraction, progress=not args.quiet, executor=ex)
    cl = result["closed_loop"]
    print(f"{result['policy_version']}: success {cl['success_rate']:.1%} over {cl['episodes']} episodes, "
          f"mean length {cl['episode_length_mean']:.1f}")
    if "offline" in result:
        print(f"held-out labels: {json.dumps({k: result['offline'][k] for k in ('labels', 'mae', 'mse')})}")
    print(f"wrote {result['files']['json']} and {result['files']['png']}")
    return 0


def _auto(args) -> int:
    # deferred: learn.auto imports torch and zarr; the CLI lists its commands without them
    from hg_dagger.learn.auto import AutoRun, load_config

    cfg = load_config(args.config, iterations=args.iterations, mode=args.mode, num_envs=args.num_envs, seed=args.seed)
    ex = executor.from_args(args)
    run = AutoRun(cfg, args.out, args.store, executor=ex)
    # one line per finished iteration (progress, ETA) and OUT/curve.png redrawn: unattended runs can be watched
    run.on_round = RoundReporter(args.out, cfg.iterations, write=lambda line: print(line, flush=True))
    with ex:
        rows = run.run(resume=args.resume, progress=not args.quiet)
    for r in rows:
        print(f"iteration {r['iteration']}: beta {r['beta']:.3f}, labels {r['replay']['labels']}, "
              f"eval success {r['eval_success_rate']:.1%}, length {r['eval_episode_length']:.1f}, "
              f"policy {r['policy_version']}")
    if not rows:
        print("nothing to do: every configured iteration is already done")
    return 0
