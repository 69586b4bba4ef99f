"""Dataset versions: immutable, content-hashed manifests of which samples of which stores a dataset holds,
each with its usage class and why, its split, and the lineage from the policy rollouts to the policy trained
on it (seed 002: policy_vN rollout -> gate events and windows -> correction labels -> QC / replay -> dataset_vN+1
-> post-training -> policy_vN+1).

    ROOT/NAME/v1.json, v2.json, ...            one manifest per version, created exclusively, never rewritten
    ROOT/NAME/trained/v2-<policy_version>.json  a policy trained on v2 (written by `train --dataset NAME@v2`)

ROOT is ``--root``, else the folder ``datasets`` beside the (first) store. dataset_v(N+1) is dataset_vN plus
the newly selected increment: every sample of vN is carried over as it is (its label layer version pinned)
unless the latest label layer revokes it (a rejection, a failed QC result, a replay mismatch) or retention
retires it, which the new version records; earlier versions never change.

A sample is one correction window, one certified span of policy steps outside windows, or one episode's
rollout (its context); it names its store, episode, label layer version, window or certification and step
range. Which trainable labels may be trained on is decided by the contract's one rule,
``contract.training_selection``, on the label layer the sample names; the usage class adds the split and the
selection (quotas, deduplication, rounds, retention) on top.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import json
import os
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    EventKind,
    LabelMask,
    ReplayStatus,
    TrainingBlock,
    TrainingRule,
    current_review,
    training_selection,
)
from hg_dagger.contract.labels import DISCARDED, certification_problem
from hg_dagger.datasets.sequences import cut_sequences, pure_runs
from hg_dagger.datasets.splits import (
    HELD_OUT,
    Assignment,
    Placed,
    SplitConfig,
    SplitError,
    SplitItem,
    assign_splits,
    check_config_against,
    leaks,
)
from hg_dagger.errors import ContractError, HgDaggerError, StoreError

FORMAT = "hg_dagger.dataset"
FORMAT_VERSION = 1
Usage = Literal["trainable", "replay_only", "evaluation_only", "audit_only"]
USAGES: tuple[str, ...] = ("trainable", "replay_only", "evaluation_only", "audit_only")
HARD_BLOCKS = ("rejected", "needs_fix", "qc_failed", "replay_mismatch")  # never trainable without a new decision
_TRAINABLE = LabelMask.TRAINABLE.code
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_REF = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})(@v(?P<version>\d+))?$")


class DatasetError(HgDaggerError):
    """A dataset version cannot be built, read or used (names the dataset, version, sample, episode or file)."""


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------- configuration


class SelectionConfig(_M):
    """Which samples become trainable in a new version, besides the contract's training rule."""

    task: str | None = Field(default=None, description="only episodes of this task id")
    rule: TrainingRule = Field(default_factory=TrainingRule, description="contract.TrainingRule (defaults: strict)")
    rounds: Literal["all", "recent"] = Field(default="all", description="recent: new trainable samples only from the "
                                             "newest recent_rounds rounds (EpisodeStart.iteration)")
    recent_rounds: int = Field(default=1, gt=0)
    dedup: bool = Field(default=True, description="a window whose recorded actions repeat a trainable one is not added")
    stratify_by: tuple[Literal["task", "gate_reason", "operator"], ...] = Field(
        default=(), description="strata of the quota: each combination of these values")
    quota: int | None = Field(default=None, gt=0, description="at most this many trainable samples per stratum "
                              "(counting those carried over); the rest are chosen by a seeded hash")
    retain_rounds: int | None = Field(default=None, gt=0, description="retention: trainable samples of rounds older "
                                      "than the newest K become replay_only in the new version")
    seed: int = 0


class DatasetConfig(_M):
    """A dataset's build config (a YAML file with ``kind: dataset``)."""

    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    splits: SplitConfig = Field(default_factory=SplitConfig)


def load_config(path: str | os.PathLike) -> DatasetConfig:
    from hg_dagger import config as cfgmod

    data = cfgmod.read_yaml(path)
    kind = data.pop("kind", "dataset")
    if kind != "dataset":
        raise DatasetError(f"{path}: kind is {kind!r}, expected 'dataset'")
    return cfgmod.validate(DatasetConfig, data, source=str(path))


# ---------------------------------------------------------------------- the manifest


class StoreRef(_M):
    id: str  # s0, s1, ... (what samples name)
    url: str


class EpisodeEntry(_M):
    """One episode of the dataset: identity, what splitting and lineage need, and its split."""

    store: str
    episode_id: str
    task: str
    scene: str = ""
    objects: tuple[str, ...] = ()
    operator: str = ""
    day: str = ""
    parent: str | None = None
    iteration: int = 0
    policy_version: str = ""
    mode: str = ""
    num_steps: int = 0
    complete: bool = True
    end_reason: str = ""
    task_success: bool = False
    replay_status: str = ReplayStatus.UNVERIFIED.value
    gate_triggers: int = 0
    estops: int = 0
    failure_modes: tuple[str, ...] = ()
    split: str
    split_reason: str = ""
    added_in: int

    @property
    def key(self) -> str:
        return f"{self.store}/{self.episode_id}"

    def split_item(self) -> SplitItem:
        return SplitItem(key=self.key, episode_id=self.episode_id, task=self.task, scene=self.scene,
                         objects=tuple(self.objects), operator=self.operator, day=self.day,
                         parent=f"{self.store}/{self.parent}" if self.parent else None,
                         failure_modes=tuple(self.failure_modes))


