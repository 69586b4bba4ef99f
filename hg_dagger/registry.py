"""Registries: the one shape of the extension points (backends, devices, experts, exporters, gate types, policies).

A registry maps a name to a small record. Our own modules register theirs when the registry's home package is
imported; other packages register through an entry point group (``hg_dagger.<kind>``), whose entries are loaded
once, on the first lookup, so a plugin costs nothing until something asks for a name.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from hg_dagger.errors import ConfigError

T = TypeVar("T")

ENTRY_POINT_PREFIX = "hg_dagger."


class RegistryError(ConfigError):
    """A name is unknown or registered twice, or a plugin's entry point fails to load."""


class Registry(Generic[T]):
    """Name -> record for one kind of extension. ``what`` names the kind in errors ("backend", "export format")."""

    def __init__(self, kind: str, what: str):
        self.kind = kind
        self.what = what
        self.group = ENTRY_POINT_PREFIX + kind
        self._items: dict[str, T] = {}
        self._origin: dict[str, str] = {}
        self._plugins_loaded = False

    def register(self, name: str, item: T, *, origin: str = "hg_dagger", replace: bool = False) -> T:
        """Add ``item`` under ``name``; a second registration of a name is an error unless ``replace``."""
        if not name or not isinstance(name, str):
            raise RegistryError(f"{self.what} names are non-empty strings, got {name!r}")
        if name in self._items and not replace and self._items[name] is not item:
            raise RegistryError(f"{self.what} {name!r} is registered twice ({self._origin[name]} and {origin})")
        self._items[name] = item
        self._origin[name] = origin
        return item

    def get(self, name: str) -> T:
        """The record of ``name``; an unknown name is one line that lists the known ones."""
        if name not in self._items:
            self.load_plugins()
        try:
            return self._items[name]
        except KeyError:
            known = ", ".join(sorted(self._items)) or "none"
            raise RegistryError(f"unknown {self.what} {name!r} (known: {known}; plugins register through the "
                                f"entry point group {self.group!r})") from None

    def origin(self, name: str) -> str:
        """Who registered ``name``: ``hg_dagger`` or the plugin's distribution."""
        self.get(name)
        return self._origin[name]

    def names(self) -> list[str]:
        """Every registered name, plugins included, sorted."""
        self.load_plugins()
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        if name not in self._items:
            self.load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def load_plugins(self) -> None:
        """Load every entry point of this registry's group once: each names a record, registered under the entry
        point's name; one that fails to import is one line naming the plugin."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group=self.group):
            dist = getattr(ep.dist, "name", None) or ep.value
            try:
                obj = ep.load()
            except Exception as exc:  # a broken plugin must not take the rest down, but it must be named
                raise RegistryError(f"{self.what} plugin {ep.name!r} ({dist}, entry point {ep.value}) failed to "
                                    f"load: {type(exc).__name__}: {exc}") from exc
            if ep.name not in self._items:
                self.register(ep.name, obj, origin=dist)


__all__ = ["ENTRY_POINT_PREFIX", "Registry", "RegistryError"]
