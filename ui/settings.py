"""Reading the app's settings file (QSettings: ~/.config/hg-dagger/hg-dagger.conf, or the file a test gives) so
that a damaged, cut-short or hand-edited file never stops the app: a value of the wrong kind is one warning naming
the file and the key, and the default is used. QSettings itself raises TypeError for, say, ``port=abc`` read as
an int, and hands back strings where bytes were written.

Qt decodes ``@Variant(...)`` and ``@DateTime(...)`` values with QDataStream while it parses the file, before any
key is read, and garbage there can crash the process. So ``app_settings`` takes every such line out of the file
before Qt opens it. The one the app itself wrote (a one-entry list, which Qt keeps as ``@Variant``) is decoded here
and written back as plain text; any other is one warning, the original file kept beside it. Lists are saved with
``store_texts``, which never makes Qt write ``@Variant``."""

from __future__ import annotations

import logging
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from PyQt6.QtCore import QByteArray, QSettings, QStandardPaths

log = logging.getLogger("hg_dagger.ui.settings")

_TRUE, _FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
_warned: set[tuple[str, str]] = set()


_SERIALIZED = ("@Variant(", "@DateTime(")  # Qt matches them case-sensitively
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]+|[0-7]+|.)", re.DOTALL)
_NAMED = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_VARIANT_LIST, _STRING, _STRING_LIST = 9, 10, 11  # QMetaType ids, as QDataStream writes them


def default_path() -> Path:
    """Where ``QSettings("hg-dagger", "hg-dagger")`` keeps the file on Linux (honours XDG_CONFIG_HOME)."""
    base = QStandardPaths.writableLocation(QStandardPaths.StandardLocation.GenericConfigLocation)
    return Path(base) / "hg-dagger" / "hg-dagger.conf"


def app_settings(path: str | Path | None = None) -> QSettings:
    """The app's settings (``path``: a file of a test's own), opened only once no line in it holds a value Qt would
    decode with QDataStream."""
    file, rewritten = _take_out_serialized(Path(path) if path is not None else default_path())
    settings = QSettings(str(file), QSettings.Format.IniFormat)
    if rewritten:
        for key, values in rewritten.items():
            store_texts(settings, key, values)
        settings.sync()
    return settings


def store_texts(settings: QSettings, key: str, values: list[str]) -> None:
    """Saves a list of texts; a one-entry list as its text (Qt would write it as ``@Variant``), read back by
    ``texts``."""
    settings.setValue(key, values[0] if len(values) == 1 else list(values))


def _unescaped(value: str) -> str:
    """Qt's INI escapes (\\xHH..., \\ooo..., \\n and the like) resolved, as near as matters for finding tags."""
    def one(m: re.Match[str]) -> str:
        code = m[1]
        if code[0] == "x" and len(code) > 1:
            n = int(code[1:], 16)
        elif code[0] in "01234567":
            n = int(code, 8)
        else:
            return _NAMED.get(code, code)
        return chr(n) if n < 0x110000 else "\ufffd"
    return _ESCAPE.sub(one, value)


def _suspect(text: str) -> bool:
    """Whether Qt could find a serialized value in ``text``: looked for with escapes resolved, with and without
    line continuations joined."""
    joined = re.sub(r"\\[ \t]*(\r\n|\r|\n)", "", text)
    return any(tag in _unescaped(f) for f in (text, joined) for tag in _SERIALIZED)


def _own_list(value: str) -> list[str] | None:
    """The texts of a ``@Variant`` the app wrote (a QVariantList of QStrings or a QStringList), or None for
    anything else; every byte must be accounted for."""
    text = _unescaped(value.strip())
    if not (text.startswith("@Variant(") and text.endswith(")")):
        return None
    try:
        data = text[len("@Variant("):-1].encode("latin-1")
    except UnicodeEncodeError:
        return None
    pos = 0

    def take(n: int) -> bytes:
        nonlocal pos
        if pos + n > len(data):
            raise ValueError
        pos += n
        return data[pos - n:pos]

    def u32() -> int:
        return int.from_bytes(take(4), "big")

    def string() -> str:
        size = u32()
        if size == 0xFFFFFFFF or size % 2:
            raise ValueError
        return take(size).decode("utf-16-be")

    try:
        kind = u32()  # QSettings streams at Qt 4.0: no null flag after a type id
        if kind not in (_VARIANT_LIST, _STRING_LIST):
            return None
        out = []
        for _ in range(u32()):
            if kind == _VARIANT_LIST and u32() != _STRING:
                return None
            out.append(string())
            if len(out) > 1000:
                return None
    except (ValueError, UnicodeDecodeError):
        return None
    return out if pos == len(data) else None


