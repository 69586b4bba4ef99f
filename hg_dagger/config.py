"""YAML config files loaded into pydantic v2 models, with errors that name the file and the key.

Every config file states its ``kind``; KINDS maps a kind to the model that validates it, so
``hg-dagger config check FILE`` works for any of them. Models live with the layer they configure.

A config *name* (``gates/toy_reach``: an area, a file name without ``.yaml``) is looked up on the search path,
first found wins: ``./configs``, then the user's config home (``$XDG_CONFIG_HOME/hg-dagger``, default
``~/.config/hg-dagger``), then the configs shipped with the package. ``find`` is the one lookup; every reader of a
named config goes through it (``hg-dagger config where NAME`` shows the winner and what it shadows).
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hg_dagger.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

# configs/ at the repository root installs as the package hg_dagger.configs (setup.py), editable or not: the
# shipped configs, last on the search path.
CONFIG_DIR = Path(str(importlib.resources.files("hg_dagger.configs")))
APP_NAME = "hg-dagger"  # the config home's folder name

# kind -> "module:Model". Add a line when a layer gains a config file kind.
KINDS: dict[str, str] = {
    "task": "hg_dagger.envs.mapping:TaskMapping",
    "gates": "hg_dagger.control.gate_specs:GateConfig",
    "run": "hg_dagger.control.session:RunConfig",
    "device": "hg_dagger.devices.configs:DeviceFile",
    "auto": "hg_dagger.learn.auto:AutoConfig",
    "qc": "hg_dagger.review.qc_config:QCConfig",
    "dataset": "hg_dagger.datasets.manifest:DatasetConfig",
    "lerobot_train": "hg_dagger.learn.lerobot_round:LeRobotTrainConfig",
}


def format_validation_error(source: str, err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line per invalid value, each naming the source and the dotted key (a single error is one line); with
    ``model``, an unknown key's line lists the keys allowed there."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {_short(got)})"
        msg = e["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
        allowed = known_keys_at(model, e["loc"][:-1]) if e["type"] == "extra_forbidden" and model else []
        known = f"; known keys here: {', '.join(allowed)}" if allowed else ""
        lines.append(f"{source}: key {key}: {msg}{shown}{known}")
    return "\n".join(lines)


def known_keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys a model accepts at ``loc`` (field names, aliases where given); [] where that is not one model."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):  # an item of a list: the list's item model
            args = [a for a in typing.get_args(current) if a is not type(None)]
            current = args[0] if len(args) == 1 else None
        else:
            fields = getattr(current, "model_fields", None)
            if not fields or part not in {f.alias or n for n, f in fields.items()}:
                return []
            current = next(f.annotation for n, f in fields.items() if (f.alias or n) == part)
        while typing.get_origin(current) in (typing.Union, types.UnionType):  # X | None -> X
            args = [a for a in typing.get_args(current) if a is not type(None)]
            current = args[0] if len(args) == 1 else None
    fields = getattr(current, "model_fields", None) if isinstance(current, type) else None
    return sorted(f.alias or n for n, f in fields.items()) if fields else []


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


# ----------------------------------------------------------------------------- the search path
def config_home() -> Path:
    """The user's config home: ``$XDG_CONFIG_HOME/hg-dagger``, else ``~/.config/hg-dagger`` (a relative
    XDG_CONFIG_HOME is ignored, as the XDG base directory spec says). It holds configs by area (``gates/``,
    ``run/``, ``tasks/``, ...), the app's settings (``app.yaml``) and device calibrations (``calibration/``)."""
    base = os.environ.get("XDG_CONFIG_HOME", "")
    root = Path(base) if base and Path(base).is_absolute() else Path.home() / ".config"
    return root / APP_NAME


def search_path() -> list[tuple[str, Path]]:
    """(label, folder) where config names are looked up, first wins: ./configs (of the current folder), the config
    home, the shipped configs. A folder met twice (a checkout's own configs/ is the shipped one) counts once, as
    the later."""
    try:
        here = [("./configs", Path.cwd() / "configs")]
    except FileNotFoundError:  # the current folder was removed under us: nothing to find there
        here = []
    roots = [*here, ("config home", config_home()), ("shipped", CONFIG_DIR)]
    out: list[tuple[str, Path]] = []
    seen: set[Path] = set()
    for label, root in reversed(roots):
        key = root.resolve()
        if key not in seen:
            seen.add(key)
            out.append((label, root))
    return out[::-1]


