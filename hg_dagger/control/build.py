"""Building a session from a run config: the env (simulator or robot bridge), gates, handover machine,
safety monitor and operator around a policy (the built-in student, or any ``--policy SPEC``: policy.sources);
``run_gated`` is all of ``hg-dagger run``."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from hg_dagger import config as config_io
from hg_dagger import safety_log
from hg_dagger.control.fleet import FleetAllocator
from hg_dagger.control.gates import GateEngine
from hg_dagger.control.handover import HandoverMachine
from hg_dagger.control.human_model import summarize
from hg_dagger.control.operators import make_operator
from hg_dagger.control.run_config import RunConfig, load_gate_config
from hg_dagger.control.safety import SafetyMonitor
from hg_dagger.control.session import RunSummary, Session
from hg_dagger.envs import make_env
from hg_dagger.envs.bridge import BridgeEnv, load_token
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.experts import make_expert
from hg_dagger.store import EpisodeStore

log = logging.getLogger(__name__)


def make_run_env(cfg: RunConfig):
    """The run's env: the task's local simulator, or, when ``cfg.robot`` is set, the robot behind
    ``hg-dagger bridge serve`` (BridgeEnv refuses a robot serving another task or mapping)."""
    if cfg.robot is None:
        return make_env(cfg.task, num_envs=cfg.num_envs, seed=cfg.seed)
    rc = cfg.robot
    env = BridgeEnv(cfg.task, host=rc.host, port=rc.port, token=load_token(rc.token_file),
                    connect_timeout_s=rc.connect_timeout_s, request_timeout_s=rc.request_timeout_s,
                    max_retries=rc.max_retries, clock_pings=rc.clock_pings, clock_resync_s=rc.clock_resync_s,
                    resume_on_reconnect=rc.resume_on_reconnect, tls_ca=rc.tls_ca, tls_server_name=rc.tls_server_name)
    if env.num_envs != cfg.num_envs:
        log.info("robot bridge %s serves %d env(s); the run follows it (run config num_envs %d is for simulation)",
                 rc.endpoint, env.num_envs, cfg.num_envs)
    return env


def _follow_robot(cfg: RunConfig, env) -> RunConfig:
    """On a robot the batch size is the robot's (``bridge serve --num-envs``): re-check the run config with it."""
    if cfg.robot is None or env.num_envs == cfg.num_envs:
        return cfg
    data = {**cfg.model_dump(exclude_unset=True), "num_envs": env.num_envs}
    return config_io.validate(RunConfig, data, source=f"run config with the robot's num_envs {env.num_envs}")


def _robot_metadata(env) -> dict[str, Any]:
    """Which robot recorded the episode (stored in EpisodeStart.extra); empty for a local simulator."""
    if not isinstance(env, BridgeEnv):
        return {}
    return {"robot_bridge": {"endpoint": f"{env.host}:{env.port}", "instance": env.status().get("instance", "")}}


