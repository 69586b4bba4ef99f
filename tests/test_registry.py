"""The registry every extension point shares: names, clear errors, plugins through entry points."""

import sys
from pathlib import Path

import pytest

from hg_dagger.registry import Registry, RegistryError


def test_an_unknown_name_is_one_line_that_lists_the_known_ones():
    reg: Registry[int] = Registry("test_kind_a", "widget")
    reg.register("one", 1)
    reg.register("two", 2)
    assert reg.get("two") == 2
    with pytest.raises(RegistryError) as err:
        reg.get("three")
    msg = str(err.value)
    assert "unknown widget 'three'" in msg and "one, two" in msg and "hg_dagger.test_kind_a" in msg
    assert "\n" not in msg


def test_a_name_registered_twice_is_refused_unless_replaced():
    reg: Registry[int] = Registry("test_kind_b", "widget")
    reg.register("one", 1)
    with pytest.raises(RegistryError, match="registered twice"):
        reg.register("one", 2, origin="someone_else")
    reg.register("one", 3, replace=True)
    assert reg.get("one") == 3


def _write_plugin(site: Path, group: str, name: str, value: str, module_src: str) -> None:
    """A real installed distribution (a dist-info folder with entry_points.txt) on sys.path."""
    (site / "demo_plugin_mod.py").write_text(module_src)
    info = site / "demo_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{group}]\n{name} = {value}\n")


def test_plugins_register_through_their_entry_point_group(tmp_path, monkeypatch):
    _write_plugin(tmp_path, "hg_dagger.test_kind_c", "shiny", "demo_plugin_mod:RECORD", "RECORD = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[int] = Registry("test_kind_c", "widget")
    reg.register("own", 1)
    assert reg.names() == ["own", "shiny"]
    assert reg.get("shiny") == 42
    assert reg.origin("shiny") == "demo-plugin"
    sys.modules.pop("demo_plugin_mod", None)


def test_a_plugin_that_fails_to_import_is_named(tmp_path, monkeypatch):
    _write_plugin(tmp_path, "hg_dagger.test_kind_d", "broken", "demo_plugin_mod:RECORD", "raise ImportError('no gizmo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg: Registry[int] = Registry("test_kind_d", "widget")
    with pytest.raises(RegistryError) as err:
        reg.get("broken")
    assert "'broken'" in str(err.value) and "demo-plugin" in str(err.value) and "no gizmo" in str(err.value)
    sys.modules.pop("demo_plugin_mod", None)
