"""What a live front end (the desktop app, a test, a benchmark) reads and sends while a session runs.

The control thread publishes an immutable ``Snapshot`` after every tick into a ``LatestSlot``; a view
reads the newest one at its own rate and never waits on the control thread. A view acts only by
putting ``Command`` values into a ``CommandQueue`` that the control thread drains at the top of its
next tick. Snapshots carry measured values (times, actions, gate state, counters, one camera frame),
never live objects, so nothing a view does can reach into the session.

Nothing here imports Qt.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# ---------------------------------------------------------------------------------- the session's last tick


@dataclass(frozen=True)
class TickView:
    """The last tick per env row, for a live front end (arrays are the tick's own; do not write to them)."""

    step: np.ndarray  # int64 [N] episode step of this tick
    t_obs: np.ndarray  # int64 [N]
    t_policy: np.ndarray  # int64 [N]
    t_action_apply: np.ndarray  # int64 [N] (NO_TIME when nothing was applied)
    policy_action: np.ndarray  # float32 [N, A]
    operator_action: np.ndarray  # float32 [N, A] the operator's command in raw action space, NaN where none
    applied_action: np.ndarray  # float32 [N, A] (NaN when nothing was applied)
    action_source: np.ndarray  # uint8 [N] ActionSource codes
    control_state: np.ndarray  # uint8 [N] ControlState codes after the decision
    gate_level: np.ndarray  # uint8 [N] 0 ok, 1 warn, 2 trigger
    gate_reason: list[str]  # per row: the gate that warned or triggered, "" if none
    confidence: np.ndarray  # float32 [N]
    uncertainty: np.ndarray  # float32 [N]
    progress: np.ndarray  # float [N] the env's "progress" signal, NaN without one
    t_request: np.ndarray  # int64 [N] when the open handover was requested, NO_TIME if none
    t_handover: np.ndarray  # int64 [N] when the operator's first command was applied, NO_TIME if none
    paused: bool  # the simulator waited for the person: nothing was applied or recorded


# ---------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Command:
    """Base of everything a view can ask of the control thread."""


@dataclass(frozen=True)
class StartEpisodes(Command):
    episodes: int = 1


@dataclass(frozen=True)
class Pause(Command):
    paused: bool = True


# Per-episode commands name the episode they mean (``episode_id``): a dialog opened on one episode
# may be answered after others began, and the command must still hit the one the person looked at.
# ``None`` means the episode running on the watched row now (scripts, keyboard shortcuts). A command
# naming an episode that is no longer running applies to it where that still means something (a
# discard of an ended episode is written as a label layer) and is refused with one line in
# Snapshot.message where it does not (reset, abort or a verdict on an ended episode: its record
# stays as it ended).


@dataclass(frozen=True)
class ResetEpisode(Command):
    """End the named (or the current) episode as an env reset and begin a fresh one."""

    episode_id: str | None = None


@dataclass(frozen=True)
class AbortEpisode(Command):
    """End the named (or the current) episode as an operator abort."""

    episode_id: str | None = None


@dataclass(frozen=True)
class MarkOutcome(Command):
    """The operator's verdict on the named (or the current) episode: it ends now with it (success or
    failure). An episode that already ended keeps the outcome it ended with (refused, Snapshot.message)."""

    success: bool
    episode_id: str | None = None


@dataclass(frozen=True)
class DiscardEpisode(Command):
    """Mark the named (or the current) episode discarded: kept on disk, never trained on. A running
    one ends now; an ended one is discarded all the same (a label layer), so a dialog answered late
    still hits the episode it showed. Undoable in the same sitting (UndoDiscard)."""

    reason: str
    episode_id: str | None = None


@dataclass(frozen=True)
class UndoDiscard(Command):
    """Take back a discard made in this sitting (one of Snapshot.discarded_this_sitting): the episode
    is trainable again. Its rows were never removed, so nothing else changes."""

    episode_id: str


@dataclass(frozen=True)
class DeclineRequest(Command):
    """The person lets the student go on: the pending handover request ends as declined (an event with
    its wait time), the student keeps driving and the gates may ask again after their grace period."""


@dataclass(frozen=True)
class Rewind(Command):
    """Take the named running episode (None: the watched one) back ``seconds`` before its request (or now) and let
    the person correct from there, in a branch episode (control.session_rewind; simulation only)."""

    episode_id: str | None = None
    seconds: float = 2.0


@dataclass(frozen=True)
class ReconnectPolicy(Command):
    """Open the policy again from the spec it came from (its server went away and is back); it acts from the next
    episode."""


@dataclass(frozen=True)
class HoldStarts(Command):
    """While a per-episode dialog is open in the window, new episodes wait to begin (``hold=True``)
    so the episode the dialog names stays the latest one. A running episode goes on, and a request
    that fires meanwhile still reaches the person. ``hold=False`` lets queued episodes start again."""

    hold: bool = True


@dataclass(frozen=True)
class FlagCorrection(Command):
    """The operator flags their own correction window as bad: it is recorded as a REJECTED review
    decision by the operator and never trained on (Snapshot.last_window_id names the latest one)."""

    window_id: str
    reason: str = "flagged by the operator"


@dataclass(frozen=True)
class EStop(Command):
    source: str = "app"
    reason: str = "operator e-stop"


@dataclass(frozen=True)
class ClearEStop(Command):
    """The explicit reset a latched e-stop needs; records who cleared it."""

    by: str = "operator"


@dataclass(frozen=True)
class Resume(Command):
    """Lift a robot hold (the link to the robot was lost); records who resumed. Nothing else lifts it."""

    by: str = "operator"


@dataclass(frozen=True)
class TakeOver(Command):
    """The operator asks for control (the same as the device's takeover button)."""


@dataclass(frozen=True)
class HandBack(Command):
    """The operator returns control to the policy (the same as the device's return button)."""


@dataclass(frozen=True)
class KeyEvent(Command):
    """A key of the in-window keyboard device, by name (see configs/devices/keyboard.yaml)."""

    key: str
    down: bool


@dataclass(frozen=True)
class ReleaseKeys(Command):
    """The window lost focus: let go of every held key."""


@dataclass(frozen=True)
class SetMode(Command):
    """human_gated | expert | student_only | teleop (takes effect at the next episode)."""

    mode: str


@dataclass(frozen=True)
class SetDevice(Command):
    """Switch the operator device: a name in configs/devices or a path ("keyboard" = the window)."""

    device: str


@dataclass(frozen=True)
class SwapStudent(Command):
    """Load a new policy (a student checkpoint, or a policy spec such as ``lerobot:DIR``, opened with the acting
    policy's options); it acts from the next episode on. ``calibration``: the new student's uncertainty on recent
    autonomous states, for the confidence gate's quantile rule."""

    checkpoint: str
    calibration: tuple[float, ...] = ()


@dataclass(frozen=True)
class TakeRobot(Command):
    """One person, several robots (docs/fleet.md): take the top request of the queue (``robot`` None) or robot
    ``robot`` (0-based), one that has not asked included (a pre-emption). It comes up large and the person's keys
    reach it; the others run on."""

    robot: int | None = None


@dataclass(frozen=True)
class StopRobot(Command):
    """E-stop one robot of a fleet: its episode ends as a safety stop and it stays where it is until ClearRobot;
    the others run on (EStop stops them all)."""

    robot: int
    by: str = "operator"


@dataclass(frozen=True)
class ClearRobot(Command):
    """The explicit reset one robot's e-stop needs; records who cleared it."""

    robot: int
    by: str = "operator"


@dataclass(frozen=True)
class Quit(Command):
    """End open episodes as operator aborts, close the recorder and the env, stop the thread."""


class CommandQueue:
    """Thread-safe FIFO: any thread puts, the control thread drains once per tick. Over a
    multiprocessing queue (``q``) the putting side may be another process; if that process is gone,
    draining ends with a Quit so the control side stops safely."""

    def __init__(self, q=None) -> None:
        self._q = q if q is not None else queue.SimpleQueue()

    def put(self, cmd: Command) -> None:
        if not isinstance(cmd, Command):
            raise TypeError(f"not a live Command: {cmd!r}")
        self._q.put(cmd)

    def drain(self) -> list[Command]:
        out = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out
            except (EOFError, OSError):
                return out + [Quit()]


# ---------------------------------------------------------------------------------- snapshots


@dataclass(frozen=True)
class LoopHealth:
    """How well the control loop keeps its rate (figures over a sliding window of recent ticks)."""

    target_hz: float = 0.0
    achieved_hz: float = 0.0
    jitter_p99_ms: float = 0.0  # |actual tick start - scheduled start|
    jitter_recent_max_ms: float = 0.0  # the largest start delay over about the last second
    missed_ticks: int = 0  # scheduled ticks skipped because a tick overran
    latency_p50_ms: float = float("nan")  # t_obs -> t_action_apply
    latency_p99_ms: float = float("nan")
    tick_ms_p99: float = 0.0  # time spent inside one tick
    recorder_queue: int = 0
    recorder_dropped: int = 0
    ticks: int = 0


@dataclass(frozen=True)
class DeviceState:
    device_id: str = ""
    kind: str = ""  # keyboard | gamepad | spacemouse | synthetic | expert | none
    connected: bool = False
    engaged: bool = False
    axes: np.ndarray | None = None  # float32 [7] the last command after calibration, in [-1, 1]
    buttons: tuple[str, ...] = ()
    deadzone: tuple[float, ...] = (0.0,) * 7  # per axis, in the units of ``axes``


@dataclass(frozen=True)
class Counters:
    episodes: int = 0
    successes: int = 0
    windows: int = 0
    human_steps: int = 0
    gate_triggers: int = 0
    context_switches: int = 0
    estops: int = 0
    steps: int = 0
    discarded: int = 0  # discards made in this sitting (less those undone)
    # how pending handover requests ended (each is one event with its wait time, see docs/gates.md)
    requests_answered: int = 0  # the person took over
    requests_declined: int = 0  # DeclineRequest: the person let the student go on
    requests_expired: int = 0  # the configured wait limit ran out, or the episode ended while waiting


@dataclass(frozen=True)
class RobotView:
    """One robot of a fleet as the fleet view shows it."""

    robot: int  # 0-based env row; shown as robot + 1
    state: str = "idle"  # autonomous | waiting | human | returning | held | e-stop | idle (between episodes)
    episode_id: str | None = None
    episodes: int = 0  # ended in this sitting
    successes: int = 0
    wait_s: float | None = None  # how long its request has waited (None without one)
    reason: str = ""  # the gate that asked, while it waits
    frame: np.ndarray | None = None  # uint8 [h, w, 3] small live view
    stopped: bool = False  # its own e-stop is latched (ClearRobot)
    step: int = 0  # its episode's step


@dataclass(frozen=True)
class QueueEntry:
    """One waiting request, in the order the person would take it (rank 1 first)."""

    robot: int
    rank: int
    wait_s: float
    reason: str  # the gate that asked
    constraint: bool = False
    uncertainty: float = 0.0
    risk: float = 0.0


@dataclass(frozen=True)
class Snapshot:
    """The watched env row (row 0; of a fleet the robot on screen, ``robot``) after one tick, plus loop-wide state.
    Arrays are copies."""

    seq: int = 0
    t_ns: int = 0
    task: str = ""
    mode: str = "human_gated"  # the mode of the episodes now running (SessionMode)
    next_mode: str = "human_gated"  # the mode new episodes begin in (a mode chosen waits for the next begin)
    # loading: the session is being built (Start waits) | idle: no episode | running (also while a
    # request waits for the person: see request_wait_s) | paused |
    # held (robot holds: Resume) | estopped | training | stopped | error
    phase: str = "idle"
    message: str = ""  # the last thing the operator should read (error, hint, a refused command)
    loading: bool = False  # the session is still being built: Start and per-episode actions wait
    # control and gates
    control_state: str = "autonomous"  # ControlState value
    gate_level: int = 0  # 0 ok, 1 warn, 2 trigger
    gate_reason: str = ""
    t_request_ns: int | None = None  # when the pending/open handover was requested
    request_wait_s: float | None = None  # how long the current request has waited (None without one)
    confidence: float = float("nan")
    uncertainty: float = float("nan")
    thresholds: dict[str, float | None] = field(default_factory=dict)  # confidence gate: warn / trigger
    progress: float = float("nan")
    # actions in the raw action space (NaN where there is none)
    policy_action: np.ndarray | None = None
    human_action: np.ndarray | None = None
    applied_action: np.ndarray | None = None
    action_source: str = "policy"
    action_names: tuple[str, ...] = ()
    # times of the last applied step (monotonic ns)
    t_obs: int | None = None
    t_policy: int | None = None
    t_action_apply: int | None = None
    t_handover: int | None = None
    # episode
    episode_id: str | None = None
    episode_step: int = 0
    ended_episode_id: str | None = None  # the episode that ended last on the watched row (for late dialogs)
    last_window_id: str | None = None  # the operator's latest correction window (FlagCorrection)
    discarded_this_sitting: tuple[str, ...] = ()  # episode ids discarded since launch (UndoDiscard)
    starts_held: bool = False  # HoldStarts is on: queued episodes wait
    next_start_in_s: float | None = None  # seconds until the next queued episode begins (the pause between)
    policy_version: str = ""
    estop: tuple[str, str] | None = None  # (source, reason) while latched
    counters: Counters = field(default_factory=Counters)
    health: LoopHealth = field(default_factory=LoopHealth)
    device: DeviceState = field(default_factory=DeviceState)
    frame: np.ndarray | None = None  # uint8 [H, W, 3] view image (not what the policy sees)
    observation: dict[str, np.ndarray] | None = None  # the watched row's non-image observation (copies)
    store: str = ""
    operator: str = ""
    rounds: tuple[dict[str, Any], ...] = ()  # one dict per finished round (success, intervention rate, labels)
    rewindable: bool = False  # a request can be rewound to before it (Rewind: a simulator that replays)
    policy_lost: str = ""  # why the policy stopped answering (its open episodes ended); ReconnectPolicy reopens it
    # one person, several robots (empty for one): the row-0 fields above then describe ``robot``, the one on screen
    robots: tuple[RobotView, ...] = ()
    queue: tuple[QueueEntry, ...] = ()
    robot: int = 0  # the robot the fields above describe
    serving: int | None = None  # the robot the person serves (None: nobody)
    allocation: str = ""  # how the queue is ranked (cur | fcfs | random)


class LatestSlot:
    """A latest-value slot: ``publish`` replaces, ``read`` returns the newest (never blocks the writer)."""

    def __init__(self, initial: Snapshot | None = None) -> None:
        self._value = initial if initial is not None else Snapshot()
        self._cond = threading.Condition()

    def publish(self, snap: Snapshot) -> None:
        self._value = snap  # one reference assignment: readers see the old or the new snapshot, whole
        if self._cond.acquire(blocking=False):  # wake waiters only when nobody holds the lock
            try:
                self._cond.notify_all()
            finally:
                self._cond.release()

    def read(self) -> Snapshot:
        return self._value

    def wait_for(self, predicate, timeout: float) -> Snapshot | None:
        """Block (not for GUI threads) until a published snapshot satisfies ``predicate``; tests and scripts."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                snap = self._value
                if predicate(snap):
                    return snap
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.05))


def as_array(x: Any) -> np.ndarray:
    return np.array(x, dtype=np.float32, copy=True)