def build_session(cfg: RunConfig, recorder, student, *, env=None, expert=None, operators: list | None = None,
                  extra: dict[str, Any] | None = None) -> Session:
    """Wire env, gates, handover, safety and the operator named by ``cfg`` around ``student``; ``extra`` goes
    into every episode's EpisodeStart.extra (an executor's worker and job)."""
    env = env if env is not None else make_run_env(cfg)
    cfg = _follow_robot(cfg, env)
    m = env.mapping
    if cfg.handover.wait == "pause" and env.num_envs != 1 and not env.pauses_rows:
        raise ConfigError(f"{m.task_id}: handover.wait 'pause' pauses the waiting env alone, which the "
                          f"{m.backend} backend cannot do in a batch: use num_envs 1, or wait 'hold' / 'policy'")
    gate_cfg = load_gate_config(cfg.gates, cfg.task)
    if gate_cfg.task and gate_cfg.task != m.task_id:
        raise ConfigError(f"gate config {gate_cfg.name!r} is for task {gate_cfg.task!r}, the run is for {m.task_id!r}")
    gates = GateEngine(gate_cfg, num_envs=env.num_envs, step_dt=m.dt, action_dim=m.action_dim)
    op = cfg.operator
    safety = SafetyMonitor(cfg.safety, num_envs=env.num_envs, action_dim=m.action_dim)
    if expert is None and op.type in ("synthetic", "expert", "human_model"):
        expert = make_expert(m.task_id, kind="policy" if cfg.expert_checkpoint else "planner", mapping=m,
                             checkpoint=cfg.expert_checkpoint)
    operator = make_operator(op, mapping=m, num_envs=env.num_envs, expert=expert, devices=operators, seed=cfg.seed)
    machine = HandoverMachine(cfg.handover, num_envs=env.num_envs, action_dim=m.action_dim,
                              step_dt=m.dt, operator=operator.role,
                              operator_name=operator.name)
    fleet, fleet_meta, fleet_extra = None, {}, {}
    if cfg.fleet is not None:  # one person, env.num_envs robots: recorded with every episode (docs/fleet.md)
        fleet = FleetAllocator(cfg.fleet, env.num_envs, m.dt)
        fleet_meta = {"fleet": {**cfg.fleet.model_dump(mode="json"), "robots": env.num_envs}}
        fleet_extra = {"fleet_size": env.num_envs}
    return Session(env, student, recorder, gates=gates, handover=machine, safety=safety, operator=operator,
                   expert=expert, latency_budget_ms=cfg.latency_budget_ms, scene=cfg.scene or gate_cfg.scene,
                   seed=cfg.seed, iteration=cfg.iteration, realtime=cfg.realtime,
                   max_episode_steps=cfg.max_episode_steps, episode_gap_s=cfg.episode_gap_s,
                   gate_config_extra={"operator_config": op.model_dump(mode="json"), **fleet_meta},
                   episode_extra={**_robot_metadata(env), **fleet_extra, **(extra or {})}, fleet=fleet)


def open_session(cfg: RunConfig, store_url: str, *, student_path: str | None = None, policy: str | None = None,
                 policy_options=None, extra: dict[str, Any] | None = None) -> Session:
    """The session a run config describes, recording into ``store_url`` (created if missing): the env, the
    policy (``policy``: a spec, policy.sources; ``student_path`` is the older name for a checkpoint; a fresh,
    untrained student when neither is given), a recorder, and the confidence gate calibrated at start-up if the
    config asks and the policy brings no thresholds of its own. The caller closes ``session.rec``, then
    ``session.env``, then the policy (``close_policy(session.student)``)."""
    spec = _one_spec(policy, student_path)
    env = make_run_env(cfg)  # bad task, robot or checkpoint: fail before the store (and before loading torch)
    student = None
    try:
        cfg = _follow_robot(cfg, env)
        # deferred: policy imports torch; importing this module stays free of it
        from hg_dagger.policy import Student, open_policy

        student = open_policy(spec, env.mapping, policy_options) if spec else Student.create(env.mapping, seed=cfg.seed)
        try:
            store = EpisodeStore.open(store_url, mode="a")
        except HgDaggerError:  # a missing store is created; a damaged one fails again below
            if Path(str(store_url)).exists() and (not Path(str(store_url)).is_dir()
                                                  or any(Path(str(store_url)).iterdir())):
                raise
            store = EpisodeStore.create(store_url)
    except BaseException:
        _close_policy(student)
        env.close()
        raise
    rec = store.recorder()
    safety_log.attach_session(store_url)  # STORE/safety.log: e-stops, holds, resumes, clamp summaries
    try:
        session = build_session(cfg, rec, student, env=env, extra=extra)
        if session.student_has_thresholds:  # the student's own thresholds: no start-up calibration
            log.info("%s", session.notice)
        elif cfg.calibrate_steps and not getattr(student, "reports_uncertainty", True):
            log.info("confidence gate not calibrated: policy %s reports no uncertainty (the gate cannot fire; the "
                     "other gates ask for help)", student.version)
        elif cfg.calibrate_steps and not session.calibrates:
            log.info("no start-up calibration: the gates of this session have no confidence gate with a "
                     "'calibration' section")
        elif cfg.calibrate_steps:
            cal = session.calibrate(cfg.calibrate_steps)
            if cal is None:
                log.info("confidence gate not calibrated: too few samples, thresholds unchanged")
            elif not cal.get("refused"):
                log.info("confidence gate calibrated at start-up: warn %.3g, trigger %.3g", cal["warn"], cal["trigger"])
    except BaseException:
        rec.close()
        env.close()
        _close_policy(student)
        raise
    return session


