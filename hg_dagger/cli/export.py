"""hg-dagger export STORE --format lerobot|ods|rlinf --out DIR [--task T] [--episodes ID ...]"""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write episodes of a store as a LeRobot v3.0 dataset or an ODS-compatible TensorDict (every step, "
        "with the per-frame label mask and intervention flags), or their trainable labels as an RLinf "
        "online-DAgger shard; the output folder must be new or empty",
    )
    p.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    p.add_argument("--format", required=True, choices=("lerobot", "ods", "rlinf"),
                   help="lerobot: LeRobot v3.0; ods: TensorDict for EmbodiChain's TensorDataSource; rlinf: LeRobot "
                   "v2.1 shard for RLinf's online DAgger (<data_path>/rank_0/id_<n>), trainable steps only")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (new or empty)")
    p.add_argument("--task", metavar="T", help="only episodes of this task id")
    p.add_argument("--episodes", nargs="+", metavar="ID",
                   help="these episodes, in this order (default: every complete episode of the store)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_export)


def _export(args) -> int:
    from hg_dagger.datasets import export_lerobot, export_ods, export_rlinf, select
    from hg_dagger.store import EpisodeStore

    store = EpisodeStore.open(args.store)
    items = select(store, task_id=args.task, episodes=args.episodes)
    fn = {"lerobot": export_lerobot, "ods": export_ods, "rlinf": export_rlinf}[args.format]
    summary = fn(items, args.out, progress=not args.quiet)
    print(json.dumps(summary.__dict__, indent=2) if args.json else summary.line())
    return 0
