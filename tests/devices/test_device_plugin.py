"""A third-party device type, installed as a real distribution: the package docs/extending.md ("A device") shows -
its module and pyproject.toml, its device file and script, taken from the page - is built and installed with
`pip install --no-deps --target`, put on PYTHONPATH, and used in a subprocess: the device file is parsed through
the entry point group hg_dagger.devices by the normal loader, the device polls the script's ticks through the
config's processing, the app's key map takes its words from the config, and a file of a type nobody registered
is one line naming the file, the type and the registered types."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import install_documented_plugin, section_blocks

pytestmark = [pytest.mark.subprocess]

HEADING = "A device"

POLL = """
import json
from hg_dagger.devices import DEVICE_TYPES, load_device_config, make_device
from hg_dagger.ui.keymap import axis_control, device_keys_line, handback_hint, takeover_hint

cfg = load_device_config("script")  # configs/devices/script.yaml of the working folder
dev = make_device(cfg)
dev.connect()
cmds = [dev.poll() for _ in range(5)]
print(json.dumps({
    "config": type(cfg).__name__, "origin": DEVICE_TYPES.origin("script"), "types": DEVICE_TYPES.names(),
    "device_id": dev.device_id,
    "ticks": [None if c is None else {"raw": c.raw.tolist(), "motion": c.motion.tolist(), "engaged": c.engaged,
                                      "buttons": sorted(c.buttons)} for c in cmds],
    "words": [axis_control("script", "x"), takeover_hint("script"), handback_hint("script"),
              device_keys_line("script")],
}))
"""


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The documented package installed into a site folder of its own; a working folder with its device file
    (configs/devices/script.yaml, found by name there) and its script."""
    base = tmp_path_factory.mktemp("device_plugin")
    site = install_documented_plugin(base, HEADING, "hgd_script")
    assert (next(site.glob("hgd_script-0.1.dist-info")) / "entry_points.txt").read_text().split() == [
        "[hg_dagger.devices]", "script", "=", "hgd_script:SCRIPT"]
    blocks = section_blocks("extending.md", HEADING)
    work = base / "work"
    (work / "configs" / "devices").mkdir(parents=True)
    (work / "configs" / "devices" / "script.yaml").write_text(blocks["yaml"])
    (work / "reach.txt").write_text(blocks["text"])
    return work, site


def _run(site: Path | None, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    paths = [str(site)] if site is not None else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_the_plugin_device_loads_from_its_file_and_polls_its_script(plugin):
    work, site = plugin
    r = _run(site, work, "-c", POLL)
    assert r.returncode == 0, r.stderr[-4000:]
    out = json.loads(r.stdout)
    assert out["config"] == "ScriptConfig" and out["origin"] == "hgd-script"
    assert out["types"] == ["gamepad", "keyboard", "script", "spacemouse", "synthetic"]
    assert out["device_id"] == "script:reach.txt"
    first, second, idle, back, over = out["ticks"]
    assert first["raw"] == [1, 0, 0, 0, 0, 0, 0] and first["buttons"] == ["takeover"] and first["engaged"]
    assert first["motion"] == [0.5, 0, 0, 0, 0, 0, 0]  # processing.scale of the device file
    assert second["raw"][:2] == [1, -0.5] and second["motion"][:2] == [0.5, -0.25] and second["buttons"] == []
    assert not idle["engaged"] and idle["motion"] == [0] * 7  # an empty line: hands off
    assert back["buttons"] == ["return"] and back["engaged"]
    assert over is None  # after the last line the device is gone
    assert out["words"] == ["x=... in reach.txt", "a line of reach.txt that moves", "", ""]


def test_the_cli_checks_and_monitors_the_plugin_device(plugin):
    work, site = plugin
    check = _run(site, work, "-m", "hg_dagger", "config", "check", "configs/devices/script.yaml")
    assert check.returncode == 0 and "configs/devices/script.yaml: ok" in check.stdout, check.stderr
    monitor = _run(site, work, "-m", "hg_dagger", "device", "monitor", "script", "--seconds", "1")
    assert "Traceback" not in monitor.stderr, monitor.stderr
    assert len([line for line in monitor.stdout.splitlines() if "motion" in line]) == 4
    assert monitor.returncode != 0 and "device lost after 4 commands" in monitor.stderr


def test_a_file_of_an_unregistered_type_is_one_line_naming_the_file_and_the_types(plugin):
    work, site = plugin
    r = _run(None, work, "-m", "hg_dagger", "config", "check", "configs/devices/script.yaml")  # no plugin here
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert "configs/devices/script.yaml" in lines[0] and "key type" in lines[0] and "'script'" in lines[0]
    assert "gamepad, keyboard, spacemouse, synthetic" in lines[0] and "hg_dagger.devices" in lines[0]

    typo = work / "typo.yaml"
    typo.write_text((work / "configs" / "devices" / "script.yaml").read_text().replace("type: script", "type: scrpt"))
    r = _run(site, work, "-m", "hg_dagger", "config", "check", str(typo))
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert str(typo) in lines[0] and "'scrpt'" in lines[0] and "script, spacemouse" in lines[0]  # the plugin's
