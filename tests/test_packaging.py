"""ui/ and devices/ install as hg_dagger.ui and hg_dagger.devices, in editable and regular installs."""

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from support.docs import section_blocks

import hg_dagger
from hg_dagger.envs.mapping import TASKS_DIR

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

REPO = Path(__file__).resolve().parent.parent


def _import_locations(python_path: str | None = None) -> dict[str, str]:
    code = "import json, hg_dagger, hg_dagger.ui, hg_dagger.devices, hg_dagger.contract; print(json.dumps({m: __import__(m, fromlist=['x']).__file__ for m in ['hg_dagger', 'hg_dagger.ui', 'hg_dagger.devices']}))"
    env = {"PYTHONPATH": python_path} if python_path else {}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**_base_env(), **env}, cwd="/")
    import json

    return json.loads(out.stdout.strip().splitlines()[-1])


def _base_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_editable_install_maps_ui_and_devices_into_the_package():
    locations = _import_locations()
    assert Path(locations["hg_dagger.ui"]) == REPO / "ui" / "__init__.py"
    assert Path(locations["hg_dagger.devices"]) == REPO / "devices" / "__init__.py"
    assert Path(hg_dagger.__file__).parent == REPO / "hg_dagger"


def test_regular_install_imports_ui_and_devices_and_adds_no_generic_top_level(tmp_path):
    wheel_dir, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheel_dir), str(REPO)], check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("hg_dagger-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top_level == {"hg_dagger"}
    assert "hg_dagger/ui/__init__.py" in names and "hg_dagger/devices/__init__.py" in names
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True)
    locations = _import_locations(str(target))
    for module in ("hg_dagger", "hg_dagger.ui", "hg_dagger.devices"):
        assert Path(locations[module]).is_relative_to(target), (module, locations[module])


# ------------------------------------------------------------------ a regular install runs (wheel and sdist)


def _fresh_venv(root: Path) -> Path:
    """A new venv without pip whose own site-packages comes first; the dev venv's site-packages is appended
    (a .pth path line) so the heavy dependencies (torch, MuJoCo, Qt) need not be installed again. Path lines of a
    .pth are only added to sys.path: the dev venv's editable-install hook is not run, so hg_dagger can only come
    from what is installed into the new venv."""
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    (site,) = (root / "lib").glob("python3*/site-packages")
    (site / "_dev_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return root


def _install_and_run(venv: Path, artifact: Path, tmp: Path, *, plugins: bool = False) -> None:
    python = venv / "bin" / "python"
    env = {**_base_env(), "PYTHONNOUSERSITE": "1", "XDG_CONFIG_HOME": str(tmp / "xdg")}
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-build-isolation",
                           str(artifact)], capture_output=True, text=True, env=env, cwd=tmp)
    assert done.returncode == 0, done.stderr[-2000:]
    where = subprocess.run([str(python), "-c", "import hg_dagger, hg_dagger.learn, hg_dagger.config as c; "
                            "print(hg_dagger.__file__); print(c.CONFIG_DIR)"],
                           capture_output=True, text=True, env=env, cwd=tmp, check=True).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where
    cli = str(venv / "bin" / "hg-dagger")

    def run(*args: str) -> str:
        out = subprocess.run([cli, *args], capture_output=True, text=True, env=env, cwd=tmp, timeout=240)
        assert out.returncode == 0, (args, out.stdout[-1500:], out.stderr[-1500:])
        return out.stdout

    assert run("--version").strip() == f"hg-dagger {hg_dagger.__version__}"
    assert "toy_reach" in run("tasks") and "fetch_pick_place" in run("tasks")
    assert "check-env toy_reach: passed" in run("check-env", "toy_reach")
    store = tmp / "store.zarr"
    printed = run("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "2", "--store", str(store),
                  "--quiet")
    assert "2 episodes" in printed, printed
    assert "2 episodes (0 incomplete), 0 violation(s)" in run("validate", str(store))
    # the user's configs are found by the search path from the install: ./configs, then the config home (env's
    # XDG_CONFIG_HOME), then the configs in the venv (docs/configuration.md)
    shipped = (REPO / "configs" / "gates" / "toy_reach.yaml").read_text()
    for root in (tmp / "configs", Path(env["XDG_CONFIG_HOME"]) / "hg-dagger"):
        (root / "gates").mkdir(parents=True, exist_ok=True)
        (root / "gates" / "toy_reach.yaml").write_text(shipped.replace("name: toy_reach_default", "name: mine"))
    lines = run("config", "where", "gates/toy_reach").splitlines()
    assert [ln.split("(")[-1] for ln in lines] == ["./configs)", "config home)", "shipped)"], lines
    assert Path(lines[-1].split()[1]).is_relative_to(venv), lines
    run("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "1", "--store", str(tmp / "mine.zarr"),
        "--quiet")
    from hg_dagger.store import EpisodeStore

    (info,) = EpisodeStore.open(str(tmp / "mine.zarr")).episodes()
    assert info.start.gate_config.get("name") == "mine"  # the task's gates: the file in ./configs
    if plugins:
        _plugins_and_a_gymnasium_env(python, run, tmp, env)