class Sample(_M):
    """One unit of a dataset: a correction window, a certified span outside windows, or an episode's rollout."""

    id: str
    store: str
    episode_id: str
    label_version: int
    kind: Literal["window", "certification", "episode"]
    window_id: str | None = None
    cert_id: str | None = None
    steps: tuple[int, int]
    source: str = ""  # human | expert (window), policy (certification, episode)
    gate_reason: str = ""
    operator: str = ""
    labels: int = 0  # steps in range trainable under the label rules
    allowed: int = 0  # of those, allowed by the training rule
    runs: tuple[tuple[int, int], ...] = ()  # allowed steps as runs of one action source inside one window
    usage: Usage
    why: str
    blocks: tuple[str, ...] = ()  # TrainingBlock names that stopped its labels
    split: str
    added_in: int
    changed_in: int | None = None
    digest: str = ""

    @property
    def key(self) -> str:
        return f"{self.store}/{self.episode_id}"


class RoundLineage(_M):
    """One round's path through the pipeline: rollouts of a policy -> gate events -> windows -> labels -> QC and
    replay -> samples of this dataset."""

    store: str
    iteration: int
    policy_version: str
    episodes: int
    gate_triggers: int
    windows: int
    labels: int
    allowed: int
    qc: dict[str, int]
    replay: dict[str, int]
    usage: dict[str, int]
    added: int


class Manifest(_M):
    format: str = FORMAT
    format_version: int = FORMAT_VERSION
    name: str
    version: int
    parent_version: int | None = None
    parent_hash: str | None = None
    created_wall: str = ""
    author: str = ""
    config: DatasetConfig
    stores: tuple[StoreRef, ...]
    episodes: tuple[EpisodeEntry, ...]
    samples: tuple[Sample, ...]
    lineage: tuple[RoundLineage, ...] = ()
    summary: dict[str, Any] = Field(default_factory=dict)
    hash: str = ""

    @property
    def ref(self) -> str:
        return f"{self.name}@v{self.version}"

    def content_hash(self) -> str:
        body = self.model_dump(mode="json", exclude={"hash", "created_wall", "author"})
        return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()

    def store_url(self, store_id: str) -> str:
        for s in self.stores:
            if s.id == store_id:
                return s.url
        raise DatasetError(f"{self.ref}: no store {store_id!r} in the manifest")

    def by_usage(self, *usages: str) -> list[Sample]:
        return [s for s in self.samples if s.usage in usages]

    def episode(self, key: str) -> EpisodeEntry:
        for e in self.episodes:
            if e.key == key:
                return e
        raise DatasetError(f"{self.ref}: no episode {key!r}")


def parse_ref(ref: str) -> tuple[str, int | None]:
    """'NAME@vN' -> (NAME, N); 'NAME' -> (NAME, None: the latest)."""
    m = _REF.match(ref.strip())
    if not m:
        raise DatasetError(f"dataset {ref!r}: expected NAME or NAME@vN (NAME: letters, digits, '.', '_', '-')")
    return m["name"], int(m["version"]) if m["version"] else None


def default_root(root: str | os.PathLike | None, stores: Sequence[str] = ()) -> Path:
    """``root`` if given, else the folder ``datasets`` beside the first store (a local path)."""
    if root is not None:
        return Path(root)
    if not stores:
        raise DatasetError("no dataset folder: give --root (or a store, whose sibling folder 'datasets' is used)")
    first = str(stores[0])
    if "://" in first:
        raise DatasetError(f"{first}: a store URL has no folder beside it; give --root for the dataset folder")
    return Path(first).absolute().parent / "datasets"


def versions(root: str | os.PathLike, name: str) -> list[int]:
    folder = Path(root) / name
    if not folder.is_dir():
        return []
    return sorted(int(p.stem[1:]) for p in folder.glob("v*.json") if p.stem[1:].isdigit())


def names(root: str | os.PathLike) -> list[str]:
    r = Path(root)
    return sorted(p.name for p in r.iterdir() if p.is_dir() and versions(r, p.name)) if r.is_dir() else []


def manifest_path(root: str | os.PathLike, name: str, version: int) -> Path:
    return Path(root) / name / f"v{version}.json"


def read_manifest(path: str | os.PathLike) -> Manifest:
    """A manifest file, checked: its format, its fields, and that its content still has the hash it was written
    with (a version never changes)."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise DatasetError(f"{p}: no such dataset manifest") from None
    except (OSError, ValueError) as exc:
        raise DatasetError(f"{p}: not a readable dataset manifest ({exc})") from exc
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise DatasetError(f"{p}: not a dataset manifest (format is {data.get('format') if isinstance(data, dict) else None!r}, "
                           f"expected {FORMAT!r})")
    if data.get("format_version") != FORMAT_VERSION:
        raise DatasetError(f"{p}: manifest format_version {data.get('format_version')!r} is not supported "
                           f"(this version reads {FORMAT_VERSION})")
    try:
        m = Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise DatasetError(f"{p}: invalid manifest at {where}: {err['msg']}") from None
    if m.hash != m.content_hash():
        raise DatasetError(f"{p}: content does not match its hash {m.hash[:12]} (the file was changed after it was "
                           "written; a dataset version never changes)")
    if p.stem != f"v{m.version}" or p.parent.name != m.name:
        raise DatasetError(f"{p}: holds {m.ref}; a manifest lives at NAME/vN.json")
    return m


def load(root: str | os.PathLike, ref: str) -> Manifest:
    """A version by 'NAME@vN' (or 'NAME', the latest) under ``root``, or a manifest file path."""
    if ref.endswith(".json") and Path(ref).is_file():
        return read_manifest(ref)
    name, version = parse_ref(ref)
    have = versions(root, name)
    if not have:
        raise DatasetError(f"dataset {name!r}: no versions under {root}")
    v = have[-1] if version is None else version
    if v not in have:
        raise DatasetError(f"dataset {name}@v{v}: no such version under {root} (versions: "
                           f"{', '.join(f'v{x}' for x in have)})")
    return read_manifest(manifest_path(root, name, v))


def root_of(path: str | os.PathLike) -> Path:
    """The dataset folder a manifest file lives in (ROOT of ROOT/NAME/vN.json)."""
    return Path(path).absolute().parent.parent


def write_exclusive(path: Path, text: str) -> None:
    """Write ``text`` at ``path`` atomically and only if nothing is there: a temporary file, then a hard link
    (which fails if the name exists), so a reader sees the whole file or none, and two writers never share it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.partial"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise DatasetError(f"{path}: already exists; a dataset version is written once and never changes") from None
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass


