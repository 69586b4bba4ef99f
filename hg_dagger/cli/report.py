"""hg-dagger report STORE: which labels may be trained on, what stopped the others, and the store's
effort and outcome figures, as JSON and a self-contained HTML page (hg_dagger.review.report)."""

from __future__ import annotations

from hg_dagger.contract import TrainingRule
from hg_dagger.datasets.report import dataset_report, render_dataset_html
from hg_dagger.datasets.repository import default_root, load, root_of
from hg_dagger.errors import ConfigError
from hg_dagger.review.recall import describe

MAX_LISTED = 20  # windows whose approval authorizes nothing, named one per line


def register(sub) -> None:
    p = sub.add_parser("report", help="training-data report of a store: labels allowed, what stopped the rest, "
                                      "interventions, recoveries, rounds; report.json + report.html")
    p.add_argument("store", metavar="STORE", nargs="?", help="store path or fsspec URL (omit with --dataset)")
    p.add_argument("--dataset", metavar="NAME@vN", help="report one dataset version: its episodes and samples, usage "
                   "classes per split, contribution per version (with STORE: the dataset folder beside it)")
    p.add_argument("--datasets-root", help="dataset folder (default: the folder 'datasets' beside STORE)")
    p.add_argument("--out", required=True, help="folder for report.json and report.html")
    p.add_argument("--task", help="only this task id")
    p.add_argument("--include-unreviewed", action="store_true", help="report under train --include-unreviewed")
    p.add_argument("--skip-qc", action="store_true", help="report under train --skip-qc")
    p.add_argument("--include-replay-mismatch", action="store_true", help="report under train --include-replay-mismatch")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_report)


def _report(args) -> int:
    # deferred: learn.train and review.report import torch and zarr; the CLI lists its commands without them
    from hg_dagger.learn.train import describe_selection
    from hg_dagger.review.report import build_report, write_report

    if args.dataset:
        return _dataset_report(args)
    if args.store is None:
        raise ConfigError("report needs STORE or --dataset NAME@vN")
    rule = TrainingRule(require_review=not args.include_unreviewed, require_qc=not args.skip_qc,
                        exclude_replay_mismatch=not args.include_replay_mismatch)
    report = build_report(args.store, rule=rule, task=args.task, progress=not args.quiet)
    paths = write_report(report, args.out)
    f = report["figures"]
    print(f"{report['episodes']} episodes, {len(report['windows'])} windows; labels: {describe_selection(report['labels'])}")
    void = [w for w in report["windows"] if w["review_problem"]]
    for w in void[:MAX_LISTED]:
        print(f"window {w['window_id']} (episode {w['episode_id']}): approval authorizes nothing: {w['review_problem']}")
    if len(void) > MAX_LISTED:
        print(f"... and {len(void) - MAX_LISTED} more window(s) whose approval authorizes nothing (report.json)")
    print(f"intervention rate {_pct(f['intervention_rate'])}, recovery success {_pct(f['recovery_success_rate'])}, "
          f"e-stops {f['estops']}")
    gr = report["gate_recall"]
    if gr["episodes"]:
        print(f"gates: {describe(gr)}")
        for r in gr["rounds"]:
            if r["gate_miss"]:
                print(f"round {r['round']}: {describe(r)}")
    print(f"wrote {paths['json']} and {paths['html']}")
    return 0


def _dataset_report(args) -> int:
    # deferred: review.report imports zarr; the CLI lists its commands without it
    from hg_dagger.review.report import write_report

    root = root_of(args.dataset) if args.datasets_root is None and args.store is None and \
        args.dataset.endswith(".json") else default_root(args.datasets_root, [args.store] if args.store else [])
    report = dataset_report(load(root, args.dataset), root)
    paths = write_report(report, args.out)
    paths["html"].write_text(render_dataset_html(report))
    d, f = report["dataset"], report["figures"]
    print(f"{d['ref']}: {report['episodes']} episodes, " + ", ".join(f"{v} {k}" for k, v in d["usage"].items()))
    print(f"trainable human-label ratio {_pct(f['trainable_human_label_ratio'])}, context-only "
          f"{_pct(f['context_only_ratio'])}, intervention rate {_pct(f['intervention_rate'])}")
    print(f"wrote {paths['json']} and {paths['html']}")
    return 0


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v:.1%}"