def areas() -> list[str]:
    """The config areas (the folders of the shipped configs: auto, devices, gates, qc, run, tasks, ...)."""
    return sorted(p.name for p in CONFIG_DIR.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def _file_name(area: str, name: str) -> str:
    name = str(name).removesuffix(".yaml")
    if not name or "/" in name or "\\" in name or name.startswith("."):
        raise ConfigError(f"{area}/{name}: a config name is a file name without .yaml (no folders), e.g. "
                          f"{area}/default")
    return f"{name}.yaml"


def candidates(area: str, name: str) -> list[tuple[str, Path]]:
    """Every file that ``area/name`` names on the search path, the one that wins first (the rest it shadows)."""
    file = _file_name(area, name)
    return [(label, root / area / file) for label, root in search_path() if (root / area / file).is_file()]


def find(area: str, name: str) -> Path | None:
    """The one lookup of a named config: the first ``<root>/<area>/<name>.yaml`` on the search path, or None."""
    found = candidates(area, name)
    return found[0][1] if found else None


def config_path(area: str, name: str) -> Path:
    """``find``'s file, else where the shipped one would be (a path that does not exist, for an ``is_file``
    check or an error naming it)."""
    return find(area, name) or CONFIG_DIR / area / _file_name(area, name)


def known_names(area: str) -> list[str]:
    """Names of the config files in <root>/<area>/ over the whole search path."""
    return sorted({p.stem for _, root in search_path() for p in (root / area).glob("*.yaml")})


def named_config(area: str, ref: str | Path, *, what: str | None = None) -> Path:
    """The file a config reference means: a path to a YAML file, or a bare name looked up on the search path. An
    unknown name is a ConfigError that lists the known ones (never a silent fallback to a default)."""
    path = Path(ref)
    if path.suffix or path.exists():
        return path
    found = find(area, str(ref))
    if found is None:
        where = ", ".join(str(root / area) for _, root in search_path())
        raise ConfigError(f"unknown {what or area} config {str(ref)!r} (known names: "
                          f"{', '.join(known_names(area)) or 'none'}, looked up in {where}; or give a path to a "
                          "YAML file)")
    return found


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a config file")
    if not path.is_file():
        hint = ""
        if any(path.parent.parent == root for _, root in search_path()):  # a name looked up in <root>/<area>/
            hint = f" (known names in {path.parent}: {', '.join(known_names(path.parent.name)) or 'none'})"
        raise ConfigError(f"{path}: no such config file{hint}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not a text file (byte {exc.start} is not UTF-8); a config is a YAML text "
                          "file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML: {_one_line(getattr(exc, 'problem', None) or exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}")
    return data


def validate(model: type[M], data: dict[str, Any], *, source: str) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(source, err, model)) from None


def load(path: str | Path, model: type[M]) -> M:
    """Load one YAML file into ``model``; the ``kind`` key, if present, must match."""
    data = read_yaml(path)
    data.pop("kind", None)
    return validate(model, data, source=str(path))


def model_for_kind(kind: str) -> type[BaseModel]:
    if kind not in KINDS:
        raise ConfigError(f"unknown config kind {kind!r}; known kinds: {', '.join(sorted(KINDS))}")
    module, _, name = KINDS[kind].partition(":")
    model: type[BaseModel] = getattr(importlib.import_module(module), name)  # KINDS names pydantic models
    return model


def check(path: str | Path) -> BaseModel:
    """Validate any config file by its ``kind`` key."""
    data = read_yaml(path)
    kind = data.pop("kind", None)
    if kind is None:
        raise ConfigError(f"{path}: missing key 'kind' (one of: {', '.join(sorted(KINDS))})")
    try:
        model = model_for_kind(str(kind))
    except ConfigError as exc:
        raise ConfigError(f"{path}: key kind: {exc}") from None
    return validate(model, data, source=str(path))