# ---------------------------------------------------------------------- building


class _Stores:
    """Stores opened once per build or use, by URL."""

    def __init__(self):
        self.open: dict[str, Any] = {}

    def get(self, url: str):
        from hg_dagger.store import EpisodeStore

        if url not in self.open:
            self.open[url] = EpisodeStore.open(url, mode="r")
        return self.open[url]


def _norm_url(url: str | os.PathLike) -> str:
    url = os.fspath(url)
    return url if "://" in url else str(Path(url).absolute())


def _day(segment_id: str) -> str:
    m = re.match(r"^(\d{4})(\d{2})(\d{2})T", segment_id)
    return f"{m[1]}-{m[2]}-{m[3]}" if m else ""


def _entry(store_id: str, info, layer, replay: ReplayStatus, version: int) -> EpisodeEntry:
    s = info.start
    events = info.end.events if info.end is not None else []
    return EpisodeEntry(
        store=store_id, episode_id=info.episode_id, task=s.task.task_id, scene=s.task.scene_id or "",
        objects=tuple(s.task.object_ids), operator=s.operator or "", day=_day(info.segment_id),
        parent=s.parent_episode_id, iteration=int(s.iteration), policy_version=s.policy_version or "",
        mode=s.mode.value, num_steps=int(info.num_steps), complete=bool(info.complete),
        end_reason=info.end.end_reason.value, task_success=bool(info.end.task_success), replay_status=replay.value,
        gate_triggers=sum(e.kind == EventKind.GATE_TRIGGER for e in events),
        estops=sum(e.kind == EventKind.ESTOP for e in events),
        failure_modes=tuple(sorted({w.gate_reason for w in layer.windows if w.gate_reason})),
        split="train", added_in=version)


