"""The student checkpoint file: one torch file with weights, normalization, mapping hash and lineage.

Layout (a plain dict, loadable with ``torch.load(weights_only=True)``)::

    format, kind: "hg_dagger.student", spec, state_dict (incl. normalization buffers),
    round, version, seed, lineage, mapping: {task_id, hash}, extra: {...}

``extra`` carries whatever a trainer needs to resume (optimizer state, iteration, beta, replay
state); a policy-only reader ignores it. ``extra["gate_thresholds"]`` holds the gate thresholds
calibrated for this student when it was trained (``Student.gate_thresholds``): every session that
loads the student starts from them, so a relaunch keeps the gate it had. Files are written atomically (temp file + rename), so a
reader polling a snapshot path never sees a half-written file. The network itself is policy.student's; this
module knows only the dict, so the student can read and write it without a cycle.
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from hg_dagger.errors import ConfigError, ContractError

FORMAT = 1
KIND = "hg_dagger.student"


def _payload(student, extra: dict[str, Any]) -> dict[str, Any]:
    if getattr(student, "gate_thresholds", None) and "gate_thresholds" not in extra:
        extra = {**extra, "gate_thresholds": student.gate_thresholds}
    return {
        "format": FORMAT,
        "kind": KIND,
        "spec": student.spec.as_dict(),
        "state_dict": {k: v.detach().cpu().clone() for k, v in student.net.state_dict().items()},
        "round": student.round,
        "version": student.version,
        "seed": student.seed,
        "lineage": list(student.lineage),
        "mapping": {"task_id": student.mapping.task_id, "hash": student.mapping.hash},
        "extra": extra,
    }


def save_checkpoint(path: str | os.PathLike, student, **extra: Any) -> Path:
    """Write atomically. A failed write (full disk) removes its temporary file and raises OSError naming ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:  # through a Python file, a full disk surfaces as OSError(ENOSPC), not torch's
            torch.save(_payload(student, extra), fh)  # RuntimeError
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    return path


def store_gate_thresholds(path: str | os.PathLike, thresholds: dict[str, Any]) -> Path:
    """Write ``thresholds`` into the checkpoint at ``path`` (atomically; weights and version unchanged)."""
    data = read_checkpoint(path)
    data["extra"] = {**data.get("extra", {}), "gate_thresholds": thresholds}
    return _rewrite(Path(path), data)


def record_promotion(path: str | os.PathLike, decision: dict[str, Any]) -> Path:
    """Write a promotion decision (learn.promotion) into the lineage entry of the checkpoint's own round, as a
    session-trained round records it in memory (atomically; weights and version unchanged)."""
    data = read_checkpoint(path)
    lineage = list(data.get("lineage") or [])
    if lineage:
        last = dict(lineage[-1])
        last["info"] = {**last.get("info", {}), "promotion": dict(decision)}
        lineage[-1] = last
    data["lineage"] = lineage
    return _rewrite(Path(path), data)


def _rewrite(path: Path, data: dict[str, Any]) -> Path:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            torch.save(data, fh)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    return path


def snapshot_bytes(student, **extra: Any) -> bytes:
    """The same payload as a file, as bytes (for handing a policy to another process)."""
    buf = io.BytesIO()
    torch.save(_payload(student, extra), buf)
    return buf.getvalue()


def read_checkpoint(source: str | os.PathLike | bytes) -> dict[str, Any]:
    """The raw checkpoint dict; raises ConfigError naming the file if it is missing or not a checkpoint."""
    where = "<bytes>" if isinstance(source, bytes) else str(source)
    if not isinstance(source, bytes) and not Path(source).is_file():
        raise ConfigError(f"{where}: no such checkpoint file")
    try:
        data = torch.load(io.BytesIO(source) if isinstance(source, bytes) else source,
                          map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        detail = type(exc).__name__ if isinstance(exc, pickle.UnpicklingError) else \
            f"{type(exc).__name__}: {first_line(exc)}"  # torch's unpickling text is advice about weights_only
        raise ConfigError(f"{where}: not a readable student checkpoint, truncated or corrupt ({detail})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ConfigError(f"{where}: not a student checkpoint (missing kind {KIND!r})")
    if data.get("format") != FORMAT:
        raise ConfigError(f"{where}: checkpoint format {data.get('format')!r} is not supported (supported: {FORMAT})")
    for key, kind in _REQUIRED.items():
        if not isinstance(data.get(key), kind):
            raise ConfigError(f"{where}: corrupt student checkpoint (key {key!r} is missing or not a {kind.__name__})")
    if not all(isinstance(data["mapping"].get(k), str) for k in ("task_id", "hash")):
        raise ConfigError(f"{where}: corrupt student checkpoint (key 'mapping' lacks task_id or hash)")
    return data


_REQUIRED = {"spec": dict, "state_dict": dict, "round": int, "version": str, "seed": int, "lineage": list,
             "mapping": dict}


def first_line(exc: Exception) -> str:
    """The gist of a library's exception text, on one line (torch's run over many)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    return text if len(text) <= 200 else text[:197] + "..."


def check_mapping(data: dict[str, Any], mapping, *, where: str) -> None:
    saved = data["mapping"]
    if saved["hash"] != mapping.hash:
        raise ContractError(
            f"{where}: checkpoint was trained for task {saved['task_id']!r} (mapping hash {saved['hash']}); "
            f"it cannot act under task {mapping.task_id!r} (mapping hash {mapping.hash}) - observation "
            f"or action semantics differ"
        )
