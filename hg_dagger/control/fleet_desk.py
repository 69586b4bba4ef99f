"""One person at a console serving a fleet (`hg-dagger app --robots N`, docs/fleet.md): what the control loop adds
to a fleet session for a live front end.

- ``FleetKeyboard``: the person's one device (the in-window keyboard) reaches the robot they serve, read once per
  tick into that robot's row; N, the decline key, lets only that robot's student go on.
- ``FleetDesk``: the person's picks (the top request, any robot by number, a pre-emption), a per-robot e-stop
  (that robot's episode ends as a safety stop, recorded with who stopped it, and the robot stays where it is, its
  simulation not stepped, until the person clears it; the other robots run on), each robot's episodes and
  successes, its small live view, and what the snapshot says about every robot and the queue.

The session's state is read; a robot's e-stop is the session's (``Session.stop_row``); nothing here imports Qt.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hg_dagger.contract.enums import ControlState
from hg_dagger.control import live
from hg_dagger.control.fleet import Request
from hg_dagger.control.handover import REQUESTED
from hg_dagger.control.operators import DeviceOperator
from hg_dagger.errors import HgDaggerError

TILE_SIZE = 160  # pixels of a robot's small live view
TILE_EVERY = 2  # a tile per this many renders of the view: each tile at view rate / (2 N), the control rate kept
STATES = {ControlState.AUTONOMOUS.value: "autonomous", ControlState.WARNING.value: "autonomous",
          ControlState.HANDOVER_REQUESTED.value: "waiting", ControlState.HUMAN.value: "human",
          ControlState.EXPERT.value: "human", ControlState.RETURNING.value: "returning",
          ControlState.SAFE_STOP.value: "e-stop"}


class FleetKeyboard(DeviceOperator):
    """One device for every robot: read once per tick into the row the person serves (``row``)."""

    def __init__(self, device, mapping, num_envs: int, name: str = ""):
        super().__init__([device] * num_envs, mapping, name)
        self.row = 0
        self._decline = False

    def _rows_to_read(self, state) -> Any:
        return [self.row]

    def decline(self) -> None:
        """The person lets the served robot's student go on (the next poll)."""
        self._decline = True

    def poll(self, obs, state, active):
        tick = super().poll(obs, state, active)
        if self._decline:
            self._decline = False
            tick.decline = np.zeros(self.n, bool)
            tick.decline[self.row] = True
        return tick

    def close(self) -> None:
        self.devices[0].close()

    def device_state(self, row: int) -> dict[str, Any]:
        return super().device_state(self.row)


