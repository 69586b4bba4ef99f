"""The training boundary holds for every export: a store whose labels nobody may train on yet (windows never
reviewed, approved without training authorization, approved without QC, approved by their own operator or by a
reviewer off the roster, an expert window nobody certified) is exported in every registered format and every
combination of its options, from `hg-dagger export` and from `hg-dagger dataset export`. A format that holds only
training labels (Training.LABELS: rlinf, lerobot --labels trainable) refuses with one line and writes nothing; a
format with every step (Training.MASK: lerobot --labels all, ods) marks none of them trainable - not in
`trainable`, `label_mask`, `segment_accepted` nor `intervene_flag` - and says in its metadata which column is the
mask. The modes are read from the exporter registry, so a new built-in format is tested here or fails
`test_every_built_in_format_is_checked`."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from reviewed import approve
from support.fuzz import run_cli
from support.store import end, fields, human_window, start, step

from hg_dagger.contract import ActionSource, CorrectionWindow, LabelMask, TrainingRule
from hg_dagger.contract.enums import Usage
from hg_dagger.datasets import EXPORTERS, ExportError, Training, export, load_ods, select
from hg_dagger.datasets.build import build
from hg_dagger.datasets.exporters import resolve_options
from hg_dagger.datasets.manifest import DatasetConfig, SelectionConfig, summarize, write_exclusive
from hg_dagger.datasets.repository import load, manifest_path
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import selection

pytestmark = [pytest.mark.slow]  # every format and option, twice over: about 30 s

OPERATOR = "op-a"
TRAINABLE = LabelMask.TRAINABLE.code
# (name, seed, steps, window (start, end), window source)
EPISODES = [("unreviewed", 0, 20, (4, 10), ActionSource.HUMAN), ("not_authorized", 1, 16, (3, 9), ActionSource.HUMAN),
            ("no_qc", 2, 18, (5, 12), ActionSource.HUMAN), ("self_approved", 3, 14, (2, 8), ActionSource.HUMAN),
            ("off_roster", 4, 15, (6, 11), ActionSource.HUMAN), ("expert", 5, 17, (4, 12), ActionSource.EXPERT),
            ("no_window", 6, 12, None, None)]


def _modes() -> list[tuple[str, dict[str, str | None]]]:
    """Every built-in format with every combination of its options (not given, or each choice)."""
    out = []
    for fmt in EXPORTERS.names():
        if EXPORTERS.origin(fmt) != "hg_dagger":
            continue
        opts = EXPORTERS.get(fmt).options
        for values in itertools.product(*[(None, *o.choices) if o.choices else (None,) for o in opts]):
            out.append((fmt, {o.name: v for o, v in zip(opts, values, strict=True)}))
    return out


MODES = _modes()


def _id(mode) -> str:
    fmt, opts = mode
    return "-".join([fmt, *(f"{k}={v}" for k, v in opts.items() if v is not None)])


@pytest.fixture(scope="module")
def unreviewed(tmp_path_factory):
    """A camera store with a label in every state that keeps it out of training, and a dataset version of it."""
    base = tmp_path_factory.mktemp("boundary")
    st = EpisodeStore.create(base / "store")
    ids = {}
    with st.recorder(on_full="block") as rec:
        for name, seed, n, window, source in EPISODES:
            eid = rec.begin_episode(start(operator=OPERATOR), fields(True))
            for t in range(n):
                inside = window is not None and window[0] <= t < window[1]
                x = step(seed, t, image=True, source=ActionSource.HUMAN if inside and source == ActionSource.HUMAN
                         else ActionSource.POLICY)
                if inside and source == ActionSource.EXPERT:  # the expert labels, the policy's action is executed
                    x |= {"expert_action": np.full(4, 100 + t, np.float32), "expert_valid": True}
                rec.put(eid, x)
            windows = [] if window is None else [human_window(eid, *window) if source == ActionSource.HUMAN else
                                                 CorrectionWindow(parent_episode_id=eid, parent_step_id=window[0] - 1,
                                                                  handover_start=window[0], handover_end=window[1],
                                                                  source=ActionSource.EXPERT)]
            rec.end_episode(eid, end(n), windows=windows)
            ids[name] = eid
    approve(st, ids["not_authorized"], authorize=False)
    approve(st, ids["no_qc"], qc=False)
    approve(st, ids["self_approved"], reviewer=OPERATOR)  # what an older release let through
    approve(st, ids["off_roster"], reviewer="rev-gone")
    EpisodeStore.open(base / "store", mode="a").set_reviewers(["rev-1"])  # rev-gone left the roster
    st = EpisodeStore.open(base / "store")
    for info in st.episodes():  # labels everywhere a window is, none of them allowed
        sel = selection(st, info)
        assert sel.labels.any() == (info.episode_id != ids["no_window"]) and not sel.allowed.any(), info.episode_id
    build("ds", [base / "store"], root=base / "datasets")
    m = load(base / "datasets", "ds")
    assert not m.by_usage(Usage.TRAINABLE) and m.by_usage(Usage.AUDIT_ONLY)
    return base, st, ids


def _lerobot_frames(out) -> tuple[dict, dict, dict]:
    """(columns of every data file, meta/episodes, info.json) of a LeRobot export."""
    table = pa.concat_tables([pq.read_table(f) for f in sorted((out / "data").glob("chunk-*/file-*.parquet"))])
    cols = {c: np.asarray(table[c].to_pylist()) for c in ("trainable", "label_mask", "segment_accepted",
                                                           "intervene_flag", "action_source")}
    eps = pq.read_table(out / "meta" / "episodes" / "chunk-000" / "file-000.parquet").to_pydict()
    return cols, eps, json.loads((out / "meta" / "info.json").read_text())


def _check_lerobot_mask(out, steps: int) -> None:
    cols, eps, info = _lerobot_frames(out)
    assert len(cols["trainable"]) == steps  # every step is there, as context
    assert (cols["action_source"] == ActionSource.HUMAN.code).any()  # the people's corrections too
    for c in ("trainable", "segment_accepted", "intervene_flag"):
        assert not cols[c].any(), c
    assert not (cols["label_mask"] == TRAINABLE).any()
    assert info["hg_dagger"]["training"] == "mask" and "trainable" in info["hg_dagger"]["training_note"]
    assert info["hg_dagger"]["trainable_frames"] == 0 and not any(eps["hg_dagger/trainable_frames"])


def _check_ods_mask(out, steps: int) -> None:
    td, meta = load_ods(out)
    valid = td["valid"].numpy()
    assert valid.sum() == steps
    assert (td["action_source"].numpy()[valid] == ActionSource.HUMAN.code).any()
    for c in ("trainable", "segment_accepted"):
        assert not td[c].numpy().any(), c
    assert not (td["label_mask"].numpy()[valid] == TRAINABLE).any()
    assert meta["training"] == "mask" and not any(e["trainable_steps"] for e in meta["episodes"])


# how a Training.MASK export of each built-in format is read back; a format holding only labels needs none
MASK_READERS = {"lerobot": _check_lerobot_mask, "ods": _check_ods_mask}


def test_every_built_in_format_is_checked():
    built_in = {fmt for fmt, _ in MODES}
    assert {"lerobot", "ods", "rlinf"} <= built_in
    for fmt, opts in MODES:
        training = EXPORTERS.get(fmt).training_for(resolve_options(fmt, opts))
        assert training in (Training.LABELS, Training.MASK), (fmt, opts)
        assert training == Training.LABELS or fmt in MASK_READERS, f"{fmt}: add its reader to MASK_READERS"
    trainings = {EXPORTERS.get(f).training_for(resolve_options(f, o)) for f, o in MODES}
    assert trainings == {Training.LABELS, Training.MASK}


def _expect(mode, out, steps: int, refusal: str | None, error: str | None) -> None:
    fmt, opts = mode
    training = EXPORTERS.get(fmt).training_for(resolve_options(fmt, opts))
    if training == Training.LABELS:
        assert error is not None and refusal in error, error
        assert not out.exists() and not list(out.parent.glob(f".{out.name}.partial*"))
    else:
        assert error is None, error
        MASK_READERS[fmt](out, steps)


@pytest.mark.parametrize("mode", MODES, ids=_id)
def test_export_of_an_unreviewed_store_offers_nothing_as_training_data(unreviewed, tmp_path, capsys, mode):
    base, st, _ = unreviewed
    fmt, opts = mode
    if opts.get("video"):
        pytest.importorskip("av")
    steps = sum(n for _, _, n, _, _ in EPISODES)
    want = f"nothing to export: none of the {len(EPISODES)} episode(s) has a label training may use"
    # the library
    try:
        summary = export(fmt, select(st), tmp_path / "lib", **opts)
        error = None
        assert summary.trainable_frames == 0 and summary.training == Training.MASK
    except ExportError as exc:
        error = str(exc)
    _expect(mode, tmp_path / "lib", steps, want, error)
    # the command
    flags = [f"--{k}={v}" for k, v in opts.items() if v is not None]
    got = run_cli(capsys, "export", base / "store", f"--format={fmt}", f"--out={tmp_path / 'cli'}", "--quiet", *flags)
    _expect(mode, tmp_path / "cli", steps, want, None if got.code == 0 else got.refused())
    if got.code == 0:
        assert "train only on the frames whose `trainable` is true" in got.out


@pytest.mark.parametrize("mode", MODES, ids=_id)
def test_dataset_export_of_untrainable_samples_offers_nothing_as_training_data(unreviewed, tmp_path, capsys, mode):
    base, _, _ = unreviewed
    fmt, opts = mode
    if opts.get("video"):
        pytest.importorskip("av")
    flags = [f"--{k}={v}" for k, v in opts.items() if v is not None]
    where = [f"--root={base / 'datasets'}", "--quiet"]
    line = run_cli(capsys, "dataset", "export", "ds", f"--format={fmt}", f"--out={tmp_path / 'none'}", *where,
                   *flags).refused()
    assert "no sample of usage trainable to export" in line and not (tmp_path / "none").exists()
    got = run_cli(capsys, "dataset", "export", "ds", f"--format={fmt}", f"--out={tmp_path / 'audit'}", *where,
                  "--usage", "audit_only", "replay_only", "evaluation_only", *flags)
    steps = sum(n for _, _, n, _, _ in EPISODES)
    _expect(mode, tmp_path / "audit", steps, "has a label training may use", None if got.code == 0 else got.refused())


def test_an_old_version_with_a_void_authorization_is_not_exported_as_training_data(unreviewed, tmp_path, capsys):
    """A version an older release built counted the self-approval: its sample is trainable in the manifest. Every
    export of it is refused in one line, as `train --dataset` refuses it (datasets.read.refuse_void)."""
    base, st, ids = unreviewed
    scratch = build("old", [base / "store"], root=tmp_path / "scratch",
                    config=DatasetConfig(selection=SelectionConfig(rule=TrainingRule(require_review=False))))[0]
    eid = ids["self_approved"]
    keep = [s for s in scratch.samples if s.usage != Usage.TRAINABLE or s.episode_id == eid]
    assert any(s.usage == Usage.TRAINABLE and s.runs for s in keep)
    old = scratch.model_copy(update={"config": DatasetConfig(), "samples": tuple(keep),
                                     "summary": summarize(keep, scratch.episodes, scratch.version)})
    old = old.model_copy(update={"hash": old.content_hash()})
    write_exclusive(manifest_path(tmp_path / "datasets", "old", 1), old.model_dump_json(indent=1))
    assert load(tmp_path / "datasets", "old@v1").hash == old.hash
    for fmt, opts in MODES:
        if opts.get("video"):
            continue
        flags = [f"--{k}={v}" for k, v in opts.items() if v is not None]
        line = run_cli(capsys, "dataset", "export", "old", f"--format={fmt}", f"--out={tmp_path / 'x'}",
                       f"--root={tmp_path / 'datasets'}", "--quiet", *flags).refused()
        assert "old@v1" in line and eid in line and "may not be exported as training data" in line, line
        assert "window's operator" in line and "hg-dagger dataset build old" in line, line
        assert not (tmp_path / "x").exists()
