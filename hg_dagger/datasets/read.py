"""Reading a dataset version's data back from its stores: the trainable steps and sequences of its samples,
EpisodeLabels for training, ExportItems for export, and ``check`` (everything wrong with a version, one line
each). Which steps are trainable is re-checked against the label layer each sample names."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hg_dagger.contract import LabelMask, TrainingBlock, TrainingRule, current_review, training_selection
from hg_dagger.contract.enums import Usage
from hg_dagger.contract.labels import TrainingSelection, review_problem, window_operator
from hg_dagger.datasets.manifest import DatasetError, Manifest, Sample
from hg_dagger.datasets.sequences import cut_sequences
from hg_dagger.datasets.source import ExportItem
from hg_dagger.datasets.splits import Placed, leaks
from hg_dagger.errors import ContractError, StoreError

_TRAINABLE = LabelMask.TRAINABLE.code
_VOID_REVIEW = int(TrainingBlock.SELF_REVIEW | TrainingBlock.REVIEWER_NOT_LISTED)


class OpenStores:
    """Stores opened once per build or use, by URL."""

    def __init__(self):
        self.open: dict[str, Any] = {}

    def get(self, url: str):
        # deferred: store imports zarr; the CLI lists its commands without it
        from hg_dagger.store import EpisodeStore

        if url not in self.open:
            self.open[url] = EpisodeStore.open(url, mode="r")
        return self.open[url]



def check(manifest: Manifest, *, stores: bool = True) -> list[str]:
    """Everything wrong with a version, one line each: leaks between splits (naming the episode and both splits),
    stores or episodes it names that are missing, label layers that are gone, and trainable samples whose steps
    the contract's training rule does not allow on the layer they name."""
    entries = {e.key: e for e in manifest.episodes}
    problems = []
    for s in manifest.samples:
        if s.key not in entries:
            problems.append(f"sample {s.id}: names episode {s.episode_id} of store {s.store}, not listed in the manifest")
    placed = [Placed(s.id, entries[s.key].split_item(), s.split, s.usage == Usage.TRAINABLE)
              for s in manifest.samples if s.key in entries]
    placed += [Placed(f"{e.episode_id}:entry", e.split_item(), e.split, False) for e in manifest.episodes]
    problems += leaks(placed, manifest.config.splits)
    if not stores:
        return problems
    opened = OpenStores()
    for ref in manifest.stores:
        try:
            opened.get(ref.url)
        except StoreError as exc:
            problems.append(f"{manifest.ref}: store {ref.id}: {exc}")
    for s in manifest.samples:
        url = manifest.store_url(s.store)
        if url not in opened.open:
            continue
        st = opened.open[url]
        if not st.has_episode(s.episode_id, refresh=False):
            problems.append(f"{manifest.ref}: sample {s.id} names episode {s.episode_id}, not in store {url}")
            continue
        if s.usage != Usage.TRAINABLE:
            continue
        try:
            allowed = _allowed(st, s, manifest.config.selection.rule)
        except StoreError as exc:
            problems.append(f"{manifest.ref}: sample {s.id}: {exc}")
            continue
        bad = [t for a, b in s.runs for t in range(a, b) if not allowed[t]]
        if bad:
            problems.append(f"{manifest.ref}: sample {s.id}: step {bad[0]} of episode {s.episode_id} is not allowed "
                            f"by the training rule on label layer v{s.label_version}")
    return problems


def _selection(store, s: Sample, rule: TrainingRule) -> tuple[TrainingSelection, Any, Any]:
    """The training rule on a sample's episode and the label layer the sample names, under the store's reviewer
    roster as it is now; with that layer and the episode's info."""
    layer = store.labels(s.episode_id, s.label_version)
    info = store.info(s.episode_id)
    replay = layer.replay.status if layer.replay is not None else info.end.replay_status
    sel = training_selection(mask=layer.mask, windows=layer.windows, certifications=layer.certifications,
                             reviews=layer.reviews, qc=layer.qc, replay_status=replay, operator=info.start.operator,
                             policy_version=info.start.policy_version, rule=rule, reviewers=store.reviewers)
    return sel, layer, info