def _plugins_and_a_gymnasium_env(python: Path, run, tmp: Path, env: dict[str, str]) -> None:
    """What a user brings, on the installed hg-dagger: a Gymnasium env named in their own task file, and the
    documented plugin packages (a backend with its planner, an export format) pip-installed beside it, found
    through their entry points by `run` and `export`."""
    pusher = yaml.safe_load((TASKS_DIR / "gym_pusher.yaml").read_text())
    pusher.update(task_id="my_pusher")
    (tmp / "my_pusher.yaml").write_text(yaml.safe_dump(pusher, sort_keys=False))
    assert "check-env my_pusher: passed" in run("check-env", str(tmp / "my_pusher.yaml"))
    for heading, module in (("A new simulator backend", "hgd_point"), ("An export format", "hgd_csv")):
        blocks = section_blocks("extending.md", heading)
        pkg = tmp / f"pkg-{module}"
        pkg.mkdir()
        (pkg / f"{module}.py").write_text(blocks["python"])
        (pkg / "pyproject.toml").write_text(blocks["toml"])
        done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                               "--no-build-isolation", str(pkg)], capture_output=True, text=True, env=env, cwd=tmp)
        assert done.returncode == 0, done.stderr[-2000:]
    task = tmp / "point.yaml"
    task.write_text(section_blocks("extending.md", "A new simulator backend")["yaml"])
    store = tmp / "point.zarr"
    assert "2 correction windows" in run("run", "--task", str(task), "--store", str(store), "--episodes", "2",
                                         "--seed", "0", "--quiet")
    run("qc", str(store))
    for window in json.loads(run("review", "list", str(store), "--json", "--quiet")):
        run("review", "approve", str(store), window["window_id"], "--reviewer", "reviewer-b", "--authorize")
    run("export", str(store), "--format", "csv", "--out", str(tmp / "labels"))
    assert len((tmp / "labels" / "labels.csv").read_text().splitlines()) > 1  # a header and the approved labels


def test_wheel_and_sdist_install_into_a_clean_venv_and_run(tmp_path):
    dist = tmp_path / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(REPO)],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,), (sdist,) = dist.glob("hg_dagger-*.whl"), dist.glob("hg_dagger-*.tar.gz")
    names = zipfile.ZipFile(wheel).namelist()
    assert "hg_dagger/learn/__init__.py" in names
    assert "hg_dagger/configs/tasks/toy_reach.yaml" in names and "hg_dagger/configs/gates/default.yaml" in names
    for artifact in (wheel, sdist):
        work = tmp_path / artifact.name.split(".")[-1]
        work.mkdir()
        _install_and_run(_fresh_venv(work / "venv"), artifact, work, plugins=artifact == wheel)


# ------------------------------------------------------------------ the core install, as on a robot PC

# what the core install must do without: the console, its devices, the plots, the simulators, video and parquet, Ray
NOT_IN_CORE = ("PyQt6", "pyqtgraph", "pygame", "hid", "matplotlib", "mujoco", "gymnasium", "gymnasium_robotics",
               "metaworld", "pyarrow", "av", "ray")


