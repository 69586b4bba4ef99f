"""`hg-dagger export` and `hg-dagger dataset export` under random options (hypothesis): every format with every
--labels, --video and --layout, episodes and tasks good and bad, and --out a new folder, a nested new one, an
empty folder, a folder with files, an earlier export, a file, or a path under a file. Each run either writes a
whole export at --out or exits 2 with one `error:` line naming the option, episode or folder at fault, and
leaves --out (and its parent) as they were: nothing half written, no temporary folder left behind.

Budgets are bounded for CI (derandomized, tests/support/fuzz.py); HG_DAGGER_FUZZ_EXAMPLES=300 runs a longer
random search."""

from __future__ import annotations

import shutil

import pytest
import support.store as sh
from hypothesis import given
from hypothesis import strategies as st
from support.fuzz import budget, run_cli, texts

from hg_dagger.contract import QCResult
from hg_dagger.datasets.build import build
from hg_dagger.review.decisions import decide, list_windows
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """Two camera episodes with a window each (the first approved, authorized and QC-passed), a dataset of them,
    and an earlier ODS export."""
    base = tmp_path_factory.mktemp("fuzz-export")
    store = base / "store"
    with EpisodeStore.create(store).recorder() as rec:
        for seed in range(2):
            sh.record(rec, seed, 10, image=True, window=(2, 7), operator="op-a")
    row = list_windows(store)[0]
    EpisodeStore.open(store, mode="a").write_labels(row.episode_id, author="qc:1", qc=[
        QCResult(episode_id=row.episode_id, passed=True),
        QCResult(episode_id=row.episode_id, window_id=row.window_id, passed=True)])
    decide(store, row.window_id, "approved", "rev-1", authorize=True)
    build("ds", [store], root=base / "datasets")
    earlier = base / "earlier"
    from hg_dagger.datasets import export_ods, select

    export_ods(select(EpisodeStore.open(store)), earlier)
    return base, [i.episode_id for i in EpisodeStore.open(store).episodes()]


def _tree(path) -> dict[str, bytes | None]:
    """Every file and folder under ``path`` (a folder maps to None), or {} when nothing is there."""
    if not path.exists():
        return {}
    if path.is_file():
        return {".": path.read_bytes()}
    return {str(p.relative_to(path)): None if p.is_dir() else p.read_bytes() for p in sorted(path.rglob("*"))} | {
        ".": None}


OUTS = ("new", "nested", "empty", "full", "earlier", "file", "under-file")


def _out(base, work, kind: str):
    out = work / "out"
    if kind == "nested":
        return work / "a" / "b" / "out"
    if kind == "empty":
        out.mkdir()
    elif kind == "full":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif kind == "earlier":
        shutil.copytree(base / "earlier", out)
    elif kind == "file":
        out.write_text("a file")
    elif kind == "under-file":
        (work / "f").write_text("a file")
        return work / "f" / "out"
    return out


run = st.fixed_dictionaries({
    "command": st.sampled_from(["export", "export", "dataset"]),
    "format": st.sampled_from(["lerobot", "ods", "rlinf", "csv"]),
    "labels": st.sampled_from([None, "all", "trainable", "some"]),
    "video": st.sampled_from([None, None, "h264", "av1", "gif"]),
    "layout": st.sampled_from([None, "padded", "ragged", "flat"]),
    "out": st.sampled_from(OUTS),
    "episodes": st.none() | st.lists(st.sampled_from(["first", "second", "prefix", "junk"]), min_size=1, max_size=2),
    "junk": texts,
    "task": st.sampled_from([None, None, "toy_reach", "fetch_pick_place"]),
    "usage": st.sampled_from([None, "trainable", "replay_only", "audit_only"]),
})


@budget(12)
@given(r=run)
def test_an_export_is_whole_or_nothing_and_a_refusal_is_one_line(template, tmp_path_factory, capsys, r):
    base, eids = template
    work = tmp_path_factory.mktemp("exp")
    out = _out(base, work, r["out"])
    opts = [f"--format={r['format']}", f"--out={out}", "--quiet"]
    opts += [f"--{k}={r[k]}" for k in ("labels", "video", "layout") if r[k] is not None]
    if r["command"] == "export":
        if r["task"]:
            opts.append(f"--task={r['task']}")
        if r["episodes"]:
            named = {"first": eids[0], "second": eids[1], "prefix": eids[0][:8], "junk": r["junk"] or "x"}
            opts += ["--episodes", *[named[e] for e in r["episodes"]]]
        argv = ["export", *opts, "--", base / "store"]
    else:
        if r["usage"]:
            opts.append(f"--usage={r['usage']}")
        argv = ["dataset", "export", *opts, f"--root={base / 'datasets'}", "--", "ds"]
    before, around = _tree(out), sorted(p.name for p in work.iterdir())
    got = run_cli(capsys, *argv)
    if got.code == 0:
        assert out.is_dir() and any(out.iterdir()), got.out
        assert not [p for p in out.parent.iterdir() if ".partial" in p.name]
        return
    line = got.refused()
    assert _tree(out) == before, line  # nothing half written, nothing of the person's touched
    assert sorted(p.name for p in work.iterdir()) == around, line  # no temporary folder, no parent made
    named = (str(out), str(out.parent), "--", "episode", "argument", "ds@v1", "task", "format")  # a file above --out
    assert any(w in line for w in named), line


def test_dataset_export_takes_the_format_options_of_export(template, tmp_path, capsys):
    """`dataset export` has --labels, --video and --layout as `export` has: --labels trainable writes the version's
    trainable run alone (one episode of its 5 steps), --layout ragged packs rows, and an option of another format
    is refused by name before anything is read or written."""
    base, _ = template
    where = f"--root={base / 'datasets'}"
    got = run_cli(capsys, "dataset", "export", "--format=lerobot", "--labels=trainable", "--video=h264",
                  f"--out={tmp_path / 'lr'}", "--quiet", where, "--", "ds")
    assert got.code == 0, got.err
    assert "1 episodes, 5 frames (5 trainable)" in got.out and (tmp_path / "lr" / "meta" / "info.json").is_file()
    assert any((tmp_path / "lr").rglob("*.mp4"))
    got = run_cli(capsys, "dataset", "export", "--format=ods", "--layout=ragged", f"--out={tmp_path / 'ods'}",
                  "--quiet", where, "--", "ds")
    assert got.code == 0, got.err
    assert "ragged" in (tmp_path / "ods" / "ods.json").read_text()
    line = run_cli(capsys, "dataset", "export", "--format=ods", "--labels=trainable", f"--out={tmp_path / 'x'}",
                   where, "--", "nosuch").refused()
    assert "--labels is for --format lerobot" in line and not (tmp_path / "x").exists()
