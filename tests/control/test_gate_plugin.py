"""A third-party gate type, installed as a real distribution: the package docs/extending.md ("A gate type") shows -
its module, its pyproject.toml and its gate file, taken from the page - is built and installed with
`pip install --no-deps --target`, put on PYTHONPATH, and used from `hg-dagger run` in a subprocess: the gate file's
type is found through the entry point group hg_dagger.gates and asks for the operator; without the package the gate
file is one line naming it, the type and the registered gate types."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.docs import install_documented_plugin, section_blocks

from hg_dagger.contract.enums import EventKind
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess]

SECTION = "A gate type"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The documented package installed into a site folder of its own, and its gate file."""
    base = tmp_path_factory.mktemp("gate_plugin")
    site = install_documented_plugin(base, SECTION, "hgd_effort")
    entry_points = (next(site.glob("hgd_effort-0.1.dist-info")) / "entry_points.txt").read_text().split()
    assert entry_points == ["[hg_dagger.gates]", "effort", "=", "hgd_effort:EFFORT"]
    gates = base / "effort.yaml"
    gates.write_text(section_blocks("extending.md", SECTION)["yaml"])
    return base, site, gates


def _cli(site: Path | None, *args):
    paths = [str(site)] if site is not None else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_plugin_gate_type_asks_for_the_operator_in_a_run(plugin):
    """A fresh student drives at a few hundredths of full speed, so a variant of the documented file (effort trigger
    0.02) asks in every episode; the documented file itself loads with the task's own gates."""
    base, site, gates = plugin
    variant = base / "effort_low.yaml"
    variant.write_text(f"kind: gates\nextends: {gates}\nname: effort_low\n"
                       "gates:\n  - {type: effort, warn: null, trigger: 0.02}\n")
    store = base / "store"
    run = _cli(site, "run", "--task", "toy_reach", "--gates", variant, "--store", store, "--episodes", 2,
               "--seed", 0, "--quiet", "--json")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    summary = json.loads(run.stdout[run.stdout.index("{"):])
    assert summary["episodes"] == 2 and summary["gate_triggers"] > 0
    for info in EpisodeStore.open(store).episodes():
        recorded = {g["name"]: g for g in info.start.gate_config["gates"]}
        assert recorded["effort"]["type"] == "effort" and "progress_stall" in recorded  # the base's gates too
        asked = [e for e in info.end.events if e.kind == EventKind.GATE_TRIGGER and "effort" in e.reason.split("+")]
        assert asked and asked[0].values["effort"]["effort"] >= 0.02


def test_without_the_plugin_the_gate_file_is_one_line_naming_the_type_and_the_registered_ones(plugin):
    base, site, gates = plugin
    r = _cli(None, "run", "--task", "toy_reach", "--gates", gates, "--store", base / "nothing", "--episodes", 1,
             "--quiet")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert str(gates) in line and "'effort'" in line and "gates." in line
    assert "progress_stall" in line and "hg_dagger.gates" in line
    assert not (base / "nothing").exists()
