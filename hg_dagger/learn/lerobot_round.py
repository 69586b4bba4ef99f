"""A round for a policy that trains with its own trainer: a LeRobot policy fine-tuned by ``lerobot-train``.

    result = lerobot_round(policy="lerobot:DIR", store="runs/app/toy_reach/store.zarr", out_dir="runs/r1",
                           python=".venv-lerobot/bin/python", config={"steps": 2000, "batch_size": 8}, report=report)
    result["spec"]  # lerobot:runs/r1/train/checkpoints/<step>/pretrained_model, the policy to serve next

The round: QC, the next version of the round's dataset (datasets.build: every label reviewed and authorized so far,
each version pinned), that version's trainable labels exported for LeRobot (``--labels trainable``), then
``lerobot-train --policy.path=DIR`` in the policy's own Python: it loads the acting policy's weights and fine-tunes
them on the new export, with the new export's normalization (a fresh optimizer; ``--resume`` would continue the old
run's schedule on the old data). Its log lines give the progress (step, loss). The new ``pretrained_model`` gets a
lineage file beside it (``hg_dagger_lineage.json``: parent version, dataset version, the exact command, steps, final
loss). A trainer that fails changes nothing: the acting policy stays, and the reason is one line (the trainer's
last words; the whole log stays in OUT/train.log).

A ``ws://`` policy is trained by whoever runs its server: ``export_round`` builds the version and exports it, and
``watch_version`` waits for the server to come back with another ``policy_version``, recorded as a lineage event.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from hg_dagger import config as config_io
from hg_dagger.contract.clock import wall_stamp
from hg_dagger.contract.enums import Usage
from hg_dagger.contract.model import StrictModel
from hg_dagger.datasets import export
from hg_dagger.datasets.build import build
from hg_dagger.datasets.manifest import DatasetConfig, DatasetError, Manifest, SelectionConfig
from hg_dagger.datasets.read import export_items
from hg_dagger.datasets.repository import default_root, record_training, versions
from hg_dagger.envs import load_mapping, make_env
from hg_dagger.errors import ConfigError, HgDaggerError
from hg_dagger.learn.evaluate import EvalConfig, closed_loop
from hg_dagger.learn.promotion import PromotionConfig, decide, successes
from hg_dagger.review.qc import run_qc

Report = Callable[[str, float], None]  # (stage text, fraction 0..1 of that stage), as learn.rounds

LINEAGE_FILE = "hg_dagger_lineage.json"  # beside the new pretrained_model folder
TRAINER = "lerobot-train"
SECTION = "lerobot_train"  # the section of a YAML file that configures the trainer
PYTHON_ENV = "HG_DAGGER_POLICY_PYTHON"  # as policy.sources: LeRobot's Python when none is given


class TrainFailed(HgDaggerError):
    """The trainer exited with an error or left no checkpoint; the acting policy stays."""


class LeRobotTrainConfig(StrictModel):
    """How ``lerobot-train`` fine-tunes the acting policy (the ``lerobot_train`` section of a YAML file)."""

    steps: int = Field(default=2000, gt=0, description="gradient steps of the fine-tuning")
    batch_size: int = Field(default=8, gt=0)
    num_workers: int = Field(default=0, ge=0, description="data loader processes")
    log_freq: int | None = Field(default=None, gt=0, description="a loss line every this many steps (default: about "
                                 "20 lines a training)")
    device: str = Field(default="cpu", description="torch device of the training (cpu, cuda, mps)")
    dataset: str = Field(default="lerobot_rounds", description="the dataset whose versions the rounds build")
    args: list[str] = Field(default_factory=list, description="further lerobot-train arguments, e.g. "
                            "--policy.optimizer_lr=1e-5")
    trainer: list[str] = Field(default_factory=list, description="the trainer command (default: lerobot-train "
                               "beside the policy's Python, else PYTHON -m lerobot.scripts.lerobot_train)")
    timeout_s: float | None = Field(default=None, gt=0, description="stop a training that runs longer (None: never)")


def load_train_config(path: str | Path) -> LeRobotTrainConfig:
    """The ``lerobot_train`` section of a YAML file (or the whole file when it has no such section)."""
    data = config_io.read_yaml(path)
    section = data.get(SECTION, data)
    if not isinstance(section, dict):
        raise ConfigError(f"{path}: key {SECTION}: expected a mapping (steps, batch_size, ...)")
    section = {k: v for k, v in section.items() if k != "kind"}
    source = f"{path}" if SECTION not in data else f"{path} ({SECTION})"
    return config_io.validate(LeRobotTrainConfig, section, source=source)


# ---------------------------------------------------------------------- the trainer's log

_STEP = re.compile(r"\bstep:(\d+(?:\.\d+)?)([KMBTQ]?)\s")
_LOSS = re.compile(r"\bloss:(-?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf))")
_BAR = re.compile(r"Training:\s.*?\|\s*(\d+)/(\d+)\s\[")
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12, "Q": 10**15}


def parse_progress(line: str) -> tuple[int, float | None] | None:
    """(step, loss) from one piece of lerobot-train's output: its metrics line ("... step:200 smpl:1K ...
    loss:0.412 ...", loss None when absent) or its progress bar ("Training: 50%|...| 2/4 [..."); None otherwise.
    Steps of 1,000 and more are written "1K" (LeRobot's format_big_number): those are as exact as it prints them."""
    m = _STEP.search(line)
    if m is not None:
        loss = _LOSS.search(line, m.end())
        step = int(round(float(m.group(1)) * _SCALE[m.group(2)]))
        return step, float(loss.group(1)) if loss else None
    bar = _BAR.search(line)
    if bar is not None:
        return int(bar.group(1)), None
    return None


_TRACE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt|Exit)\b.*:|^\w+(Error|Exception)$")


def failure_reason(tail: list[str]) -> str:
    """The line of a failed trainer's output that says why: the exception line a traceback ends with, else the
    last line that is not a progress bar."""
    lines = [ln.strip() for ln in tail if ln.strip() and not ln.lstrip().startswith("Training:")]
    for ln in reversed(lines):
        if _TRACE.match(ln):
            return ln
    return lines[-1] if lines else "no output"


# ---------------------------------------------------------------------- the command


def policy_folder(spec: str) -> Path:
    """The pretrained_model folder of ``lerobot:DIR`` (or of DIR itself)."""
    text = str(spec)
    return Path(text.split(":", 1)[1] if text.startswith("lerobot:") else text).expanduser().resolve()


def trainer_base(python: str | None, cfg: LeRobotTrainConfig) -> list[str]:
    """The trainer command without arguments: the config's, else ``lerobot-train`` beside ``python``, else
    ``python -m lerobot.scripts.lerobot_train``."""
    if cfg.trainer:
        return list(cfg.trainer)
    python = python or os.environ.get(PYTHON_ENV)
    if not python:
        raise ConfigError(f"lerobot-train runs in LeRobot's own Python: give --policy-python PATH (or set "
                          f"{PYTHON_ENV})")
    beside = Path(python).expanduser().absolute().with_name(TRAINER)  # not resolved: a venv's python is a link
    return [str(beside)] if beside.is_file() else [python, "-m", "lerobot.scripts.lerobot_train"]


def trainer_command(base: list[str], parent: Path, dataset_root: Path, repo_id: str, out: Path,
                    cfg: LeRobotTrainConfig) -> list[str]:
    """``lerobot-train`` fine-tuning the policy in ``parent`` on the export in ``dataset_root``, into ``out``
    (one checkpoint, at the last step; no evaluation, no hub, no wandb)."""
    log_freq = cfg.log_freq or max(1, cfg.steps // 20)
    return [*base, f"--dataset.repo_id={repo_id}", f"--dataset.root={dataset_root}", f"--policy.path={parent}",
            f"--policy.device={cfg.device}", "--policy.push_to_hub=false", "--wandb.enable=false",
            f"--steps={cfg.steps}", f"--batch_size={cfg.batch_size}", f"--num_workers={cfg.num_workers}",
            f"--save_freq={cfg.steps}", "--eval_freq=0", f"--log_freq={log_freq}", f"--output_dir={out}", *cfg.args]


def run_trainer(cmd: list[str], log_path: Path, steps: int, report: Report, *, timeout_s: float | None = None,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run the trainer, its output to ``log_path``, its progress to ``report`` ("lerobot-train: step 40/200, loss
    0.31"); the last step and loss it logged. A failure raises TrainFailed with the reason in one line."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tail: deque[str] = deque(maxlen=60)
    step, loss = 0, None
    losses: list[tuple[int, float]] = []
    t0 = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                                    env=env, errors="replace")
        except OSError as exc:
            raise TrainFailed(f"cannot start the trainer {cmd[0]!r} ({exc.strerror or exc})") from None
        timer = None
        timed_out = threading.Event()
        if timeout_s is not None:
            def stop() -> None:
                timed_out.set()
                proc.kill()
            timer = threading.Timer(timeout_s, stop)
            timer.daemon = True
            timer.start()
        try:
            assert proc.stdout is not None  # started with stdout=PIPE
            report(f"{TRAINER}: starting", 0.0)
            for line in proc.stdout:  # text mode: the progress bar's \r ends a line too
                log.write(line if line.endswith("\n") else line + "\n")
                tail.append(line.rstrip("\n"))
                got = parse_progress(line)
                if got is None:
                    continue
                s, lo = got
                step = max(step, min(s, steps))
                if lo is not None:
                    loss = lo
                    losses.append((s, lo))
                report(f"{TRAINER}: step {step}/{steps}" + (f", loss {loss:.4g}" if loss is not None else ""),
                       step / steps)
            code = proc.wait()
        finally:
            if timer is not None:
                timer.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if timed_out.is_set():
        raise TrainFailed(f"{TRAINER} ran past {timeout_s:g} s and was stopped (log: {log_path})")
    if code != 0:
        raise TrainFailed(f"{TRAINER} failed (exit {code}): {failure_reason(list(tail))} (log: {log_path})")
    return {"step": step, "loss_last": loss, "losses": losses, "seconds": round(time.monotonic() - t0, 2)}


def trained_folder(out: Path) -> Path:
    """The pretrained_model folder lerobot-train wrote last under ``out`` (checkpoints/last, resolved)."""
    last = out / "checkpoints" / "last"
    folder = (last.resolve() if last.exists() else last) / "pretrained_model"
    if not (folder / "config.json").is_file():
        raise TrainFailed(f"{TRAINER} ended without a checkpoint: no {folder / 'config.json'} (log: "
                          f"{out.parent / 'train.log'})")
    return folder


# ---------------------------------------------------------------------- the dataset version


def next_version(store: str, *, name: str, task: str | None = None, root: str | None = None,
                 report: Report) -> tuple[Manifest, bool, Path]:
    """QC, then the next version of dataset ``name`` with ``store`` (or the current one when nothing is new);
    (manifest, written, dataset folder)."""
    report("quality checks", 0.0)
    run_qc(store, progress=False)
    report("dataset version", 0.0)
    droot = default_root(root, [store])
    # a new dataset selects the task's episodes; an existing one keeps the config its versions were built with
    cfg = DatasetConfig(selection=SelectionConfig(task=task)) if task and not versions(droot, name) else None
    manifest, written = build(name, [store], root=droot, config=cfg)
    report("dataset version", 1.0)
    return manifest, written, droot


def export_version(manifest: Manifest, out: Path, report: Report) -> dict[str, Any]:
    """The version's trainable labels as a LeRobot dataset (``--labels trainable``) in ``out``."""
    items = export_items(manifest, [Usage.TRAINABLE.value])
    if not items:
        raise DatasetError(f"{manifest.ref}: no trainable label yet: approve and authorize correction windows in "
                           f"review (hg-dagger review approve STORE WINDOW --authorize), then train")
    report("export for LeRobot", 0.0)
    summary = export("lerobot", items, out, labels="trainable")
    report("export for LeRobot", 1.0)
    return {"path": str(out), "episodes": summary.episodes, "frames": summary.frames, "line": summary.line()}


# ---------------------------------------------------------------------- the round


def lerobot_round(*, policy: str, store: str, out_dir: str, python: str | None = None,
                  config: dict[str, Any] | None = None, task: str | None = None, dataset_root: str | None = None,
                  check_serves: bool = False, promotion: dict[str, Any] | None = None,
                  report: Report) -> dict[str, Any]:
    """One round for the LeRobot policy ``policy`` (lerobot:DIR): dataset version, export, ``lerobot-train``
    from DIR into ``out_dir``, lineage. Returns the new checkpoint (``spec``: lerobot:NEW), its version, the
    parent's, the dataset version, the command, steps and final loss. ``check_serves``: start ``hg-dagger policy
    serve`` on the new checkpoint in ``python`` once, so a checkpoint that does not load fails the round here.
    ``promotion`` (a PromotionConfig's fields; needs ``task``): both policies, served from ``python``, are evaluated
    on the same held-out seeds, and the result's ``promotion`` says whether the new one takes over (learn.promotion's
    rule, as for the built-in student); the decision is in the lineage either way."""
    # deferred: the policy package imports torch, and the app imports this module in its window process to start jobs
    from hg_dagger.policy.lerobot_served import read_config, weights_version

    cfg = LeRobotTrainConfig(**(config or {}))
    parent = policy_folder(policy)
    policy_type = read_config(parent)["type"]  # a wrong folder is one line, before anything is built
    parent_version = weights_version(parent, policy_type)
    base = trainer_base(python, cfg)
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty; a round writes a new folder")
    t0 = time.monotonic()
    manifest, written, droot = next_version(store, name=cfg.dataset, task=task, root=dataset_root, report=report)
    exported = export_version(manifest, out / "export", report)
    repo_id = f"local/{manifest.name}_v{manifest.version}"
    cmd = trainer_command(base, parent, out / "export", repo_id, out / "train", cfg)
    trained = run_trainer(cmd, out / "train.log", cfg.steps, report, timeout_s=cfg.timeout_s)
    folder = trained_folder(out / "train")
    version = weights_version(folder, policy_type)
    if check_serves and promotion is None:  # the held-out evaluation serves it anyway
        report("serving the new checkpoint", 0.0)
        serve_once(python or base[0], folder)
    decision = None
    if promotion is not None:
        if task is None:
            raise ConfigError("the held-out evaluation of a round needs the task (--task)")
        decision = judge_served(f"lerobot:{folder}", f"lerobot:{parent}", task, PromotionConfig(**promotion),
                                python or base[0], report)
    lineage = {
        "policy_version": version, "policy_type": policy_type, "checkpoint": str(folder),
        "parent_version": parent_version, "parent_checkpoint": str(parent),
        "dataset": manifest.ref, "dataset_hash": manifest.hash, "dataset_new": written,
        "store": str(store), "export": exported["path"], "frames": exported["frames"],
        "trainer": TRAINER, "command": cmd, "command_line": shlex.join(cmd),
        "steps": cfg.steps, "step_last": trained["step"], "batch_size": cfg.batch_size,
        "loss_last": trained["loss_last"], "losses": trained["losses"], "train_seconds": trained["seconds"],
        "promotion": decision, "created_wall": wall_stamp(),
    }
    path = folder.parent / LINEAGE_FILE
    path.write_text(json.dumps(lineage, indent=1))
    record_training(droot, manifest, version, str(folder))
    return {**lineage, "spec": f"lerobot:{folder}", "version": version, "lineage": str(path),
            "seconds": round(time.monotonic() - t0, 2), "labels": exported["frames"]}


def judge_served(candidate: str, acting: str, task: str, cfg: PromotionConfig, python: str,
                 report: Report) -> dict[str, Any]:
    """The promotion decision for the served policy ``candidate`` against ``acting``: both rolled alone on the same
    held-out seeds (learn.evaluate.closed_loop), then learn.promotion's rule."""
    # deferred: the policy package imports torch (see lerobot_round)
    from hg_dagger.policy.remote import PolicyOptions
    from hg_dagger.policy.sources import close_policy, open_policy

    mapping = load_mapping(task)
    held = EvalConfig(episodes=cfg.episodes, num_envs=min(cfg.num_envs, cfg.episodes), seed=cfg.seed)
    figures, names = {}, {}
    with make_env(mapping, num_envs=held.num_envs, seed=cfg.seed) as env:
        for i, (who, spec) in enumerate((("acting", acting), ("new", candidate))):
            report(f"held-out evaluation: the {who} policy", i / 2)
            policy = open_policy(spec, mapping, PolicyOptions(python=python))
            try:
                figures[who], names[who] = successes(closed_loop(policy, env, held)), policy.version
            finally:
                close_policy(policy)
    report("held-out evaluation: the new policy", 1.0)
    d = decide(figures["new"], figures["acting"], cfg.confidence)
    d.update(candidate_version=names["new"], incumbent_version=names["acting"],
             acting_version=names["new"] if d["promoted"] else names["acting"])
    return d


def promotion_words(d: dict[str, Any]) -> str:
    """The decision in one line: which policy acts next, and both held-out figures."""
    n = d["episodes"]
    new, old = round(d["candidate_success"] * n), round(d["incumbent_success"] * n)
    head = (f"new policy {d['candidate_version']} takes over" if d["promoted"]
            else f"kept policy {d['incumbent_version']}: the new one ({d['candidate_version']}) did worse")
    return f"{head}; held-out {new}/{n} new against {old}/{n} acting ({d['reason'].split(': ', 1)[-1]})"


def serve_once(python: str, folder: Path) -> None:
    """Start ``hg-dagger policy serve lerobot:FOLDER`` in ``python`` until it listens, then stop it."""
    # deferred: the policy package imports torch (see lerobot_round)
    from hg_dagger.policy.sources import ServerProcess

    server = ServerProcess(python, f"lerobot:{folder}")
    try:
        server.wait_ready(300.0)
    except HgDaggerError as exc:  # it exited, or did not listen in time: its own line says why
        raise TrainFailed(f"the new checkpoint does not serve: {exc}") from None
    finally:
        server.stop()


def read_lineage(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The lineage beside a pretrained_model folder (None: none, e.g. a policy trained elsewhere)."""
    path = policy_folder(str(folder)).parent / LINEAGE_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ---------------------------------------------------------------------- a policy server's own trainer


def export_round(*, policy: str, store: str, out_dir: str, version: str, dataset: str = "lerobot_rounds",
                 task: str | None = None, dataset_root: str | None = None, report: Report) -> dict[str, Any]:
    """A round for a policy served from elsewhere (``ws://``), trained by its owner: the next dataset version,
    exported for LeRobot into OUT/export, and OUT/round.json saying which server version it is meant to improve.
    ``watch_version`` then records the server's next version."""
    out = Path(out_dir).expanduser().absolute()
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty; a round writes a new folder")
    manifest, written, _ = next_version(store, name=dataset, task=task, root=dataset_root, report=report)
    exported = export_version(manifest, out / "export", report)
    record = {"policy": policy, "parent_version": version, "dataset": manifest.ref, "dataset_hash": manifest.hash,
              "dataset_new": written, "export": exported["path"], "frames": exported["frames"],
              "trainer": "the server's own", "created_wall": wall_stamp()}
    (out / "round.json").write_text(json.dumps(record, indent=1))
    return {**record, "round": str(out / "round.json")}


def record_new_version(round_file: str | os.PathLike, version: str) -> dict[str, Any]:
    """The server came back with ``version``: a lineage event in the round folder (OUT/hg_dagger_lineage.json)."""
    path = Path(round_file)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a round record ({exc})") from None
    event = {"policy_version": version, "parent_version": record["parent_version"], "dataset": record["dataset"],
             "dataset_hash": record["dataset_hash"], "policy": record["policy"], "trainer": record["trainer"],
             "command": None, "seen_wall": wall_stamp()}
    (path.parent / LINEAGE_FILE).write_text(json.dumps(event, indent=1))
    return event


def watch_version(read_version: Callable[[], str | None], parent: str, *, timeout_s: float, every_s: float = 5.0,
                  report: Report | None = None) -> str | None:
    """Ask ``read_version`` (the server's metadata version; None while it is down) every ``every_s`` until it
    differs from ``parent``; that version, or None when ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = read_version()
        if now is not None and now != parent:
            return now
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        if report is not None:
            report(f"waiting for a new server version (now {now or 'down'})", 0.0)
        time.sleep(min(every_s, left))


__all__ = ["LINEAGE_FILE", "LeRobotTrainConfig", "TrainFailed", "export_round", "failure_reason", "judge_served",
           "lerobot_round", "load_train_config", "parse_progress", "promotion_words", "read_lineage",
           "record_new_version", "run_trainer", "trainer_command", "watch_version"]
