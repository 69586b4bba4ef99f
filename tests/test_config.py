"""YAML config loading: errors name the file and the key; `hg-dagger config check` uses a file's kind."""

import subprocess
import sys

import pytest
from pydantic import BaseModel, Field

from hg_dagger import config
from hg_dagger.errors import ConfigError


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