class FleetDesk:
    """The fleet side of a ControlLoop (see the module docstring); call it from the control thread."""

    def __init__(self, session):
        self.s = session
        self.alloc = session.fleet
        self.n = session.n
        self.episodes = np.zeros(self.n, np.int64)
        self.successes = np.zeros(self.n, np.int64)
        self._ended = list(session.ended_ids)
        self._successes = 0
        self._ticks = 0
        self.frames: list[np.ndarray | None] = [None] * self.n
        self._next_tile = 0
        self._calls = 0
        # a person at the console picks; an operator model (synthetic, expert) is served the top request as headless
        self.alloc.manual = self._keyboard() is not None

    @property
    def row(self) -> int:
        """The robot on the person's screen (the snapshot's watched row): with an operator model, the one it serves."""
        a = self.alloc
        if not a.manual and a.serving is not None:
            a.selected = a.serving
        return int(a.selected)

    def _keyboard(self) -> FleetKeyboard | None:
        s = self.s
        for op in (s._pending.get("person"), s._person, s.operator):
            if isinstance(op, FleetKeyboard):
                return op
        return None

    def _point(self, row: int) -> None:
        kb = self._keyboard()
        if kb is not None:
            kb.row = row

    # ---- commands --------------------------------------------------------------------------

    def handle(self, cmd: live.Command) -> str:
        """Apply a fleet command; returns the line for the operator (a refusal raises HgDaggerError)."""
        match cmd:
            case live.TakeRobot(robot=r) if not self.alloc.manual:  # an operator model serves: only look
                if r is None:
                    raise HgDaggerError("the operator model takes the requests itself; pick a robot to watch")
                self._check(r)
                self.alloc.selected = r
                return ""
            case live.TakeRobot(robot=r):
                try:
                    row = self.alloc.pick(r)
                except ValueError as exc:
                    raise HgDaggerError(str(exc)) from None
                self._point(row)
                return ""
            case live.StopRobot(robot=r, by=who):
                self._check(r)
                self.stop(r, who)
                return f"robot {r + 1} e-stopped; the others run on (clear it on its tile, or Shift+X)"
            case live.ClearRobot(robot=r, by=who):
                self._check(r)
                self.clear(r, who)
                return f"robot {r + 1}'s e-stop cleared by {who}"
        raise HgDaggerError(f"unknown fleet command {type(cmd).__name__}")

    def _check(self, r: int) -> None:
        if not 0 <= r < self.n:
            raise HgDaggerError(f"no robot {r + 1}: the fleet has robots 1 to {self.n}")

    def decline(self) -> None:
        """N: the robot on the screen lets its student go on, if its request waits."""
        r = self.row
        if not (self.s.machine.state[r] == REQUESTED and self.s.eids[r] is not None):
            raise HgDaggerError(f"no request of robot {r + 1} is waiting for the person")
        kb = self._keyboard()
        if kb is None:
            raise HgDaggerError("no person's keyboard answers this fleet")
        kb.decline()

    def stop(self, r: int, by: str) -> None:
        """Robot ``r`` stops where it is until ``clear`` (Session.stop_row)."""
        self.s.stop_row(r, by)

    def clear(self, r: int, by: str) -> None:
        """The explicit reset robot ``r``'s e-stop needs (Session.clear_row)."""
        self.s.clear_row(r, by)

    @property
    def stopped(self) -> set[int]:
        """The e-stopped robots (the session's)."""
        return self.s.stopped_rows

    # ---- what the snapshot says -------------------------------------------------------------

    def observe(self) -> None:
        """Count the episodes each robot ended since the last call, and their successes."""
        s = self.s
        ended = [r for r in range(self.n) if s.ended_ids[r] is not None and s.ended_ids[r] != self._ended[r]]
        self._ended = list(s.ended_ids)
        gained = s.summary.successes - self._successes
        self._successes = s.summary.successes
        if not ended:
            return
        tick = s.engine.last
        for r in ended:
            self.episodes[r] += 1
            if len(ended) == 1:
                ok = gained > 0
            else:  # several ended in one tick: the env said which succeeded
                ok = tick is not None and tick.env is not None and bool(tick.env.success[r]) and not (
                    tick.stop is not None and tick.stop[r])
            self.successes[r] += int(ok)

    def render_tile(self, env) -> None:
        """One robot's small view every TILE_EVERY calls, in turn (the selected robot's large one is the loop's)."""
        self._calls += 1
        if self._calls % TILE_EVERY:
            return
        r = self._next_tile
        self._next_tile = (r + 1) % self.n
        self.frames[r] = env.render_view(r, TILE_SIZE)

    def _state(self, r: int, last) -> str:
        s = self.s
        if r in self.stopped or s.safety.estopped:
            return "e-stop"
        if s.robot_hold:
            return "held"
        if s.eids[r] is None or last is None:
            return "idle"
        return STATES.get(ControlState.from_code(int(s.machine.state[r])).value, "autonomous")

    def fields(self) -> dict[str, Any]:
        """The Snapshot's fleet fields: every robot, the queue, who is served and who is on the screen."""
        s = self.s
        last = s.last
        robots = []
        for r in range(self.n):
            wait = s.request_wait_s(r) if s.machine.state[r] == REQUESTED else None
            reason = (last.gate_reason[r] if last is not None else "") or ""
            robots.append(live.RobotView(
                robot=r, state=self._state(r, last), episode_id=s.eids[r], episodes=int(self.episodes[r]),
                successes=int(self.successes[r]), wait_s=wait, reason=reason if wait is not None else "",
                frame=self.frames[r], stopped=r in self.stopped, step=int(s.ep_step[r])))
        ranked = self.alloc.ranked if self.alloc.manual else [
            Request(r, i, s.request_wait_s(r) or 0.0) for i, r in enumerate(self.alloc.waiting())]
        queue = tuple(live.QueueEntry(robot=q.row, rank=i + 1, wait_s=q.wait_s,
                                      reason=(last.gate_reason[q.row] if last is not None else "") or "gate",
                                      constraint=q.constraint, uncertainty=q.uncertainty, risk=q.risk)
                      for i, q in enumerate(ranked) if s.eids[q.row] is not None)
        return {"robots": tuple(robots), "queue": queue, "robot": self.row, "serving": self.alloc.serving,
                "allocation": self.alloc.cfg.allocation}


def fleet_keyboard(session, device, name: str) -> FleetKeyboard:
    """The person's keyboard for every robot of ``session`` (set as its operator from the first episode on)."""
    device.connect()
    op = FleetKeyboard(device, session.mapping, session.n, name)
    session.set_operator(op)
    return op


__all__ = ["STATES", "TILE_SIZE", "FleetDesk", "FleetKeyboard", "fleet_keyboard"]
