"""The state every part of a Session shares (control.session and its mixins: controls, episodes, events, rewind),
declared once: the attributes Session.__init__ sets, the views of the engine and the writer every part reads, and
the methods one part calls on another. The parts subclass this, so each reads the same declarations."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from hg_dagger.contract.enums import EndReason, EventKind, SessionMode

if TYPE_CHECKING:
    from hg_dagger.control.action_history import ActionHistory
    from hg_dagger.control.engine import Engine, EpisodeRows
    from hg_dagger.control.episodes import EpisodeWriter
    from hg_dagger.control.gates import GateEngine
    from hg_dagger.control.handover import HandoverConfig, HandoverMachine, RequestEnd
    from hg_dagger.control.operators import Operator
    from hg_dagger.control.safety import SafetyMonitor


class SessionState:
    """What Session.__init__ sets (the type checker's view; the values live on the session)."""

    env: Any
    mapping: Any
    n: int
    engine: Engine
    gates: GateEngine
    machine: HandoverMachine
    operator: Operator
    safety: SafetyMonitor
    summary: Any  # the session's RunSummary (control.session imports the parts: not imported back)
    writer: EpisodeWriter
    rows: EpisodeRows
    history: ActionHistory
    expert: Any
    mode: SessionMode
    scene: str
    iteration: int
    step_limit: int | None
    episode_extra: dict[str, Any]
    gate_config_extra: dict[str, Any]
    episode_gap_s: float
    starts_held: bool
    threshold_source: str
    ended_ids: list[str | None]
    robot_hold: str
    succeeding: np.ndarray
    signals: dict[str, np.ndarray]
    t_obs_align_ms: np.ndarray | None
    window_episode: dict[str, str]
    stopped_rows: set[int]
    last_window_id: str | None
    _base_handover: HandoverConfig
    _world_clock: Any
    _env_info: dict[str, Any]
    _gating: bool
    _decline: bool
    _target: int
    _queued: dict[int, int]
    _pending: dict[str, Any]
    _person: Operator | None
    _pressed: set[str]
    _prev_device_ok: np.ndarray

    # ---- views of the engine and the writer

    @property
    def student(self) -> Any:
        """The policy that acts (the engine's)."""
        return self.engine.policy

    @student.setter
    def student(self, policy: Any) -> None:
        self.engine.policy = policy

    @property
    def obs(self) -> dict[str, np.ndarray] | None:
        """The observation the next tick acts on (the engine's)."""
        return self.engine.obs

    @obs.setter
    def obs(self, obs: dict[str, np.ndarray] | None) -> None:
        self.engine.obs = obs

    @property
    def t_obs(self) -> np.ndarray:
        t = self.engine.t_obs
        assert t is not None  # set in Session.__init__
        return t

    @t_obs.setter
    def t_obs(self, t: np.ndarray) -> None:
        self.engine.t_obs = t

    @property
    def _started(self) -> int:
        """Episodes begun in this session (the next one's number)."""
        return self.rows.begun

    @property
    def eids(self) -> list[str | None]:
        return self.writer.eids

    @property
    def ep_step(self) -> np.ndarray:
        return self.writer.steps

    # ---- what one part calls on another (defined in session.py and the parts)

    if TYPE_CHECKING:
        @property
        def person_available(self) -> bool: ...

        @property
        def running(self) -> bool: ...

        def _adopt_student_thresholds(self) -> bool: ...

        def _event(self, r: int, kind: EventKind, t_ns: int, reason: str = "", source: str = "",
                   values: dict[str, Any] | None = None) -> None: ...

        def _request_events(self, ended: list[RequestEnd], t_ns: int) -> None: ...

        def _window_events(self, t_apply: np.ndarray | None, num_steps: int | None = None) -> None: ...

        def poll_idle(self) -> None: ...

        def _end(self, r: int, reason: EndReason, success: bool, flags: list[str] | None = None) -> None: ...

        def _end_now(self, row: int, reason: EndReason, success: bool, flags: list[str] | None = None) -> None: ...

        def _restart(self, ended: list[int], obs: Any, info: Any, restarted: np.ndarray, *,
                     wait: bool = True) -> None: ...

        def _take_obs(self, obs: Any, info: Any, rows: np.ndarray) -> None: ...

        def _begin_rows(self, rows: list[int],
                        branch: dict[int, tuple[str, int, int | None]] | None = None) -> None: ...

        def _info_now(self) -> dict[str, Any]: ...


__all__ = ["SessionState"]
