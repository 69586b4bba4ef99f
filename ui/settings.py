"""The app's settings: one pydantic model (``AppSettings``) in one YAML file in the config home,
``~/.config/hg-dagger/app.yaml`` ($XDG_CONFIG_HOME honoured; ``SettingsFile(path)`` for a file of a test's own).

What is remembered: the start dialog's pseudonym, task, backend, bridge host, port and token file, and the recent
stores; the sound switch; the window's geometry and splitter positions (Qt's own bytes, as base64 text).

A damaged or hand-edited file never stops the app. Each value it cannot use is one warning naming the file, the key
and what is allowed there, and that key's default is used; the rest of the file still counts. The bad file is not
overwritten silently: before the app first saves over it, the file as it was is kept beside it as
``app.yaml.damaged-<time>`` and a warning says so. Saves are atomic (a temporary file, then a rename): a crash never
leaves half a file.

Before this file existed the app kept its settings with QSettings in ``hg-dagger.conf`` in the same folder. When
``app.yaml`` does not exist yet, that file is read once (its plain values, parsed here without Qt, so none of Qt's
serialized values is ever decoded) and ``app.yaml`` is written from it; the old file is left as it was. Window
layouts are not carried over (the window opens once with the default layout).
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import tempfile
import time
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hg_dagger.config import config_home, known_keys_at
from hg_dagger.contract.model import StrictModel

log = logging.getLogger("hg_dagger.ui.settings")

FILE_NAME = "app.yaml"
OLD_FILE_NAME = "hg-dagger.conf"  # QSettings' INI file of earlier versions, in the same folder
RECENT_STORES = 8
_warned: set[tuple[str, str]] = set()


class _Section(StrictModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class StartSettings(_Section):
    """What the start dialog remembers."""

    operator: str = Field(default="", description="the operator pseudonym last used")
    task: str = Field(default="", description="the task last started (an id, or a task file)")
    backend: Literal["embedded", "bridge"] = "embedded"
    host: str = "127.0.0.1"
    port: int = Field(default=7557, ge=1, le=65535)
    token_file: str = ""
    policy: str = Field(default="", description="the policy last started: a checkpoint, ws://HOST:PORT or "
                        "lerobot:DIR (empty: the app's own newest student)")
    recent_stores: list[str] = Field(default_factory=list, max_length=RECENT_STORES,
                                     description="stores recorded into, newest first")


class UiSettings(_Section):
    sound: bool = Field(default=True, description="beep once when a gate asks")


class WindowSettings(_Section):
    """The console's layout: Qt's saveGeometry / saveState bytes as base64 text ("" = the default layout)."""

    geometry: str = ""
    split_main: str = ""
    split_view: str = ""
    plots_splitter: str = ""
    split_fleet: str = ""  # the fleet console's robots and queue against the robot on screen (app --robots N)


class AppSettings(_Section):
    """The app's settings file (app.yaml in the config home)."""

    start: StartSettings = Field(default_factory=StartSettings)
    ui: UiSettings = Field(default_factory=UiSettings)
    window: WindowSettings = Field(default_factory=WindowSettings)


def default_path() -> Path:
    """~/.config/hg-dagger/app.yaml (the config home honours XDG_CONFIG_HOME)."""
    return config_home() / FILE_NAME


def _warn(file: Path | str, key: str, line: str) -> None:
    """One warning per file and key, however often the app reads it: ``settings FILE: key KEY: ...``."""
    if (str(file), key) not in _warned:
        _warned.add((str(file), key))
        log.warning("settings %s: %s", file, line)


