"""Building a dataset version from stores and a config: the episodes and their splits, the samples of each
episode's latest label layer with their usage class and why, what carries over from vN, and the selection
(quotas, deduplication, rounds, retention) on top.

dataset_v(N+1) is dataset_vN plus the newly selected increment: every sample of vN is carried over as it is
(its label layer version pinned) unless the latest label layer revokes it (a rejection, a failed QC result, a
replay mismatch) or retention retires it, which the new version records; earlier versions never change. Which
trainable labels may be trained on is decided by the contract's one rule, ``contract.training_selection``, on
the label layer the sample names (docs/datasets.md, "Selection").
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    EventKind,
    ReplayStatus,
    TrainingBlock,
    TrainingRule,
    current_review,
    training_selection,
)
from hg_dagger.contract.clock import wall_stamp
from hg_dagger.contract.enums import Usage
from hg_dagger.contract.labels import DISCARDED, certification_problem
from hg_dagger.datasets.manifest import (
    DatasetConfig,
    DatasetError,
    EpisodeEntry,
    Manifest,
    RoundLineage,
    Sample,
    SelectionConfig,
    StoreRef,
    diff,
    read_manifest,
    summarize,
    write_exclusive,
)
from hg_dagger.datasets.read import OpenStores, void_authorization
from hg_dagger.datasets.repository import default_root, manifest_path, versions
from hg_dagger.datasets.sequences import pure_runs
from hg_dagger.datasets.splits import (
    HELD_OUT,
    Assignment,
    Placed,
    SplitError,
    assign_splits,
    check_config_against,
    leaks,
)
from hg_dagger.errors import StoreError

HARD_BLOCKS = ("rejected", "needs_fix", "qc_failed", "replay_mismatch")  # never trainable without a new decision
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


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
              labels: int, allowed: int, blocks: Sequence[str], ok_why: str) -> tuple[Usage, str]:
    """Usage class and why of one sample (before quotas, deduplication, rounds and retention)."""
    held = split in HELD_OUT
    if not entry.complete:
        return Usage.AUDIT_ONLY, "incomplete episode (never committed): no labels"
    if discarded:
        return Usage.AUDIT_ONLY, "the operator discarded the episode: never training data"
    if kind == "episode":
        if entry.replay_status == ReplayStatus.REPLAY_MISMATCH.value:
            return Usage.AUDIT_ONLY, "replay_mismatch: the rollout does not replay as recorded"
        if held:
            return Usage.EVALUATION_ONLY, f"rollout of a held-out episode (split {split}: {split_reason})"
        if entry.mode == CollectionMode.EVAL.value:
            return Usage.AUDIT_ONLY, "evaluation rollout in the train split: kept for audit"
        return Usage.REPLAY_ONLY, ("policy rollout: failure context, replayable from its seed; policy actions outside "
                               "windows are never training targets")
    if labels == 0:
        return Usage.AUDIT_ONLY, "no trainable label in range (steps invalid, flagged or of another source)"
    hard = [b for b in blocks if b in HARD_BLOCKS]
    if hard:
        return Usage.AUDIT_ONLY, f"stopped by {', '.join(hard)}"
    if held:
        extra = f"; labels not authorized ({', '.join(blocks)})" if blocks else ""
        return Usage.EVALUATION_ONLY, f"held out: split {split} ({split_reason}){extra}"
    if blocks:
        return Usage.AUDIT_ONLY, f"unauthorized: {', '.join(blocks)} (kept for audit until a reviewer authorizes it)"
    if allowed == 0:
        return Usage.AUDIT_ONLY, "no label allowed by the training rule"
    return Usage.TRAINABLE, ok_why


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
        "author": author, "created_wall": wall_stamp()})
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
    sel_cfg = cfg.selection
    refs: list[StoreRef] = list(parent.stores) if parent else []
    for u in urls:
        if u not in [r.url for r in refs]:
            refs.append(StoreRef(id=f"s{len(refs)}", url=u))
    if not refs:
        raise DatasetError(f"{name}@v{version}: no store to build from (give --store)")
    opened = OpenStores()
    for ref in refs:  # a store the earlier version names may be gone: say which version names it
        try:
            opened.get(ref.url)
        except StoreError as exc:
            named_by = parent.ref if parent is not None and ref in parent.stores else None
            raise DatasetError(f"{name}@v{version}: store {ref.id}" + (f" (named by {named_by})" if named_by is not None else "")
                               + f": {exc}") from None
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

    # vN's trainable samples whose authorization counts for nothing now (an older release's self-approval, a
    # reviewer since off the roster) are not carried as they are
    void: dict[tuple[str, str], str] = {}
    for sample_key, p in old_samples.items():
        why = void_authorization(opened.get(_url(refs, p.store)), p, sel_cfg.rule)
        if why is not None:
            void[sample_key] = why
    samples = _carry_and_select(fresh, old_samples, entries, sel_cfg, version, void)
    placed = [Placed(s.id, entries[s.key].split_item(), s.split, s.usage == Usage.TRAINABLE) for s in samples]
    earlier = {k: (e.split, f"{name}@v{version - 1}") for k, e in old_eps.items()}
    problems = leaks(placed, cfg.splits, earlier)
    if problems:
        raise DatasetError(f"{name}@v{version}: leakage between splits: {problems[0]}"
                           + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    eps = tuple(sorted(entries.values(), key=lambda e: (e.store, e.added_in, e.episode_id)))
    return Manifest(name=name, version=version, parent_version=parent.version if parent else None,
                    parent_hash=parent.hash if parent else None, config=cfg, stores=tuple(refs), episodes=eps,
                    samples=tuple(samples), lineage=tuple(_lineage(found, entries, samples, version)),
                    summary=summarize(samples, eps, version))


def _url(refs: Sequence[StoreRef], sid: str) -> str:
    return next(r.url for r in refs if r.id == sid)


def _carry_and_select(fresh: list[Sample], old: dict[tuple[str, str], Sample], entries: dict[str, EpisodeEntry],
                      cfg: SelectionConfig, version: int, void: dict[tuple[str, str], str] | None = None) -> list[Sample]:
    """vN's samples carried over (revoked ones demoted, and those whose authorization is ``void`` replaced by
    their fresh sample), new ones added; quotas, deduplication, rounds and retention applied to what becomes
    trainable."""
    void = void or {}
    out: dict[tuple[str, str], Sample] = {}
    newly: list[tuple[str, str]] = []
    for s in fresh:
        k = (s.store, s.id)
        p = old.get(k)
        if p is None:
            out[k] = s
            if s.usage == Usage.TRAINABLE:
                newly.append(k)
        elif k in void:
            why = s.why if s.usage == Usage.TRAINABLE else (
                f"revoked: its authorization in label layer v{p.label_version} counts for nothing ({void[k]}); "
                f"now {s.why}")
            out[k] = s.model_copy(update={"added_in": p.added_in, "changed_in": version, "why": why})
        elif p.usage == Usage.TRAINABLE:
            if s.usage == Usage.TRAINABLE or not (set(s.blocks) & set(HARD_BLOCKS)):
                out[k] = p
            else:
                out[k] = s.model_copy(update={"added_in": p.added_in, "changed_in": version,
                                              "why": f"revoked in label layer v{s.label_version}: {s.why}"})
        elif (s.usage, s.why) == (p.usage, p.why):
            out[k] = p
        else:
            out[k] = s.model_copy(update={"added_in": p.added_in, "changed_in": version})
            if s.usage == Usage.TRAINABLE:
                newly.append(k)
    for k, p in old.items():
        if k in void and k not in out:  # not in the stores' catalog now (a task filter): demoted as it was
            out[k] = p.model_copy(update={"usage": Usage.AUDIT_ONLY, "runs": (), "allowed": 0, "changed_in": version,
                                          "why": f"revoked: its authorization in label layer v{p.label_version} "
                                                 f"counts for nothing ({void[k]})"})
        out.setdefault(k, p)

    def demote(k, why):
        s = out[k]
        out[k] = s.model_copy(update={"usage": Usage.REPLAY_ONLY, "why": why,
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
        seen = {s.digest: s.id for k, s in out.items() if s.usage == Usage.TRAINABLE and s.digest and k not in newly}
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

        used = Counter(stratum(s) for k, s in out.items() if s.usage == Usage.TRAINABLE and k not in newly)
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
            if s.usage == Usage.TRAINABLE and it <= newest - cfg.retain_rounds:
                demote(k, f"retired by retention: round {it} is older than the newest {cfg.retain_rounds}")
    for k, s in out.items():  # demoted again for the same reason as in vN: vN's sample stands, unchanged
        p = old.get(k)
        if p is not None and k not in void and s is not p and (s.usage, s.why) == (p.usage, p.why):
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
            r["usage"][str(s.usage)] += 1
            r["added"] += int(s.added_in == version or s.changed_in == version)
            if s.kind == "window":
                r["windows"] += 1
                r["qc"]["passed" if qc_w.get(s.window_id) else "failed" if s.window_id in qc_w else "not_run"] += 1
            r["labels"] += s.labels
            r["allowed"] += s.allowed
    return [RoundLineage(store=k[0], iteration=k[1], policy_version=k[2], **{
        **v, "qc": dict(v["qc"]), "replay": dict(v["replay"]), "usage": dict(v["usage"])})
        for k, v in sorted(rounds.items())]
