"""hg-dagger config check FILE"""

from __future__ import annotations

from hg_dagger import config


def register(sub) -> None:
    p = sub.add_parser("config", help="work with YAML config files")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    c = csub.add_parser("check", help="validate config files against their kind's schema")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.set_defaults(func=_check)


def _check(args) -> int:
    for path in args.files:
        model = config.check(path)
        print(f"{path}: ok ({type(model).__name__})")
    return 0
