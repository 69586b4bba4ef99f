"""hg-dagger validate STORE | hg-dagger store ls STORE | hg-dagger store info STORE EPISODE |
hg-dagger store reviewers STORE [--set A,B | --clear]"""

from __future__ import annotations

import json

from hg_dagger.contract.enums import LabelMask
from hg_dagger.errors import StoreError


def register(sub) -> None:
    v = sub.add_parser("validate", help="check every contract invariant of an episode store (exit 1 on any violation)")
    v.add_argument("store", metavar="STORE", help="store path or fsspec URL")
    v.add_argument("--quick", action="store_true", help="do not decode camera frames (metadata is still checked)")
    v.add_argument("--max", type=int, default=200, metavar="N", help="print at most N violations (default 200)")
    v.set_defaults(func=_validate)

    p = sub.add_parser("store", help="inspect an episode store")
    ssub = p.add_subparsers(dest="store_command", metavar="ACTION", required=True)
    ls = ssub.add_parser("ls", help="list episodes (one line each); exit 1 when a segment or episode is damaged")
    ls.add_argument("store", metavar="STORE")
    ls.add_argument("--task", help="only this task id")
    ls.add_argument("--mode", help="only this collection mode")
    ls.add_argument("--split", help="only this split")
    ls.add_argument("--incomplete", action="store_true", help="only episodes that were never committed")
    ls.set_defaults(func=_ls)
    info = ssub.add_parser("info", help="metadata, events, fields and label layers of one episode")
    info.add_argument("store", metavar="STORE")
    info.add_argument("episode", metavar="EPISODE", help="episode id (a unique prefix is enough)")
    info.set_defaults(func=_info)
    rev = ssub.add_parser("reviewers", help="show or set the reviewer roster: who may authorize training")
    rev.add_argument("store", metavar="STORE")
    how = rev.add_mutually_exclusive_group()
    how.add_argument("--set", metavar="A,B,...", help="only these reviewer pseudonyms may authorize training")
    how.add_argument("--clear", action="store_true", help="remove the roster (anyone but the operator may authorize)")
    rev.set_defaults(func=_reviewers)
    val = ssub.add_parser("validate", help="same as `hg-dagger validate`")
    val.add_argument("store", metavar="STORE")
    val.add_argument("--quick", action="store_true")
    val.add_argument("--max", type=int, default=200, metavar="N")
    val.set_defaults(func=_validate)


def _validate(args) -> int:
    # deferred: store imports zarr; the CLI lists its commands without it
    from hg_dagger.store import EpisodeStore, validate_store

    store = EpisodeStore.open(args.store, mode="r")
    violations = validate_store(store, images=not args.quick, progress=True)
    infos = store.episodes()
    incomplete = sum(not i.complete for i in infos)
    for v in violations[: args.max]:
        print(v)
    if len(violations) > args.max:
        print(f"... and {len(violations) - args.max} more")
    warnings = store.warnings  # not violations: they never make a store invalid
    for w in warnings:
        print(f"warning: {w}")
    summary = f"{args.store}: {len(infos)} episodes ({incomplete} incomplete), {len(violations)} violation(s)"
    print(summary + (f", {len(warnings)} warning(s)" if warnings else ""))
    return 1 if violations else 0


def _ls(args) -> int:
    # deferred: store imports zarr; the CLI lists its commands without it
    from hg_dagger.store import EpisodeStore

    store = EpisodeStore.open(args.store, mode="r")
    infos = store.episodes(task_id=args.task, mode=args.mode, split=args.split,
                           complete=False if args.incomplete else None)
    print(f"{'episode_id':32}  {'task':18} {'mode':13} {'split':10} {'steps':>6}  end")
    for i in infos:
        print(f"{i.episode_id:32}  {i.task_id:18} {i.start.mode.value:13} {i.start.split.value:10} "
              f"{i.num_steps:6d}  {i.end.end_reason.value}{'' if i.complete else ' (INCOMPLETE)'}")
    damaged = store.damaged  # a segment or episode that cannot be read: named, and the exit status says so
    for _eid, msg in damaged:
        print(f"damaged: {msg}")
    print(f"{len(infos)} episode(s)" + (f"; {len(damaged)} damaged (run `hg-dagger validate {args.store}`)"
                                        if damaged else ""))
    return 1 if damaged else 0


def _info(args) -> int:
    # deferred: store imports zarr; the CLI lists its commands without it
    from hg_dagger.store import EpisodeStore

    store = EpisodeStore.open(args.store, mode="r")
    matches = [i for i in store.episodes() if i.episode_id.startswith(args.episode)]
    if len(matches) != 1:
        raise StoreError(f"{args.store}: {len(matches)} episodes match {args.episode!r}")
    info = matches[0]
    print(f"episode {info.episode_id}  ({'complete' if info.complete else 'INCOMPLETE'}, {info.num_steps} steps, "
          f"segment {info.segment_id})")
    print("start: " + json.dumps(info.start.model_dump(mode="json"), indent=2))
    print("end: " + json.dumps(info.end.model_dump(mode="json"), indent=2))
    print("fields:")
    for name, spec in store.fields(info.episode_id).items():
        print(f"  {name:22} {spec.dtype:8} {list(spec.shape)}{'  image' if spec.image else ''}")
    for v in store.label_versions(info.episode_id) or [0]:
        layer = store.labels(info.episode_id, v)
        counts = {m.value: int((layer.mask == m.code).sum()) for m in LabelMask}
        print(f"label layer v{v} by {layer.author or '-'}: {counts}, {len(layer.windows)} window(s), "
              f"{len(layer.reviews)} review(s), {len(layer.qc)} QC result(s)")
    return 0


def _reviewers(args) -> int:
    # deferred: store imports zarr; the CLI lists its commands without it
    from hg_dagger.store import EpisodeStore

    store = EpisodeStore.open(args.store, mode="a" if args.set is not None or args.clear else "r")
    if args.clear:
        store.set_reviewers(None)
    elif args.set is not None:
        store.set_reviewers(args.set.split(","))
    roster = store.reviewers
    if roster is None:
        print(f"{args.store}: no reviewer roster: anyone but a window's operator may authorize it for training")
    else:
        print(f"{args.store}: reviewer roster ({len(roster)}): {', '.join(roster)}; only they may authorize training")
    return 0
