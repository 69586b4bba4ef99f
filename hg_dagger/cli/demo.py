"""hg-dagger demo: the end-to-end main job (expert demos -> BC student -> human-gated run -> validate)."""

from __future__ import annotations

import time

from hg_dagger.demo import run_demo


def register(sub) -> None:
    p = sub.add_parser("demo", help="end to end on the embedded MuJoCo task: expert demos, a BC student, a "
                       "human-gated run with the synthetic operator, validation, and a summary")
    p.add_argument("--out", help="output folder (default: runs/demo-<time>)")
    p.add_argument("--task", default="fetch_pick_place")
    p.add_argument("--demo-episodes", type=int, default=16, help="planner demonstrations for behaviour cloning")
    p.add_argument("--train-steps", type=int, default=1500)
    p.add_argument("--gated-episodes", type=int, default=3, help="human-gated episodes with the synthetic operator")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    out = args.out or time.strftime("runs/demo-%Y%m%d-%H%M%S")
    report = run_demo(out, task=args.task, demo_episodes=args.demo_episodes, train_steps=args.train_steps,
                      gated_episodes=args.gated_episodes, seed=args.seed, progress=not args.quiet)
    print("\n".join(report.lines()))
    for v in report.violations[:20]:
        print(f"  {v}")
    return 1 if report.violations else 0
