"""What the review workspace shows, read from stores without Qt: the window rows and one episode's arrays.

The rows come from the catalog and each committed episode's latest label layer (never step arrays): the window
with its review state (``decisions``' own row), its QC verdict and flags, its episode's replay status, mode,
policy, date and privacy status. Step arrays are read only for the one episode a reviewer selects
(``load_episode``).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from typing import Any

import numpy as np

from hg_dagger.contract.command import COMMAND_AXES
from hg_dagger.contract.enums import ActionSource, ControlState, ReviewStatus
from hg_dagger.contract.labels import certified_windows
from hg_dagger.contract.schema import EpisodeStart
from hg_dagger.review.decisions import WindowRow, open_store, window_row
from hg_dagger.store import EpisodeInfo, EpisodeStore
from hg_dagger.ui import style

# What each step is on the timeline: its action source (ActionSource codes as stored, docs/data-format.md), except
# that a safety_controller step says why the controller acted (its control_state): holding position while a
# request waited for the operator, or blending the hand-back to the policy. Only the rest is "safety".
STEP_KINDS: dict[str, tuple[str, str]] = {  # kind -> (colour, legend text)
    "policy": (style.POLICY, "policy"),
    "human": (style.HUMAN, "human"),
    "expert": (style.EXPERT, "expert"),
    "waiting": ("#b3b9c2", "waiting for operator"),
    "handback": ("#9cb9e6", "hand-back blend"),
    "safety": (style.SAFETY, "safety"),
    "unknown": (style.NEUTRAL, "unknown"),
}
_SOURCE_KINDS = {ActionSource.POLICY.code: "policy", ActionSource.HUMAN.code: "human",
                 ActionSource.SAFETY_CONTROLLER.code: "safety", ActionSource.EXPERT.code: "expert"}
_HOLD_KINDS = {ControlState.HANDOVER_REQUESTED.code: "waiting", ControlState.RETURNING.code: "handback"}
ANY = ""
QC_NONE = "no QC"
PRIVACY_KEY = "privacy"
"""EpisodeStart.extra key a recorder may set to the privacy processing it applied (a string, or a dict with
``status``); without it the status is derived from what is recorded (docs/decisions.md)."""
PSEUDONYMISED = "pseudonymised (operator id is a pseudonym)"


@dataclass(frozen=True)
class ReviewRow:
    """One correction window as the browser lists it: the review API's row plus where it lives and its checks."""

    store: str
    window: WindowRow
    qc: str = QC_NONE  # "passed", "failed" or "no QC"
    replay: str = "unverified"
    context_before: int = 0
    context_after: int = 0
    qc_flags: tuple[str, ...] = ()  # the flags of the window's latest QC result
    mode: str = ""
    policy_version: str = ""
    date: str = ""  # YYYY-MM-DD (UTC) the episode was recorded
    privacy: str = ""
    robot: str = ""  # "k of N": robot k (1-based) of a fleet of N one person served (docs/fleet.md); "" for one robot

    @property
    def window_id(self) -> str:
        return self.window.window_id

    @property
    def key(self) -> tuple[str, str]:
        return (self.store, self.window.window_id)


# filter key -> the row's value(s) for it; the browser offers one choice per distinct value
FILTER_VALUES: dict[str, Callable[[ReviewRow], Iterable[str]]] = {
    "task": lambda r: (r.window.task,),
    "operator": lambda r: (r.window.operator,),
    "mode": lambda r: (r.mode,),
    "gate_reason": lambda r: (r.window.gate_reason,),
    "outcome": lambda r: (r.window.outcome,),
    "status": lambda r: (r.window.status.value,),
    "qc": lambda r: (r.qc,),
    "qc_flag": lambda r: r.qc_flags,
    "replay": lambda r: (r.replay,),
    "policy_version": lambda r: (r.policy_version,),
    "date": lambda r: (r.date,),
    "robot": lambda r: (r.robot,),
}


