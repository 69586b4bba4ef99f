"""From the command line, end to end: record a human-gated session, QC it, approve one window for
training, reject another, approve a third without authorization - and `train` uses exactly the human
labels of the authorized window. `hg-dagger report` says what stopped every other label."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hg_dagger.contract import ActionSource, LabelMask
from hg_dagger.envs import load_mapping
from hg_dagger.review.decisions import list_windows
from hg_dagger.store import EpisodeStore

pytestmark = [pytest.mark.subprocess, pytest.mark.simulation]

ENV = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def _cli(*args, timeout=600):
    r = subprocess.run([sys.executable, "-m", "hg_dagger", *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, env=ENV)
    return r


def _ok(*args):
    r = _cli(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _human_labels(store: EpisodeStore, row) -> int:
    """Steps of a window that a person drove and the label rules make trainable."""
    src = store.read_steps(row.episode_id, ["action_source"])["action_source"][row.handover_start:row.handover_end]
    mask = store.labels(row.episode_id).mask[row.handover_start:row.handover_end]
    return int(((src == ActionSource.HUMAN.code) & (mask == LabelMask.TRAINABLE.code)).sum())


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    root = tmp_path_factory.mktemp("authorized")
    gates = root / "gates.yaml"
    gates.write_text("kind: gates\nname: eager\ntask: toy_reach\ngates:\n"
                     "  - {type: confidence, trigger: 1.0e-9, debounce_ticks: 1}\n")
    store = root / "store"
    _ok("run", "--task", "toy_reach", "--operator", "synthetic", "--episodes", "3", "--num-envs", "1",
        "--store", store, "--gates", gates, "--calibrate-steps", "0", "--quiet")
    return root, store


def test_train_uses_exactly_the_approved_authorized_qc_passed_labels(session):
    root, store = session
    rows = list_windows(store)
    assert len(rows) >= 3
    st = EpisodeStore.open(store)
    counts = [_human_labels(st, r) for r in rows]
    assert all(c > 0 for c in counts)

    # nothing is reviewed yet: train refuses, naming why
    r = _cli("train", "--store", store, "--task", "toy_reach", "--out", root / "none", "--steps", "5", "--quiet")
    assert r.returncode == 2 and "not_reviewed" in r.stderr and "Traceback" not in r.stderr

    _ok("review", "approve", store, rows[0].window_id, "--reviewer", "rev-a", "--authorize")
    _ok("review", "reject", store, rows[1].window_id, "--reviewer", "rev-a", "--reason", "drifted off target")
    _ok("review", "approve", store, rows[2].window_id, "--reviewer", "rev-b")  # approved, not authorized

    # approved and authorized, but QC never ran: still nothing
    r = _cli("train", "--store", store, "--task", "toy_reach", "--out", root / "noqc", "--steps", "5", "--quiet")
    assert r.returncode == 2 and "qc_not_run" in r.stderr

    _ok("qc", store, "--quiet")
    r = _ok("train", "--store", store, "--task", "toy_reach", "--out", root / "t", "--steps", "5", "--quiet")
    result = json.loads((root / "t" / "train.json").read_text())
    sel = result["selection"]
    assert result["labels"] == sel["allowed"] == counts[0], r.stdout
    assert sel["rejected"] == counts[1] and sel["not_authorized"] == counts[2]
    assert sel["not_reviewed"] == sum(counts[3:]) and sel["qc_not_run"] == 0 and sel["qc_failed"] == 0
    assert sel["labels"] == sum(counts) and sel["rule"]["require_review"]
    assert f"{counts[0]} of {sum(counts)} labels allowed" in r.stdout

    # the trained rows are exactly the authorized window's human steps
    from hg_dagger.store.trainable import load_labels

    keys = list(load_mapping("toy_reach").obs_spec())
    st = EpisodeStore.open(store)  # as reviewed and QC'd
    got = {(i.episode_id, int(t)) for i in st.episodes() for t in load_labels(st, i, keys).step}
    src = st.read_steps(rows[0].episode_id, ["action_source"])["action_source"]
    mask = st.labels(rows[0].episode_id).mask
    want = {(rows[0].episode_id, t) for t in range(rows[0].handover_start, rows[0].handover_end)
            if src[t] == ActionSource.HUMAN.code and mask[t] == LabelMask.TRAINABLE.code}
    assert got == want

    # the report says, per window, what stopped its labels
    _ok("report", store, "--out", root / "report")
    report = json.loads((root / "report" / "report.json").read_text())
    by_id = {w["window_id"]: w for w in report["windows"]}
    assert by_id[rows[0].window_id]["allowed"] == counts[0] and by_id[rows[0].window_id]["stopped_by"] == {}
    assert by_id[rows[1].window_id]["stopped_by"] == {"rejected": counts[1]}
    assert by_id[rows[2].window_id]["stopped_by"] == {"not_authorized": counts[2]}
    assert report["labels"]["allowed"] == counts[0]
    html = (root / "report" / "report.html").read_text()
    assert rows[1].window_id[:12] in html and "data:image/png;base64," in html
    assert 'src="http' not in html and "<link" not in html  # self-contained

    # experiments may lift the review requirement, explicitly, and it is recorded
    _ok("train", "--store", store, "--task", "toy_reach", "--out", root / "all", "--steps", "5", "--quiet",
        "--include-unreviewed")
    lenient = json.loads((root / "all" / "train.json").read_text())
    assert lenient["labels"] == sum(counts) and not lenient["selection"]["rule"]["require_review"]
