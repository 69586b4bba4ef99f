"""hg-dagger dataset build|ls|show|diff|check|export: immutable dataset versions (hg_dagger.datasets: manifest, repository, build, read)."""

from __future__ import annotations

import json
import sys

from hg_dagger.cli.export import add_format_arguments, format_options
from hg_dagger.contract.enums import Usage
from hg_dagger.datasets import export
from hg_dagger.datasets.build import build
from hg_dagger.datasets.manifest import DatasetConfig, DatasetError, diff, load_config, read_manifest
from hg_dagger.datasets.read import check, export_items
from hg_dagger.datasets.repository import chain, default_root, load, manifest_path, names, root_of, versions

ROOT_HELP = "dataset folder (default: the folder 'datasets' beside the first --store)"


def register(sub) -> None:
    d = sub.add_parser("dataset", help="versioned datasets: build dataset_v(N+1) = v_N + new authorized samples, "
                                       "with usage classes, leak-free splits and lineage; list, show, diff, check")
    dsub = d.add_subparsers(dest="dataset_command", metavar="ACTION")

    b = dsub.add_parser("build", help="build the next version of a dataset from stores (nothing written if it "
                                      "would add nothing, or on any error)")
    b.add_argument("name", metavar="NAME")
    b.add_argument("--store", action="append", default=[], metavar="STORE",
                   help="episode store (repeatable; the earlier version's stores are always included)")
    b.add_argument("--root", help=ROOT_HELP)
    b.add_argument("--config", help="dataset config YAML (kind: dataset); default: the earlier version's")
    b.add_argument("--version", type=int, help="the version to build (default: the next); an existing one is "
                                               "accepted only if the result is identical")
    b.add_argument("--task", help="only episodes of this task id")
    b.add_argument("--val-fraction", type=float)
    b.add_argument("--test-fraction", type=float)
    b.add_argument("--isolate", nargs="+", choices=("task", "scene", "object", "operator", "day"),
                   help="dimensions whose values never span two splits")
    b.add_argument("--holdout-operators", nargs="+", metavar="OP", help="unseen-operator holdout")
    b.add_argument("--holdout-failure-modes", nargs="+", metavar="GATE_REASON", help="unseen-failure-mode holdout")
    b.add_argument("--recent-rounds", type=int, help="new trainable samples only from the newest K rounds")
    b.add_argument("--retain-rounds", type=int, help="retention: trainable samples of older rounds become replay_only")
    b.add_argument("--quota", type=int, help="at most this many trainable samples per stratum")
    b.add_argument("--stratify-by", nargs="+", choices=("task", "gate_reason", "operator"))
    b.add_argument("--author", default="", help="who built it (recorded, not hashed)")
    b.add_argument("--json", action="store_true", help="print the summary as JSON")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=_build)

    ls = dsub.add_parser("ls", help="datasets under a folder, or the versions of one")
    ls.add_argument("name", nargs="?", metavar="NAME")
    ls.add_argument("--root", help=ROOT_HELP)
    ls.add_argument("--store", action="append", default=[], help="find the folder beside this store")
    ls.set_defaults(func=_ls)

    s = dsub.add_parser("show", help="a version: counts per usage class and split, its lineage chain")
    s.add_argument("ref", metavar="NAME[@vN]|FILE")
    s.add_argument("--root", help=ROOT_HELP)
    s.add_argument("--store", action="append", default=[], help="find the folder beside this store")
    s.add_argument("--samples", action="store_true", help="list every sample: id, usage, why, split, steps")
    s.add_argument("--json", action="store_true", help="print the manifest")
    s.set_defaults(func=_show)

    df = dsub.add_parser("diff", help="what a version adds to, removes from or changes in another")
    df.add_argument("a", metavar="NAME@vA")
    df.add_argument("b", metavar="NAME@vB")
    df.add_argument("--root", help=ROOT_HELP)
    df.add_argument("--store", action="append", default=[], help="find the folder beside this store")
    df.add_argument("--samples", action="store_true", help="list the samples added and changed")
    df.set_defaults(func=_diff)

    c = dsub.add_parser("check", help="leakage check (an episode, its windows, a parent, an isolated value or a "
                                      "held-out one in two splits) and the stores, episodes and labels named")
    c.add_argument("ref", metavar="NAME[@vN]|FILE")
    c.add_argument("--root", help=ROOT_HELP)
    c.add_argument("--store", action="append", default=[], help="find the folder beside this store")
    c.add_argument("--no-stores", action="store_true", help="check the manifest alone")
    c.set_defaults(func=_check)

    e = dsub.add_parser("export", help="export a version's episodes (training mask = its trainable samples) with "
                                       "hg-dagger export's formats and options")
    e.add_argument("ref", metavar="NAME[@vN]|FILE")
    add_format_arguments(e)
    e.add_argument("--usage", nargs="+", default=["trainable"],
                   choices=[u.value for u in Usage],
                   help="episodes with a sample of these usage classes (default: trainable)")
    e.add_argument("--root", help=ROOT_HELP)
    e.add_argument("--store", action="append", default=[], help="find the folder beside this store")
    e.add_argument("--quiet", action="store_true")
    e.set_defaults(func=_export)
    d.set_defaults(func=lambda args: (d.print_help(), 2)[1])


def _root(args):
    ref = getattr(args, "ref", None)
    if args.root is None and not args.store and ref and ref.endswith(".json"):
        return root_of(ref)
    return default_root(args.root, args.store)


