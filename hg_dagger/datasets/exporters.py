"""Export formats: one record per format in ``EXPORTERS`` (kind "exporters"; other packages register through the
entry point group ``hg_dagger.exporters``), and ``export``, the one dispatch that both `hg-dagger export` and
`hg-dagger dataset export` (and Python callers) go through.

    EXPORTERS.register("csv", Exporter(write=write_csv, description="the training labels as CSV",
                                       training=Training.LABELS,
                                       options=(ExportOption("delimiter", "comma or tab", ("comma", "tab"), "comma"),)))
    export("csv", select(store), "out/csv", delimiter="tab")

``write(items, out, *, progress, **options)`` writes the episodes of ``items`` (ExportItem) into ``out`` and returns
an ExportSummary. ``source.read_episodes(items)`` gives it every episode with ``trainable``, the training boundary
per step, so a format never decides for itself which labels may train (docs/extending.md, "An export format").
An option becomes ``--<name>`` of both commands; given with another format it is refused by name.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from hg_dagger.errors import HgDaggerError
from hg_dagger.registry import Registry, RegistryError


class ExportError(HgDaggerError):
    """An export cannot be written (bad selection or option, output folder in the way, episodes that do not fit
    together, nothing training may use in a format that holds only training labels)."""


class Training(StrEnum):
    """What an export offers as training data. Every format says one of these (docs/datasets.md, "Exports")."""

    LABELS = "labels"  # only labels the training boundary allows; a selection without one is refused
    MASK = "mask"  # every step, with the training boundary per frame (`trainable`): train on those frames only
    NONE = "none"  # not training data: no per-frame training mask

    @property
    def note(self) -> str:
        return _NOTES[self]


_NOTES = {
    Training.LABELS: "only labels the training boundary allows (reviewed and authorized, or certified; QC passed; "
                     "replay not mismatched)",
    Training.MASK: "every step; train only on the frames whose `trainable` is true (the training boundary per frame)",
    Training.NONE: "not training data (no per-frame training mask)",
}

@dataclass
class ExportSummary:
    """What an export wrote."""

    out: str
    format: str
    episodes: int
    frames: int
    tasks: int = 0
    fps: float = 0.0
    files: int = 0
    trainable_frames: int = 0
    bytes: int = 0
    columns: list[str] = field(default_factory=list)
    training: str = ""  # what of it is training data: a Training value (set by exporters.export)

    def line(self) -> str:
        note = f"; {Training(self.training).note}" if self.training else ""
        return (f"{self.format} export: {self.episodes} episodes, {self.frames} frames ({self.trainable_frames} "
                f"trainable), {self.tasks} task(s), fps {self.fps:g}, {self.files} files, "
                f"{self.bytes / 1e6:.1f} MB -> {self.out}{note}")


# argument names of the commands themselves: an option of a format may not take one
RESERVED = frozenset({"format", "out", "task", "episodes", "json", "quiet", "usage", "root", "store", "ref", "help",
                      "verbose", "version", "progress", "items", "command", "dataset_command", "func"})
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class ExportOption:
    """One option of a format: ``--<name>`` (underscores as dashes) on both export commands, passed to its
    ``write`` as the keyword ``name``. Values are strings; ``choices`` restricts them, ``default`` is what the
    format gets when the option is not given."""

    name: str
    help: str
    choices: tuple[str, ...] | None = None
    default: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name) or self.name in RESERVED:
            raise RegistryError(f"export option name {self.name!r}: lower-case letters, digits and underscores, and "
                                f"none of {', '.join(sorted(RESERVED))}")
        if self.choices is not None and self.default is not None and self.default not in self.choices:
            raise RegistryError(f"export option {self.flag}: default {self.default!r} is not one of its choices")

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Exporter:
    """One export format. ``write``: the function, or ``"module:function"`` (imported on first use).
    ``training``: what its output offers as training data, a Training or a function of the resolved options
    (lerobot: ``--labels trainable`` writes labels only, ``--labels all`` every step with the mask).
    ``description``: one line for ``--help``."""

    write: Callable[..., ExportSummary] | str
    description: str
    training: Training | Callable[[Mapping[str, Any]], Training] = Training.NONE
    options: tuple[ExportOption, ...] = ()

    def __post_init__(self) -> None:
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise RegistryError(f"export options named twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
        if not callable(self.training):
            object.__setattr__(self, "training", Training(self.training))

    def writer(self) -> Callable[..., ExportSummary]:
        if callable(self.write):
            return self.write
        module, _, attr = str(self.write).partition(":")
        return getattr(importlib.import_module(module), attr)

    def training_for(self, options: Mapping[str, Any]) -> Training:
        return Training(self.training(options) if callable(self.training) else self.training)


EXPORTERS: Registry[Exporter] = Registry("exporters", "export format")
_plugin_failure: list[RegistryError] = []  # a plugin that failed to load: named when its format is asked for


def _load_plugins() -> None:
    """Load the plugins once; one that fails is remembered, not raised, so the commands still build their
    arguments (and every other command runs) and the failure is the line `--format <its name>` gets."""
    try:
        EXPORTERS.load_plugins()
    except RegistryError as exc:
        _plugin_failure.append(exc)


def format_names() -> list[str]:
    """Every export format, plugins included, sorted."""
    _load_plugins()
    return EXPORTERS.names()


def exporter(name: str) -> Exporter:
    """The record of format ``name``; an unknown one is one line listing the known ones (or naming the plugin
    that failed to load)."""
    _load_plugins()
    if name not in EXPORTERS and _plugin_failure:
        raise _plugin_failure[0]
    return EXPORTERS.get(name)


def option_table() -> dict[str, list[tuple[str, ExportOption]]]:
    """Option name -> [(format, its option)] over every format: what the commands add as arguments."""
    table: dict[str, list[tuple[str, ExportOption]]] = {}
    for fmt in format_names():
        for opt in EXPORTERS.get(fmt).options:
            table.setdefault(opt.name, []).append((fmt, opt))
    return table


def resolve_options(fmt: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The options ``write`` of ``fmt`` gets: those given (None = not given), else their defaults. An option
    of another format, or a value outside an option's choices, is one line naming the option."""
    ex = exporter(fmt)
    own = {o.name: o for o in ex.options}
    for name, value in given.items():
        if value is None:
            continue
        if name not in own:
            flag = "--" + str(name).replace("_", "-")
            others = [f for f, _ in option_table().get(name, [])]
            raise ExportError(f"{flag} is for --format {' or '.join(others)}" if others
                              else f"export format {fmt!r} has no option {flag}")
        opt = own[name]
        if opt.choices is not None and value not in opt.choices:
            raise ExportError(f"--format {fmt}: {opt.flag} must be one of {', '.join(opt.choices)}, not {value!r}")
    return {name: given[name] if given.get(name) is not None else o.default for name, o in own.items()}


def export(format: str, items, out, *, progress: bool = False, **options: Any) -> ExportSummary:
    """Export ``items`` (ExportItem, in that order) as ``format`` into ``out`` (a new or empty folder) with that
    format's ``options``; the summary says what it wrote and what of it is training data."""
    ex = exporter(format)
    opts = resolve_options(format, options)
    summary = ex.writer()(items, out, progress=progress, **opts)
    summary.training = ex.training_for(opts).value
    return summary


__all__ = ["EXPORTERS", "ExportError", "ExportOption", "Exporter", "RESERVED", "Training", "export", "exporter",
           "format_names", "option_table", "resolve_options", "ExportSummary"]
