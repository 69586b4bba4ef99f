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


# ------------------------------------------------------------------- the search path: ./configs, home, shipped
def _shipped(area: str, name: str) -> str:
    return (config.CONFIG_DIR / area / f"{name}.yaml").read_text()


def _own_gates(folder, name="mine", trigger=0.9):
    """A copy of toy_reach's gates with a name and a confidence trigger of its own."""
    path = folder / "gates" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(_shipped("gates", "toy_reach").replace("name: toy_reach_default", f"name: {name}")
                    .replace("trigger: 0.5", f"trigger: {trigger}"))
    return path


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A working folder of the test's own (for ./configs) and a config home of its own (XDG_CONFIG_HOME)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return work, tmp_path / "xdg" / "hg-dagger"


def test_a_config_in_dot_configs_shadows_the_shipped_one(home):
    from hg_dagger.control.engine import task_safety
    from hg_dagger.control.run_config import load_gate_config, load_run_config

    work, _ = home
    shipped = config.CONFIG_DIR / "gates" / "toy_reach.yaml"
    assert config.find("gates", "toy_reach") == shipped
    own = _own_gates(work / "configs", "toy_reach")
    assert config.find("gates", "toy_reach") == own and config.known_names("gates").count("toy_reach") == 1
    assert load_gate_config("", "toy_reach").name == "toy_reach"  # the task's default gates are the local ones
    run = work / "configs" / "run" / "toy_reach.yaml"
    run.parent.mkdir()
    run.write_text(_shipped("run", "toy_reach").replace("episodes: 8", "episodes: 3").replace("high: [1.0, 1.0]",
                                                                                            "high: [0.5, 0.5]"))
    assert load_run_config(None, "toy_reach").episodes == 3
    assert task_safety("toy_reach").limits.high == [0.5, 0.5]  # the safety monitor reads the same file
    assert [label for label, _ in config.candidates("gates", "toy_reach")] == ["./configs", "shipped"]


def test_the_config_home_comes_between_and_xdg_config_home_is_honoured(home):
    from hg_dagger.control.run_config import load_gate_config
    from hg_dagger.devices.configs import load_device_config
    from hg_dagger.envs.mapping import known_tasks, load_mapping

    work, xdg = home
    assert config.config_home() == xdg
    _own_gates(xdg, "mine", trigger=0.8)
    assert load_gate_config("mine", "toy_reach").name == "mine" and "mine" in config.known_names("gates")
    _own_gates(work / "configs", "mine", trigger=0.7)
    assert config.find("gates", "mine") == work / "configs" / "gates" / "mine.yaml"  # ./configs first
    pad = xdg / "devices" / "mypad.yaml"
    pad.parent.mkdir()
    pad.write_text(_shipped("devices", "gamepad").replace("name:", "name: mine #", 1))
    assert load_device_config("mypad").type == "gamepad"
    task = xdg / "tasks" / "my_reach.yaml"
    task.parent.mkdir()
    task.write_text(_shipped("tasks", "toy_reach").replace("task_id: toy_reach", "task_id: my_reach"))
    assert "my_reach" in known_tasks() and load_mapping("my_reach").task_id == "my_reach"
    task.write_text(_shipped("tasks", "toy_reach"))  # found by name, its task_id must be its file name
    with pytest.raises(ConfigError, match="task_id 'toy_reach' must equal the file name 'my_reach'"):
        load_mapping("my_reach")


def test_config_where_names_the_winner_and_what_it_shadows(home, capsys):
    from support.fuzz import run_cli

    work, xdg = home
    own = _own_gates(work / "configs", "toy_reach")
    mid = _own_gates(xdg, "toy_reach")
    ran = run_cli(capsys, "config", "where", "gates/toy_reach")
    assert ran.code == 0
    assert ran.out.splitlines() == [f"gates/toy_reach: {own}  (./configs)", f"  shadows {mid}  (config home)",
                                    f"  shadows {config.CONFIG_DIR / 'gates' / 'toy_reach.yaml'}  (shipped)"]
    assert run_cli(capsys, "config", "where", "gates/toy_reach.yaml").out == ran.out
    ran = run_cli(capsys, "config", "where")
    assert [ln.split("(")[-1] for ln in ran.out.splitlines()[1:]] == ["./configs)", "config home)", "shipped)"]
    line = run_cli(capsys, "config", "where", "gates/nope").refused()
    assert "gates/nope: no such config" in line and "toy_reach" in line and str(xdg / "gates") in line
    assert "AREA/NAME with AREA one of" in run_cli(capsys, "config", "where", "toy_reach").refused()
    assert "no folders" in run_cli(capsys, "config", "where", "gates/../run/x").refused()
    ran = run_cli(capsys, "config", "check", "gates/toy_reach")  # a name is checked where it is found
    assert ran.code == 0 and ran.out == f"{own}: ok (GateConfig)\n"


