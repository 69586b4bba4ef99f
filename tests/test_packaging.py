"""ui/ and devices/ install as hg_dagger.ui and hg_dagger.devices, in editable and regular installs."""

import subprocess
import sys
import zipfile
from pathlib import Path

import hg_dagger

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
