"""Where dataset versions live and how they are named: the dataset folder (ROOT), refs NAME@vN, listing and
loading versions, and the lineage after training (which policies were trained on a version).

    ROOT/NAME/v1.json, v2.json, ...            one manifest per version, created exclusively, never rewritten
    ROOT/NAME/trained/v2-<policy_version>.json  a policy trained on v2 (written by `train --dataset NAME@v2`)

ROOT is ``--root``, else the folder ``datasets`` beside the (first) store.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from hg_dagger.contract.clock import wall_stamp
from hg_dagger.contract.model import FrozenModel
from hg_dagger.datasets.manifest import USAGES, DatasetError, Manifest, read_manifest, write_exclusive

_REF = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99})(@v(?P<version>\d+))?$")


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



class TrainedRecord(FrozenModel):
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
                        created_wall=wall_stamp())
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
