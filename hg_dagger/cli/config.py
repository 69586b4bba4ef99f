"""hg-dagger config check FILE|NAME, hg-dagger config where [NAME]"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hg_dagger import config
from hg_dagger.errors import ConfigError


def register(sub: Any) -> None:
    p = sub.add_parser("config", help="work with YAML config files (and where a config name is found)")
    csub = p.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    c = csub.add_parser("check", help="validate config files against their kind's schema")
    c.add_argument("files", nargs="+", metavar="FILE", help="a YAML file, or a config name (gates/toy_reach) looked "
                   "up on the search path")
    c.set_defaults(func=_check)
    w = csub.add_parser("where", help="which file a config name means (./configs, then the config home, then the "
                        "shipped configs) and which files of that name it shadows; without NAME: the search path")
    w.add_argument("name", nargs="?", metavar="NAME", help="AREA/NAME, e.g. gates/toy_reach, run/fetch_pick_place, "
                   "tasks/toy_reach")
    w.set_defaults(func=_where)


def split_name(name: str) -> tuple[str, str]:
    """'gates/toy_reach' (or 'gates/toy_reach.yaml') -> ('gates', 'toy_reach'); anything else is one line."""
    area, sep, rest = name.strip().partition("/")
    known = config.areas()
    if not sep or area not in known:
        raise ConfigError(f"{name!r}: a config name is AREA/NAME with AREA one of {', '.join(known)} "
                          "(e.g. gates/toy_reach)")
    return area, rest.removesuffix(".yaml")


def resolve(ref: str) -> Path:
    """A FILE argument: an existing path, else a config name (AREA/NAME) found on the search path, else the path
    (whose error then says it is not there)."""
    path = Path(ref)
    area, sep, name = ref.partition("/")
    if path.exists() or not sep or area not in config.areas() or not name or "/" in name or name.startswith("."):
        return path
    return config.find(area, name) or path


def _check(args: argparse.Namespace) -> int:
    for ref in args.files:
        path = resolve(ref)
        model = config.check(path)
        print(f"{path}: ok ({type(model).__name__})")
    return 0


def _where(args: argparse.Namespace) -> int:
    roots = config.search_path()
    if args.name is None:
        print("config names are looked up in (first found wins):")
        for label, root in roots:
            print(f"  {root}  ({label}{'' if root.is_dir() else ', not there'})")
        return 0
    area, name = split_name(args.name)
    found = config.candidates(area, name)
    if not found:
        looked = ", ".join(str(root / area) for _, root in roots)
        raise ConfigError(f"{area}/{name}: no such config (looked in {looked}; known names: "
                          f"{', '.join(config.known_names(area)) or 'none'})")
    (label, winner), *shadowed = found
    print(f"{area}/{name}: {winner}  ({label})")
    for label, path in shadowed:
        print(f"  shadows {path}  ({label})")
    return 0