def _config(args):
    root = _root(args)
    if args.config:
        cfg = load_config(args.config)
    elif versions(root, args.name):
        cfg = load(root, args.name).config
    else:
        cfg = DatasetConfig()
    sel = cfg.selection.model_dump()
    spl = cfg.splits.model_dump()
    for key, value in (("task", args.task), ("recent_rounds", args.recent_rounds),
                       ("retain_rounds", args.retain_rounds), ("quota", args.quota),
                       ("stratify_by", args.stratify_by)):
        if value is not None:
            sel[key] = value
    if args.recent_rounds is not None:
        sel["rounds"] = "recent"
    for key, value in (("val_fraction", args.val_fraction), ("test_fraction", args.test_fraction),
                       ("isolate", args.isolate)):
        if value is not None:
            spl[key] = value
    if args.holdout_operators is not None:
        spl["holdout"]["operators"] = args.holdout_operators
    if args.holdout_failure_modes is not None:
        spl["holdout"]["failure_modes"] = args.holdout_failure_modes
    return root, DatasetConfig.model_validate({"selection": sel, "splits": spl})


def _build(args) -> int:
    root, cfg = _config(args)
    m, written = build(args.name, args.store, root=root, config=cfg, version=args.version, author=args.author,
                       progress=not args.quiet)
    if args.json:
        print(json.dumps({"dataset": m.ref, "hash": m.hash, "written": written, **m.summary}, indent=2))
        return 0
    u = m.summary["usage"]
    if not written:
        print(f"{m.ref} is current: nothing new to add (hash {m.hash[:12]})")
        return 0
    print(f"wrote {m.ref} (hash {m.hash[:12]}) in {root / m.name}")
    if m.parent_version:
        print(f"since v{m.parent_version}: {diff(load(root, f'{m.name}@v{m.parent_version}'), m)['text']}")
    print(f"{m.summary['samples']} samples of {m.summary['episodes']} episodes: " +
          ", ".join(f"{u[k]} {k}" for k in u) + f"; {m.summary['trainable_steps']} trainable steps; splits " +
          ", ".join(f"{k} {v}" for k, v in m.summary["splits"].items()))
    return 0


def _ls(args) -> int:
    root = _root(args)
    if args.name is None:
        found = names(root)
        if not found:
            print(f"no datasets under {root}")
        for n in found:
            vs = versions(root, n)
            print(f"{n}: v{vs[-1]} ({len(vs)} versions)")
        return 0
    vs = versions(root, args.name)
    if not vs:
        raise DatasetError(f"dataset {args.name!r}: no versions under {root}")
    for v in vs:
        m = read_manifest(manifest_path(root, args.name, v))
        u = m.summary.get("usage", {})
        print(f"{m.ref}  {m.hash[:12]}  {m.created_wall}  {m.summary.get('samples', 0)} samples, "
              f"{u.get('trainable', 0)} trainable, {m.summary.get('trainable_steps', 0)} trainable steps, "
              f"+{m.summary.get('added', 0)} new, {m.summary.get('changed', 0)} changed")
    return 0


def _show(args) -> int:
    root = _root(args)
    m = load(root, args.ref)
    if args.json:
        print(m.model_dump_json(indent=1))
        return 0
    u = m.summary["usage"]
    print(f"{m.ref}  hash {m.hash}  created {m.created_wall or '-'}  by {m.author or '-'}")
    print("stores: " + ", ".join(f"{s.id} {s.url}" for s in m.stores))
    print(f"{m.summary['samples']} samples of {m.summary['episodes']} episodes: "
          + ", ".join(f"{u[k]} {k}" for k in u) + f"; {m.summary['trainable_steps']} trainable steps")
    print("splits: " + ", ".join(f"{k} {v} episodes" for k, v in m.summary["splits"].items()))
    print(f"rule: {', '.join(f'{k}={v}' for k, v in m.config.selection.rule.model_dump().items())}")
    print("lineage:")
    for line in chain(root, m):
        print(f"  {line}")
    if args.samples:
        for s in m.samples:
            print(f"{s.id}  {s.kind}  {s.usage}  split {s.split}  steps {s.steps[0]}-{s.steps[1]}  layer "
                  f"v{s.label_version}  {s.why}")
    return 0


def _diff(args) -> int:
    root = _root(args)
    d = diff(load(root, args.a), load(root, args.b))
    print(f"{d['from']} -> {d['to']}: {d['text']}")
    if args.samples:
        for s in d["added"]:
            print(f"+ {s.id}  {s.usage}  {s.why}")
        for s in d["removed"]:
            print(f"- {s.id}  {s.usage}")
        for a, b in d["changed"]:
            print(f"~ {b.id}  {a.usage} -> {b.usage}  {b.why}")
    return 0


def _check(args) -> int:
    m = load(_root(args), args.ref)
    problems = check(m, stores=not args.no_stores)
    if problems:
        for p in problems:
            print(f"leak or problem: {p}", file=sys.stderr)
        raise DatasetError(f"{m.ref}: check failed: {len(problems)} problem{'s' if len(problems) > 1 else ''}; "
                           f"first: {problems[0]}")
    splits = ", ".join(f"{k} {v}" for k, v in m.summary["splits"].items())
    print(f"{m.ref}: ok (hash {m.hash[:12]}; no episode, window, parent or isolated value in two splits; {splits})")
    return 0


def _export(args) -> int:
    options = format_options(args)  # a bad format or option is refused before the version is read
    m = load(_root(args), args.ref)
    items = export_items(m, args.usage)
    if not items:
        raise DatasetError(f"{m.ref}: no sample of usage {', '.join(args.usage)} to export")
    summary = export(args.format, items, args.out, progress=not args.quiet, **options)
    print(f"{m.ref}: {summary.line()}")
    return 0