def _read_columns(store, infos: list, fields: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
    """episode_id -> field -> (T,) arrays for many episodes, with a few block reads per segment (bounded memory:
    one block of rows at a time besides the arrays returned)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    if not infos:
        return out
    for i in infos:
        out[i.episode_id] = {}
    names = list(fields)
    for batch in store.iter_batches(65536, episodes=infos, fields=names, shuffle=False, block_rows=65536):
        epi = batch["episode_index"].numpy()
        step = batch["step"].numpy()
        cols = {n: batch[tuple(n.split("/"))].numpy() for n in names}
        order = np.argsort(epi, kind="stable")
        epi, step = epi[order], step[order]
        edges = np.concatenate([[0], np.flatnonzero(np.diff(epi)) + 1, [len(epi)]])
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            if hi <= lo:
                continue
            info = infos[int(epi[lo])]
            d = out[info.episode_id]
            for n in names:
                col = cols[n][order[lo:hi]]
                if n not in d:
                    d[n] = np.zeros((info.num_steps, *col.shape[1:]), col.dtype)
                d[n][step[lo:hi]] = col
    return out


def _classify(kind: str, split: str, split_reason: str, entry: EpisodeEntry, discarded: bool,
              labels: int, allowed: int, blocks: Sequence[str], ok_why: str) -> tuple[str, str]:
    """Usage class and why of one sample (before quotas, deduplication, rounds and retention)."""
    held = split in HELD_OUT
    if not entry.complete:
        return "audit_only", "incomplete episode (never committed): no labels"
    if discarded:
        return "audit_only", "the operator discarded the episode: never training data"
    if kind == "episode":
        if entry.replay_status == ReplayStatus.REPLAY_MISMATCH.value:
            return "audit_only", "replay_mismatch: the rollout does not replay as recorded"
        if held:
            return "evaluation_only", f"rollout of a held-out episode (split {split}: {split_reason})"
        if entry.mode == CollectionMode.EVAL.value:
            return "audit_only", "evaluation rollout in the train split: kept for audit"
        return "replay_only", ("policy rollout: failure context, replayable from its seed; policy actions outside "
                               "windows are never training targets")
    if labels == 0:
        return "audit_only", "no trainable label in range (steps invalid, flagged or of another source)"
    hard = [b for b in blocks if b in HARD_BLOCKS]
    if hard:
        return "audit_only", f"stopped by {', '.join(hard)}"
    if held:
        extra = f"; labels not authorized ({', '.join(blocks)})" if blocks else ""
        return "evaluation_only", f"held out: split {split} ({split_reason}){extra}"
    if blocks:
        return "audit_only", f"unauthorized: {', '.join(blocks)} (kept for audit until a reviewer authorizes it)"
    if allowed == 0:
        return "audit_only", "no label allowed by the training rule"
    return "trainable", ok_why


def _episode_samples(store_id: str, info, layer, entry: EpisodeEntry, rule: TrainingRule, version: int,
                     cols: dict[str, np.ndarray] | None, reviewers: list[str] | None = None) -> list[Sample]:
    """Samples of one episode from its label layer ``layer`` under the contract's training rule and the store's
    reviewer roster ``reviewers``."""
    eid = info.episode_id
    n = entry.num_steps
    split, why_split = entry.split, entry.split_reason
    discarded = info.end is not None and DISCARDED in info.end.quality_flags
    common = dict(store=store_id, episode_id=eid, label_version=int(layer.version), split=split, added_in=version)
    out = [Sample(id=f"{eid}:episode", kind="episode", steps=(0, n), source=ActionSource.POLICY.value,
                  operator=entry.operator,
                  **dict(zip(("usage", "why"), _classify("episode", split, why_split, entry, discarded, 0, 0, (), ""),
                             strict=True)), **common)]
    if not entry.complete or n == 0:
        return out
    sel = training_selection(mask=layer.mask, windows=layer.windows, certifications=layer.certifications,
                             reviews=layer.reviews, qc=layer.qc, replay_status=ReplayStatus(entry.replay_status),
                             operator=info.start.operator, policy_version=info.start.policy_version, rule=rule,
                             reviewers=reviewers)
    src = cols["action_source"] if cols else np.zeros(n, np.uint8)
    bounds = sorted({b for w in layer.windows for b in (w.handover_start, w.handover_end)})
    counting = [c for c in layer.certifications
                if certification_problem(c, operator=info.start.operator,
                                         policy_version=info.start.policy_version) is None]
    inside = np.zeros(n, bool)
    for w in layer.windows:
        inside[w.handover_start:min(w.handover_end, n)] = True

    def block_names(s, e, where=None):
        b = sel.blocks[s:e][sel.labels[s:e] if where is None else where[s:e] & sel.labels[s:e]]
        return tuple(TrainingBlock.names(int(np.bitwise_or.reduce(b))) if len(b) else ())

    for w in layer.windows:
        s, e = w.handover_start, min(w.handover_end, n)
        labels, allowed = int(sel.labels[s:e].sum()), int(sel.allowed[s:e].sum())
        cover = next((c for c in counting if c.step_start <= w.handover_start and w.handover_end <= c.step_end), None)
        d = current_review(layer.reviews, w.window_id)
        ok = (f"certified: {cover.method} by {cover.certifier}" if cover is not None else
              f"approved with training authorization by {d.reviewer if d else '?'}"
              + ("; QC passed" if w.source == ActionSource.HUMAN and rule.require_qc else ""))
        blocks = block_names(s, e)
        usage, why = _classify("window", split, why_split, entry, discarded, labels, allowed, blocks, ok)
        runs = tuple(pure_runs(src, sel.allowed, bounds, s, e)) if allowed else ()
        out.append(Sample(id=f"{eid}:{w.window_id}", kind="window", window_id=w.window_id, steps=(s, e),
                          source=w.source.value, gate_reason=w.gate_reason, operator=w.operator or entry.operator,
                          labels=labels, allowed=allowed, runs=runs, usage=usage, why=why, blocks=blocks,
                          digest=_digest(entry.task, cols, s, e), **common))
    for c in counting:
        s, e = c.step_start, min(c.step_end, n)
        outside = ~inside
        labels = int((sel.labels[s:e] & outside[s:e]).sum())
        if labels == 0:
            continue  # it certifies windows only (an automatic planner's): those are window samples
        allowed_mask = sel.allowed & outside
        allowed = int(allowed_mask[s:e].sum())
        blocks = block_names(s, e, outside)
        usage, why = _classify("certification", split, why_split, entry, discarded, labels, allowed, blocks,
                               f"certified policy steps: {c.method} by {c.certifier}")
        runs = tuple(pure_runs(src, allowed_mask, bounds, s, e)) if allowed else ()
        out.append(Sample(id=f"{eid}:cert:{c.cert_id}", kind="certification", cert_id=c.cert_id, steps=(s, e),
                          source=ActionSource.POLICY.value, operator=entry.operator, labels=labels, allowed=allowed,
                          runs=runs, usage=usage, why=why, blocks=blocks, digest=_digest(entry.task, cols, s, e),
                          **common))
    return out


def _digest(task: str, cols: dict[str, np.ndarray] | None, s: int, e: int) -> str:
    if not cols or "applied_action" not in cols:
        return ""
    h = hashlib.sha1(task.encode())
    h.update(np.ascontiguousarray(cols["action_source"][s:e]).tobytes())
    h.update(np.ascontiguousarray(cols["applied_action"][s:e]).tobytes())
    return h.hexdigest()[:20]


def build(name: str, stores: Sequence[str | os.PathLike], *, root: str | os.PathLike | None = None,
          config: DatasetConfig | None = None, version: int | None = None, author: str = "",
          progress: bool = False) -> tuple[Manifest, bool]:
    """Build dataset_v(N+1) of ``name`` from ``stores`` (plus the stores of vN) and write it, or find that vN is
    current. Returns (manifest, written). Everything is checked before anything is written: missing stores or
    episodes, a split config that cannot be satisfied, leaks, and a ``version`` that exists with other content."""
    if not _NAME.match(name):
        raise DatasetError(f"dataset name {name!r}: use letters, digits, '.', '_' and '-'")
    root = default_root(root, [str(s) for s in stores])
    have = versions(root, name)
    latest = have[-1] if have else 0
    if version is not None and version > latest + 1:
        raise DatasetError(f"{name}@v{version}: the next version of {name} is v{latest + 1}")
    base_v = (version - 1) if version is not None and version <= latest else latest
    parent = read_manifest(manifest_path(root, name, base_v)) if base_v else None
    cfg = config or (parent.config if parent else DatasetConfig())
    if parent is not None:
        check_config_against(cfg.splits, parent.config.splits, f"{name}@v{base_v + 1}")
    new_v = base_v + 1
    manifest = _assemble(name, new_v, [_norm_url(s) for s in stores], cfg, parent, progress)
    manifest = manifest.model_copy(update={
        "author": author, "created_wall": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")})
    manifest = manifest.model_copy(update={"hash": manifest.content_hash()})
    path = manifest_path(root, name, new_v)
    if new_v <= latest:  # rebuilding an existing version: only the same content is accepted
        old = read_manifest(path)
        if old.hash != manifest.hash:
            changed = diff(old, manifest)
            raise DatasetError(f"{name}@v{new_v}: exists with other content (hash {old.hash[:12]}, now "
                               f"{manifest.hash[:12]}: {changed['text']}); a version never changes, build "
                               f"v{latest + 1}")
        return old, False
    if parent is not None and _same_content(parent, manifest):
        return parent, False
    write_exclusive(path, manifest.model_dump_json(indent=1))
    return manifest, True


def _same_content(parent: Manifest, new: Manifest) -> bool:
    """Nothing new: no sample or episode added or changed, no store added."""
    v = new.version
    return (new.stores == parent.stores and not any(e.added_in == v for e in new.episodes)
            and not any(s.added_in == v or s.changed_in == v for s in new.samples))


def _assemble(name: str, version: int, urls: list[str], cfg: DatasetConfig, parent: Manifest | None,
              progress: bool) -> Manifest:
    from tqdm import tqdm

    sel_cfg = cfg.selection
    refs: list[StoreRef] = list(parent.stores) if parent else []
    for u in urls:
        if u not in [r.url for r in refs]:
            refs.append(StoreRef(id=f"s{len(refs)}", url=u))
    if not refs:
        raise DatasetError(f"{name}@v{version}: no store to build from (give --store)")
    opened = _Stores()
    old_eps = {e.key: e for e in (parent.episodes if parent else ())}
    old_samples = {(s.store, s.id): s for s in (parent.samples if parent else ())}
    for key in old_eps:  # what the earlier version names must still be there
        sid, eid = key.split("/", 1)
        st = opened.get(_url(refs, sid))
        if not st.has_episode(eid, refresh=False):
            raise DatasetError(f"{name}@v{version - 1}: names episode {eid}, not in store {st.url}")

    # episodes and their latest label layers
    found: list[tuple[str, Any, Any, EpisodeEntry]] = []
    for ref in refs:
        st = opened.get(ref.url)
        infos = st.episodes(task_id=sel_cfg.task) if sel_cfg.task else st.episodes()
        for info in tqdm(infos, desc=f"catalog {ref.id}", disable=not progress, leave=False):
            layer = st.labels(info.episode_id)
            replay = layer.replay.status if layer.replay is not None else (
                info.end.replay_status if info.complete else ReplayStatus.UNVERIFIED)
            found.append((ref.id, info, layer, _entry(ref.id, info, layer, replay, version)))

    # splits: the earlier version's stay, new episodes are assigned
    inherited = {k: Assignment(e.split, e.split_reason) for k, e in old_eps.items()}
    items = [dataclasses.replace(e.split_item(), recorded=info.start.split.value)
             for _sid, info, _l, e in found if e.key not in old_eps]
    try:
        assigned = assign_splits(items, cfg.splits, inherited)
    except SplitError as exc:
        raise DatasetError(f"{name}@v{version}: {exc}") from None
    entries: dict[str, EpisodeEntry] = {}
    for _sid, _info, _layer, e in found:
        if e.key in old_eps:
            entries[e.key] = old_eps[e.key]
        else:
            a = assigned[e.key]
            entries[e.key] = e.model_copy(update={"split": a.split, "split_reason": a.reason})
    for k, e in old_eps.items():  # filtered out now (another task filter): carried as they were
        entries.setdefault(k, e)

    # samples from the latest layers (action sources and actions read in blocks per store)
    fresh: list[Sample] = []
    for ref in refs:
        st = opened.get(ref.url)
        mine = [(info, layer) for sid, info, layer, _e in found if sid == ref.id]
        need = [info for info, layer in mine if info.complete and (layer.windows or layer.certifications)]
        cols = _read_columns(st, need, ["action_source", "applied_action"])
        for info, layer in tqdm(mine, desc=f"samples {ref.id}", disable=not progress, leave=False):
            e = entries[f"{ref.id}/{info.episode_id}"]
            fresh += _episode_samples(ref.id, info, layer, e, sel_cfg.rule, version, cols.get(info.episode_id),
                                      st.reviewers)

    samples = _carry_and_select(fresh, old_samples, entries, sel_cfg, version)
    placed = [Placed(s.id, entries[s.key].split_item(), s.split, s.usage == "trainable") for s in samples]
    earlier = {k: (e.split, f"{name}@v{version - 1}") for k, e in old_eps.items()}
    problems = leaks(placed, cfg.splits, earlier)
    if problems:
        raise DatasetError(f"{name}@v{version}: leakage between splits: {problems[0]}"
                           + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    eps = tuple(sorted(entries.values(), key=lambda e: (e.store, e.added_in, e.episode_id)))
    return Manifest(name=name, version=version, parent_version=parent.version if parent else None,
                    parent_hash=parent.hash if parent else None, config=cfg, stores=tuple(refs), episodes=eps,
                    samples=tuple(samples), lineage=tuple(_lineage(found, entries, samples, version)),
                    summary=_summary(samples, eps, version))


def _url(refs: Sequence[StoreRef], sid: str) -> str:
    return next(r.url for r in refs if r.id == sid)


def _carry_and_select(fresh: list[Sample], old: dict[tuple[str, str], Sample], entries: dict[str, EpisodeEntry],
                      cfg: SelectionConfig, version: int) -> list[Sample]:
    """vN's samples carried over (revoked ones demoted), new ones added; quotas, deduplication, rounds and
    retention applied to what becomes trainable."""
    out: dict[tuple[str, str], Sample] = {}
    newly: list[tuple[str, str]] = []
    for s in fresh:
        k = (s.store, s.id)
        p = old.get(k)
        if p is None:
            out[k] = s
            if s.usage == "trainable":
                newly.append(k)
        elif p.usage == "trainable":
            if s.usage == "trainable" or not (set(s.blocks) & set(HARD_BLOCKS)):
                out[k] = p
            else:
                out[k] = s.model_copy(update={"added_in": p.added_in, "changed_in": version,
                                              "why": f"revoked in label layer v{s.label_version}: {s.why}"})
        elif (s.usage, s.why) == (p.usage, p.why):
            out[k] = p
        else:
            out[k] = s.model_copy(update={"added_in": p.added_in, "changed_in": version})
            if s.usage == "trainable":
                newly.append(k)
    for k, p in old.items():
        out.setdefault(k, p)

    def demote(k, why):
        s = out[k]
        out[k] = s.model_copy(update={"usage": "replay_only", "why": why,
                                      "changed_in": version if s.added_in != version else s.changed_in})

    iters = [entries[s.key].iteration for s in out.values()]
    newest = max(iters, default=0)
    if cfg.rounds == "recent":
        for k in list(newly):
            it = entries[out[k].key].iteration
            if it <= newest - cfg.recent_rounds:
                demote(k, f"authorized, not selected: round {it} is older than the newest {cfg.recent_rounds} "
                          f"(rounds: recent)")
                newly.remove(k)
    if cfg.dedup:
        seen = {s.digest: s.id for k, s in out.items() if s.usage == "trainable" and s.digest and k not in newly}
        for k in list(newly):
            d = out[k].digest
            if d and d in seen:
                demote(k, f"authorized, not selected: duplicate of sample {seen[d]} (same recorded actions)")
                newly.remove(k)
            elif d:
                seen[d] = out[k].id
    if cfg.quota is not None:
        def stratum(s: Sample) -> tuple[str, ...]:
            e = entries[s.key]
            vals = {"task": e.task, "gate_reason": s.gate_reason, "operator": s.operator}
            return tuple(vals[d] for d in cfg.stratify_by)

        used = Counter(stratum(s) for k, s in out.items() if s.usage == "trainable" and k not in newly)
        order = sorted(newly, key=lambda k: hashlib.sha256(f"{cfg.seed}:{k[1]}".encode()).hexdigest())
        for k in order:
            st = stratum(out[k])
            if used[st] >= cfg.quota:
                label = ", ".join(f"{d}={v!r}" for d, v in zip(cfg.stratify_by, st, strict=True)) or "all"
                demote(k, f"authorized, not selected: quota {cfg.quota} of stratum {label} is full")
            else:
                used[st] += 1
    if cfg.retain_rounds is not None:
        for k, s in out.items():
            it = entries[s.key].iteration
            if s.usage == "trainable" and it <= newest - cfg.retain_rounds:
                demote(k, f"retired by retention: round {it} is older than the newest {cfg.retain_rounds}")
    for k, s in out.items():  # demoted again for the same reason as in vN: vN's sample stands, unchanged
        p = old.get(k)
        if p is not None and s is not p and (s.usage, s.why) == (p.usage, p.why):
            out[k] = p
    return sorted(out.values(), key=lambda s: (s.added_in, s.store, entries[s.key].added_in, s.episode_id,
                                               s.steps[0], s.kind != "episode", s.id))


def _lineage(found, entries, samples: list[Sample], version: int) -> list[RoundLineage]:
    rounds: dict[tuple[str, int, str], dict[str, Any]] = {}
    by_ep: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_ep[s.key].append(s)
    layers = {f"{sid}/{info.episode_id}": layer for sid, info, layer, _e in found}
    for key, e in entries.items():
        r = rounds.setdefault((e.store, e.iteration, e.policy_version), {
            "episodes": 0, "gate_triggers": 0, "windows": 0, "labels": 0, "allowed": 0, "qc": Counter(),
            "replay": Counter(), "usage": Counter(), "added": 0})
        r["episodes"] += 1
        r["gate_triggers"] += e.gate_triggers
        r["replay"][e.replay_status] += 1
        layer = layers.get(key)
        qc_w = {q.window_id: q.passed for q in layer.qc} if layer is not None else {}
        for s in by_ep[key]:
            r["usage"][s.usage] += 1
            r["added"] += int(s.added_in == version or s.changed_in == version)
            if s.kind == "window":
                r["windows"] += 1
                r["qc"]["passed" if qc_w.get(s.window_id) else "failed" if s.window_id in qc_w else "not_run"] += 1
            r["labels"] += s.labels
            r["allowed"] += s.allowed
    return [RoundLineage(store=k[0], iteration=k[1], policy_version=k[2], **{
        **v, "qc": dict(v["qc"]), "replay": dict(v["replay"]), "usage": dict(v["usage"])})
        for k, v in sorted(rounds.items())]


def _summary(samples: Sequence[Sample], eps: Sequence[EpisodeEntry], version: int) -> dict[str, Any]:
    usage = Counter(s.usage for s in samples)
    split = Counter(e.split for e in eps)
    trainable_steps = sum(e - s for x in samples if x.usage == "trainable" for s, e in x.runs)
    return {"samples": len(samples), "episodes": len(eps), "usage": {u: usage.get(u, 0) for u in USAGES},
            "splits": dict(sorted(split.items())), "trainable_steps": trainable_steps,
            "added": sum(s.added_in == version for s in samples),
            "changed": sum(s.changed_in == version for s in samples)}


# ---------------------------------------------------------------------- reading a version


def diff(a: Manifest, b: Manifest) -> dict[str, Any]:
    """What ``b`` adds to, removes from or changes in ``a`` (by sample id), and a one-line text."""
    sa = {(s.store, s.id): s for s in a.samples}
    sb = {(s.store, s.id): s for s in b.samples}
    added = [s for k, s in sb.items() if k not in sa]
    removed = [s for k, s in sa.items() if k not in sb]
    changed = [(sa[k], s) for k, s in sb.items() if k in sa and (sa[k].usage, sa[k].why, sa[k].label_version)
               != (s.usage, s.why, s.label_version)]
    ea = {e.key: e for e in a.episodes}
    moved = [(ea[e.key], e) for e in b.episodes if e.key in ea and ea[e.key].split != e.split]
    add_u = Counter(s.usage for s in added)
    text = (f"+{len(added)} samples ({', '.join(f'{n} {u}' for u, n in sorted(add_u.items())) or 'none'}), "
            f"-{len(removed)}, {len(changed)} changed, {len(moved)} episodes moved between splits")
    return {"from": a.ref, "to": b.ref, "added": added, "removed": removed, "changed": changed, "moved": moved,
            "text": text}


def check(manifest: Manifest, *, stores: bool = True) -> list[str]:
    """Everything wrong with a version, one line each: leaks between splits (naming the episode and both splits),
    stores or episodes it names that are missing, label layers that are gone, and trainable samples whose steps
    the contract's training rule does not allow on the layer they name."""
    entries = {e.key: e for e in manifest.episodes}
    problems = []
    for s in manifest.samples:
        if s.key not in entries:
            problems.append(f"sample {s.id}: names episode {s.episode_id} of store {s.store}, not listed in the manifest")
    placed = [Placed(s.id, entries[s.key].split_item(), s.split, s.usage == "trainable")
              for s in manifest.samples if s.key in entries]
    placed += [Placed(f"{e.episode_id}:entry", e.split_item(), e.split, False) for e in manifest.episodes]
    problems += leaks(placed, manifest.config.splits)
    if not stores:
        return problems
    opened = _Stores()
    for ref in manifest.stores:
        try:
            opened.get(ref.url)
        except StoreError as exc:
            problems.append(f"{manifest.ref}: store {ref.id}: {exc}")
    for s in manifest.samples:
        url = _url(manifest.stores, s.store)
        if url not in opened.open:
            continue
        st = opened.open[url]
        if not st.has_episode(s.episode_id, refresh=False):
            problems.append(f"{manifest.ref}: sample {s.id} names episode {s.episode_id}, not in store {url}")
            continue
        if s.usage != "trainable":
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


def _allowed(store, s: Sample, rule: TrainingRule) -> np.ndarray:
    """The training rule's allowed steps of a sample's episode on the label layer the sample names, under the
    store's reviewer roster as it is now."""
    layer = store.labels(s.episode_id, s.label_version)
    info = store.info(s.episode_id)
    replay = layer.replay.status if layer.replay is not None else info.end.replay_status
    return training_selection(mask=layer.mask, windows=layer.windows, certifications=layer.certifications,
                              reviews=layer.reviews, qc=layer.qc, replay_status=replay, operator=info.start.operator,
                              policy_version=info.start.policy_version, rule=rule,
                              reviewers=store.reviewers).allowed


def trainable_steps(manifest: Manifest) -> dict[tuple[str, str], list[tuple[Sample, list[tuple[int, int]]]]]:
    """(store id, episode id) -> [(sample, runs)] of every trainable sample, in manifest order."""
    out: dict[tuple[str, str], list] = {}
    for s in manifest.samples:
        if s.usage == "trainable":
            out.setdefault((s.store, s.episode_id), []).append((s, list(s.runs)))
    return out


def sequences(manifest: Manifest, length: int, stride: int | None = None,
              usages: Iterable[str] = ("trainable",)) -> list[tuple[str, str, int, int]]:
    """(store id, episode id, start, end) sequences of ``length`` steps for a chunked policy, each inside one run
    of one sample: never across a handover boundary, never mixing action sources."""
    want = set(usages)
    return [(s.store, s.episode_id, a, b) for s in manifest.samples if s.usage in want
            for a, b in cut_sequences(s.runs, length, stride)]


def episode_labels(manifest: Manifest, obs_keys: Sequence[str], *, task: str | None = None,
                   mapping_hash: str | None = None) -> list:
    """The manifest's trainable samples as EpisodeLabels for a Replay: exactly the steps of their runs, with the
    target the label layer each sample names gives. A missing store or episode, or a step that layer does not
    make trainable, is an error naming the sample."""
    from hg_dagger.store.trainable import LABEL_FIELDS, extract_labels

    opened = _Stores()
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
        data["label_mask"], data["label_target"] = mask, target
        try:
            out.append(extract_labels(data, episode_id=eid, obs_keys=obs_keys, iteration=info.start.iteration,
                                      success=bool(info.end.task_success)))
        except ContractError as exc:
            raise DatasetError(f"{manifest.ref}: {exc}") from None
    return out


def export_items(manifest: Manifest, usages: Iterable[str] = ("trainable",)) -> list:
    """ExportItems (hg_dagger.datasets.source) of every episode with a sample of ``usages``: the per-step
    ``trainable`` mask is the trainable samples' runs, the label layer the newest one those samples name."""
    from hg_dagger.datasets.source import ExportItem

    want = set(usages)
    opened = _Stores()
    chosen: dict[tuple[str, str], list[Sample]] = {}
    for s in manifest.samples:
        if s.usage in want:
            chosen.setdefault((s.store, s.episode_id), [])
    for s in manifest.samples:
        if (s.store, s.episode_id) in chosen:
            chosen[(s.store, s.episode_id)].append(s)
    items = []
    for (sid, eid), samples in chosen.items():
        st = opened.get(manifest.store_url(sid))
        if not st.has_episode(eid, refresh=False):
            raise DatasetError(f"{manifest.ref}: sample {samples[0].id} names episode {eid}, not in store {st.url}")
        n = st.info(eid).num_steps
        mask = np.zeros(n, bool)
        for s in samples:
            if s.usage == "trainable":
                for a, b in s.runs:
                    mask[a:b] = True
        items.append(ExportItem(st, eid, trainable=mask, label_version=max(s.label_version for s in samples) or None))
    return items


# ---------------------------------------------------------------------- lineage after training


class TrainedRecord(_M):
    dataset: str
    dataset_hash: str
    policy_version: str
    checkpoint: str
    created_wall: str = ""


def record_training(root: str | os.PathLike, manifest: Manifest, policy_version: str, checkpoint: str) -> Path:
    """Note that ``policy_version`` was trained on this version (ROOT/NAME/trained/vN-<policy>.json, written once)."""
    path = Path(root) / manifest.name / "trained" / f"v{manifest.version}-{policy_version}.json"
    rec = TrainedRecord(dataset=manifest.ref, dataset_hash=manifest.hash, policy_version=policy_version,
                        checkpoint=str(Path(checkpoint).absolute()),
                        created_wall=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))
    try:
        write_exclusive(path, rec.model_dump_json(indent=1))
    except DatasetError:
        pass  # the same policy recorded before (a resumed run): the record stands
    return path