@dataclass(frozen=True)
class Filters:
    """The browser's filters; ANY ("") means no restriction. ``qc_flag`` keeps windows whose QC flags hold it."""

    task: str = ANY
    operator: str = ANY
    mode: str = ANY
    gate_reason: str = ANY
    outcome: str = ANY
    status: str = ANY
    qc: str = ANY
    qc_flag: str = ANY
    replay: str = ANY
    policy_version: str = ANY
    date: str = ANY
    robot: str = ANY

    @cached_property
    def _active(self) -> tuple[tuple[Callable[[ReviewRow], Iterable[str]], str], ...]:
        return tuple((FILTER_VALUES[f.name], getattr(self, f.name)) for f in fields(self) if getattr(self, f.name) != ANY)

    def accepts(self, row: ReviewRow) -> bool:
        return all(want in get(row) for get, want in self._active)


def privacy_status(start: EpisodeStart, has_camera: bool) -> str:
    """What privacy processing an episode had: the recorder's own record (EpisodeStart.extra["privacy"]) if it
    wrote one, else what the recorded data says: the operator is stored as a pseudonym, camera frames as taken."""
    recorded = start.extra.get(PRIVACY_KEY)
    if isinstance(recorded, dict):
        recorded = recorded.get("status")
    if isinstance(recorded, str) and recorded.strip():
        return recorded.strip()
    text = PSEUDONYMISED if start.operator else "no operator recorded"
    return text + ("; camera frames not processed" if has_camera else "")


def recorded_date(info: EpisodeInfo) -> str:
    """The UTC day the episode's recorder session began (segment ids start with its YYYYMMDD stamp)."""
    s = info.segment_id
    return f"{s[:4]}-{s[4:6]}-{s[6:8]}" if len(s) >= 8 and s[:8].isdigit() else ""


def robot_of(start: EpisodeStart) -> str:
    """Which robot of a fleet recorded the episode ("k of N", k from 1): its env row and the fleet's size; "" for
    an episode recorded without a fleet."""
    size = start.extra.get("fleet_size")
    return f"{start.env_index + 1} of {size}" if isinstance(size, int) and size > 1 else ""


def rows_of_episodes(st: EpisodeStore, url: str, infos: Iterable[EpisodeInfo]) -> list[ReviewRow]:
    """The rows of every window of the given committed episodes (others are skipped), in the order given.

    Each episode's latest label layer is read once (``EpisodeStore.labels`` lists the episode's layers on every
    call, which after a QC run is one listing per episode and call), and no step array is read."""
    rows = []
    cameras: dict[str, bool] = {}  # segment id -> has a camera field
    for info in infos:
        if not info.complete:
            continue
        layer = st.labels(info.episode_id)
        if not layer.windows:
            continue
        start = info.start
        replay = (layer.replay.status if layer.replay is not None else info.end.replay_status).value
        qc = {q.window_id: q for q in layer.qc if q.window_id is not None}  # the latest result per window
        cam = cameras.get(info.segment_id)
        if cam is None:
            cam = cameras[info.segment_id] = any(s.image for s in st.fields(info.episode_id).values())
        common = {"store": url, "replay": replay, "mode": start.mode.value, "policy_version": start.policy_version,
                  "date": recorded_date(info), "privacy": privacy_status(start, cam), "robot": robot_of(start)}
        certified = certified_windows(layer.windows, layer.certifications, operator=start.operator,
                                      policy_version=start.policy_version)
        for w in layer.windows:
            q = qc.get(w.window_id)
            rows.append(ReviewRow(window=window_row(info, layer, w, certified), qc=QC_NONE if q is None else
                                  ("passed" if q.passed else "failed"), qc_flags=tuple(q.flags) if q else (),
                                  context_before=w.context_before, context_after=w.context_after, **common))
    return rows


def rows_of_store(store: EpisodeStore | str | os.PathLike, url: str | None = None) -> list[ReviewRow]:
    """Every reviewable window of one store with its checks; ``url`` names the store in the rows (default: the
    path given, or the store's own url)."""
    st = open_store(store)
    if url is None:
        url = st.url if isinstance(store, EpisodeStore) else os.fspath(store)
    return rows_of_episodes(st, url, st.episodes(complete=True))


