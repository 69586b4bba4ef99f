"""hg-dagger export STORE --format lerobot|ods|rlinf --out DIR [--task T] [--episodes ID ...] [--labels all|trainable]
[--video h264|av1] [--layout padded|ragged]"""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write episodes of a store as a LeRobot v3.0 dataset (every step with the per-frame label mask, or "
        "with --labels trainable only the labels training may use, ready for lerobot-train) or an ODS-compatible "
        "TensorDict with the DAgger schema, or their trainable labels as an RLinf online-DAgger shard; the output "
        "folder must be new or empty",
    )
    p.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    p.add_argument("--format", required=True, choices=("lerobot", "ods", "rlinf"),
                   help="lerobot: LeRobot v3.0; ods: TensorDict for EmbodiChain's TensorDataSource; rlinf: LeRobot "
                   "v2.1 shard for RLinf's online DAgger (<data_path>/rank_0/id_<n>), trainable steps only")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (new or empty)")
    p.add_argument("--task", metavar="T", help="only episodes of this task id")
    p.add_argument("--episodes", nargs="+", metavar="ID",
                   help="these episodes, in this order (default: every complete episode of the store)")
    add_format_options(p)
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_export)


def _export(args) -> int:
    from hg_dagger.datasets import select
    from hg_dagger.store import EpisodeStore

    check_format_options(args)
    store = EpisodeStore.open(args.store)
    items = select(store, task_id=args.task, episodes=args.episodes)
    summary = write_export(items, args)
    print(json.dumps(summary.__dict__, indent=2) if args.json else summary.line())
    return 0


def add_format_options(p) -> None:
    """The options of one export format (--labels, --video: lerobot; --layout: ods), shared by `export` and
    `dataset export`."""
    p.add_argument("--labels", choices=("all", "trainable"), default="all",
                   help="lerobot: all = every step with the label information per frame (default); trainable = only "
                   "the labels training may use, each run of them one episode, action = the label target")
    p.add_argument("--video", choices=("h264", "av1"),
                   help="lerobot: cameras as mp4 video (H.264 for OpenCV and browsers, AV1 for archives; lossy) "
                   "instead of PNG frames")
    p.add_argument("--layout", choices=("padded", "ragged"), default="padded",
                   help="ods: padded = one row per episode, padded to the longest (default); ragged = episodes "
                   "packed end to end into rows, each its own continuity stretch")


def check_format_options(args) -> None:
    """An option of another format than --format is refused by name (it would silently do nothing)."""
    from hg_dagger.datasets.source import ExportError

    for flag, value, default, fmt in (("--labels", args.labels, "all", "lerobot"), ("--video", args.video, None, "lerobot"),
                                      ("--layout", args.layout, "padded", "ods")):
        if value != default and args.format != fmt:
            raise ExportError(f"{flag} is for --format {fmt}")


def write_export(items, args):
    """Export ``items`` as ``args.format`` into ``args.out`` with that format's options; the summary."""
    from hg_dagger.datasets import export_lerobot, export_ods, export_rlinf

    if args.format == "lerobot":
        return export_lerobot(items, args.out, progress=not args.quiet, labels=args.labels, video=args.video)
    if args.format == "ods":
        return export_ods(items, args.out, progress=not args.quiet, layout=args.layout)
    return export_rlinf(items, args.out, progress=not args.quiet)