def _take_out_serialized(file: Path) -> tuple[Path, dict[str, list[str]]]:
    """Removes every logical line (a trailing backslash continues one) whose value Qt would decode with QDataStream.
    Returns the file to open and the lists the app wrote that way, to be written back as plain values. Anything
    else taken out is one warning per key, the file as it was kept as ``<name>.damaged-<time>``. A file that cannot
    be read is left to QSettings; one that cannot be repaired in place is read from a repaired copy in the temp
    folder."""
    try:
        raw = file.read_bytes()
    except OSError:
        return file, {}
    text = raw.decode("utf-8", "surrogateescape")
    if not _suspect(text):
        return file, {}
    entries: list[tuple[str, list[str]]] = []  # (group/key or "", the logical line)
    dropped: list[str] = []
    rewritten: dict[str, list[str]] = {}
    group = "General"
    lines = re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z", text)  # Qt ends lines at \r or \n only
    i = 0
    while i < len(lines):
        logical = [lines[i]]
        while logical[-1].rstrip("\r\n").endswith("\\") and i + 1 < len(lines):
            i += 1
            logical.append(lines[i])
        i += 1
        head = logical[0].strip()
        if head.startswith("[") and "]" in head:
            group = head[1:head.index("]")] or "General"
        key, eq, value = "".join(logical).partition("=")
        name = (key.strip() if group.lower() == "general" else f"{group}/{key.strip()}") if eq else ""
        entries.append((name, logical))
        if eq and _suspect(value):
            own = _own_list(value)
            if own is None:
                dropped.append(name)
            else:
                rewritten[name] = own
    gone = set(dropped) | set(rewritten)  # every line of such a key, so its default (or its texts) really wins
    kept = [ln for name, logical in entries if not (name and name in gone) for ln in logical]
    if _suspect("".join(kept)):  # a tag outside any value Qt would read here: keep nothing rather than guess
        kept, rewritten = [], {}
        dropped.append("(every key)")
    repaired = "".join(kept).encode("utf-8", "surrogateescape")
    original = file
    backup = file.with_name(f"{file.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}") if dropped else None
    try:
        if backup is not None:
            backup.write_bytes(raw)
        file.write_bytes(repaired)
        kept_in = f"the file as it was is kept in {backup.name}" if backup is not None else ""
    except OSError as exc:
        file = Path(tempfile.mkdtemp(prefix="hg-dagger-settings-")) / file.name
        file.write_bytes(repaired)
        kept_in = f"the file could not be repaired in place ({exc}), so changes are kept in {file}"
    for key in dict.fromkeys(k for k in dropped if k not in rewritten):
        _warn(str(original), key, f"holds a Qt-serialized value the app never writes; using the default ({kept_in})")
    return file, rewritten


def _warn(file: str, key: str, line: str) -> None:
    if (file, key) not in _warned:  # once per file and key, however often the app reads it
        _warned.add((file, key))
        log.warning("settings %s: %s %s", file, key, line)


class _Unreadable:
    def __repr__(self) -> str:
        return "a value Qt could not hand over"


def _value(settings: QSettings, key: str) -> Any:
    """``settings.value(key)``; a value PyQt cannot convert (it raises TypeError) is returned as ``_Unreadable``."""
    try:
        return settings.value(key)
    except TypeError:
        return _Unreadable()


def _bad(settings: QSettings, key: str, raw: Any, what: str, default: Any) -> Any:
    shown = repr(raw)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    _warn(settings.fileName(), key, f"is {shown}, not {what}; using {default!r}")
    return default


def text(settings: QSettings, key: str, default: str = "") -> str:
    raw = _value(settings, key)
    if raw is None:
        return default
    return raw if isinstance(raw, str) else _bad(settings, key, raw, "text", default)


def number(settings: QSettings, key: str, default: int, lo: int, hi: int) -> int:
    """A whole number in [lo, hi]."""
    raw = _value(settings, key)
    if raw is None:
        return default
    value = None
    if isinstance(raw, int) and not isinstance(raw, bool):
        value = raw
    elif isinstance(raw, str):
        try:
            value = int(raw.strip())
        except ValueError:
            value = None
    if value is None or not lo <= value <= hi:
        return _bad(settings, key, raw, f"a whole number from {lo} to {hi}", default)
    return value


def flag(settings: QSettings, key: str, default: bool) -> bool:
    raw = _value(settings, key)
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in _TRUE + _FALSE:
        return raw.strip().lower() in _TRUE
    return _bad(settings, key, raw, "true or false", default)


def texts(settings: QSettings, key: str) -> list[str]:
    """A list of texts (QSettings hands back a one-element list as a plain string); empty entries dropped."""
    raw = _value(settings, key)
    if raw is None:
        return []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        return _bad(settings, key, raw, "a list of texts", [])
    return [x for x in raw if x]


def blob(settings: QSettings, key: str) -> QByteArray | None:
    """Bytes the app saved (a window geometry, a splitter state); None when missing or of another kind."""
    raw = _value(settings, key)
    if raw is None:
        return None
    if isinstance(raw, QByteArray | bytes):
        return QByteArray(raw)
    return _bad(settings, key, raw, "saved window bytes", None)


def restored(settings: QSettings, key: str, ok: bool) -> bool:
    """``ok``: whether Qt took the bytes read at ``key``; a refusal is one warning (the default layout is used)."""
    if not ok:
        _warn(settings.fileName(), key, "holds bytes that are not a saved layout; using the default layout")
    return ok