def counts(rows: list[ReviewRow]) -> str:
    """A one-line summary, e.g. ``3 window(s): 2 pending, 1 approved; 2 episode(s), 1 authorized, QC 3 passed``."""
    c = Counter(r.window.status.value for r in rows)
    parts = ", ".join(f"{c[s.value]} {s.value}" for s in ReviewStatus if c[s.value])
    text = f"{len(rows)} window(s)" + (f": {parts}" if parts else "")
    if not rows:
        return text
    q = Counter(r.qc for r in rows)
    qc = ", ".join(f"{q[k]} {k}" for k in ("passed", "failed", QC_NONE) if q[k])
    return (text + f"; {len({(r.store, r.window.episode_id) for r in rows})} episode(s), "
            f"{sum(r.window.authorized for r in rows)} training authorized"
            + (f", {cert} certified" if (cert := sum(r.window.certified for r in rows)) else "") + f", QC {qc}")


@dataclass
class Marker:
    """A point event on the timeline (gate warning/trigger, e-stop, a wait for the operator, ...)."""

    step: int
    kind: str
    reason: str = ""
    text: str = ""  # what it says (a wait: "waited 4.2 s for operator"); empty: the kind's own label
    short: str = ""  # the same, short ("4.2 s"), drawn where the held steps beside it already show the wait


WAIT_MARKER = "request_end"
"""Marker kind of a handover request's end (EventKind ``request_end``, its values ``outcome`` and ``wait_s``):
how long the request waited for the person. Where the simulator paused meanwhile the wait left no rows, and
this marker is all the timeline shows of it; where the robot held, the held steps read "waiting for operator"."""


def wait_text(values: dict[str, Any]) -> tuple[str, str] | None:
    """The timeline labels of an event that ended a handover request, long and short (``waited 4.2 s for
    operator`` and ``4.2 s``, with ``declined`` or ``expired`` when the person did not take over), or None for
    any other event. The time is control time (ticks waited x the step period: a live loop's clock, and the
    same in a run faster than real time); the wall time where an older record has only that."""
    outcome = values.get("outcome")
    seconds = values.get("wait_s")
    if seconds is None:
        seconds = values.get("wait_wall_s")
    if not isinstance(outcome, str) or isinstance(seconds, bool) or not isinstance(seconds, int | float):
        return None
    suffix = "" if outcome == "answered" else f", {outcome}"
    return f"waited {float(seconds):.1f} s for operator{suffix}", f"{float(seconds):.1f} s{suffix}"


def step_kinds(action_source: np.ndarray, control_state: np.ndarray | None) -> list[str]:
    """The STEP_KINDS key of every step (see STEP_KINDS for the rule)."""
    kinds = [_SOURCE_KINDS.get(int(c), "unknown") for c in action_source]
    if control_state is not None:
        hold = ActionSource.SAFETY_CONTROLLER.code
        for t in np.flatnonzero(np.asarray(action_source) == hold):
            kinds[t] = _HOLD_KINDS.get(int(control_state[t]), "safety")
    return kinds


@dataclass
class EpisodeData:
    """The arrays and metadata the timeline, plots and frame view need for one episode."""

    episode_id: str
    num_steps: int
    control_hz: float
    action_names: list[str]
    action_source: np.ndarray  # (T,) uint8 codes
    applied: np.ndarray  # (T, A)
    policy: np.ndarray  # (T, A)
    expert: np.ndarray  # (T, A), NaN where not queried
    human: np.ndarray | None = None  # (T, 7) raw device command (human_command), NaN where none
    human_axes: list[int | None] = field(default_factory=list)  # per action dim: the command axis driving it
    image_key: str | None = None
    images: np.ndarray | None = None  # (T, H, W, 3) uint8
    obs: dict[str, np.ndarray] = field(default_factory=dict)  # state observations, key -> (T, ...)
    markers: list[Marker] = field(default_factory=list)
    windows: list[Any] = field(default_factory=list)  # CorrectionWindow of the latest layer
    mode: str = ""
    operator: str = ""
    policy_version: str = ""
    privacy: str = ""
    control_state: np.ndarray | None = None  # (T,) ControlState codes
    store: str = ""  # the store's url (where a scene is re-rendered from)
    task_id: str = ""
    action_description: str = ""  # the task mapping's words on the action (units, scale)
    action_ranges: list[tuple[float, float]] = field(default_factory=list)  # per dim (low, high), raw units

    @cached_property
    def kinds(self) -> list[str]:
        """Each step's STEP_KINDS key."""
        return step_kinds(self.action_source, self.control_state)

    def step_colours(self) -> list[str]:
        """The timeline colour of each step (STEP_KINDS)."""
        return [STEP_KINDS[k][0] for k in self.kinds]

    def step_text(self, step: int) -> str:
        """What the step was, as the legend says it (``waiting for operator``, ``human``, ...)."""
        return STEP_KINDS[self.kinds[step]][1]

    def obs_text(self, step: int) -> str:
        """The step's state observations as readable lines (shown where there is no camera frame)."""
        lines = []
        for key, arr in self.obs.items():
            v = np.asarray(arr[step]).ravel()
            lines.append(f"{key}: " + " ".join(f"{x:+.3f}" for x in v[:16]) + (" ..." if v.size > 16 else ""))
        return "\n".join(lines) or "(no observations recorded)"


