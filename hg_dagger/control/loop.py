"""The control thread of a live front end: ticks a Session at a fixed rate, publishes Snapshots, drains Commands.

    loop = ControlLoop(build)          # build() -> Session, called in the control thread (GL contexts live there)
    loop.start(); loop.commands.put(StartEpisodes(3)); snap = loop.slot.read(); ...; loop.stop()

The schedule is absolute (tick k starts at t0 + k * period): a slow tick never shifts later ticks,
it skips the slots it overran and counts them as missed. The thread never waits on a reader;
readers never take a lock the thread needs. Between episodes (or paused) the loop keeps its rate,
drains commands, polls the device for the panel and renders the view, so the operator always
sees a live scene.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from hg_dagger.contract.clock import NO_TIME, now_ns
from hg_dagger.contract.enums import ActionSource, ControlState, EndReason
from hg_dagger.control import live
from hg_dagger.control.fleet_desk import FleetDesk
from hg_dagger.control.loop_health import (
    HealthWindow,
    control_process_settings,
    sleep_until,
    steady_collector,
)
from hg_dagger.control.loop_snap import describe, loading_snapshot, opt_time, row_obs, store_url
from hg_dagger.control.store_actions import StoreActions
from hg_dagger.errors import HgDaggerError, PolicyError

log = logging.getLogger(__name__)

DEFAULT_EPISODE_GAP_S = 2.0  # a live front end's pause before a queued episode begins (run config episode_gap_s)


class ControlLoop:
    """Owns one Session in its own thread; views talk to it only through ``slot`` and ``commands``."""

    def __init__(self, build: Callable[[], Any], *, rate_hz: float | None = None, view_size: int = 256,
                 view_hz: float = 30.0, store: str = "", name: str = "hg-dagger-control",
                 slot: live.LatestSlot | None = None, commands=None, episode_gap_s: float | None = None):
        self._build = build
        self._rate_hz = rate_hz
        self.view_size = view_size
        self.view_hz = view_hz
        self.store = store
        self.slot = slot if slot is not None else live.LatestSlot(loading_snapshot(store))
        self.commands = commands if commands is not None else live.CommandQueue()
        self.session: Any = None  # the Session that build() returns, built in run() (in the control thread)
        self.health: HealthWindow | None = None  # from the first tick on
        self.error: str = ""
        self.summary: dict[str, Any] | None = None  # the session's RunSummary once the loop has ended
        self._stop = threading.Event()
        self._paused = False
        self._seq = 0
        self._frame: np.ndarray | None = None
        self._last_frame_ns = 0
        self._message = ""
        self._episode_gap_s = episode_gap_s  # None: the run config's, else DEFAULT_EPISODE_GAP_S
        self._discards: list[str] = []  # episodes discarded in this sitting, oldest first (UndoDiscard takes back)
        self._rewindable = False  # the session's env can rewind a row (a simulator that replays)
        self._policy_lost = ""  # why the policy stopped answering, until it is reconnected
        self.actions: Any = None  # StoreActions (run() sets it up): the label layers commands write, off-thread
        self._per_version: dict[str, dict[str, int]] = {}  # policy_version -> what it did, in order of first use
        self.desk: FleetDesk | None = None  # one person, several robots: picks, per-robot stops, the fleet view
        self._thread = threading.Thread(target=self.run, name=name, daemon=True)

    # ---- lifecycle (any thread) ------------------------------------------------------------

    def start(self) -> ControlLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Quit: open episodes end as operator aborts, the recorder and env close, the thread ends."""
        if self._thread.is_alive():
            self.commands.put(live.Quit())
            self._thread.join(timeout)
            if self._thread.is_alive():
                self._stop.set()
                self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    # ---- the thread -------------------------------------------------------------------------

    def run(self) -> None:
        """The loop itself, in the calling thread (``start`` runs it in a thread of its own)."""
        self._seq += 1
        self.slot.publish(replace(loading_snapshot(self.store), seq=self._seq))
        try:
            self.session = self._build()
            self._rewindable = self.session.rewindable() == ""
            self.desk = FleetDesk(self.session) if self.session.fleet is not None else None
        except Exception as exc:  # noqa: BLE001 - shown to the operator, the thread ends
            self.error = describe(exc)
            log.error("could not start the session: %s", self.error)
            self._seq += 1
            self.slot.publish(live.Snapshot(seq=self._seq, phase="error", message=self.error, store=self.store))
            return
        s = self.session
        gap = self._episode_gap_s if self._episode_gap_s is not None else s.live_episode_gap_s
        s.episode_gap_s = DEFAULT_EPISODE_GAP_S if gap is None else float(gap)
        self._message = s.notice
        self.actions = StoreActions(self.store or store_url(s.rec), s.operator_name)
        from hg_dagger.policy import one_inference_thread  # lazily: the app's window process needs no torch

        one_inference_thread()
        self._warm_up()
        m = s.mapping
        hz = float(self._rate_hz or m.control_hz)
        period = int(round(1e9 / hz))
        self.health = HealthWindow(hz)
        t0 = time.monotonic_ns()
        k = 0
        try:
            while not self._stop.is_set():
                scheduled = t0 + k * period
                now = time.monotonic_ns()
                if now < scheduled:
                    sleep_until(scheduled)
                start = time.monotonic_ns()
                self._one_tick()
                busy = time.monotonic_ns() - start
                self.health.tick(start, scheduled, busy)
                k += 1
                behind = (time.monotonic_ns() - (t0 + k * period)) // period
                if behind > 0:  # overran whole periods: skip their slots, count them
                    self.health.missed += int(behind)
                    k += int(behind)
        except Exception as exc:  # noqa: BLE001 - an unexpected fault: save what we have, say what happened
            self.error = describe(exc)
            log.exception("control loop stopped")
        finally:
            self._shutdown()

    def settled(self) -> bool:
        """No store action (discard, undo, flag) is still waiting to be written (tests, scripts)."""
        return self.actions is None or not self.actions.busy

    def _warm_up(self) -> None:
        """The first render (a GL context) and the first student call (torch's lazy setup) happen before
        the schedule starts, so they never show up as a late first tick."""
        s = self.session
        if self.view_hz > 0:
            self._render()
        obs = s.env.observe()
        if obs is not None:
            s.student.act(obs[0])

    def _one_tick(self) -> None:
        s = self.session
        for line in self.actions.take_messages():
            self._message = line
        version, before = s.student.version, self._counts()  # the student acting now (a swap waits)
        for cmd in self.commands.drain():
            self._handle(cmd)
            if self._stop.is_set():
                self._attribute(version, before)
                return
        if s.running and not self._paused:
            s.refresh_obs()  # decide on a sample taken now, not at the end of the last tick
            try:
                s.tick()
            except PolicyError as exc:  # its server died or stalled: the episodes end, the app offers to reconnect
                self._lose_policy(str(exc))
            last = s.last
            if last is not None and not last.paused and self.health is not None:  # health: set up by run()
                lat = (int(last.t_action_apply[0]) - int(last.t_obs[0])) / 1e6
                if last.t_action_apply[0] != NO_TIME and last.t_obs[0] != NO_TIME:
                    self.health.latency.append(lat)
        elif not s.running:
            s.poll_idle()  # devices stay live for the panel between episodes
        self._attribute(version, before)
        self._render()
        self._publish()

    @property
    def row(self) -> int:
        """The watched row: 0, or the fleet's robot on screen."""
        return self.desk.row if self.desk is not None else 0

    def _render(self) -> None:
        t = now_ns()
        if self.view_hz <= 0 or t - self._last_frame_ns < 1e9 / self.view_hz * 0.9:
            return
        try:
            frame = self.session.env.render_view(self.row, self.view_size)
            if self.desk is not None:
                self.desk.render_tile(self.session.env)
        except Exception as exc:  # noqa: BLE001 - a view failure must not stop the robot loop
            log.warning("view camera failed, view off: %s", exc)
            self.view_hz = 0
            frame = None
        self._frame = frame
        self._last_frame_ns = t

    def _shutdown(self) -> None:
        s = self.session
        try:
            if s is not None:
                s.close_all("app closed")
        except Exception as exc:  # noqa: BLE001
            self.error = self.error or describe(exc)
            log.exception("closing episodes failed")
        finally:
            try:
                if s is not None:
                    s.rec.close()
                if self.actions is not None:  # every episode is committed now: write what still waits
                    self.actions.close()
            finally:
                if s is not None:
                    s.env.close()
                    s.close_operators()
        if s is not None:
            self.summary = s.summary.as_dict()
        self._publish(phase="stopped" if not self.error else "error")

    # ---- commands ---------------------------------------------------------------------------

    def _handle(self, cmd: live.Command) -> None:
        s = self.session
        self._message = ""
        try:
            match cmd:
                case live.Quit():
                    self._stop.set()
                case live.StartEpisodes(episodes=n):
                    if self._policy_lost:  # reconnect first; a server still down refuses the start
                        self._reconnect_policy()
                    if s.running:
                        s.add_episodes(n)
                    else:
                        s.start(n)  # a fresh start begins every robot: a robot's own e-stop is lifted
                    self._paused = False
                case live.Pause(paused=p):
                    self._paused = p
                case live.ResetEpisode(episode_id=eid):
                    self._end(EndReason.ENV_RESET, False, eid, "reset")
                case live.AbortEpisode(episode_id=eid):
                    self._end(EndReason.OPERATOR_ABORT, False, eid, "abort")
                case live.MarkOutcome(success=ok, episode_id=eid):
                    self._end(EndReason.SUCCESS if ok else EndReason.FAILURE, ok, eid,
                              "mark success" if ok else "mark failure")
                case live.DiscardEpisode(reason=why, episode_id=eid):
                    self._discard(eid, why)
                case live.UndoDiscard(episode_id=eid):
                    self._undo_discard(eid)
                case live.TakeRobot() | live.StopRobot() | live.ClearRobot() if self.desk is not None:
                    self._message = self.desk.handle(cmd)
                case live.DeclineRequest() if self.desk is not None:
                    self.desk.decline()
                case live.DeclineRequest():
                    if not s.decline():
                        raise HgDaggerError("no request is waiting for the person")
                case live.Rewind(episode_id=eid, seconds=sec):
                    row = self._row_of(eid)
                    if row is None:
                        raise HgDaggerError("no running episode to rewind" if eid is None else
                                            f"episode {eid[:12]} has already ended; only a running one rewinds")
                    step = s.rewind(row, sec)
                    self._message = f"rewound {sec:g} s to step {step}: take over to correct from there"
                case live.HoldStarts(hold=h):
                    s.hold_starts(h)
                case live.FlagCorrection(window_id=wid, reason=why):
                    if not wid:
                        raise HgDaggerError("no correction to flag yet")
                    self.actions.flag(wid, why or "flagged by the operator", s.window_episode.get(wid, ""))
                    self._message = f"flagging correction {wid[:12]} as bad..."
                case live.EStop(source=src, reason=why):
                    s.estop(src, why)
                case live.ClearEStop(by=who):
                    s.clear_estop(who)
                case live.Resume(by=who):
                    s.resume(who)
                case live.TakeOver():
                    s.press("takeover")
                case live.HandBack():
                    s.press("return")
                case live.KeyEvent(key=key, down=down):
                    s.key(key, down)
                case live.ReleaseKeys():
                    s.release_keys()
                case live.SetMode(mode=mode):
                    s.set_mode(mode)
                case live.SetDevice(device=name):
                    s.set_device(name)
                case live.ReconnectPolicy():
                    self._reconnect_policy()
                case live.SwapStudent(checkpoint=path, calibration=unc):
                    self._swap_student(path, unc)
                case _:
                    raise HgDaggerError(f"unknown command {type(cmd).__name__}")
        except HgDaggerError as exc:
            self._message = str(exc)
            log.warning("%s: %s", type(cmd).__name__, exc)

    def _row_of(self, episode_id: str | None) -> int | None:
        """The env row running ``episode_id`` (None: the watched row, if it runs an episode); None if it runs
        nowhere (it ended, or never ran here)."""
        eids = self.session.eids
        if episode_id is None:
            return self.row if eids[self.row] is not None else None
        return eids.index(episode_id) if episode_id in eids else None

    def _end(self, reason: EndReason, success: bool, episode_id: str | None, what: str) -> None:
        """End exactly the named episode (None: the watched one); an episode that already ended is refused."""
        row = self._row_of(episode_id)
        if row is None:
            if episode_id is None:
                return  # nothing runs: nothing to end
            raise HgDaggerError(f"episode {episode_id[:12]} has already ended; {what} applies only to a running "
                                "episode (its record stays as it ended)")
        self.session.end_episode(row, reason, success)

    def _discard(self, episode_id: str | None, reason: str) -> None:
        """Discard exactly the named episode: a running one ends now; an ended one is discarded all the same.
        Either way a label layer keeps it out of training (StoreActions), undoable in this sitting."""
        row = self._row_of(episode_id)
        if row is not None:
            episode_id = self.session.discard_episode(row, reason, final=False)
        elif episode_id is None:
            raise HgDaggerError("no running episode to discard; name the episode")
        if episode_id in self._discards:
            raise HgDaggerError(f"episode {episode_id[:12]} is already discarded")
        self._discards.append(episode_id)
        self.actions.discard(episode_id, reason or "discarded")
        self._message = f"discarding episode {episode_id[:12]}..."

    def _undo_discard(self, episode_id: str) -> None:
        if episode_id not in self._discards:
            raise HgDaggerError(f"episode {episode_id[:12]} was not discarded in this sitting; nothing to undo")
        self._discards.remove(episode_id)
        self.actions.undo(episode_id)
        self._message = f"undoing the discard of episode {episode_id[:12]}..."

    def _lose_policy(self, why: str) -> None:
        """Its open episodes end as safety stops saying why; the window offers ReconnectPolicy."""
        self.session.policy_lost(why)
        self._policy_lost = why
        self._message = f"{why}; the open episodes ended as safety stops. Start the server again, then Reconnect policy"

    def _reconnect_policy(self) -> None:
        """Open the policy again from its spec; it acts from the next episode."""
        s = self.session
        opened = getattr(s.student, "opened_from", None)
        if opened is None or not self._policy_lost:
            raise HgDaggerError("the policy answers; there is nothing to reconnect")
        # deferred: policy loads torch; the app's window process needs none
        from hg_dagger.policy import close_policy, open_policy

        spec, options = opened
        policy = open_policy(spec, s.mapping, options)  # a PolicyError says why, and the offer stays
        close_policy(s.student)
        s.set_student(policy)
        self._policy_lost = ""
        self._message = f"reconnected to {spec}: policy {policy.version} acts from the next episode"

    def _swap_student(self, path: str, calibration: tuple[float, ...]) -> None:
        """A new student from the next episode on (closing the previous student's round), with the
        confidence gate recalibrated on the new student's uncertainty where samples came with it."""
        # deferred: policy loads torch; the app's window process needs none
        from hg_dagger.policy import Student, close_policy, is_remote, open_policy

        s = self.session
        if is_remote(path):  # a round's new checkpoint of a policy from elsewhere (lerobot:DIR), opened as the last
            old, policy = s.student, open_policy(path, s.mapping, (getattr(s.student, "opened_from", None) or
                                                                   (path, None))[1])  # one that fails changes nothing
            s.set_student(policy)
            if all(e is None for e in s.eids):  # else the old one ends its episode; its server ends with the loop
                close_policy(old)
            self._message = f"new policy {policy.version} acts from the next episode"
            return
        student = Student.load(path, s.mapping)
        s.set_student(student)
        conf = student.gate_thresholds.get("confidence")
        if conf:  # its own thresholds, set when it starts acting
            self._message = (f"new student {student.version} with its own confidence thresholds (warn "
                             f"{conf.get('warn', float('nan')):.3g}, trigger {conf.get('trigger', float('nan')):.3g})")
            return
        cal = None
        if calibration and s.gates.confidence is not None and s.gates.confidence.spec.calibration is not None:
            cal = s.gates.calibrate(np.asarray(calibration, np.float32))
        if cal is not None and cal.get("refused"):
            self._message = f"new student {student.version}; {cal['refused']}"
            return
        self._message = f"new student {student.version}" + (
            f", confidence gate recalibrated (trigger {cal['trigger']:.3g})" if cal else "")

    def _counts(self) -> dict[str, int]:
        sm = self.session.summary
        return {"episodes": sm.episodes, "successes": sm.successes, "steps": sm.steps,
                "human_labels": sm.human_steps, "context_switches": sm.context_switches,
                "requests_answered": sm.requests_answered, "requests_declined": sm.requests_declined,
                "requests_expired": sm.requests_expired}

    def _attribute(self, version: str, before: dict[str, int]) -> None:
        """What this tick did (commands included) goes to the student that acted in it."""
        now = self._counts()
        if now == before and version in self._per_version:
            return
        acc = self._per_version.setdefault(version, dict.fromkeys(before, 0))
        for k, v in now.items():
            acc[k] += v - before[k]

    # ---- snapshots --------------------------------------------------------------------------

    def rounds(self) -> list[dict[str, Any]]:
        """One row per student, in the order they acted: success, intervention rate, human labels."""
        out = []
        for i, (version, acc) in enumerate(self._per_version.items()):
            eps, steps = acc["episodes"], acc["steps"]
            out.append({"round": i, "policy_version": version, "episodes": eps,
                        "success_rate": acc["successes"] / eps if eps else 0.0,
                        "intervention_rate": acc["human_labels"] / steps if steps else 0.0,
                        "human_labels": acc["human_labels"], "context_switches": acc["context_switches"],
                        "requests_answered": acc["requests_answered"], "requests_declined": acc["requests_declined"],
                        "requests_expired": acc["requests_expired"],
                        "current": version == self.session.student.version})
        return out

    def _publish(self, phase: str | None = None) -> None:
        s = self.session
        self._seq += 1
        sm = s.summary
        counters = live.Counters(episodes=sm.episodes, successes=sm.successes, windows=sm.windows,
                                 human_steps=sm.human_steps, gate_triggers=sm.gate_triggers,
                                 context_switches=sm.context_switches, estops=sm.estops, steps=sm.steps,
                                 discarded=len(self._discards), requests_answered=sm.requests_answered,
                                 requests_declined=sm.requests_declined, requests_expired=sm.requests_expired)
        safety = s.safety
        estop = (safety.estop_source or "", safety.estop_reason or "") if safety.estopped else None
        if phase is None:
            phase = "estopped" if estop else ("held" if s.robot_hold and s.running else (
                "paused" if self._paused else ("running" if s.running else "idle")))
        rec = s.rec
        health = self.health.snapshot(rec.queue_len, rec.stats.dropped_steps) if self.health else live.LoopHealth()
        kw: dict[str, Any] = {}
        r = self.row
        last = s.last if s.eids[r] is not None else None  # between episodes the last tick says nothing
        if last is not None:
            state = ControlState.from_code(int(last.control_state[r])).value
            kw = dict(
                control_state=state, gate_level=int(last.gate_level[r]), gate_reason=last.gate_reason[r],
                t_request_ns=opt_time(last.t_request[r]), confidence=float(last.confidence[r]),
                uncertainty=float(last.uncertainty[r]), progress=float(last.progress[r]),
                policy_action=live.as_array(last.policy_action[r]), human_action=live.as_array(last.operator_action[r]),
                applied_action=live.as_array(last.applied_action[r]),
                action_source=ActionSource.from_code(int(last.action_source[r])).value,
                t_obs=opt_time(last.t_obs[r]), t_policy=opt_time(last.t_policy[r]), t_action_apply=opt_time(last.t_action_apply[r]),
                t_handover=opt_time(last.t_handover[r]), episode_step=int(last.step[r]),
            )
        if safety.estopped:
            kw["control_state"] = ControlState.SAFE_STOP.value
        if self.desk is not None:
            self.desk.observe()
            kw.update(self.desk.fields())
        conf = s.gates.confidence
        thresholds = {}
        if conf is not None:
            thresholds = {"warn": conf.warn, "trigger": conf.trigger, "gate": conf.name}
        snap = live.Snapshot(
            seq=self._seq, t_ns=now_ns(), task=s.mapping.task_id, mode=str(s.mode), next_mode=str(s.next_mode), phase=phase,
            message=self.error or self._message or s.robot_hold, thresholds=thresholds,
            action_names=tuple(s.mapping.action.names), episode_id=s.eids[r],
            policy_version=s.student.version, estop=estop, counters=counters, health=health,
            device=s.device_state(), frame=self._frame, store=self.store, operator=s.operator_name,
            rounds=tuple(self.rounds()), observation=row_obs(s, r), request_wait_s=s.request_wait_s(r),
            ended_episode_id=s.ended_ids[r], last_window_id=s.last_window_id,
            discarded_this_sitting=tuple(self._discards), starts_held=s.starts_held,
            next_start_in_s=s.next_start_in_s(), rewindable=self._rewindable, policy_lost=self._policy_lost, **kw)
        self.slot.publish(snap)