def _allowed(store, s: Sample, rule: TrainingRule) -> np.ndarray:
    return _selection(store, s, rule)[0].allowed


def void_authorization(store, s: Sample, rule: TrainingRule) -> str | None:
    """Why a trainable sample's authorization counts for nothing on the label layer it names
    (``contract.labels.review_problem``: its window's operator approved it, or a reviewer off the store's roster as
    it is now); None when it stands or the sample is not trainable. A version an older release built, or one built
    before the roster changed, may hold such a sample: it must not train (docs/datasets.md, "Re-checked on use")."""
    if s.usage != Usage.TRAINABLE or not s.runs:
        return None
    sel, layer, info = _selection(store, s, rule)
    bits = 0
    for a, b in s.runs:
        if b > a:
            bits |= int(np.bitwise_or.reduce(sel.blocks[a:b]))
    if not bits & _VOID_REVIEW:
        return None
    w = next((w for w in layer.windows if w.window_id == s.window_id), None)
    d = current_review(layer.reviews, w.window_id) if w is not None else None
    why = review_problem(d, operator=window_operator(w, info.start.operator), reviewers=store.reviewers) \
        if w is not None and d is not None else None
    return why or ", ".join(TrainingBlock.names(bits & _VOID_REVIEW))


def refuse_void(manifest: Manifest, store, s: Sample, *, use: str, then: str) -> None:
    """One line, naming the version, sample and episode, when a trainable sample's authorization counts for
    nothing now (``void_authorization``): it may not ``use`` ("train"), and the next version is what to ``then``."""
    void = void_authorization(store, s, manifest.config.selection.rule)
    if void is not None:
        raise DatasetError(f"{manifest.ref}: sample {s.id} of episode {s.episode_id} may not {use}: {void} (label "
                           f"layer v{s.label_version}; the version was built before this was refused); "
                           f"`hg-dagger dataset build {manifest.name}` (same --root) writes the next version with "
                           f"it demoted - {then}")


def trainable_steps(manifest: Manifest) -> dict[tuple[str, str], list[tuple[Sample, list[tuple[int, int]]]]]:
    """(store id, episode id) -> [(sample, runs)] of every trainable sample, in manifest order."""
    out: dict[tuple[str, str], list] = {}
    for s in manifest.samples:
        if s.usage == Usage.TRAINABLE:
            out.setdefault((s.store, s.episode_id), []).append((s, list(s.runs)))
    return out


def sequences(manifest: Manifest, length: int, stride: int | None = None,
              usages: Iterable[str] = (Usage.TRAINABLE,)) -> list[tuple[str, str, int, int]]:
    """(store id, episode id, start, end) sequences of ``length`` steps for a chunked policy, each inside one run
    of one sample: never across a handover boundary, never mixing action sources."""
    want = set(usages)
    return [(s.store, s.episode_id, a, b) for s in manifest.samples if s.usage in want
            for a, b in cut_sequences(s.runs, length, stride)]


