"""hg-dagger tasks ; hg-dagger check-env TASK"""

from __future__ import annotations

from hg_dagger.envs import known_tasks, load_mapping
from hg_dagger.envs.check import smoke_test


def register(sub) -> None:
    p = sub.add_parser("tasks", help="list the shipped tasks (configs/tasks)")
    p.set_defaults(func=_tasks)
    c = sub.add_parser("check-env", help="reset/step smoke test of a task in this process; prints its mapping")
    c.add_argument("task", metavar="TASK", help="task id or path to a task YAML file")
    c.add_argument("--num-envs", type=int, default=2)
    c.add_argument("--steps", type=int, default=5, help="steps per action source")
    c.add_argument("--seed", type=int, default=0)
    c.set_defaults(func=_check_env)


def _tasks(args) -> int:
    for task in known_tasks():
        m = load_mapping(task)
        keys = ", ".join(f"{k.name}{list(k.shape)}" for k in m.observation)
        print(f"{task:22s} {m.backend:11s} {m.control_hz:g} Hz  horizon {m.horizon:4d}  action {m.action_dim}  obs {keys}")
    return 0


def _check_env(args) -> int:
    mapping = load_mapping(args.task)
    print(mapping.describe())
    smoke_test(args.task, num_envs=args.num_envs, steps=args.steps, seed=args.seed, log=lambda s: print(f"  ok  {s}"))
    print(f"check-env {mapping.task_id}: passed")
    return 0