def _core_closure() -> list:
    """The installed distributions the core requirements of hg-dagger need (no extras), transitively."""
    from importlib.metadata import PackageNotFoundError, distribution, requires

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    todo = [Requirement(r) for r in requires("hg-dagger") or []]
    found: dict[str, object] = {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or one for another platform
        name = canonicalize_name(req.name)
        if name in found:
            continue
        try:
            dist = distribution(req.name)
        except PackageNotFoundError:
            continue  # an optional dependency of a dependency that the dev environment does not hold either
        found[name] = dist
        todo += [Requirement(r) for r in dist.requires or []]
    return list(found.values())


def _core_venv(root: Path) -> Path:
    """A new venv that sees only the core dependencies: a folder of links to just their installed files (taken
    from the dev venv, so nothing is downloaded), on the venv's path through a .pth line."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True)
    (site,) = (root / "lib").glob("python3*/site-packages")
    deps = root / "core-dependencies"
    deps.mkdir()
    for dist in _core_closure():
        for f in dist.files or []:
            top = f.parts[0]
            src = Path(dist.locate_file(top))
            if top in ("..", "bin") or (deps / top).exists() or not src.exists():
                continue
            (deps / top).symlink_to(src)
    (site / "_core_dependencies.pth").write_text(f"{deps}\n")
    return root


def test_the_core_wheel_serves_a_bridge_and_validates_without_the_app_or_simulators(tmp_path):
    """`pip install hg-dagger` without extras, as on a robot PC: no Qt, pygame, HID, matplotlib, MuJoCo, Gymnasium,
    pyarrow, PyAV or Ray; the bridge serves the numpy toy arm, a session from the dev environment drives it, and
    the store it wrote validates with the core CLI."""
    wheel_dir = tmp_path / "wheel"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(wheel_dir), str(REPO)], check=True, capture_output=True)
    (wheel,) = wheel_dir.glob("hg_dagger-*.whl")
    venv = _core_venv(tmp_path / "venv")
    python = venv / "bin" / "python"
    env = {**_base_env(), "PYTHONNOUSERSITE": "1"}
    done = subprocess.run([str(python), "-m", "pip", "--version"], capture_output=True, text=True, env=env)
    pip = [str(python), "-m", "pip"] if done.returncode == 0 else [sys.executable, "-m", "pip", "--python", str(python)]
    done = subprocess.run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], capture_output=True,
                          text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    probe = ("import importlib.util, json; print(json.dumps({m: importlib.util.find_spec(m) is not None for m in "
             f"{list(NOT_IN_CORE)!r}}}))")
    present = json.loads(subprocess.run([str(python), "-c", probe], capture_output=True, text=True, env=env,
                                        check=True).stdout.strip().splitlines()[-1])
    assert not any(present.values()), f"the core venv sees extras: {[m for m, p in present.items() if p]}"

    token = tmp_path / "robot.token"
    token.write_text("ab" * 32)
    token.chmod(0o600)
    server = subprocess.Popen([str(venv / "bin" / "hg-dagger"), "bridge", "serve", "toy_reach", "--port", "0",
                               "--token-file", str(token)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env, cwd=tmp_path)
    try:
        line = server.stdout.readline()
        assert line.startswith("listening on "), (line, server.stderr.read() if server.poll() is not None else "")
        address = line.split()[-1]
        store = tmp_path / "store.zarr"
        out = subprocess.run([sys.executable, "-m", "hg_dagger", "run", "--task", "toy_reach", "--robot", address,
                              "--token-file", str(token), "--operator", "synthetic", "--episodes", "1",
                              "--store", str(store), "--quiet"], capture_output=True, text=True, timeout=240,
                             cwd=tmp_path)
        assert out.returncode == 0, (out.stdout[-1500:], out.stderr[-1500:])
    finally:
        server.terminate()
        server.wait(timeout=30)
    checked = subprocess.run([str(venv / "bin" / "hg-dagger"), "validate", str(store)], capture_output=True,
                             text=True, env=env, timeout=240)
    assert checked.returncode == 0 and "1 episodes (0 incomplete), 0 violation(s)" in checked.stdout, checked
