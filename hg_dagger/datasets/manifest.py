"""A dataset version's manifest: the pydantic models (its build config, stores, episodes, samples, lineage and
summary), its content hash, and reading and writing a manifest file with every check a reader relies on
(docs/datasets.md, "The manifest").

A sample is one correction window, one certified span of policy steps outside windows, or one episode's
rollout (its context); it names its store, episode, label layer version, window or certification and step
range, and carries its usage class and why.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError

from hg_dagger import config as cfgmod
from hg_dagger.contract import ReplayStatus, TrainingRule
from hg_dagger.contract.enums import Usage
from hg_dagger.contract.model import FrozenModel
from hg_dagger.datasets.splits import SplitConfig, SplitItem
from hg_dagger.errors import HgDaggerError

FORMAT = "hg_dagger.dataset"
FORMAT_VERSION = 1
USAGES: tuple[Usage, ...] = tuple(Usage)  # the order summaries and reports list them in


class DatasetError(HgDaggerError):
    """A dataset version cannot be built, read or used (names the dataset, version, sample, episode or file)."""


# ---------------------------------------------------------------------- configuration


class SelectionConfig(FrozenModel):
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


class DatasetConfig(FrozenModel):
    """A dataset's build config (a YAML file with ``kind: dataset``)."""

    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    splits: SplitConfig = Field(default_factory=SplitConfig)


def load_config(path: str | Path) -> DatasetConfig:
    data = cfgmod.read_yaml(path)
    kind = data.pop("kind", "dataset")
    if kind != "dataset":
        raise DatasetError(f"{path}: kind is {kind!r}, expected 'dataset'")
    return cfgmod.validate(DatasetConfig, data, source=str(path))


# ---------------------------------------------------------------------- the manifest


class StoreRef(FrozenModel):
    id: str  # s0, s1, ... (what samples name)
    url: str


class EpisodeEntry(FrozenModel):
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


class Sample(FrozenModel):
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


class RoundLineage(FrozenModel):
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


class Manifest(FrozenModel):
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
    why = _incoherent(m)
    if why:
        raise DatasetError(f"{p}: inconsistent manifest: {why} (a manifest is written whole by dataset build; this "
                           "one was edited)")
    return m



def _incoherent(m: Manifest) -> str | None:
    """What in a manifest whose hash matches contradicts the rest of it (a hand edit that re-hashed it): the
    readers rely on every sample naming a listed store and episode, on step ranges inside their episode and
    on the summary being the one its samples give."""
    if m.parent_version is not None and not 1 <= m.parent_version < m.version:
        return f"parent version v{m.parent_version} is not an earlier version of v{m.version}"
    ids = [s.id for s in m.stores]
    if len(set(ids)) != len(ids):
        return f"store ids {', '.join(ids)} repeat"
    entries: dict[str, EpisodeEntry] = {}
    for e in m.episodes:
        if e.store not in ids:
            return f"episode {e.episode_id} names store {e.store!r}, not one of its stores ({', '.join(ids) or 'none'})"
        if e.num_steps < 0:
            return f"episode {e.episode_id} has {e.num_steps} steps"
        entries[e.key] = e
    for s in m.samples:
        if s.store not in ids:
            return f"sample {s.id} names store {s.store!r}, not one of its stores ({', '.join(ids) or 'none'})"
        entry = entries.get(s.key)
        if entry is None:
            return f"sample {s.id} names episode {s.episode_id} of store {s.store}, not listed in the manifest"
        a, b = s.steps
        if not 0 <= a <= b <= entry.num_steps:
            return f"sample {s.id}: steps [{a}, {b}) are not inside episode {s.episode_id}'s {entry.num_steps} steps"
        for lo, hi in s.runs:
            if not a <= lo < hi <= b:
                return f"sample {s.id}: run [{lo}, {hi}) is not inside its steps [{a}, {b})"
    if m.summary != json.loads(json.dumps(summarize(m.samples, m.episodes, m.version))):
        return "its summary is not the one its samples and episodes give"
    return None


def summarize(samples: Sequence[Sample], eps: Sequence[EpisodeEntry], version: int) -> dict[str, Any]:
    """The counts a manifest's ``summary`` holds (every read compares them with its samples and episodes)."""
    usage = Counter(s.usage for s in samples)
    split = Counter(e.split for e in eps)
    trainable_steps = sum(e - s for x in samples if x.usage == Usage.TRAINABLE for s, e in x.runs)
    return {"samples": len(samples), "episodes": len(eps), "usage": {u.value: usage.get(u, 0) for u in USAGES},
            "splits": dict(sorted(split.items())), "trainable_steps": trainable_steps,
            "added": sum(s.added_in == version for s in samples),
            "changed": sum(s.changed_in == version for s in samples)}



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
