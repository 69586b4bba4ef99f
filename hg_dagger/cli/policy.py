"""hg-dagger policy serve SPEC | check SPEC --task TASK | train-next --policy SPEC --store S --out DIR; and the
``--policy`` options of run and eval (docs/policies.md; train-next: docs/learning.md, "Rounds with your own trainer")."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from pathlib import Path

import numpy as np

from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError
from hg_dagger.learn.lerobot_round import (
    LINEAGE_FILE,
    LeRobotTrainConfig,
    export_round,
    lerobot_round,
    load_train_config,
    promotion_words,
    record_new_version,
    watch_version,
)

SPEC_HELP = ("the policy to run: PATH.pt (a built-in student), ws://HOST:PORT (a policy server speaking openpi's "
             "protocol) or lerobot:DIR (a LeRobot pretrained_model folder, served from --policy-python)")


def add_arguments(p, *, spec: bool = True) -> None:
    """``--policy SPEC`` (unless the command declares its own) and the options of opening it."""
    if spec:
        p.add_argument("--policy", metavar="SPEC", help=SPEC_HELP)
    g = p.add_argument_group("policy", "how --policy is opened (docs/policies.md)")
    g.add_argument("--policy-python", metavar="PYTHON", help="for --policy lerobot:DIR: the python of LeRobot's "
                   "environment, which runs the policy server (default: environment variable HG_DAGGER_POLICY_PYTHON)")
    g.add_argument("--policy-action-steps", type=int, metavar="N", help="actions of each chunk executed before the "
                   "policy is asked again (default: the server's n_action_steps, else the whole chunk)")
    g.add_argument("--policy-temporal-ensemble", action="store_true", help="ask the policy every tick and act on the "
                   "weighted mean of what its recent chunks said about that tick (ACT's temporal ensembling)")
    g.add_argument("--policy-ask-ahead", type=_ask_ahead, metavar="N|auto", default=0, const=None, nargs="?",
                   help="send the next request when a chunk has N actions left, so a slow or remote policy answers "
                   "while the loop goes on (auto, or the option alone: the measured round trip in ticks, plus 1; "
                   "default 0: ask when the chunk is done and wait)")
    g.add_argument("--policy-timeout", type=float, metavar="SECONDS", default=30.0,
                   help="a policy server that takes longer to answer counts as stalled and stops the run (default 30)")


def _ask_ahead(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of actions or auto, not {text!r}") from None


def policy_spec(args, alias: str = "student") -> str | None:
    """``--policy``, or its older spelling ``--ALIAS PATH`` (a student checkpoint); not both."""
    spec, old = getattr(args, "policy", None), getattr(args, alias, None)
    if spec is not None and old is not None:
        raise ConfigError(f"give --policy or --{alias}, not both (--{alias} PATH is --policy PATH)")
    return spec if spec is not None else old


def trainable_spec(args, what: str, alias: str = "student") -> str | None:
    """The policy spec for a command that trains the built-in student (``what``: its flag): a checkpoint path, or
    None; a policy served from elsewhere is refused (its rounds: `hg-dagger policy train-next`)."""
    spec = policy_spec(args, alias)
    # deferred: policy imports torch; the CLI lists its commands without it
    from hg_dagger.policy import is_remote

    if is_remote(spec):
        raise ConfigError(f"{what} trains the built-in student; --policy {spec} runs without {what} (a round with "
                          f"its own trainer: hg-dagger policy train-next --policy {spec} --store STORE --out DIR)")
    return spec


def policy_options(args):
    # deferred: policy imports torch; the CLI lists its commands without it
    from hg_dagger.policy import PolicyOptions

    return PolicyOptions(python=getattr(args, "policy_python", None),
                         action_steps=getattr(args, "policy_action_steps", None),
                         temporal_ensemble=bool(getattr(args, "policy_temporal_ensemble", False)),
                         ask_ahead=getattr(args, "policy_ask_ahead", 0),
                         timeout_s=getattr(args, "policy_timeout", None) or 30.0)


def register(sub) -> None:
    p = sub.add_parser("policy", help="policies from elsewhere: serve one over openpi's protocol, check one against "
                       "a task (docs/policies.md)")
    psub = p.add_subparsers(dest="policy_command", metavar="ACTION", required=True)
    s = psub.add_parser("serve", help="serve a policy over openpi's websocket protocol (`--policy ws://HOST:PORT` "
                        "connects to it)")
    s.add_argument("spec", metavar="SPEC", help="PATH.pt (a built-in student; needs --task) or lerobot:DIR (a LeRobot "
                   "pretrained_model folder; in an environment where LeRobot is installed)")
    s.add_argument("--task", help="task id or YAML: the mapping a built-in student acts in")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: loopback only; 0.0.0.0 "
                   "serves every interface)")
    s.add_argument("--port", type=int, default=8000, help="TCP port, 0 = any free port (default 8000, openpi's)")
    s.add_argument("--device", default="cpu", help="torch device of a LeRobot policy (default cpu)")
    s.add_argument("--samples", type=int, default=0, metavar="K", help="send K samples of each chunk with the reply "
                   "(action_samples), for the spread gate: a built-in student's ensemble members (default 0: none)")
    s.add_argument("--exit-with-stdin", action="store_true", help=argparse.SUPPRESS)  # a parent's child server
    s.set_defaults(func=_serve)
    c = psub.add_parser("check", help="open a policy for a task, check its features and act once; print what it is")
    c.add_argument("spec", metavar="SPEC", help=SPEC_HELP)
    c.add_argument("--task", required=True, help="task id or YAML")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    add_arguments(c, spec=False)
    c.set_defaults(func=_check)
    t = psub.add_parser("train-next", help="a round with the policy's own trainer: the next dataset version of the "
                        "store, exported for LeRobot (--labels trainable); lerobot:DIR is fine-tuned by lerobot-train "
                        "into --out, ws://HOST:PORT waits for its server's next version (docs/learning.md)")
    t.add_argument("--policy", required=True, metavar="SPEC", help="lerobot:DIR (the acting LeRobot policy) or "
                   "ws://HOST:PORT (a server its owner retrains)")
    t.add_argument("--store", required=True, help="episode store whose reviewed, authorized labels train the round")
    t.add_argument("--out", required=True, help="the round's folder (new): export/, train/ (lerobot-train's run), "
                   "train.log; the new pretrained_model gets hg_dagger_lineage.json beside it")
    t.add_argument("--task", help="only episodes of this task id (a new dataset's selection)")
    t.add_argument("--config", metavar="YAML", help="a file whose lerobot_train section sets steps, batch_size, "
                   "num_workers, device, dataset, args (learn.lerobot_round.LeRobotTrainConfig)")
    t.add_argument("--steps", type=int, help="gradient steps (default: the config's, else 2000)")
    t.add_argument("--batch-size", type=int, help="batch size (default: the config's, else 8)")
    t.add_argument("--dataset", help="the dataset whose versions the rounds build (default lerobot_rounds)")
    t.add_argument("--dataset-root", help="folder of the dataset versions (default: beside the store)")
    t.add_argument("--policy-python", metavar="PYTHON", help="the python of LeRobot's environment, which runs "
                   "lerobot-train (default: environment variable HG_DAGGER_POLICY_PYTHON)")
    t.add_argument("--trainer", nargs="+", metavar="ARG", help="the trainer command instead of lerobot-train beside "
                   "--policy-python (it is given lerobot-train's arguments)")
    t.add_argument("--no-serve-check", action="store_true", help="do not start `policy serve` on the new checkpoint "
                   "to check that it loads")
    t.add_argument("--promotion-episodes", type=int, default=0, metavar="N", help="held-out episodes both policies "
                   "run (needs --task): the new one takes over unless it is worse beyond the noise (default 0: it "
                   "takes over when its training succeeds)")
    t.add_argument("--wait", type=float, default=0.0, metavar="SECONDS", help="ws://: wait this long for the server "
                   "to report another policy_version, and record it (default 0: export and return)")
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.add_argument("--quiet", action="store_true", help="no progress lines")
    t.set_defaults(func=_train_next)


def _served(args):
    # deferred: these modules import torch; the CLI lists its commands without it
    from hg_dagger.policy.sources import source_name

    kind = source_name(args.spec)
    if kind == "lerobot":
        from hg_dagger.policy.lerobot_served import LeRobotServed

        if args.samples:
            raise ConfigError(f"policy serve {args.spec}: --samples is served for a built-in student only (a LeRobot "
                              "policy's samples are not yet)")
        return LeRobotServed(args.spec.split(":", 1)[1], device=args.device)
    if kind == "student":
        if args.task is None:
            raise ConfigError(f"policy serve {args.spec}: a built-in student needs --task TASK (the mapping it acts in)")
        from hg_dagger.policy import Student, one_inference_thread
        from hg_dagger.policy.server import StudentServed

        one_inference_thread()
        return StudentServed(Student.load(args.spec, load_mapping(args.task)), samples=args.samples)
    if kind == "ws":
        raise ConfigError(f"policy serve {args.spec}: that is a policy server already; connect to it with "
                          f"--policy {args.spec}")
    raise ConfigError(f"policy serve {args.spec}: serves PATH.pt (with --task) or lerobot:DIR")


def _serve(args) -> int:
    # deferred: policy.server imports torch; the CLI lists its commands without it
    from hg_dagger.policy.server import serve

    if args.exit_with_stdin:  # started by `--policy lerobot:DIR`: end with the parent, which holds our stdin
        threading.Thread(target=_exit_at_eof, name="parent-watch", daemon=True).start()
    policy = _served(args)

    def ready(address: str) -> None:
        print(f"listening on {address}", flush=True)  # the one stdout line; scripts parse the address from it

    serve(policy, host=args.host, port=args.port, on_ready=ready)
    return 0


def _exit_at_eof() -> None:
    try:
        sys.stdin.read()
    finally:
        os._exit(0)


def _check(args) -> int:
    # deferred: policy imports torch; the CLI lists its commands without it
    from hg_dagger.policy import close_policy, open_policy

    mapping = load_mapping(args.task)
    policy = open_policy(args.spec, mapping, policy_options(args))
    try:
        zero = {k: np.zeros((1, *shape), dtype) for k, (shape, dtype) in mapping.obs_spec().items()}
        policy.reset_rows([0], 1)
        out = policy.act(zero)
        describe = getattr(policy, "describe", None)
        info = describe() if callable(describe) else {"source": args.spec, "policy_version": policy.version}
        info.update(task=mapping.task_id, action_on_zeros=np.asarray(out.action[0]).round(6).tolist(),
                    inference_ms=round(out.inference_ns / 1e6, 3))
    finally:
        close_policy(policy)
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(f"{args.spec}: policy {info['policy_version']} fits task {mapping.task_id}; on a zero observation it "
              f"proposes {info['action_on_zeros']} ({info['inference_ms']} ms)")
    return 0


def _train_config(args) -> dict:
    """The lerobot_train section of --config, with --steps, --batch-size, --dataset and --trainer over it."""
    cfg = load_train_config(args.config) if args.config else LeRobotTrainConfig()
    given = {"steps": args.steps, "batch_size": args.batch_size, "dataset": args.dataset, "trainer": args.trainer}
    merged = {**cfg.model_dump(), **{k: v for k, v in given.items() if v is not None}}
    return LeRobotTrainConfig(**merged).model_dump()  # a bad value is one line naming the option's field


def _progress(quiet: bool):
    last = [""]

    def report(stage: str, fraction: float) -> None:
        if not quiet and stage != last[0]:
            last[0] = stage
            print(stage, file=sys.stderr, flush=True)

    return report


def _train_next(args) -> int:
    # deferred: policy imports torch; the CLI lists its commands without it
    from hg_dagger.policy.sources import source_name

    kind = source_name(args.policy)
    report = _progress(args.quiet)
    if kind == "ws":
        return _export_for_server(args, report)
    if kind != "lerobot":
        raise ConfigError(f"policy train-next --policy {args.policy}: rounds with the policy's own trainer are for "
                          "lerobot:DIR and ws://HOST:PORT; a built-in student trains with `hg-dagger train` or the "
                          "app's Rounds tab")
    if args.wait:
        raise ConfigError("--wait is for a ws:// policy (its server's next version); lerobot:DIR trains here")
    if args.promotion_episodes < 0 or (args.promotion_episodes and not args.task):
        raise ConfigError("--promotion-episodes N: give N >= 1 with --task TASK (the held-out evaluation's task)")
    result = lerobot_round(policy=args.policy, store=args.store, out_dir=args.out, python=args.policy_python,
                           config=_train_config(args), task=args.task, dataset_root=args.dataset_root,
                           check_serves=not args.no_serve_check, report=report,
                           promotion={"episodes": args.promotion_episodes} if args.promotion_episodes else None)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    loss, decision = result["loss_last"], result["promotion"]
    print(f"{result['parent_version']} -> {result['version']}: {result['step_last']} lerobot-train steps on "
          f"{result['dataset']} ({result['frames']} frames)" + (f", final loss {loss:.4g}" if loss is not None else "")
          + (f"; {promotion_words(decision)}" if decision else "")
          + (f"; serve it: --policy {result['spec']}" if not decision or decision["promoted"] else ""))
    return 0


def server_version(url: str, timeout_s: float = 10.0) -> str | None:
    """The policy version a server's metadata declares; None while it does not answer."""
    # deferred: policy imports torch; the CLI lists its commands without it
    from websockets.sync.client import connect

    from hg_dagger.policy.remote import metadata_version
    from hg_dagger.policy.wire import unpackb

    try:
        with connect(url, open_timeout=timeout_s, compression=None, max_size=None) as ws:
            first = ws.recv(timeout=timeout_s)
        meta = unpackb(first) if isinstance(first, bytes) else None
    except Exception:  # noqa: BLE001 - down, refused or not a policy server: not there yet
        return None
    if not isinstance(meta, dict):
        return None
    return metadata_version({(k.decode() if isinstance(k, bytes) else str(k)): v for k, v in meta.items()})


