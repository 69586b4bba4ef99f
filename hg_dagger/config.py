"""YAML config files loaded into pydantic v2 models, with errors that name the file and the key.

Every config file states its ``kind``; KINDS maps a kind to the model that validates it, so
``hg-dagger config check FILE`` works for any of them. Models live with the layer they configure.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hg_dagger.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"

# kind -> "module:Model". Add a line when a layer gains a config file kind.
KINDS: dict[str, str] = {
    "task": "hg_dagger.envs.mapping:TaskMapping",
    "gates": "hg_dagger.control.gates:GateConfig",
    "run": "hg_dagger.control.session:RunConfig",
    "device": "hg_dagger.devices.configs:DeviceFile",
    "auto": "hg_dagger.learn.auto:AutoConfig",
    "qc": "hg_dagger.review.qc:QCConfig",
}


def format_validation_error(source: str, err: ValidationError) -> str:
    lines = [f"{source}: {err.error_count()} invalid value(s)"]
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        got = e.get("input")
        shown = "" if isinstance(got, dict | list) else f" (got {got!r})"
        lines.append(f"  {key}: {e['msg']}{shown}")
    return "\n".join(lines)


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{path}:{where} not valid YAML: {getattr(exc, 'problem', exc)}") from None
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
    return validate(model_for_kind(str(kind)), data, source=str(path))
