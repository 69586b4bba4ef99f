"""A third-party simulator backend, installed as a real distribution: the package docs/extending.md ("A new
simulator backend") shows - its module, its pyproject.toml and its task file, taken from the page - is built and
installed with `pip install --no-deps --target`, put on PYTHONPATH, and used from the `hg-dagger` CLI in a
subprocess: the task file's backend is found through the entry point group hg_dagger.backends, the package's
planner (group hg_dagger.experts) drives the synthetic operator of `run`, its episodes replay, and a task file
naming a backend nobody registered is one line naming the file and the known backends, the plugin's included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import install_documented_plugin, section_blocks

from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The documented package installed into a site folder of its own, and its task file."""
    base = tmp_path_factory.mktemp("backend_plugin")
    site = install_documented_plugin(base, "A new simulator backend", "hgd_point")
    entry_points = (next(site.glob("hgd_point-0.1.dist-info")) / "entry_points.txt").read_text().split()
    assert entry_points == ["[hg_dagger.backends]", "point", "=", "hgd_point:BACKEND",
                            "[hg_dagger.experts]", "point_planner", "=", "hgd_point:PLANNER"]
    task = base / "point.yaml"
    task.write_text(section_blocks("extending.md", "A new simulator backend")["yaml"])
    return base, site, task


def _cli(site: Path | None, *args, cwd: Path | None = None):
    paths = [str(site)] if site is not None else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=cwd)


def test_the_plugin_backend_runs_from_the_cli_with_its_planner_and_replays(plugin):
    base, site, task = plugin
    check = _cli(site, "check-env", task)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "(backend point)" in check.stdout and "check-env point_reach: passed" in check.stdout

    store = base / "store"
    run = _cli(site, "run", "--task", task, "--store", store, "--episodes", 3, "--seed", 0, "--quiet", "--json")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    summary = json.loads(run.stdout[run.stdout.index("{"):])
    assert summary["episodes"] == 3
    assert summary["windows"] >= 1 and summary["human_steps"] > 0, "the plugin's planner drove the operator"
    infos = EpisodeStore.open(store).episodes()
    assert {i.start.mapping["backend"] for i in infos} == {"point"}
    assert all(i.start.versions.simulator.startswith("numpy ") for i in infos)  # the record's packages

    replay = _cli(site, "replay", store, "--quiet", "--json")
    assert replay.returncode == 0, replay.stderr[-4000:]
    out = json.loads(replay.stdout)
    assert {r["status"] for r in out["results"]} == {"replayable"}, out["results"]


def test_without_the_plugin_the_task_file_is_one_line_naming_the_known_backends(plugin):
    base, site, task = plugin
    r = _cli(None, "check-env", task)  # the package is not on the path: nobody registers "point"
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert str(task) in line and "key backend" in line and "'point'" in line
    assert "gymnasium" in line and "hg_dagger.backends" in line

    typo = base / "typo.yaml"
    typo.write_text(task.read_text().replace("backend: point", "backend: pointt"))
    r = _cli(site, "check-env", typo)
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1, r.stderr
    assert str(typo) in lines[0] and "'pointt'" in lines[0] and "point," in lines[0]  # the plugin's name is known
