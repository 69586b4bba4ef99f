"""hg-dagger qc STORE: automated QC of every committed episode and correction window (hg_dagger.review.qc)."""

from __future__ import annotations

import sys

from hg_dagger.review.qc_config import load_qc_config


def register(sub) -> None:
    p = sub.add_parser("qc", help="automated QC of episodes and correction windows; writes QC results as a new "
                                  "label layer per episode whose results changed")
    p.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    p.add_argument("--episode", action="append", metavar="ID", help="only this episode (repeatable)")
    p.add_argument("--config", metavar="FILE", help="QC thresholds (YAML, kind: qc); default: built-in")
    p.add_argument("--dry-run", action="store_true", help="check and report, write nothing")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_qc)


def _qc(args) -> int:
    # deferred: review.qc imports zarr; the CLI lists its commands without it
    from hg_dagger.review.qc import format_json, run_qc

    cfg = load_qc_config(args.config)
    summary = run_qc(args.store, config=cfg, episodes=args.episode, write=not args.dry_run, progress=not args.quiet)
    for msg in summary.errors:
        print(f"error: {msg}", file=sys.stderr)
    if args.json:
        print(format_json(summary))
    else:
        for e in summary.episodes:
            for r in e.results:
                if not r.passed:
                    where = f"episode {r.episode_id}" + (f" window {r.window_id}" if r.window_id else "")
                    failed = [c for c, ok in r.checks.items() if not ok and c not in ("recovery", "review")]
                    print(f"{where}: failed {', '.join(failed)} [{', '.join(r.flags)}]")
        print(summary.line())
    return 1 if summary.errors else 0