MARKER_KINDS = ("gate_warning", "gate_trigger", "estop", "safety_clamp", "handover_start", "handover_end")


def load_episode(store: EpisodeStore | str | os.PathLike, episode_id: str) -> EpisodeData:
    """Read the arrays one episode's review views need (and nothing of any other episode)."""
    st = open_store(store)
    info = st.info(episode_id)
    specs = st.fields(episode_id)
    image_key = next((n for n, s in specs.items() if n.startswith("obs/") and s.dtype == "uint8"
                      and len(s.shape) == 3 and s.shape[-1] == 3), None)
    obs_keys = [n for n, s in specs.items() if n.startswith("obs/") and n != image_key and not s.image]
    want = [n for n in ("action_source", "control_state", "applied_action", "policy_action", "expert_action",
                        "human_command") if n in specs]
    arrays = st.read_steps(episode_id, want + obs_keys + ([image_key] if image_key else []))
    n = info.num_steps
    mapping = info.start.mapping or {}
    names = list((mapping.get("action") or {}).get("names") or [])
    a = arrays.get("applied_action")
    dim = a.shape[1] if a is not None and a.ndim == 2 else len(names)
    if len(names) != dim:
        names = [f"a{i}" for i in range(dim)]
    nan = np.full((n, dim), np.nan, np.float32)
    human = arrays.get("human_command")
    human_names = list((mapping.get("human") or {}).get("axes") or [])
    human_axes = [COMMAND_AXES.index(ax) if ax in COMMAND_AXES else None for ax in human_names][:dim]
    human_axes += [None] * (dim - len(human_axes))
    markers = []
    for e in info.end.events:
        if e.step is None or e.step < 0:
            continue
        waited = wait_text(e.values) if e.kind.value == WAIT_MARKER else None
        if waited is not None:
            markers.append(Marker(int(e.step), WAIT_MARKER, e.reason or "", *waited))
        elif e.kind.value in MARKER_KINDS:
            markers.append(Marker(int(e.step), e.kind.value, e.reason or ""))
    action = mapping.get("action") or {}
    lows, highs = list(action.get("low") or []), list(action.get("high") or [])
    ranges = list(zip(lows, highs, strict=True)) if len(lows) == len(highs) == dim else []
    return EpisodeData(
        episode_id=episode_id, num_steps=n, control_hz=float(info.start.control_hz or 10.0), action_names=names,
        action_source=np.asarray(arrays.get("action_source", np.full(n, 4, np.uint8))),
        applied=np.asarray(arrays.get("applied_action", nan)), policy=np.asarray(arrays.get("policy_action", nan)),
        expert=np.asarray(arrays.get("expert_action", nan)), image_key=image_key,
        human=None if human is None else np.asarray(human), human_axes=human_axes,
        images=arrays.get(image_key) if image_key else None,
        obs={k.removeprefix("obs/"): arrays[k] for k in obs_keys}, markers=markers,
        windows=list(st.labels(episode_id).windows), mode=info.start.mode.value, operator=info.start.operator,
        policy_version=info.start.policy_version,
        privacy=privacy_status(info.start, image_key is not None or any(s.image for s in specs.values())),
        control_state=np.asarray(arrays["control_state"]) if "control_state" in arrays else None, store=st.url,
        task_id=info.task_id, action_description=str(action.get("description") or ""),
        action_ranges=[(float(lo), float(hi)) for lo, hi in ranges])


def with_window(row: ReviewRow, w: WindowRow) -> ReviewRow:
    """The same browser row with the window's new review state."""
    return replace(row, window=w)