def episode_labels(manifest: Manifest, obs_keys: Sequence[str], *, task: str | None = None,
                   mapping_hash: str | None = None) -> list:
    """The manifest's trainable samples as EpisodeLabels for a LabelBuffer: exactly the steps of their runs, with the
    target the label layer each sample names gives. A missing store or episode, or a step that layer does not
    make trainable, is an error naming the sample."""
    # deferred: store.trainable imports zarr; the CLI lists its commands without it
    from hg_dagger.store.trainable import LABEL_FIELDS, extract_labels

    opened = OpenStores()
    for ref in manifest.stores:  # every store the version names must be there, trainable samples or not
        try:
            opened.get(ref.url)
        except StoreError as exc:
            raise DatasetError(f"{manifest.ref}: store {ref.id}: {exc}") from None
    out = []
    entries = {e.key: e for e in manifest.episodes}
    for (sid, eid), parts in trainable_steps(manifest).items():
        url = manifest.store_url(sid)
        st = opened.get(url)
        if not st.has_episode(eid, refresh=False):
            raise DatasetError(f"{manifest.ref}: sample {parts[0][0].id} names episode {eid}, not in store {url}")
        e = entries.get(f"{sid}/{eid}")
        if task is not None and e is not None and e.task != task:
            raise DatasetError(f"{manifest.ref}: episode {eid} is of task {e.task!r}, not {task!r}")
        info = st.info(eid)
        if mapping_hash and info.start.mapping_hash and info.start.mapping_hash != mapping_hash:
            raise DatasetError(f"{manifest.ref}: episode {eid} was recorded under mapping hash "
                               f"{info.start.mapping_hash}, the task now has {mapping_hash}")
        try:
            data = st.read_steps(eid, [f"obs/{k}" for k in obs_keys] + list(LABEL_FIELDS))
        except StoreError as exc:
            raise DatasetError(f"{manifest.ref}: sample {parts[0][0].id}: {exc}") from None
        n = len(data["action_source"])
        mask = np.full(n, LabelMask.CONTEXT_ONLY.code, np.uint8)
        target = np.zeros(n, np.uint8)
        for s, runs in parts:
            layer = st.labels(eid, s.label_version)
            for a, b in runs:
                if b > n or np.any(layer.mask[a:b] != _TRAINABLE):
                    raise DatasetError(f"{manifest.ref}: sample {s.id}: steps [{a}, {b}) are not all trainable in "
                                       f"label layer v{s.label_version} of episode {eid}")
                mask[a:b] = _TRAINABLE
                target[a:b] = layer.target[a:b]
            refuse_void(manifest, st, s, use="train", then="train on that")
        data["label_mask"], data["label_target"] = mask, target
        try:
            out.append(extract_labels(data, episode_id=eid, obs_keys=obs_keys, iteration=info.start.iteration,
                                      success=bool(info.end.task_success)))
        except ContractError as exc:
            raise DatasetError(f"{manifest.ref}: {exc}") from None
    return out


def export_items(manifest: Manifest, usages: Iterable[str] = (Usage.TRAINABLE,)) -> list:
    """ExportItems (hg_dagger.datasets.source) of every episode with a sample of ``usages``: the per-step
    ``trainable`` mask is the trainable samples' runs, the label layer the newest one those samples name. A
    trainable sample whose authorization counts for nothing now (an older version's self-approval, a reviewer
    off the roster) is refused as `train --dataset` refuses it: no export offers it as training data."""
    want = set(usages)
    opened = OpenStores()
    chosen: dict[tuple[str, str], list[Sample]] = {}
    for s in manifest.samples:
        if s.usage in want:
            chosen.setdefault((s.store, s.episode_id), [])
    for s in manifest.samples:
        if (s.store, s.episode_id) in chosen:
            chosen[(s.store, s.episode_id)].append(s)
    items = []
    for (sid, eid), samples in chosen.items():
        try:
            st = opened.get(manifest.store_url(sid))
        except StoreError as exc:  # the line says which version names the store
            raise DatasetError(f"{manifest.ref}: store {sid}: {exc}") from None
        if not st.has_episode(eid, refresh=False):
            raise DatasetError(f"{manifest.ref}: sample {samples[0].id} names episode {eid}, not in store {st.url}")
        have = st.label_versions(eid)
        gone = next((x for x in samples if x.label_version and x.label_version not in have), None)
        if gone is not None:
            raise DatasetError(f"{manifest.ref}: sample {gone.id} names label layer v{gone.label_version} of episode "
                               f"{eid}, not in store {st.url} (layers: {have})")
        n = st.info(eid).num_steps
        mask = np.zeros(n, bool)
        for s in samples:
            if s.usage == Usage.TRAINABLE:
                refuse_void(manifest, st, s, use="be exported as training data", then="export that")
                for a, b in s.runs:
                    mask[a:b] = True
        items.append(ExportItem(st, eid, trainable=mask, label_version=max(s.label_version for s in samples) or None))
    return items
