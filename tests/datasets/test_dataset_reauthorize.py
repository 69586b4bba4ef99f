"""`train --dataset` re-checks every trainable sample's authorization on the label layer it names: a version an
older release built with a self-approved window (the operator approving their own correction), or one whose
reviewer has since left the store's roster, is refused in one line naming the version, sample and episode, and
`dataset build` demotes the sample in the next version."""

from __future__ import annotations

import datetime as dt

import pytest
from support.cli import cli_ok as _ok
from support.cli import run_cli as _cli

from hg_dagger.contract import ReviewDecision, ReviewStatus, TrainingRule
from hg_dagger.contract.enums import Usage
from hg_dagger.datasets.build import build
from hg_dagger.datasets.manifest import DatasetConfig, SelectionConfig, summarize, write_exclusive
from hg_dagger.datasets.repository import load, manifest_path
from hg_dagger.review.decisions import list_windows
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

def _refused(r, *words):
    assert r.returncode != 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("reauthorize")
    gates = root / "gates.yaml"
    gates.write_text("kind: gates\nname: eager\ntask: toy_reach\ngates:\n"
                     "  - {type: confidence, trigger: 1.0e-9, debounce_ticks: 1}\n")
    store = root / "store"
    _ok("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "2", "--num-envs", "1",
        "--store", store, "--gates", gates, "--calibrate-steps", "0", "--quiet")
    _ok("qc", store, "--quiet")
    return root, store


def _self_approve(store, row) -> None:
    """What an older release let through: the window's own operator approving it for training, written as a
    label layer (today `review approve` refuses it)."""
    st = EpisodeStore.open(store, mode="a")
    base = st.labels(row.episode_id)
    own = ReviewDecision(window_id=row.window_id, reviewer=row.operator, status=ReviewStatus.APPROVED,
                         replay_training_authorized=True, notes="", t_wall=dt.datetime.now(dt.UTC).isoformat())
    st.write_labels(row.episode_id, author="review:old-release", windows=base.windows,
                    certifications=base.certifications, qc=base.qc, reviews=[*base.reviews, own], mask=base.mask)


def test_a_self_approved_sample_in_an_old_version_is_not_trained(session, tmp_path):
    root, store = session
    rows = list_windows(store)
    row = rows[0]
    assert row.operator
    _self_approve(store, row)
    assert list_windows(store)[0].auth == "void"

    # an older release's build: it counted the self-approval, so the window's labels were trainable. Built here
    # with the review requirement off, then recorded under the strict rule as that release would have written it
    scratch = tmp_path / "scratch"
    m, _ = build("toy", [store], root=scratch,
                 config=DatasetConfig(selection=SelectionConfig(rule=TrainingRule(require_review=False))))
    target = f"{row.episode_id}:{row.window_id}"
    samples = []
    for s in m.samples:
        if s.kind == "window" and s.usage == "trainable" and s.id != target:
            s = s.model_copy(update={"usage": Usage.AUDIT_ONLY, "why": "unauthorized: not_reviewed", "runs": (),
                                     "allowed": 0, "blocks": ("not_reviewed",)})
        samples.append(s)
    assert any(s.id == target and s.usage == "trainable" and s.runs for s in samples)
    data = tmp_path / "datasets"
    old = m.model_copy(update={"config": DatasetConfig(), "samples": tuple(samples),
                               "summary": summarize(samples, m.episodes, m.version)})
    old = old.model_copy(update={"hash": old.content_hash()})
    write_exclusive(manifest_path(data, "toy", 1), old.model_dump_json(indent=1))
    assert load(data, "toy@v1").hash == old.hash  # a valid manifest: only its authorization is void

    r = _cli("train", "--dataset", "toy@v1", "--datasets-root", data, "--task", "toy_reach", "--out",
             tmp_path / "t", "--steps", "2", "--quiet")
    line = _refused(r, "toy@v1", target, row.episode_id, "window's operator", "hg-dagger dataset build toy")
    assert not (tmp_path / "t" / "student.pt").exists(), line
    # dataset check says the same
    r = _cli("dataset", "check", "toy@v1", "--root", data)
    assert r.returncode != 0 and target in r.stderr and "Traceback" not in r.stderr

    # rebuilding as the line says: the next version carries the sample demoted, and records why
    _ok("dataset", "build", "toy", "--root", data, "--quiet")
    v2 = load(data, "toy@v2")
    s2 = next(s for s in v2.samples if s.id == target)
    assert s2.usage != "trainable" and "self_review" in s2.why and s2.changed_in == 2


def test_an_authorization_by_a_reviewer_off_the_roster_is_not_trained(session, tmp_path):
    root, store = session
    rows = list_windows(store)
    row = next(r for r in rows if r.auth == "no")
    _ok("review", "approve", store, row.window_id, "--reviewer", "rev-a", "--authorize")
    data = tmp_path / "datasets"
    m, _ = build("toy", [store], root=data)
    target = f"{row.episode_id}:{row.window_id}"
    assert next(s for s in m.samples if s.id == target).usage == "trainable"
    st = EpisodeStore.open(store, mode="a")
    st.set_reviewers(["rev-b"])  # rev-a leaves the roster after the version was built
    try:
        r = _cli("train", "--dataset", "toy@v1", "--datasets-root", data, "--task", "toy_reach", "--out",
                 tmp_path / "t", "--steps", "2", "--quiet")
        _refused(r, "toy@v1", target, row.episode_id, "roster", "hg-dagger dataset build toy")
    finally:
        st.set_reviewers(None)
