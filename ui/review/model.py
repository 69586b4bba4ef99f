"""What the review workspace shows, read from stores without Qt: the window rows and one episode's arrays.

The rows come from ``decisions.list_windows`` (catalog and label layers only, never step arrays), with the
QC verdict and replay status of each window added from the same cached label layers. Step arrays are read
only for the one episode a reviewer selects (``load_episode``).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.review.decisions import WindowFilter, WindowRow, list_windows, open_store
from hg_dagger.store import EpisodeStore
from hg_dagger.ui import style

# ActionSource codes as stored (docs/data-format.md): 0 policy, 1 human, 2 safety_controller, 3 expert, 4 unknown
SOURCE_COLOURS: dict[int, str] = {0: style.POLICY, 1: style.HUMAN, 2: style.SAFETY, 3: style.EXPERT, 4: style.NEUTRAL}
SOURCE_NAMES = {0: "policy", 1: "human", 2: "safety", 3: "expert", 4: "unknown"}
ANY = ""
QC_NONE = "no QC"


@dataclass(frozen=True)
class ReviewRow:
    """One correction window as the browser lists it: the review API's row plus where it lives and its checks."""

    store: str
    window: WindowRow
    qc: str = QC_NONE  # "passed", "failed" or "no QC"
    replay: str = "unverified"
    context_before: int = 0
    context_after: int = 0

    @property
    def window_id(self) -> str:
        return self.window.window_id

    @property
    def key(self) -> tuple[str, str]:
        return (self.store, self.window.window_id)


@dataclass(frozen=True)
class Filters:
    """The browser's filters; ANY ("") means no restriction."""

    task: str = ANY
    operator: str = ANY
    gate_reason: str = ANY
    status: str = ANY
    qc: str = ANY
    replay: str = ANY

    def accepts(self, row: ReviewRow) -> bool:
        w = row.window
        return all(want in (ANY, have) for want, have in (
            (self.task, w.task), (self.operator, w.operator), (self.gate_reason, w.gate_reason),
            (self.status, w.status.value), (self.qc, row.qc), (self.replay, row.replay)))


def _qc_verdict(layer, window_id: str) -> str:
    results = [q for q in layer.qc if q.window_id == window_id]
    if not results:
        return QC_NONE
    return "passed" if results[-1].passed else "failed"


def rows_of_store(store: EpisodeStore | str | os.PathLike, url: str | None = None) -> list[ReviewRow]:
    """Every reviewable window of one store with its QC verdict and its episode's replay status; ``url``
    names the store in the rows (default: the path given, or the store's own url)."""
    st = open_store(store)
    if url is None:
        url = st.url if isinstance(store, EpisodeStore) else os.fspath(store)
    rows = []
    for w in list_windows(st, WindowFilter()):
        rows.append(row_with_checks(st, url, w))
    return rows


def row_with_checks(st: EpisodeStore, url: str, w: WindowRow) -> ReviewRow:
    """A ReviewRow for ``w`` from its episode's latest label layer (cached by the store)."""
    layer = st.labels(w.episode_id)
    cw = next((x for x in layer.windows if x.window_id == w.window_id), None)
    return ReviewRow(store=url, window=w, qc=_qc_verdict(layer, w.window_id),
                     replay=st.replay_status(w.episode_id).value,
                     context_before=cw.context_before if cw else 0, context_after=cw.context_after if cw else 0)


def counts(rows: list[ReviewRow]) -> str:
    """A one-line summary of review states, e.g. ``3 windows: 2 pending, 1 approved``."""
    c = Counter(r.window.status.value for r in rows)
    parts = ", ".join(f"{c[s.value]} {s.value}" for s in ReviewStatus if c[s.value])
    return f"{len(rows)} window(s)" + (f": {parts}" if parts else "")


@dataclass
class Marker:
    """A point event on the timeline (gate warning/trigger, e-stop, ...)."""

    step: int
    kind: str
    reason: str = ""


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
    image_key: str | None = None
    images: np.ndarray | None = None  # (T, H, W, 3) uint8
    obs: dict[str, np.ndarray] = field(default_factory=dict)  # state observations, key -> (T, ...)
    markers: list[Marker] = field(default_factory=list)
    windows: list[Any] = field(default_factory=list)  # CorrectionWindow of the latest layer

    def step_colours(self) -> list[str]:
        """The timeline colour of each step, by the source of its applied action."""
        return [SOURCE_COLOURS.get(int(c), style.NEUTRAL) for c in self.action_source]

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
    want = [n for n in ("action_source", "applied_action", "policy_action", "expert_action") if n in specs]
    arrays = st.read_steps(episode_id, want + obs_keys + ([image_key] if image_key else []))
    n = info.num_steps
    mapping = info.start.mapping or {}
    names = list((mapping.get("action") or {}).get("names") or [])
    a = arrays.get("applied_action")
    dim = a.shape[1] if a is not None and a.ndim == 2 else len(names)
    if len(names) != dim:
        names = [f"a{i}" for i in range(dim)]
    nan = np.full((n, dim), np.nan, np.float32)
    markers = [Marker(int(e.step), e.kind.value, e.reason or "") for e in info.end.events
               if e.kind.value in MARKER_KINDS and e.step is not None and e.step >= 0]
    return EpisodeData(
        episode_id=episode_id, num_steps=n, control_hz=float(info.start.control_hz or 10.0), action_names=names,
        action_source=np.asarray(arrays.get("action_source", np.full(n, 4, np.uint8))),
        applied=np.asarray(arrays.get("applied_action", nan)), policy=np.asarray(arrays.get("policy_action", nan)),
        expert=np.asarray(arrays.get("expert_action", nan)), image_key=image_key,
        images=arrays.get(image_key) if image_key else None,
        obs={k.removeprefix("obs/"): arrays[k] for k in obs_keys}, markers=markers,
        windows=list(st.labels(episode_id).windows))


def with_window(row: ReviewRow, w: WindowRow) -> ReviewRow:
    """The same browser row with the window's new review state."""
    return replace(row, window=w)
