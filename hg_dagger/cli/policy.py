"""hg-dagger policy serve SPEC | hg-dagger policy check SPEC --task TASK; and the ``--policy`` options of run and
eval (docs/policies.md)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import numpy as np

from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError

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
    g.add_argument("--policy-timeout", type=float, metavar="SECONDS", default=30.0,
                   help="a policy server that takes longer to answer counts as stalled and stops the run (default 30)")


def policy_spec(args, alias: str = "student") -> str | None:
    """``--policy``, or its older spelling ``--ALIAS PATH`` (a student checkpoint); not both."""
    spec, old = getattr(args, "policy", None), getattr(args, alias, None)
    if spec is not None and old is not None:
        raise ConfigError(f"give --policy or --{alias}, not both (--{alias} PATH is --policy PATH)")
    return spec if spec is not None else old


def trainable_spec(args, what: str, alias: str = "student") -> str | None:
    """The policy spec for a command that trains the built-in student (``what``: its flag): a checkpoint path, or
    None; a policy served from elsewhere is refused (training it with its own trainer comes later)."""
    spec = policy_spec(args, alias)
    # deferred: policy imports torch; the CLI lists its commands without it
    from hg_dagger.policy import is_remote

    if is_remote(spec):
        raise ConfigError(f"{what} trains the built-in student; --policy {spec} runs without {what} (train your own "
                          "policy with its own trainer on `hg-dagger export --format lerobot --labels trainable`)")
    return spec


def policy_options(args):
    # deferred: policy imports torch; the CLI lists its commands without it
    from hg_dagger.policy import PolicyOptions

    return PolicyOptions(python=getattr(args, "policy_python", None),
                         action_steps=getattr(args, "policy_action_steps", None),
                         temporal_ensemble=bool(getattr(args, "policy_temporal_ensemble", False)),
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
    s.add_argument("--exit-with-stdin", action="store_true", help=argparse.SUPPRESS)  # a parent's child server
    s.set_defaults(func=_serve)
    c = psub.add_parser("check", help="open a policy for a task, check its features and act once; print what it is")
    c.add_argument("spec", metavar="SPEC", help=SPEC_HELP)
    c.add_argument("--task", required=True, help="task id or YAML")
    c.add_argument("--json", action="store_true", help="print the result as JSON")
    add_arguments(c, spec=False)
    c.set_defaults(func=_check)


def _served(args):
    # deferred: these modules import torch; the CLI lists its commands without it
    from hg_dagger.policy.sources import source_name

    kind = source_name(args.spec)
    if kind == "lerobot":
        from hg_dagger.policy.lerobot_served import LeRobotServed

        return LeRobotServed(args.spec.split(":", 1)[1], device=args.device)
    if kind == "student":
        if args.task is None:
            raise ConfigError(f"policy serve {args.spec}: a built-in student needs --task TASK (the mapping it acts in)")
        from hg_dagger.policy import Student, one_inference_thread
        from hg_dagger.policy.server import StudentServed

        one_inference_thread()
        return StudentServed(Student.load(args.spec, load_mapping(args.task)))
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
