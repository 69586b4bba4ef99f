"""hg-dagger review list|show|approve|reject|needs-fix|open: reviewers' decisions on correction windows."""

from __future__ import annotations

import json
import sys
from collections import Counter

from tqdm import tqdm

from hg_dagger.ui.review_main import run_review

STATUSES = ("pending", "approved", "rejected", "needs_fix")


def register(sub) -> None:
    p = sub.add_parser("review", help="list correction windows, show their audit trail, approve or reject them")
    rsub = p.add_subparsers(dest="review_command", metavar="ACTION", required=True)

    ls = rsub.add_parser("list", help="one line per correction window with its current review state")
    ls.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    ls.add_argument("--status", choices=STATUSES, help="only windows in this review state")
    ls.add_argument("--task", help="only this task id")
    ls.add_argument("--operator", help="only this operator pseudonym")
    ls.add_argument("--json", action="store_true", help="print a JSON list (full window ids)")
    ls.add_argument("--quiet", action="store_true", help="no progress bar")
    ls.set_defaults(func=_list)

    show = rsub.add_parser("show", help="a window, its episode and every decision ever made on it")
    show.add_argument("store", metavar="STORE")
    show.add_argument("window", metavar="WINDOW_ID", help="window id (a unique prefix of >= 8 characters)")
    show.add_argument("--json", action="store_true", help="print JSON")
    show.set_defaults(func=_show)

    for name, status, help_ in (("approve", "approved", "approve a window (optionally authorize it for training)"),
                                ("reject", "rejected", "reject a window (a reason is required)"),
                                ("needs-fix", "needs_fix", "send a window back for fixing (a reason is required)")):
        d = rsub.add_parser(name, help=help_)
        d.add_argument("store", metavar="STORE")
        d.add_argument("window", metavar="WINDOW_ID", help="window id (a unique prefix of >= 8 characters)")
        d.add_argument("--reviewer", required=True,
                       help="reviewer pseudonym (never a real name, never the window's operator)")
        d.add_argument("--reason", default="", help="why" + ("" if status == "approved" else " (required)"))
        if status == "approved":
            d.add_argument("--authorize", action="store_true", dest="authorize",
                           help="authorize the window for training (replay_training_authorized)")
            d.add_argument("--no-authorize", action="store_false", dest="authorize",
                           help="approve without training authorization (default)")
        d.add_argument("--json", action="store_true", help="print the decision as JSON")
        d.set_defaults(func=_decide, status=status, authorize=False)

    op = rsub.add_parser("open", help="the review workspace: browse windows, scrub their episodes, decide")
    op.add_argument("stores", metavar="STORE", nargs="+", help="one or more store paths")
    op.add_argument("--reviewer", help="reviewer pseudonym (asked in a dialog when missing)")
    op.set_defaults(func=_open)


def _list(args) -> int:
    # deferred: review.decisions imports zarr; the CLI lists its commands without it
    from hg_dagger.review.decisions import WindowFilter, incomplete_episodes, list_windows, open_store

    store = open_store(args.store)
    rows = list_windows(store, WindowFilter(status=args.status, task=args.task, operator=args.operator),
                        progress=lambda it: tqdm(it, desc="review list", unit="ep", disable=args.quiet,
                                                 leave=False, file=sys.stderr))
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        print(f"{'window':12}  {'episode':12}  {'task':16} {'operator':12} {'gate':12} {'steps':>11}  "
              f"{'source':6} {'outcome':16} {'status':9} {'auth':9}  reviewer")
        for r in rows:
            steps = f"[{r.handover_start},{r.handover_end})"
            print(f"{r.short_id:12}  {r.episode_id[:12]:12}  {r.task:16} {r.operator or '-':12} "
                  f"{r.gate_reason or '-':12} {steps:>11}  {r.source:6} {r.outcome:16} {r.status.value:9} "
                  f"{r.auth:9}  {r.reviewer or '-'}")
    counts = Counter(r.status.value for r in rows)
    parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES if counts[s])
    skipped = incomplete_episodes(store)
    note = f"; {len(skipped)} incomplete episode(s) not reviewable" if skipped else ""
    print(f"{args.store}: {len(rows)} window(s)" + (f" ({parts})" if parts else "") + note,
          file=sys.stderr if args.json else sys.stdout)
    return 0


def _show(args) -> int:
    # deferred: review.decisions imports zarr; the CLI lists its commands without it
    from hg_dagger.review.decisions import window_context

    ctx = window_context(args.store, args.window)
    row, window, ep = ctx["row"], ctx["window"], ctx["episode"]
    if args.json:
        print(json.dumps({"window": window.model_dump(mode="json"), "current": row.to_json(), "episode": ep,
                          "qc": [q.model_dump(mode="json") for q in ctx["qc"]],
                          "trail": [e.to_json() for e in ctx["trail"]]}, indent=2))
        return 0
    print(f"window {row.window_id}  ({row.status.value}{', authorized' if row.authorized else ''}"
          f"{', by ' + row.reviewer if row.reviewer else ''})")
    print(f"  steps [{window.handover_start}, {window.handover_end}) of {ep['num_steps']}, gate fired at step "
          f"{window.parent_step_id} ({window.gate_reason or '-'}), source {window.source.value}, "
          f"operator {row.operator or '-'}, outcome {window.outcome.value}")
    print(f"episode {ep['episode_id']}  task {ep['task']}, mode {ep['mode']}, policy {ep['policy_version'] or '-'}, "
          f"end {ep['end_reason']}, success {ep['task_success']}, replay {ep['replay_status']}, "
          f"{ep['windows_in_episode']} window(s), label layers {ep['label_versions']}")
    if row.trainable_steps == 0:
        print(f"  none of its steps is a trainable label: {row.excluded_why or 'its labels are excluded'}")
    for q in ctx["qc"]:
        print(f"  QC {'passed' if q.passed else 'FAILED'}" + (f": {', '.join(q.flags)}" if q.flags else ""))
    trail = ctx["trail"]
    print(f"audit trail ({len(trail)} decision(s), oldest first):")
    for e in trail:
        d = e.decision
        print(f"  v{e.version} {d.t_wall or e.created_wall}  {d.reviewer}: {d.status.value}"
              f"{' (training authorized)' if d.replay_training_authorized else ''}"
              + (f" - {d.notes}" if d.notes else ""))
    return 0


def _decide(args) -> int:
    # deferred: review.decisions imports zarr; the CLI lists its commands without it
    from hg_dagger.review.decisions import decide

    row, version = decide(args.store, args.window, args.status, args.reviewer, args.reason, args.authorize)
    if args.json:
        print(json.dumps({**row.to_json(), "label_version": version}, indent=2))
    else:
        print(f"{args.store}: window {row.window_id} (episode {row.episode_id}) {row.status.value}"
              f"{', training authorized' if row.authorized else ''} by {row.reviewer}; label layer v{version}")
    return 0


def _open(args) -> int:
    return run_review(args.stores, args.reviewer)
