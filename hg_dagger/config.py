"""YAML config files loaded into pydantic v2 models, with errors that name the file and the key.

Every config file states its ``kind``; KINDS maps a kind to the model that validates it, so
``hg-dagger config check FILE`` works for any of them. Models live with the layer they configure.
"""

from __future__ import annotations

import importlib
import importlib.resources
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hg_dagger.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

# configs/ at the repository root installs as the package hg_dagger.configs (setup.py), editable or not.
CONFIG_DIR = Path(str(importlib.resources.files("hg_dagger.configs")))

# kind -> "module:Model". Add a line when a layer gains a config file kind.
KINDS: dict[str, str] = {
    "task": "hg_dagger.envs.mapping:TaskMapping",
    "gates": "hg_dagger.control.gate_specs:GateConfig",
    "run": "hg_dagger.control.session:RunConfig",
    "device": "hg_dagger.devices.configs:DeviceFile",
    "auto": "hg_dagger.learn.auto:AutoConfig",
    "qc": "hg_dagger.review.qc_config:QCConfig",
    "dataset": "hg_dagger.datasets.manifest:DatasetConfig",
}


def format_validation_error(source: str, err: ValidationError) -> str:
    """One line per invalid value, each naming the source and the dotted key (a single error is one line)."""
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {_short(got)})"
        msg = e["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's own message
        lines.append(f"{source}: key {key}: {msg}{shown}")
    return "\n".join(lines)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def known_names(area: str) -> list[str]:
    """Names of the config files shipped in configs/<area>/."""
    return sorted(p.stem for p in (CONFIG_DIR / area).glob("*.yaml"))


def named_config(area: str, ref: str | Path, *, what: str | None = None) -> Path:
    """The file a config reference means: a path to a YAML file, or a bare name in configs/<area>/. An unknown
    name is a ConfigError that lists the known ones (never a silent fallback to a default)."""
    path = Path(ref)
    if path.suffix or path.exists():
        return path
    shipped = CONFIG_DIR / area / f"{ref}.yaml"
    if not shipped.is_file():
        raise ConfigError(f"unknown {what or area} config {str(ref)!r} (known names in configs/{area}: "
                          f"{', '.join(known_names(area)) or 'none'}; or give a path to a YAML file)")
    return shipped


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a folder, not a config file")
    if not path.is_file():
        hint = ""
        if path.parent.parent == CONFIG_DIR:  # a name looked up in configs/<area>/
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
        raise ConfigError(format_validation_error(source, err)) from None


def load(path: str | Path, model: type[M]) -> M:
    """Load one YAML file into ``model``; the ``kind`` key, if present, must match."""
    data = read_yaml(path)
    data.pop("kind", None)
    return validate(model, data, source=str(path))


def model_for_kind(kind: str) -> type[BaseModel]:
    if kind not in KINDS:
        raise ConfigError(f"unknown config kind {kind!r}; known kinds: {', '.join(sorted(KINDS))}")
    module, _, name = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


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