class SettingsFile:
    """The settings model bound to its file. ``data`` is the model (read it, assign to it); ``save()`` writes it."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path is not None else default_path()
        self.old_path = self.path.with_name(OLD_FILE_NAME)
        self._raw: bytes | None = None  # the file as read
        self._damaged = False  # it held something the app could not use: kept beside before the first save
        self.data = self._read()

    def problem(self, key: str, line: str) -> None:
        """A value of the file the app cannot use: one warning (file, key, what happens), and the file as it was
        is kept beside it before the app next saves."""
        _warn(self.path, key, line)
        self._damaged = self._raw is not None

    # ---- reading -----------------------------------------------------------------------------------
    def _read(self) -> AppSettings:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self._read_old()
        except OSError as exc:
            _warn(self.path, "<file>", f"cannot be read ({exc.strerror or exc}); using the defaults")
            return AppSettings()
        self._raw = raw
        data = self._parse(raw)
        if data is None:
            return AppSettings()
        settings, _ = salvage(data, self.path, self.problem)
        return settings

    def _parse(self, raw: bytes) -> dict[str, Any] | None:
        """The file's mapping, or None (one warning naming the file) when it is not one."""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.problem("<file>", f"is not a text file (byte {exc.start} is not UTF-8); using the defaults")
            return None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
            self.problem("<file>", f"is not valid YAML{where}: {problem}; using the defaults")
            return None
        if data is None:
            return {}
        if not isinstance(data, dict):
            self.problem("<file>", f"expected a mapping of keys (start, ui, window) at the top level, got "
                         f"{type(data).__name__}; using the defaults")
            return None
        return data

    def _read_old(self) -> AppSettings:
        """No app.yaml yet: the old QSettings file's values, read once and saved as app.yaml."""
        try:
            text = self.old_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return AppSettings()
        self.data, _ = salvage(old_values(text), self.old_path, lambda key, line: _warn(self.old_path, key, line))
        if self.save():
            log.info("settings: read %s once (the settings of an earlier version); from now on %s", self.old_path,
                     self.path)
        return self.data

    # ---- writing -----------------------------------------------------------------------------------
    def save(self) -> bool:
        """Write the settings (atomically). The first save over a damaged file keeps that file beside it first;
        a save that cannot be written is one warning (the app goes on with what it has in memory)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self._damaged and self._raw is not None:
                kept = _unused(self.path.with_name(f"{self.path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}"))
                _atomic_write(kept, self._raw)
                log.warning("settings %s: the file held values the app could not use; it is kept as %s, and the "
                            "settings are saved with their defaults in their place", self.path, kept.name)
                self._damaged = False
            body = yaml.safe_dump(self.data.model_dump(mode="json"), sort_keys=False, allow_unicode=True)
            new = (HEADER + body).encode("utf-8")
            _atomic_write(self.path, new)
            self._raw = new
        except OSError as exc:
            _warn(self.path, "<save>", f"cannot be written ({exc.strerror or exc}); settings are kept until the "
                  "app closes")
            return False
        return True


HEADER = ("# hg-dagger app settings, written by the app (docs/configuration.md). Hand edits are fine: a value the "
          "app cannot use\n# is one warning and its default, and this file is kept as app.yaml.damaged-<time> "
          "before the app saves over it.\n")


def _unused(path: Path) -> Path:
    """``path``, or ``path-2``, ``path-3``, ... when that is taken (two keeps in one second)."""
    n = 1
    found = path
    while found.exists():
        n += 1
        found = path.with_name(f"{path.name}-{n}")
    return found


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def salvage(data: dict[Any, Any], source: Path,
            warn: Callable[[str, str], None]) -> tuple[AppSettings, list[str]]:
    """The settings in ``data``; every value the model refuses is one ``warn(key, line)`` (the line names the key
    and what is allowed) and its key is left to its default. Returns the model and the lines."""
    data = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    lines: list[str] = []
    for _ in range(64):  # each round drops at least one key
        try:
            return AppSettings.model_validate(data), lines
        except ValidationError as err:
            for e in err.errors():
                key = _drop(data, e["loc"])
                line = f"key {'.'.join(map(_shown, e['loc']))}: {_problem(e)}"
                default = _default_of(key)
                line += f"; using {default!r}" if default is not None else "; ignored"
                lines.append(line)
                warn(key, line)
    return AppSettings(), lines


def _problem(e: Any) -> str:
    """What pydantic says is wrong (it names the allowed values), with the keys allowed beside an unknown one."""
    msg = str(e["msg"]).removeprefix("Value error, ")
    if e["type"] == "extra_forbidden":
        keys = known_keys_at(AppSettings, tuple(e["loc"][:-1]))
        msg = f"unknown key (known keys here: {', '.join(keys)})" if keys else "unknown key"
    got = e.get("input")
    if e["type"] != "extra_forbidden" and not isinstance(got, dict | list):
        text = repr(got)
        msg += f" (got {text if len(text) <= 60 else text[:57] + '...'})"
    allowed = _allowed(tuple(e["loc"]))
    return f"{msg}; allowed: {allowed}" if allowed else msg


def _allowed(loc: tuple[Any, ...]) -> str:
    """What a settings key takes, in words ("" for a key the model does not have, or a Literal pydantic names)."""
    if len(loc) < 2 or loc[0] not in AppSettings.model_fields:
        return ""
    section = AppSettings.model_fields[loc[0]].annotation
    field = getattr(section, "model_fields", {}).get(loc[1])
    if field is None:
        return ""
    kind = field.annotation
    if kind is bool:
        return "true or false"
    if kind is int:
        lo = next((m.ge for m in field.metadata if getattr(m, "ge", None) is not None), None)
        hi = next((m.le for m in field.metadata if getattr(m, "le", None) is not None), None)
        return f"a whole number from {lo} to {hi}" if lo is not None and hi is not None else "a whole number"
    if kind is str:
        return "text"
    if typing.get_origin(kind) is list:
        return f"a list of texts (at most {RECENT_STORES})"
    return ""


def _shown(part: Any) -> str:
    """A key as a warning shows it: as written when it is a plain word, else quoted (one line, visible)."""
    text = str(part)
    return text if text.isprintable() and text.strip() == text and text and "." not in text else repr(text)


def _drop(data: dict[Any, Any], loc: tuple[Any, ...]) -> str:
    """Remove the key an error is about (a section's key; a whole list for one bad item); returns it dotted."""
    keys = list(loc[:2])
    section = data.get(keys[0]) if len(keys) == 2 else None
    if isinstance(section, dict):
        section.pop(keys[1], None)
    else:
        keys = keys[:1]
        data.pop(keys[0], None)
    return ".".join(map(_shown, keys))


def _default_of(key: str) -> Any:
    """The default of a dotted key (None for a key the model does not have)."""
    value: Any = AppSettings()
    for part in key.split("."):
        if not isinstance(value, BaseModel) or part not in type(value).model_fields:
            return None
        value = getattr(value, part)
    return value.model_dump() if hasattr(value, "model_dump") else value


# ---- the old QSettings file, read without Qt ----------------------------------------------------------------
_OLD_KEYS = {"start/operator": "text", "start/task": "text", "start/backend": "text", "start/host": "text",
             "start/port": "text", "start/token_file": "text", "start/recent_stores": "list", "ui/sound": "text"}
_NAMED = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}