# ---------------------------------------------------------------------------------------------
# The same loop in a process of its own
# ---------------------------------------------------------------------------------------------


class ControlProcess:
    """A ControlLoop in a spawned process, with the same ``slot`` / ``commands`` seam.

    The window's drawing and the control loop then never share an interpreter lock: nothing the
    GUI does (drawing, a slow dialog, garbage collection) can delay a tick. Snapshots come back over
    a pipe, sent by a thread of the child that never blocks the control thread (latest value only);
    commands go the other way over a queue. ``build`` must be picklable (a top-level function or a
    functools.partial of one). When the app dies, the child sees the pipe break and quits cleanly.
    """

    def __init__(self, build: Callable[[], Any], **loop_kwargs: Any):
        ctx = mp.get_context("spawn")
        self._cmd_q = ctx.Queue()
        self._recv, send = ctx.Pipe(duplex=False)
        self.slot = live.LatestSlot(loading_snapshot(loop_kwargs.get("store", "")))  # until the child's first snapshot
        self.commands = live.CommandQueue(self._cmd_q)
        self.store = loop_kwargs.get("store", "")
        self.error = ""
        self.summary: dict[str, Any] | None = None
        self._proc = ctx.Process(target=_child_main, args=(build, loop_kwargs, self._cmd_q, send), daemon=True,
                                 name="hg-dagger-control")
        self._send_end = send
        self._receiver = threading.Thread(target=self._receive, name="hg-dagger-snapshots", daemon=True)

    def start(self) -> ControlProcess:
        self._proc.start()
        self._send_end.close()  # only the child writes
        self._receiver.start()
        return self

    def _receive(self) -> None:
        while True:
            try:
                kind, payload = self._recv.recv()
            except (EOFError, OSError):
                break
            if kind == "snapshot":
                self.slot.publish(payload)
            elif kind == "final":
                self.summary, self.error = payload["summary"], payload["error"] or self.error
        if self._proc.exitcode not in (0, None) and not self.error:
            self.error = f"the control process ended with exit code {self._proc.exitcode}"
            self.slot.publish(live.Snapshot(seq=self.slot.read().seq + 1, phase="error", message=self.error,
                                            store=self.store))

    def stop(self, timeout: float = 30.0) -> None:
        if self._proc.is_alive():
            self.commands.put(live.Quit())
            self._proc.join(timeout)
            if self._proc.is_alive():
                self._proc.terminate()
                self._proc.join(5)
        self._receiver.join(timeout)

    @property
    def alive(self) -> bool:
        return self._proc.is_alive() or self._receiver.is_alive()

    def join(self, timeout: float | None = None) -> None:
        self._proc.join(timeout)
        self._receiver.join(timeout)


def _child_main(build, loop_kwargs, cmd_q, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl+C reaches the app, which asks this process to quit
    control_process_settings()
    commands = live.CommandQueue(cmd_q)

    def build_and_settle():
        session = build()
        steady_collector()  # this process is the control loop
        return session

    loop = ControlLoop(build_and_settle, commands=commands, **loop_kwargs)
    stop_sending = threading.Event()

    def send() -> None:
        seq = -1
        while not stop_sending.is_set():
            snap = loop.slot.wait_for(lambda s, last=seq: s.seq != last, 0.2)
            if snap is None or snap.seq == seq:
                continue
            seq = snap.seq
            try:
                conn.send(("snapshot", snap))
            except (OSError, ValueError):  # the app is gone
                commands.put(live.Quit())
                return

    sender = threading.Thread(target=send, name="hg-dagger-snapshot-sender", daemon=True)
    sender.start()
    try:
        loop.run()
    finally:
        stop_sending.set()
        sender.join(2)
        try:
            conn.send(("snapshot", loop.slot.read()))
            conn.send(("final", {"summary": loop.summary, "error": loop.error}))
        except (OSError, ValueError):
            pass
        conn.close()