def _one_spec(policy: str | None, student_path: str | None) -> str | None:
    if policy is not None and student_path is not None and str(policy) != str(student_path):
        raise ConfigError("give a policy or a student checkpoint, not both (a checkpoint is a policy spec: PATH.pt)")
    return str(policy) if policy is not None else (str(student_path) if student_path is not None else None)


def _close_policy(policy) -> None:
    if policy is not None:
        # deferred: policy imports torch; importing this module stays free of it
        from hg_dagger.policy import close_policy

        close_policy(policy)


def unused_seed(store_url: str) -> int:
    """One past the largest episode seed the store holds (0 for a new store): a sitting that starts its episodes
    here meets start states no earlier sitting, bootstrap demonstrations included, has met."""
    try:
        episodes = EpisodeStore.open(store_url).episodes()
    except HgDaggerError:
        return 0
    seeds = [s for i in episodes if isinstance(s := i.start.initial_state.get("seed"), int)]
    return max(seeds, default=-1) + 1


def fleet_figures(session) -> dict[str, Any]:
    """The queue's figures of a fleet session, with the human-paced person's when it is one."""
    out = session.fleet.stats.as_dict()
    facts = getattr(session.operator, "facts", None)
    if facts is not None:
        out["person"] = summarize(facts)
    return out


def run_gated(cfg: RunConfig, store_url: str, *, student_path: str | None = None, policy: str | None = None,
              policy_options=None, progress: bool = True, extra: dict[str, Any] | None = None,
              executor=None) -> RunSummary:
    """A whole human-gated collection run: ``open_session``, then record ``cfg.episodes`` episodes.

    With a Ray ``executor`` (learn.executor) the episodes are split into contiguous seed blocks, one
    session per worker, each recording into its own store segments (the built-in student only). A policy that
    stops answering mid-run ends the open episodes as safety stops (``Session.policy_lost``) and raises its
    PolicyError."""
    spec = _one_spec(policy, student_path)
    if executor is not None and executor.kind != "local":
        # deferred: policy imports torch; importing this module stays free of it
        from hg_dagger.policy import is_remote

        if is_remote(spec):
            raise ConfigError(f"--executor {executor.kind} ships the built-in student to its workers; --policy {spec} "
                              "runs with --executor local")
        return executor.run_gated(cfg, store_url, student_path=spec, progress=progress)
    # deferred: policy imports torch; importing this module stays free of it
    from hg_dagger.policy import PolicyError

    session = open_session(cfg, store_url, policy=spec, policy_options=policy_options, extra=extra)
    try:
        summary = session.run(cfg.episodes, progress=progress, windows=cfg.windows)
        if session.fleet is not None:
            summary.fleet = fleet_figures(session)
        return summary
    except PolicyError as exc:
        try:
            session.policy_lost(str(exc))
        except Exception as inner:  # the original error is the one to report
            log.warning("could not end the open episodes after the policy was lost: %s", inner)
        raise
    finally:
        safety_log.detach_session()
        session.rec.close()
        session.env.close()
        _close_policy(session.student)
