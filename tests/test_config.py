"""YAML config loading: errors name the file and the key; `hg-dagger config check` uses a file's kind."""

import subprocess
import sys

import pytest
from pydantic import BaseModel, Field

from hg_dagger import config
from hg_dagger.errors import ConfigError

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]


class Inner(BaseModel):
    threshold: float = Field(gt=0)


class Outer(BaseModel):
    name: str
    inner: Inner


def test_a_wrong_value_names_file_and_dotted_key(tmp_path):
    path = tmp_path / "gate.yaml"
    path.write_text("name: g\ninner:\n  threshold: -1\n")
    with pytest.raises(ConfigError) as err:
        config.load(path, Outer)
    message = str(err.value)
    assert str(path) in message and "inner.threshold" in message and "greater than 0" in message


def test_broken_yaml_names_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: g\ninner: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+, column \d+"):
        config.read_yaml(path)


def test_missing_file_and_non_mapping_are_clear(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        config.read_yaml(tmp_path / "nope.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        config.read_yaml(tmp_path / "list.yaml")


def test_check_requires_a_known_kind(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: g\n")
    with pytest.raises(ConfigError, match="missing key 'kind'"):
        config.check(path)
    path.write_text("kind: nonsense\n")
    with pytest.raises(ConfigError, match="unknown config kind 'nonsense'; known kinds:"):
        config.check(path)


def test_every_shipped_config_file_is_valid():
    # configs/rlinf/ holds RLinf's own (Hydra) recipe files, not ours
    files = sorted(p for p in config.CONFIG_DIR.rglob("*.yaml") if "rlinf" not in p.parts)
    assert files, "configs/ ships config files"
    for path in files:
        config.check(path)


def test_cli_reports_an_invalid_file_without_a_traceback(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("kind: nonsense\n")
    proc = subprocess.run([sys.executable, "-m", "hg_dagger", "config", "check", str(path)],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    assert "unknown config kind 'nonsense'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_binary_file_a_folder_and_control_characters_are_one_line_naming_the_file(tmp_path):
    binary = tmp_path / "gates.yaml"
    binary.write_bytes(b"kind: gates\n\x89PNG\r\n\x1a\n\xff\xfe\x00")
    with pytest.raises(ConfigError, match=f"{binary}: not a text file") as err:
        config.check(binary)
    assert "\n" not in str(err.value)
    control = tmp_path / "ctl.yaml"
    control.write_bytes(b"kind: gates\nname: \x00\x01\n")
    with pytest.raises(ConfigError, match=f"{control}: not valid YAML") as err:
        config.check(control)
    assert "\n" not in str(err.value)
    (tmp_path / "dir.yaml").mkdir()
    with pytest.raises(ConfigError, match="dir.yaml: is a folder, not a config file"):
        config.check(tmp_path / "dir.yaml")


def test_each_invalid_value_is_one_line_with_the_file_and_its_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("kind: run\ntask: toy_reach\nepisodes: many\nhandover: {wait: sometimes}\nbogus: 1\n")
    with pytest.raises(ConfigError) as err:
        config.check(path)
    lines = str(err.value).splitlines()
    assert len(lines) == 3 and all(line.startswith(f"{path}: key ") for line in lines)
    assert {"episodes", "handover.wait", "bogus"} == {line.split(": key ")[1].split(":")[0] for line in lines}
    path.write_text("kind: nonsense\n")
    with pytest.raises(ConfigError, match=f"{path}: key kind: unknown config kind 'nonsense'"):
        config.check(path)


def test_an_unknown_gate_config_name_is_an_error_listing_the_known_ones(tmp_path):
    from hg_dagger.control.gate_specs import GateConfig
    from hg_dagger.control.run_config import load_gate_config, load_run_config

    known = config.known_names("gates")
    assert "default" in known
    with pytest.raises(ConfigError, match="unknown gate config 'no_such_gates'") as err:
        load_gate_config("no_such_gates", "toy_reach")
    assert all(name in str(err.value) for name in known)
    with pytest.raises(ConfigError, match=r"key gates: unknown gate config 'no_such_gates'"):
        load_run_config(None, "toy_reach", gates="no_such_gates")
    # the implicit default stays: the task's own gates, else default.yaml; names and paths that exist load
    assert load_gate_config("", "toy_reach") == config.load(config.CONFIG_DIR / "gates" / "toy_reach.yaml", GateConfig)
    assert load_gate_config("", "fetch_push") == config.load(config.CONFIG_DIR / "gates" / "default.yaml", GateConfig)
    assert load_gate_config("default", "toy_reach").name == load_gate_config("", "fetch_push").name
    own = tmp_path / "mine.yaml"
    own.write_text((config.CONFIG_DIR / "gates" / "default.yaml").read_text())
    assert load_run_config(None, "toy_reach", gates=str(own)).gates == str(own)
    with pytest.raises(ConfigError, match="no such config file"):
        load_gate_config(str(tmp_path / "missing.yaml"), "toy_reach")


def test_a_missing_shipped_config_lists_the_names_there():
    with pytest.raises(ConfigError, match=r"nope.yaml: no such config file \(known names in .*gamepad"):
        config.read_yaml(config.CONFIG_DIR / "devices" / "nope.yaml")
