"""Review states for the export tests: a window's labels reach training only when a reviewer other than its
operator approved and authorized them and QC passed (or a planner certified them); these helpers write that
state as a new label layer, the way `hg-dagger review approve` and `hg-dagger qc` leave it."""

from __future__ import annotations

from hg_dagger.contract import QCResult, ReviewDecision, ReviewStatus
from hg_dagger.contract.labels import planner_certifications
from hg_dagger.store import EpisodeStore


def approve(store: EpisodeStore, eid: str, *, authorize: bool = True, qc: bool = True,
            reviewer: str = "reviewer-1") -> None:
    """Every window of ``eid`` approved by ``reviewer`` (authorized for training unless told), with passing QC
    results for the episode and each window unless ``qc`` is False."""
    st = EpisodeStore.open(store.url, mode="a")
    layer = st.labels(eid)
    reviews = [*layer.reviews, *(ReviewDecision(window_id=w.window_id, reviewer=reviewer, status=ReviewStatus.APPROVED,
                                                replay_training_authorized=authorize) for w in layer.windows)]
    results = [QCResult(episode_id=eid, passed=True)] + [
        QCResult(episode_id=eid, window_id=w.window_id, passed=True) for w in layer.windows] if qc else list(layer.qc)
    st.write_labels(eid, author=reviewer, reviews=reviews, qc=results)


def certify(store: EpisodeStore, eid: str) -> None:
    """Every window of ``eid`` certified by an automatic planner (needs no reviewer)."""
    st = EpisodeStore.open(store.url, mode="a")
    st.write_labels(eid, author="planner", certifications=planner_certifications(eid, st.labels(eid).windows, "ik"))