def _export_for_server(args, report) -> int:
    """ws://: the version exported for the server's owner, then (--wait) its next version recorded."""
    version = server_version(args.policy)
    if version is None:
        raise ConfigError(f"policy train-next --policy {args.policy}: the server does not answer; a round records "
                          "which server version its data is meant to improve, so start it first")
    cfg = _train_config(args)
    result = export_round(policy=args.policy, store=args.store, out_dir=args.out, version=version,
                          dataset=cfg["dataset"], task=args.task, dataset_root=args.dataset_root, report=report)
    print(f"{result['dataset']} exported for {args.policy} (now {version}): {result['export']}; train on it with "
          "your trainer, then serve the new checkpoint at the same address", file=sys.stderr if args.json else
          sys.stdout, flush=True)
    if args.wait > 0:
        new = watch_version(lambda: server_version(args.policy), version, timeout_s=args.wait, report=report)
        if new is None:
            raise ConfigError(f"{args.policy} still serves {version} after {args.wait:g} s; the export stays in "
                              f"{result['export']} (run train-next again, or wait longer with --wait)")
        result["lineage_event"] = record_new_version(result["round"], new)
        if not args.json:
            print(f"{args.policy}: new version {new} (parent {version}, trained on {result['dataset']}) recorded in "
                  f"{Path(result['round']).with_name(LINEAGE_FILE)}")
    if args.json:
        print(json.dumps(result, indent=2))
    return 0
