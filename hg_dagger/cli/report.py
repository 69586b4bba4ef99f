"""hg-dagger report STORE: which labels may be trained on, what stopped the others, and the store's
effort and outcome figures, as JSON and a self-contained HTML page (hg_dagger.review.report)."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("report", help="training-data report of a store: labels allowed, what stopped the rest, "
                                      "interventions, recoveries, rounds; report.json + report.html")
    p.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    p.add_argument("--out", required=True, help="folder for report.json and report.html")
    p.add_argument("--task", help="only this task id")
    p.add_argument("--include-unreviewed", action="store_true", help="report under train --include-unreviewed")
    p.add_argument("--skip-qc", action="store_true", help="report under train --skip-qc")
    p.add_argument("--include-replay-mismatch", action="store_true", help="report under train --include-replay-mismatch")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_report)


def _report(args) -> int:
    from hg_dagger.contract import TrainingRule
    from hg_dagger.learn.train import describe_selection
    from hg_dagger.review.report import build_report, write_report

    rule = TrainingRule(require_review=not args.include_unreviewed, require_qc=not args.skip_qc,
                        exclude_replay_mismatch=not args.include_replay_mismatch)
    report = build_report(args.store, rule=rule, task=args.task, progress=not args.quiet)
    paths = write_report(report, args.out)
    f = report["figures"]
    print(f"{report['episodes']} episodes, {len(report['windows'])} windows; labels: {describe_selection(report['labels'])}")
    print(f"intervention rate {_pct(f['intervention_rate'])}, recovery success {_pct(f['recovery_success_rate'])}, "
          f"e-stops {f['estops']}")
    print(f"wrote {paths['json']} and {paths['html']}")
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"