def test_an_unknown_key_names_the_keys_allowed_there(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("kind: run\ntask: toy_reach\nhandover: {wiat: pause}\n")
    with pytest.raises(ConfigError) as err:
        config.check(path)
    (line,) = str(err.value).splitlines()
    assert line.startswith(f"{path}: key handover.wiat: Extra inputs are not permitted (got 'pause'); known keys "
                           "here: ")
    assert "wait" in line.split("known keys here: ")[1]


# ------------------------------------------------------------------- run --config / --task FILE / --gates FILE
def _run(capsys, *args):
    from support.fuzz import run_cli

    return run_cli(capsys, "run", "--quiet", *args)


def test_run_takes_a_task_file_a_run_config_and_a_gate_file_of_the_users(home, capsys):
    from hg_dagger.store import EpisodeStore

    work, _ = home
    task = work / "short_reach.yaml"  # the shipped task with a horizon of its own (same id: its planner answers)
    task.write_text(_shipped("tasks", "toy_reach").replace("horizon: 100", "horizon: 30"))
    gates = _own_gates(work, "mine")
    ran = _run(capsys, "--task", task, "--gates", gates, "--store", work / "a.zarr", "--episodes", "2",
               "--num-envs", "1", "--operator", "synthetic", "--calibrate-steps", "0")
    assert ran.code == 0, ran.err
    infos = EpisodeStore.open(str(work / "a.zarr")).episodes()
    assert len(infos) == 2 and all(i.start.mapping["horizon"] == 30 and i.num_steps <= 30 for i in infos)
    assert all(i.start.gate_config.get("name") == "mine" for i in infos), infos[0].start.gate_config
    run = work / "myrun.yaml"  # a run config names its task: --task is not needed
    run.write_text(f"kind: run\ntask: {task}\nepisodes: 1\ngates: {gates}\noperator: {{type: synthetic}}\n")
    ran = _run(capsys, "--config", run, "--store", work / "b.zarr")
    assert ran.code == 0, ran.err
    (info,) = EpisodeStore.open(str(work / "b.zarr")).episodes()
    assert info.start.mapping["horizon"] == 30 and info.start.gate_config.get("name") == "mine"


@pytest.mark.parametrize("bad", ["task", "config", "gates", "gates_of_another_task", "missing_gates"])
def test_a_bad_file_of_the_users_is_one_line_and_no_store_is_made(home, capsys, bad):
    work, _ = home
    task = work / "t.yaml"
    task.write_text(_shipped("tasks", "toy_reach"))
    args = ["--task", str(task), "--store", str(work / "s.zarr"), "--episodes", "1"]
    if bad == "task":
        task.write_text(_shipped("tasks", "toy_reach").replace("backend: toy", "backend: toy\nbackend_opts: {}"))
        want = f"{task}: key backend_opts: Extra inputs are not permitted"
    elif bad == "config":
        (work / "r.yaml").write_text("kind: run\ntask: toy_reach\nhandover: {wait: sometimes}\n")
        args += ["--config", str(work / "r.yaml")]
        want = f"{work / 'r.yaml'}"
    elif bad == "gates":
        _own_gates(work).write_text(_shipped("gates", "toy_reach").replace("trigger: 0.5", "trigger: high"))
        args += ["--gates", str(work / "gates" / "mine.yaml")]
        want = f"{work / 'gates' / 'mine.yaml'}: key gates.0"
    elif bad == "gates_of_another_task":
        args += ["--gates", "fetch_pick_place"]
        want = "gate config is for task 'fetch_pick_place', the run is for 'toy_reach'"
    else:
        args += ["--gates", "no_such_gates"]
        want = "unknown gate config 'no_such_gates'"
    line = _run(capsys, *args).refused()
    assert want in line, line
    assert not (work / "s.zarr").exists()  # nothing half written


def test_run_needs_a_task_or_a_run_config(home, capsys):
    assert "run needs --task TASK" in _run(capsys, "--store", "s.zarr").refused()
