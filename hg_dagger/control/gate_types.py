"""Gate types: one record per type in ``GATES`` (kind "gates"; other packages register through the entry point group
``hg_dagger.gates``): the spec model a gate file's item is read with, the scorer the engine runs, whether the gate
waits out the grace after a reset or hand-back, and why it asks, in the operator's words. A gate file's ``type`` is
looked up here, so a new gate type is one module and one registration (docs/extending.md, "A gate type"); our own
types are registered at the bottom of gate_scores, where spec and scorer meet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import Field, model_validator

from hg_dagger.contract.model import StrictModel
from hg_dagger.registry import Registry, RegistryError


class GateSpecBase(StrictModel):
    """What every gate's spec has: its levels and how they are entered and left. A type's spec model adds
    ``type: Literal["<its registered name>"] = "<its registered name>"`` and its own keys."""

    name: str = ""  # defaults to the type
    enabled: bool = True
    warn: float | None = None  # score at which a warning is raised; None = no warning level
    trigger: float
    hysteresis: float = Field(default=0.1, ge=0.0, lt=1.0, description="fraction of a threshold to fall below it to clear")
    debounce_ticks: int = Field(default=1, ge=1, description="consecutive ticks a rise must hold")
    if TYPE_CHECKING:  # for the type checker only (no field here): each type's spec model declares its own
        type: str

    @model_validator(mode="after")
    def _order(self):
        if self.warn is not None and self.warn > self.trigger:
            raise ValueError(f"gate {self.name or self.type!r}: warn {self.warn} is above trigger {self.trigger}")
        return self


@dataclass(frozen=True)
class GateType:
    """One gate type. ``scorer(spec, num_envs, step_dt, action_dim)`` builds the engine's scorer (a
    gate_scores.GateScorer). ``grace``: a gate that predicts trouble, held quiet for the gate file's grace after a
    reset or hand-back (one that sees trouble, or the operator's own takeover, never waits). ``words``: why the
    gate asks, for the operator's console, read by a gate's name when it is the type's; ``named_words`` the same
    for well-known names of gates of this type (a signal gate named ``collision``)."""

    spec: type[GateSpecBase]
    scorer: Callable[..., Any]
    grace: bool = False
    words: str = ""
    named_words: Mapping[str, str] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        kind = self.spec.model_fields.get("type") if isinstance(self.spec, type) and issubclass(
            self.spec, GateSpecBase) else None
        if kind is None or not isinstance(kind.default, str):
            raise RegistryError(f"gate type {self.spec!r}: the spec is a GateSpecBase model with a "
                                f"'type: Literal[\"<name>\"] = \"<name>\"' field")


GATES: Registry[GateType] = Registry("gates", "gate type")


def gate_spec(item: Any) -> GateSpecBase:
    """One item of a gate file's ``gates`` (a mapping, or a spec model already built), read with the spec model of
    the type it names; a bad or unknown type is one line naming the gate, the type and the registered types (the
    item's index is the error's key, ``gates.<i>``)."""
    name: str | None
    if isinstance(item, GateSpecBase):
        kind, name = getattr(item, "type", None), item.name
    elif isinstance(item, Mapping):
        kind, name = item.get("type"), item.get("name")
    else:
        raise ValueError(f"a gate is a mapping with a 'type' (one of {', '.join(GATES.names())}), got {item!r}")
    who = f"gate {name or kind!r}" if (name or kind) else "a gate"
    if not isinstance(kind, str) or not kind:
        raise ValueError(f"{who}: give its type (one of {', '.join(GATES.names())})")
    try:
        record = GATES.get(kind)
    except RegistryError as exc:
        raise ValueError(f"{who}: {exc}") from None
    if isinstance(item, GateSpecBase):
        if not isinstance(item, record.spec):
            raise ValueError(f"{who}: a {type(item).__name__} is not the spec of gate type {kind!r} "
                             f"({record.spec.__name__})")
        return item
    spec = record.spec.model_validate(item)
    if spec.type != kind:
        raise ValueError(f"{who}: gate type {kind!r} is registered with the spec of type {spec.type!r}")
    return spec


def gate_type(spec: GateSpecBase) -> GateType:
    """The record of a gate's type."""
    return GATES.get(spec.type)


def operator_words(name: str) -> str | None:
    """Why a gate of this name asks, in a person's words (None: none registered; the console shows the name)."""
    records = [(kind, GATES.get(kind)) for kind in GATES.names()]
    own = next((r.words for kind, r in records if kind == name and r.words), None)
    return own or next((r.named_words[name] for _, r in records if name in r.named_words), None)


__all__ = ["GATES", "GateSpecBase", "GateType", "gate_spec", "gate_type", "operator_words"]
