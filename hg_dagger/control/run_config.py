"""Run configuration: run/<name>.yaml on the config search path (kind: run), the operator and robot sections, and
gate-config lookup. A task is a task id or a task YAML file of the user's; the run and gate configs a task brings
by default are found by its task id (``task_name``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hg_dagger import config as config_io
from hg_dagger.contract.model import StrictModel
from hg_dagger.control.fleet import FleetConfig
from hg_dagger.control.gate_specs import GateConfig
from hg_dagger.control.handover import HandoverConfig
from hg_dagger.control.safety import SafetyConfig
from hg_dagger.envs.mapping import load_mapping
from hg_dagger.errors import ConfigError


class OperatorConfig(StrictModel):
    """Who answers a handover request."""

    type: Literal["synthetic", "expert", "device", "human_model"] = "synthetic"
    name: str = Field(default="", description="operator pseudonym stored with episodes and windows")
    # synthetic operator (driven by the task's planner expert through mapping.raw_to_human)
    reaction_delay_steps: int = Field(default=5, ge=0)
    noise_std: float = Field(default=0.0, ge=0.0)
    availability: float = Field(default=1.0, ge=0.0, le=1.0)
    return_after_steps: int | None = Field(default=None, ge=1)
    certification: Literal["none", "planner_auto"] = Field(
        default="none", description="planner_auto: the synthetic or expert operator's windows are certified by the "
        "planner that produced them and reach training without a reviewer (recorded per window)")
    # a real device: a name in configs/devices or a path
    device: str | None = None


class RobotConfig(StrictModel):
    """Run on a robot behind ``hg-dagger bridge serve`` instead of a local simulator.

    The token stays out of the config: it comes from ``token_file`` or the environment variable
    HG_DAGGER_BRIDGE_TOKEN. The heartbeat timeout is the robot's (``serve --heartbeat-timeout``);
    the client heartbeats at a quarter of it."""

    host: str = Field(default="127.0.0.1", min_length=1, description="robot bridge address (loopback by default)")
    port: int = Field(default=7650, ge=1, le=65535)
    token_file: str | None = Field(default=None, description="file holding the shared token; default: the "
                                   "environment variable HG_DAGGER_BRIDGE_TOKEN")
    connect_timeout_s: float = Field(default=2.0, gt=0)
    request_timeout_s: float = Field(default=10.0, gt=0)
    max_retries: int = Field(default=5, ge=0, description="reconnect attempts before the run fails")
    clock_pings: int = Field(default=8, ge=1, description="ping/pong exchanges per clock sync")
    clock_resync_s: float = Field(default=5.0, gt=0)
    resume_on_reconnect: bool = Field(default=False, description="lift a robot hold found after a reconnect without "
                                      "a person (unattended runs only; otherwise resume needs the operator)")
    tls_ca: str | None = Field(default=None, description="connect over TLS, trusting robot certificates that chain "
                               "to this PEM file (a CA, or the robot's self-signed certificate)")
    tls_server_name: str | None = Field(default=None, description="the name the robot's certificate must carry "
                                        "(default: host; an IP address must be an IP entry of its subjectAltName)")

    @model_validator(mode="before")
    @classmethod
    def _no_secret(cls, data: Any) -> Any:
        if isinstance(data, dict) and "token" in data:
            raise ValueError("keep the bridge token out of the config: give robot.token_file, or set the "
                             "environment variable HG_DAGGER_BRIDGE_TOKEN")
        return data

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


class RunConfig(StrictModel):
    """run/<name>.yaml on the config search path (kind: run): one human-gated collection run."""

    task: str
    scene: str = ""
    num_envs: int = Field(default=1, ge=1)
    episodes: int = Field(default=10, ge=1)
    windows: int | None = Field(default=None, ge=1, description="stop beginning episodes once the run holds this many "
                                "correction windows (the open ones finish); at most `episodes` episodes either way")
    seed: int = 0
    max_episode_steps: int | None = Field(default=None, ge=1, description="cut every episode after this many steps "
                                          "(end reason timeout); default: the task's horizon")
    iteration: int = Field(default=0, ge=0, description="the DAgger round these episodes belong to (recorded per "
                           "episode; set by round runs, `run --rounds` and `auto` in mode human_gated)")
    gates: str | GateConfig = Field(default="", description="a gate config: name in configs/gates, a path, or inline; "
                                    "empty = configs/gates/<task>.yaml")
    handover: HandoverConfig = Field(default_factory=HandoverConfig)
    safety: SafetyConfig = Field(default_factory=SafetyConfig)
    operator: OperatorConfig = Field(default_factory=OperatorConfig)
    expert_checkpoint: str | None = Field(
        default=None, description="a student checkpoint that labels for the synthetic or expert operator (a policy "
        "expert) instead of the task's planner: for tasks no planner labels, e.g. a Gymnasium env of your own")
    calibrate_steps: int = Field(default=0, ge=0, description="autonomous steps to calibrate the confidence gate first")
    latency_budget_ms: float | None = Field(default=None, gt=0, description="obs-to-apply latency above which a step "
                                            "is flagged latency_exceeded (excluded from labels)")
    realtime: bool = Field(default=False, description="pace ticks at the task's control rate (live devices)")
    episode_gap_s: float | None = Field(default=None, ge=0, description="live front ends (the app): a pause "
                                        "before each queued episode begins, so the person can breathe; None: "
                                        "the front end's default (the app: 2 s). A headless run never waits")
    robot: RobotConfig | None = Field(default=None, description="drive a robot over the bridge instead of a "
                                      "local simulator")
    fleet: FleetConfig | None = Field(default=None, description="one person serves every env row through a request "
                                      "queue (`run --robots N`, docs/fleet.md); None: each row answers on its own")

    @field_validator("gates")
    @classmethod
    def _known_gates(cls, v: str | GateConfig) -> str | GateConfig:
        """A gate config name is checked with the rest of the config: a typo fails before any store is touched."""
        if isinstance(v, str) and v:
            try:
                config_io.named_config("gates", v, what="gate")
            except ConfigError as exc:
                raise ValueError(str(exc)) from None
        return v

    @model_validator(mode="after")
    def _one_env(self) -> RunConfig:
        if self.operator.type == "device" and self.num_envs != 1:
            raise ValueError("operator.type 'device': a live device drives one env, set num_envs 1")
        if self.operator.type == "human_model" and self.num_envs > 1 and self.fleet is None:
            raise ValueError("operator.type 'human_model' is one person: with several envs give a fleet section "
                             "(run --robots N), whose queue decides which robot they serve")
        return self


def is_task_file(task: str | Path) -> bool:
    """Whether a task reference is a task YAML file (else it is a task id looked up in tasks/)."""
    return Path(task).suffix in (".yaml", ".yml")


def task_name(task: str | Path) -> str:
    """The task id a task reference stands for: the id itself, or the ``task_id`` inside a task file."""
    return load_mapping(task).task_id if is_task_file(task) else str(task)


def load_gate_config(ref: str | GateConfig, task: str) -> GateConfig:
    """A GateConfig from an inline model, a path, or a name on the config search path (gates/). Without one: the
    task's (gates/<task id>.yaml), else gates/default.yaml. A name that is not there is an error, never the
    default."""
    if isinstance(ref, GateConfig):
        return ref
    if not ref:
        return config_io.load(config_io.find("gates", task_name(task)) or config_io.config_path("gates", "default"),
                              GateConfig)
    return config_io.load(config_io.named_config("gates", ref, what="gate"), GateConfig)


def gates_for(ref: str | GateConfig, task: str) -> GateConfig:
    """``load_gate_config``, and a gate config written for another task is refused (one line naming it), so a front
    end can check its gates before it opens a store."""
    cfg = load_gate_config(ref, task)
    if cfg.task and task and cfg.task != task_name(task):
        where = ref if isinstance(ref, str) and ref else f"gates/{cfg.name}"
        raise ConfigError(f"{where}: key task: the gate config is for task {cfg.task!r}, the run is for "
                          f"{task_name(task)!r}")
    return cfg


def load_run_config(path: str | Path | None, task: str | None = None, **overrides) -> RunConfig:
    """The run config at ``path`` (a file, or a name in run/ on the config search path), else run/<task id>.yaml,
    else defaults; ``overrides`` win (None = keep)."""
    data: dict[str, Any] = {}
    if path is not None:
        path = config_io.named_config("run", path, what="run")
    elif task is not None:
        path = config_io.find("run", task_name(task))
    source = str(path) if path else "run options"
    if path is not None:
        data = config_io.read_yaml(path)
        data.pop("kind", None)
    if task is not None:
        data["task"] = task
    if any(v is not None for v in overrides.values()) and path is not None:
        source = f"{path} with options {', '.join(k for k, v in overrides.items() if v is not None)}"
    for key, value in overrides.items():
        if value is None:
            continue
        target = data
        *parents, leaf = key.split(".")
        for p in parents:
            if target.get(p) is None:
                target[p] = {}
            if not isinstance(target[p], dict):
                raise ConfigError(f"{source}: key {p!r} must be a mapping to take option {key}")
            target = target[p]
        target[leaf] = value
    return config_io.validate(RunConfig, data, source=source)


def parse_endpoint(text: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 as [ADDR]:PORT) -> (host, port)."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--robot {text!r}: expected HOST:PORT, e.g. 127.0.0.1:7650")
    return host, int(port)
