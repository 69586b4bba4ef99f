"""hg-dagger replay STORE [--episode ID ...] [--dry-run] [--json] [--quiet]"""

from __future__ import annotations

import json
import sys

from hg_dagger.learn import executor
from hg_dagger.review.replay import replay_store


def register(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="re-run episodes from their recorded seed with their applied actions and record whether the "
        "simulator reproduces the stored observations (exit 1 on any replay_mismatch)",
    )
    p.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    p.add_argument("--episode", action="append", metavar="ID", dest="episodes",
                   help="only this episode (id or unique prefix); repeat for more (default: every committed episode)")
    p.add_argument("--author", default="replay", help="author of the label layers written (default: replay)")
    p.add_argument("--dry-run", action="store_true", help="report only; write no label layer")
    p.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    executor.add_arguments(p)
    p.set_defaults(func=_replay)


def _replay(args) -> int:
    with executor.from_args(args) as ex:
        report = replay_store(args.store, episodes=args.episodes, write=not args.dry_run, author=args.author,
                              progress=not args.quiet, executor=ex)
    if args.json:
        print(json.dumps({**report.to_json(), "summary": report.summary()}, indent=2))
    else:
        for r in report.results:
            c = r.check
            if r.skipped:
                print(f"{r.episode_id}  skipped: {r.skipped}")
            elif c.status.value != "replayable":
                print(f"{r.episode_id}  {c.status.value}: {c.reason}")
        print(report.summary())
    if report.mismatches:
        print(f"{len(report.mismatches)} episode(s) do not replay", file=sys.stderr)
        return 1
    return 0
