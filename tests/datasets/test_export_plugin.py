"""A third-party export format, installed as a real distribution: the package docs/extending.md ("An export
format") shows - its module and its pyproject.toml, taken from the page - is built and installed with
`pip install --no-deps --target`, put on PYTHONPATH, and used from `hg-dagger export` and `hg-dagger dataset
export` in a subprocess. Its format and option appear in both commands, it writes exactly the labels training
may use, its option is refused with another format, and a plugin that fails to import breaks no command."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from reviewed import approve
from support.docs import install_documented_plugin
from support.store import record

from hg_dagger.datasets.build import build
from hg_dagger.datasets.exporters import Training
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import selection

pytestmark = [pytest.mark.subprocess]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """The documented package installed into a folder of its own (a site directory on PYTHONPATH), and a store of
    three episodes: two approved windows, one never reviewed; with a dataset version of it."""
    base = tmp_path_factory.mktemp("plugin")
    site = install_documented_plugin(base, "An export format", "hgd_csv")
    assert (next(site.glob("hgd_csv-0.1.dist-info")) / "entry_points.txt").read_text().split() == [
        "[hg_dagger.exporters]", "csv", "=", "hgd_csv:CSV"]
    st = EpisodeStore.create(base / "store")
    with st.recorder(on_full="block") as rec:
        eids = [record(rec, seed, n, window=w, operator="op-a")
                for seed, n, w in ((0, 20, (4, 11)), (1, 16, (3, 9)), (2, 18, (6, 14)))]
    approve(st, eids[0])
    approve(st, eids[2])
    build("ds", [base / "store"], root=base / "datasets")
    return base, site, EpisodeStore.open(base / "store"), eids


def _cli(site: Path, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p))
    return subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                          timeout=300, env=env)


def _one_line(r, *words) -> str:
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and all(w in lines[0] for w in words), r.stderr
    return lines[0]


def _rows(path: Path, delimiter: str) -> list[list[str]]:
    with open(path, newline="") as f:
        return list(csv.reader(f, delimiter=delimiter))


def test_an_installed_plugin_format_exports_from_both_commands(plugin, tmp_path):
    base, site, st, eids = plugin
    for command in (["export"], ["dataset", "export"]):
        r = _cli(site, *command, "--help")
        assert r.returncode == 0 and "{csv,lerobot,ods,rlinf}" in r.stdout.replace(" ", "") and "--delimiter" in r.stdout

    r = _cli(site, "export", base / "store", "--format", "csv", "--delimiter", "tab", "--out", tmp_path / "labels")
    assert r.returncode == 0, r.stderr
    allowed = {(eid, int(t)) for eid in eids for t in np.flatnonzero(selection(st, st.info(eid)).allowed)}
    assert len(allowed) == 7 + 8  # the approved windows, not the unreviewed one
    assert f"csv export: 3 episodes, {len(allowed)} frames ({len(allowed)} trainable)" in r.stdout
    assert Training.LABELS.note in r.stdout
    rows = _rows(tmp_path / "labels" / "labels.csv", "\t")
    assert rows[0] == ["episode_id", "step", "action"]
    assert {(e, int(t)) for e, t, _ in rows[1:]} == allowed and len(rows) - 1 == len(allowed)
    for eid, t, action in rows[1:]:
        want = st.read_steps(eid, ["applied_action"])["applied_action"][int(t)]
        np.testing.assert_array_equal(np.array(action.split(), np.float32), want)

    # a dataset version's trainable samples, with the option's default
    r = _cli(site, "dataset", "export", "ds", "--root", base / "datasets", "--format", "csv", "--out",
             tmp_path / "ds", "--quiet")
    assert r.returncode == 0, r.stderr
    assert {(e, int(t)) for e, t, _ in _rows(tmp_path / "ds" / "labels.csv", ",")[1:]} == allowed


def test_the_plugin_holds_the_boundary_and_its_option_is_refused_elsewhere(plugin, tmp_path):
    base, site, _, eids = plugin
    _one_line(_cli(site, "export", base / "store", "--format", "csv", "--episodes", eids[1], "--out", tmp_path / "n"),
              "nothing to export: none of the 1 episode(s) has a label training may use")
    _one_line(_cli(site, "export", base / "store", "--format", "lerobot", "--delimiter", "tab", "--out",
                   tmp_path / "n"), "--delimiter is for --format csv")
    _one_line(_cli(site, "dataset", "export", "ds", "--root", base / "datasets", "--format", "ods", "--delimiter",
                   "comma", "--out", tmp_path / "n"), "--delimiter is for --format csv")
    _one_line(_cli(site, "export", base / "store", "--format", "xlsx", "--out", tmp_path / "n"),
              "unknown export format 'xlsx'", "csv, lerobot, ods, rlinf", "hg_dagger.exporters")
    assert not (tmp_path / "n").exists()


def test_a_plugin_that_fails_to_import_breaks_no_command(plugin, tmp_path):
    """A distribution whose entry point raises on import: every command still runs, the built-in formats
    export, and asking for its format is the one line that names the plugin and its error."""
    base, _, _, _ = plugin
    site = tmp_path / "site"
    info = site / "hgd_broken-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hgd-broken\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hg_dagger.exporters]\nbroken = hgd_broken:FORMAT\n")
    (site / "hgd_broken.py").write_text("raise ImportError('needs the xlsx writer')\n")
    r = _cli(site, "export", base / "store", "--format", "lerobot", "--out", tmp_path / "ok", "--quiet")
    assert r.returncode == 0, r.stderr
    _one_line(_cli(site, "export", base / "store", "--format", "broken", "--out", tmp_path / "n"),
              "'broken'", "hgd-broken", "needs the xlsx writer")