def trained_on(root: str | os.PathLike, manifest: Manifest) -> list[TrainedRecord]:
    folder = Path(root) / manifest.name / "trained"
    out = []
    for p in sorted(folder.glob(f"v{manifest.version}-*.json")) if folder.is_dir() else []:
        try:
            out.append(TrainedRecord.model_validate_json(p.read_text()))
        except (OSError, ValidationError):
            continue
    return out


def chain(root: str | os.PathLike, manifest: Manifest) -> list[str]:
    """The lineage as lines: per round, policy rollouts -> gate events -> windows -> labels -> QC and replay ->
    this version's samples; then the versions before it and the policies trained on it."""
    lines = []
    for r in manifest.lineage:
        qc = ", ".join(f"{k} {v}" for k, v in sorted(r.qc.items())) or "none"
        rp = ", ".join(f"{k} {v}" for k, v in sorted(r.replay.items()))
        use = ", ".join(f"{r.usage.get(u, 0)} {u}" for u in USAGES if r.usage.get(u))
        lines.append(f"policy {r.policy_version or '-'} (round {r.iteration}, store {r.store}): {r.episodes} rollouts "
                     f"-> {r.gate_triggers} gate events -> {r.windows} windows -> {r.labels} labels, {r.allowed} "
                     f"allowed -> QC windows: {qc}; replay: {rp} -> {use} (+{r.added} new or changed in v{manifest.version})")
    parents = []
    v = manifest.parent_version
    while v:
        parents.append(f"v{v}")
        try:
            v = read_manifest(manifest_path(root, manifest.name, v)).parent_version
        except DatasetError:
            break
    su = manifest.summary.get("usage", {})
    lines.append(f"-> {manifest.ref} (hash {manifest.hash[:12]}, {'built on ' + ' <- '.join(parents) if parents else 'first version'}): "
                 f"{su.get('trainable', 0)} trainable samples, {manifest.summary.get('trainable_steps', 0)} trainable "
                 f"steps")
    trained = trained_on(root, manifest)
    if trained:
        for t in trained:
            lines.append(f"-> trained policy {t.policy_version} ({t.checkpoint})")
    else:
        lines.append("-> not trained on yet (train --dataset records it)")
    return lines
