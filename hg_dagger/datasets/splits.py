"""Splits of a dataset version and the leakage check (seed 002: holdouts isolated by task, scene / object,
operator and time period; the windows before and after a handover of one original episode never in different
splits; an unseen-operator or unseen-failure-mode evaluation removes those from training).

The unit of assignment is a *group*: episodes connected by a shared value of an isolated dimension
(``SplitConfig.isolate``: task, scene, object, operator, day) or by a parent link (``EpisodeStart.parent_episode_id``)
are one group, and a group lies in exactly one split, so every sample of an episode (its windows, its
certified spans, its rollout context) does too. A group goes to ``holdout`` when one of its episodes matches
``SplitConfig.holdout`` (named tasks, scenes, objects, operators, failure modes, a recording period), else to
the split its recorded ``EpisodeStart.split`` names (val, test, holdout), else by a salted hash of its smallest
episode key: ``val`` below ``val_fraction``, ``test`` below ``val_fraction + test_fraction``, else ``train``.

Across versions a split never changes: an episode in dataset_vN keeps its split in every later version, and a
new episode joining a group of vN takes that group's split.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from pydantic import Field, model_validator

from hg_dagger.contract.enums import HELD_OUT_SPLITS, Split
from hg_dagger.contract.model import FrozenModel
from hg_dagger.errors import ConfigError, HgDaggerError

SPLITS = tuple(s.value for s in Split if s is not Split.UNASSIGNED)  # what a split rule assigns
HELD_OUT = tuple(s.value for s in HELD_OUT_SPLITS)
Dimension = Literal["task", "scene", "object", "operator", "day"]


class SplitError(HgDaggerError):
    """A split config that cannot be satisfied by the episodes at hand, or a leak between splits."""


class Period(FrozenModel):
    """Recording days ``[start, end)`` (UTC, the day a segment was recorded); an open side is unbounded."""

    start: _dt.date | None = None
    end: _dt.date | None = None

    def contains(self, day: str) -> bool:
        if not day:
            return False
        d = _dt.date.fromisoformat(day)
        return (self.start is None or d >= self.start) and (self.end is None or d < self.end)


class Holdout(FrozenModel):
    """Episodes matching any entry go to the ``holdout`` split, with their whole group; none may train.
    ``operators`` is the unseen-operator holdout, ``failure_modes`` (gate reasons of windows) the
    unseen-failure-mode one."""

    tasks: tuple[str, ...] = ()
    scenes: tuple[str, ...] = ()
    objects: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    failure_modes: tuple[str, ...] = ()
    period: Period | None = None

    @property
    def empty(self) -> bool:
        return not (self.tasks or self.scenes or self.objects or self.operators or self.failure_modes or self.period)


class SplitConfig(FrozenModel):
    """How a dataset's episodes are split. Fixed for a dataset name: every version uses its first's."""

    val_fraction: float = Field(default=0.0, ge=0.0, lt=1.0, description="share of groups in val")
    test_fraction: float = Field(default=0.0, ge=0.0, lt=1.0, description="share of groups in test")
    isolate: tuple[Dimension, ...] = Field(default=(), description="dimensions whose values never span two splits")
    holdout: Holdout = Field(default_factory=Holdout)
    keep_recorded: bool = Field(default=True, description="an episode recorded with split val/test/holdout keeps it")
    seed: int = 0

    @model_validator(mode="after")
    def _fractions(self):
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(f"val_fraction {self.val_fraction:g} + test_fraction {self.test_fraction:g} leaves no "
                             "room for train (must be < 1)")
        return self


@dataclass(frozen=True)
class SplitItem:
    """What splitting needs to know of one episode (key: unique across the dataset, e.g. "s0/<episode_id>")."""

    key: str
    episode_id: str
    task: str = ""
    scene: str = ""
    objects: tuple[str, ...] = ()
    operator: str = ""
    day: str = ""  # ISO date of the recording (UTC)
    parent: str | None = None  # key of the episode it branches from
    failure_modes: tuple[str, ...] = ()
    recorded: str = "unassigned"  # EpisodeStart.split

    def values(self, dim: str) -> tuple[str, ...]:
        if dim == "object":
            return tuple(self.objects)
        return (getattr(self, dim),) if getattr(self, dim) else ()


@dataclass
class Assignment:
    split: str
    reason: str


@dataclass
class _Groups:
    parent: dict[str, str] = field(default_factory=dict)

    def find(self, k: str) -> str:
        root = k
        while self.parent.setdefault(root, root) != root:
            root = self.parent[root]
        while self.parent[k] != root:
            self.parent[k], k = root, self.parent[k]
        return root

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def _hash01(seed: int, key: str) -> float:
    return int(hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()[:12], 16) / float(1 << 48)


def holdout_match(item: SplitItem, h: Holdout) -> str | None:
    """Why ``item`` belongs to the holdout, or None."""
    for dim, names in (("task", h.tasks), ("scene", h.scenes), ("object", h.objects), ("operator", h.operators)):
        hit = sorted(set(item.values(dim)) & set(names))
        if hit:
            what = "unseen operator" if dim == "operator" else f"held-out {dim}"
            return f"{what} {hit[0]!r}"
    hit = sorted(set(item.failure_modes) & set(h.failure_modes))
    if hit:
        return f"unseen failure mode {hit[0]!r}"
    if h.period is not None and h.period.contains(item.day):
        return f"recorded {item.day}, in the held-out period"
    return None


def assign_splits(items: Iterable[SplitItem], config: SplitConfig,
                  inherited: Mapping[str, Assignment] | None = None) -> dict[str, Assignment]:
    """The split of every item (and of the inherited ones, unchanged). Raises SplitError when the config cannot
    be satisfied: a holdout value no episode has, a fraction no group can fill, or a new episode that joins groups
    already in different splits."""
    inherited = dict(inherited or {})
    items = list(items)
    groups = _Groups()
    by_value: dict[tuple[str, str], str] = {}
    keys = {i.key for i in items} | set(inherited)
    for it in items:
        groups.find(it.key)
        for dim in config.isolate:
            for v in it.values(dim):
                first = by_value.setdefault((dim, v), it.key)
                groups.union(first, it.key)
        if it.parent is not None and it.parent in keys:
            groups.union(it.parent, it.key)
    for k in inherited:
        groups.find(k)
    members: dict[str, list[str]] = defaultdict(list)
    for k in keys:
        members[groups.find(k)].append(k)
    item_by_key = {i.key: i for i in items}

    _check_holdout_names(items, config.holdout)
    out: dict[str, Assignment] = dict(inherited)
    fresh: list[tuple[float, str]] = []  # (hash, root) of groups to split by hash
    for root, ks in sorted(members.items()):
        old = {inherited[k].split: k for k in ks if k in inherited}
        new = [k for k in ks if k not in inherited]
        if len(old) > 1:
            (s1, k1), (s2, k2) = sorted(old.items())[:2]
            joiner = next((k for k in new), None)
            raise SplitError(f"episode {_eid(joiner, item_by_key)} joins episodes already in two splits: "
                             f"{_eid(k1, item_by_key)} in {s1} and {_eid(k2, item_by_key)} in {s2} (isolated by "
                             f"{', '.join(config.isolate) or 'parent episode'}); the split config cannot be satisfied")
        if not new:
            continue
        if old:
            (split, via), = old.items()
            for k in new:
                held = holdout_match(item_by_key[k], config.holdout)
                if held and split != Split.HOLDOUT:
                    raise SplitError(f"episode {_eid(k, item_by_key)} ({held}) must be held out, but its group is "
                                     f"already in {split} through episode {_eid(via, item_by_key)}")
                out[k] = Assignment(split, f"group of {_eid(via, item_by_key)} (in {split} since an earlier version)")
            continue
        reason = next((r for r in (holdout_match(item_by_key[k], config.holdout) for k in sorted(new)) if r), None)
        if reason:
            for k in new:
                out[k] = Assignment(Split.HOLDOUT.value, reason)
            continue
        recorded = sorted({item_by_key[k].recorded for k in new} & set(HELD_OUT)) if config.keep_recorded else []
        if recorded:
            for k in new:
                out[k] = Assignment(recorded[-1], f"recorded split {recorded[-1]}")
            continue
        fresh.append((_hash01(config.seed, min(new)), root))
    _split_by_hash(fresh, members, config, out, inherited)
    return out


def _eid(key: str | None, items: Mapping[str, SplitItem]) -> str:
    if key is None:
        return "?"
    it = items.get(key)
    return it.episode_id if it else key.rsplit("/", 1)[-1]


def _check_holdout_names(items: list[SplitItem], h: Holdout) -> None:
    if not items:
        return
    for dim, names in (("task", h.tasks), ("scene", h.scenes), ("object", h.objects), ("operator", h.operators)):
        have = {v for it in items for v in it.values(dim)}
        missing = [n for n in names if n not in have]
        if missing:
            raise SplitError(f"holdout.{dim}s: no episode has {dim} {missing[0]!r} (known: "
                             f"{', '.join(sorted(have)[:10]) or 'none'}); the split config cannot be satisfied")
    have = {f for it in items for f in it.failure_modes}
    missing = [n for n in h.failure_modes if n not in have]
    if missing:
        raise SplitError(f"holdout.failure_modes: no window has gate reason {missing[0]!r} (known: "
                         f"{', '.join(sorted(have)[:10]) or 'none'}); the split config cannot be satisfied")


def _split_by_hash(fresh, members, config: SplitConfig, out: dict[str, Assignment], inherited) -> None:
    """Hash each new group into val / test / train; then every split asked for (and train) that is still empty
    takes a group from a split that keeps one, or the config cannot be satisfied."""
    v, t = config.val_fraction, config.test_fraction
    what = f"group ({', '.join(config.isolate)})" if config.isolate else "episode"
    chosen: dict[str, str] = {}
    for h, root in sorted(fresh):
        chosen[root] = (Split.VAL if h < v else Split.TEST if h < v + t else Split.TRAIN).value
    wanted = [Split.TRAIN.value] + [s.value for s, f in ((Split.VAL, v), (Split.TEST, t)) if f > 0]
    old = {a.split for a in inherited.values()}
    if fresh:
        for s in wanted:
            if s in old or s in chosen.values():
                continue
            counts: defaultdict[str, int] = defaultdict(int)
            for r in chosen.values():
                counts[r] += 1
            donor = next((root for _h, root in sorted(fresh)
                          if chosen[root] != s and (counts[chosen[root]] > 1 or chosen[root] in old)), None)
            if donor is None:
                n = len(fresh)
                raise SplitError(f"{n} {what}{'s' if n != 1 else ''} cannot fill {' + '.join(wanted)} (val_fraction "
                                 f"{v:g}, test_fraction {t:g}); the split config cannot be satisfied: record more "
                                 "episodes or isolate fewer dimensions")
            chosen[donor] = s
    for root, split in chosen.items():
        why = f"hash of the {what}" + ("" if split == Split.TRAIN else f" ({split} share)")
        for k in members[root]:
            if k not in inherited:
                out[k] = Assignment(split, why)


# ---------------------------------------------------------------------- leakage check


@dataclass(frozen=True)
class Placed:
    """One sample as the leakage check sees it."""

    sample_id: str
    episode: SplitItem
    split: str
    trainable: bool


def leaks(placed: Iterable[Placed], config: SplitConfig, earlier: Mapping[str, tuple[str, str]] | None = None) -> list[str]:
    """Every way the placed samples leak between splits, one line each naming the episode and both splits:
    an episode (or its windows) in two splits; a parent and its branch in two; a value of an isolated dimension in
    two; a held-out episode (unseen operator, failure mode, ...) or any held-out sample trainable; an episode whose
    split differs from an earlier version's (``earlier``: key -> (split, version label))."""
    out: list[str] = []
    first: dict[str, Placed] = {}
    by_value: dict[tuple[str, str], Placed] = {}
    episodes: dict[str, Placed] = {}
    for p in placed:
        k = p.episode.key
        seen = first.setdefault(k, p)
        if seen.split != p.split:
            out.append(f"episode {p.episode.episode_id}: in split {seen.split} (sample {seen.sample_id}) and split "
                       f"{p.split} (sample {p.sample_id})")
        episodes.setdefault(k, p)
        if p.trainable and p.split != Split.TRAIN:
            out.append(f"episode {p.episode.episode_id}: sample {p.sample_id} is trainable in split {p.split}; "
                       "held-out samples never train")
        held = holdout_match(p.episode, config.holdout)
        if held and p.split != Split.HOLDOUT:
            out.append(f"episode {p.episode.episode_id}: {held} is in split {p.split}, must be in split holdout")
        for dim in config.isolate:
            for v in p.episode.values(dim):
                other = by_value.setdefault((dim, v), p)
                if other.split != p.split:
                    out.append(f"episode {p.episode.episode_id}: {dim} {v!r} in split {p.split} and in split "
                               f"{other.split} (episode {other.episode.episode_id})")
    for k, p in episodes.items():
        parent = episodes.get(p.episode.parent) if p.episode.parent else None
        if parent is not None and parent.split != p.split:
            out.append(f"episode {p.episode.episode_id}: in split {p.split}, its parent episode "
                       f"{parent.episode.episode_id} in split {parent.split}")
        if earlier and k in earlier and earlier[k][0] != p.split:
            out.append(f"episode {p.episode.episode_id}: in split {p.split}, but in split {earlier[k][0]} in "
                       f"{earlier[k][1]}")
    return list(dict.fromkeys(out))


def check_config_against(config: SplitConfig, parent: SplitConfig | None, where: str) -> None:
    """A dataset keeps its first version's split config: changing it would move episodes between splits."""
    if parent is not None and config != parent:
        raise ConfigError(f"{where}: split config differs from the earlier version's (a split never changes within "
                          "a dataset); build a new dataset name for other splits")
