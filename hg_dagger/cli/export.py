"""hg-dagger export STORE --format FORMAT --out DIR [--task T] [--episodes ID ...] [format options]: the formats
and their options come from the exporter registry (hg_dagger.datasets.exporters), shared with `dataset export`."""

from __future__ import annotations

import json

from hg_dagger.datasets import EXPORTERS, export, format_names, select
from hg_dagger.datasets.exporters import option_table, resolve_options


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write episodes of a store in a format another trainer reads (LeRobot v3.0, an ODS TensorDict, an "
        "RLinf online-DAgger shard, or a plugin's): the training boundary per frame, or only the labels training "
        "may use; the output folder must be new or empty",
    )
    p.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    add_format_arguments(p)
    p.add_argument("--task", metavar="T", help="only episodes of this task id")
    p.add_argument("--episodes", nargs="+", metavar="ID",
                   help="these episodes, in this order (default: every complete episode of the store)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_export)


def _export(args) -> int:
    from hg_dagger.store import EpisodeStore  # deferred: zarr loads for a command that opens a store

    options = format_options(args)  # a bad format or option is refused before the store is opened
    store = EpisodeStore.open(args.store)
    items = select(store, task_id=args.task, episodes=args.episodes)
    summary = export(args.format, items, args.out, progress=not args.quiet, **options)
    print(json.dumps(summary.__dict__, indent=2) if args.json else summary.line())
    return 0


def add_format_arguments(p) -> None:
    """--format, --out and every registered format's options (each --<name> once, its help per format), for
    `export` and `dataset export` alike. Defaults are None: the library fills each format's own and refuses an
    option of another format by name."""
    names = format_names()
    p.add_argument("--format", required=True, metavar="{" + ",".join(names) + "}",
                   help="; ".join(f"{n}: {EXPORTERS.get(n).description}" for n in names))
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (new or empty)")
    for name, uses in option_table().items():
        flag = uses[0][1].flag
        choices = {o.choices for _, o in uses}
        shared = choices.pop() if len(choices) == 1 else None
        p.add_argument(flag, dest=name, choices=shared, default=None,
                       help="; ".join(f"{fmt}: {o.help}" + (f" (default {o.default})" if o.default else "")
                                      for fmt, o in uses))


def format_options(args) -> dict[str, str | None]:
    """The format options given on the command line, checked against --format (hg_dagger.datasets.exporters)."""
    given = {name: getattr(args, name, None) for name in option_table()}
    resolve_options(args.format, given)
    return given
