"""Step values as field columns: the one shape and dtype rule a value must meet to be stored under its FieldSpec.

The recorder applies it to put() rows and to put_rows() columns alike; a value that fails it poisons its episode
with the episode, step and field named (field_error), and describe_value() says what came instead.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hg_dagger.contract.schema import FieldSpec
from hg_dagger.errors import ContractError

log = logging.getLogger(__name__)


def as_column(vals: Any, spec: FieldSpec) -> np.ndarray | None:
    """Rows (a list of values, or an (n, ...) array) as an (n, *shape) array of spec's dtype; None if their shape
    or dtype does not fit the field."""
    try:
        col = np.asarray(vals)
    except (ValueError, TypeError):
        return None
    if col.ndim == 0 or col.shape[1:] != tuple(spec.shape) or col.dtype == object:
        return None
    if col.dtype != spec.np_dtype:
        if not np.can_cast(col.dtype, spec.np_dtype, casting="same_kind"):
            return None
        col = col.astype(spec.np_dtype)
    return col


def stack_values(vals: list[Any], spec: FieldSpec) -> np.ndarray | list[Any] | None:
    """(n, *shape) array of spec's dtype, or None if any value has the wrong shape or an incompatible dtype.
    Image fields give a list of n frames instead: the writer copies each frame once, straight into its chunk."""
    if spec.image:
        return _frames(vals, spec)
    return as_column(vals, spec)


def concat_parts(parts: list[Any]) -> Any:
    """One column from the parts stack_values() or as_column() made (camera frames stay a list of arrays)."""
    if len(parts) == 1:
        return parts[0]
    if isinstance(parts[0], list):
        return [frame for p in parts for frame in p]
    return np.concatenate(parts)


def field_error(eid: str, step: int, name: str, spec: FieldSpec, got: str) -> ContractError:
    """The error of a step whose field does not fit its FieldSpec (logged here, raised by the next call)."""
    error = ContractError(f"episode {eid} step {step}: field '{name}' expected shape {tuple(spec.shape)} dtype "
                          f"{spec.dtype}, got {got}; the episode stays incomplete")
    log.error("%s", error)
    return error


def describe_value(v: Any) -> str:
    """What a value that failed the rule is, for field_error's message; never raises, even on ragged nesting."""
    try:
        a = np.asarray(v)
    except (ValueError, TypeError):
        return f"a {type(v).__name__} that is no array"
    return f"shape {a.shape} dtype {a.dtype}"


def _frames(vals: list[Any], spec: FieldSpec) -> list[Any] | None:
    shape, dtype = tuple(spec.shape), spec.np_dtype
    out = []
    for v in vals:
        if not (isinstance(v, np.ndarray) and v.shape == shape and v.dtype == dtype):
            try:
                a = np.asarray(v)
            except (ValueError, TypeError):
                return None
            if a.shape != shape or a.dtype == object or not np.can_cast(a.dtype, dtype, casting="same_kind"):
                return None
            v = a.astype(dtype, copy=False)
        out.append(v)
    return out