def old_values(text: str) -> dict[str, Any]:
    """The values an earlier version kept in QSettings' INI file, as AppSettings data: the start dialog's and the
    sound switch. A value Qt serialized (``@Variant(...)``, ``@ByteArray(...)``: layouts, an old one-entry list)
    is skipped, never decoded."""
    group = ""
    out: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
            continue
        key, eq, value = line.partition("=")
        if not eq or line.startswith((";", "#")):
            continue
        name = f"{group}/{key.strip()}" if group.lower() != "general" else key.strip()
        if name not in _OLD_KEYS or value.strip().startswith("@"):
            continue
        items = _qt_items(value)
        section, field = name.split("/")
        if _OLD_KEYS[name] == "list":
            got: Any = [x for x in items if x][:RECENT_STORES]
        else:
            got = ", ".join(items)  # a text with a comma Qt did not quote reads back as a list
        out.setdefault(section, {})[field] = got
    return out


def _qt_items(value: str) -> list[str]:
    """Qt's INI value syntax: quoted parts, backslash escapes, and unquoted commas between list items."""
    items: list[str] = []
    buf: list[str] = []
    quoted = False
    i, n = 0, len(value)
    while i < n:
        c = value[i]
        if c == "\\" and i + 1 < n:
            nxt = value[i + 1]
            j = i + 2
            if nxt == "x":
                while j < n and value[j] in "0123456789abcdefABCDEF":
                    j += 1
                code = int(value[i + 2:j] or "0", 16)
            elif nxt in "01234567":
                while j < n and value[j] in "01234567":
                    j += 1
                code = int(value[i + 1:j], 8)
            else:
                buf.append(_NAMED.get(nxt, nxt))
                i = j
                continue
            buf.append(chr(code) if code < 0x110000 else "\ufffd")
            i = j
        elif c == '"':
            quoted = not quoted
            i += 1
        elif c == "," and not quoted:
            items.append("".join(buf).strip())
            buf = []
            i += 1
        else:
            buf.append(c)
            i += 1
    items.append("".join(buf).strip())
    return items


# ---- layouts ----------------------------------------------------------------------------------------------
def layout_bytes(settings: SettingsFile, key: str) -> bytes | None:
    """The saved bytes of a window layout key (geometry, split_main, ...); None when there are none or they are
    not base64 (one warning)."""
    text = getattr(settings.data.window, key)
    if not text:
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        settings.problem(f"window.{key}", f"key window.{key}: not base64 text of a saved layout; using the default "
                         "layout")
        return None


def store_layout(settings: SettingsFile, key: str, raw: bytes) -> None:
    setattr(settings.data.window, key, base64.b64encode(bytes(raw)).decode("ascii"))


def restored(settings: SettingsFile, key: str, ok: bool) -> bool:
    """``ok``: whether Qt took the bytes read at ``key``; a refusal is one warning (the default layout is used)."""
    if not ok:
        settings.problem(f"window.{key}", f"key window.{key}: holds bytes that are not a saved layout; using the "
                         "default layout")
    return ok


def remember_store(settings: SettingsFile, store: str) -> None:
    """Put ``store`` first in the recent stores (at most RECENT_STORES)."""
    recent = [store] + [x for x in settings.data.start.recent_stores if x != store]
    settings.data.start.recent_stores = recent[:RECENT_STORES]
