"""The LeRobot round's parts that need no LeRobot: the progress parser and the failure line on lerobot-train's own
output (captured from LeRobot 0.4.4, tests/data/lerobot_train), the command it builds, its config section, and a
failed training (a stand-in trainer that fails as lerobot-train does on a bad config) that keeps the acting policy,
from the library, the CLI and the app's Rounds tab (ui.rounds.OwnTrainerRounds); a ws:// round's export and the
server's next version; the live loop swapping in a served policy from the next episode. The successful round with
the real lerobot-train: tests/interop/test_lerobot_round.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.app import WAIT_MS, close_app, wait_snap

from hg_dagger.contract.enums import EndReason
from hg_dagger.control import live
from hg_dagger.control.build import open_session
from hg_dagger.control.loop import ControlLoop
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import load_mapping
from hg_dagger.errors import ConfigError
from hg_dagger.learn.lerobot_round import (
    LINEAGE_FILE,
    LeRobotTrainConfig,
    TrainFailed,
    export_round,
    failure_reason,
    lerobot_round,
    load_train_config,
    parse_progress,
    record_new_version,
    trainer_base,
    trainer_command,
    watch_version,
)
from hg_dagger.learn.rounds import bootstrap_student
from hg_dagger.policy import Student
from hg_dagger.policy.sources import ServerProcess
from hg_dagger.store import EpisodeStore
from hg_dagger.ui.application import AppOptions, OperatorApp
from hg_dagger.ui.rounds import LEROBOT_CONFIG, OwnTrainerRounds

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "lerobot_train"
FAKE_TRAINER = ROOT / "tests" / "fakes" / "lerobot_train" / "lerobot-train"
BAD_CONFIG_LINE = "draccus.utils.DecodingError: `chunk_size`: Couldn't parse 'notanumber' into an int"


def _pieces(path: Path) -> list[str]:
    """The output as the round reads it from the pipe (text mode: the progress bar's carriage returns end lines)."""
    return path.read_text().splitlines()


def test_progress_is_read_from_lerobot_trains_own_output():
    got = [p for p in map(parse_progress, _pieces(DATA / "finetune.log")) if p is not None]
    steps = [s for s, _ in got]
    assert steps == sorted(steps) and steps[-1] == 4 and set(steps) == {0, 1, 2, 3, 4}
    losses = [(s, loss) for s, loss in got if loss is not None]
    assert losses == [(2, 67.826), (4, 63.217)]  # its metrics lines at --log_freq=2
    assert parse_progress("INFO 2026-12-06 ot_train.py:332 cfg.steps=4 (4)") is None
    assert parse_progress("INFO ot_train.py:435 step:12K smpl:96K ep:1K epch:3.50 loss:0.041 grdn:1.2") == (12000, 0.041)
    assert parse_progress("INFO ot_train.py:435 step:7 smpl:28 ep:1 epch:0.4 loss:nan grdn:nan")[0] == 7


def test_the_failure_line_is_the_exception_a_bad_config_ends_with():
    assert failure_reason(_pieces(DATA / "bad_config.log")) == BAD_CONFIG_LINE
    assert failure_reason(["Training:  50%|█ | 2/4 [00:01<00:01]", "Killed"]) == "Killed"
    assert failure_reason([]) == "no output"


def test_the_command_fine_tunes_the_acting_checkpoint(tmp_path):
    cfg = LeRobotTrainConfig(steps=300, batch_size=16, args=["--policy.optimizer_lr=1e-5"])
    cmd = trainer_command(["lerobot-train"], tmp_path / "pm", tmp_path / "export", "local/d_v3", tmp_path / "train",
                          cfg)
    assert cmd[0] == "lerobot-train" and cmd[-1] == "--policy.optimizer_lr=1e-5"  # the user's arguments win
    assert {f"--policy.path={tmp_path / 'pm'}", f"--dataset.root={tmp_path / 'export'}", "--dataset.repo_id=local/d_v3",
            "--steps=300", "--batch_size=16", "--save_freq=300", "--log_freq=15", "--eval_freq=0",
            f"--output_dir={tmp_path / 'train'}", "--policy.push_to_hub=false", "--wandb.enable=false"} <= set(cmd)
    assert not any(a.startswith("--resume") for a in cmd)  # weights from the acting policy, a fresh optimizer

    bin_ = tmp_path / "env" / "bin"
    bin_.mkdir(parents=True)
    (bin_ / "python").touch()
    assert trainer_base(str(bin_ / "python"), LeRobotTrainConfig()) == [str(bin_ / "python"), "-m",
                                                                         "lerobot.scripts.lerobot_train"]
    (bin_ / "lerobot-train").touch()
    assert trainer_base(str(bin_ / "python"), LeRobotTrainConfig()) == [str(bin_ / "lerobot-train")]
    assert trainer_base(None, LeRobotTrainConfig(trainer=["x", "y"])) == ["x", "y"]


def test_without_a_python_the_round_says_which_option(monkeypatch):
    monkeypatch.delenv("HG_DAGGER_POLICY_PYTHON", raising=False)
    with pytest.raises(ConfigError, match="--policy-python"):
        trainer_base(None, LeRobotTrainConfig())


def test_the_config_section_and_its_errors(tmp_path):
    good = tmp_path / "round.yaml"
    good.write_text("lerobot_train:\n  steps: 50\n  batch_size: 4\n  args: ['--policy.optimizer_lr=1e-5']\n")
    cfg = load_train_config(good)
    assert (cfg.steps, cfg.batch_size, cfg.args) == (50, 4, ["--policy.optimizer_lr=1e-5"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("lerobot_train:\n  stepz: 50\n")
    with pytest.raises(ConfigError) as err:
        load_train_config(bad)
    assert str(err.value).count("\n") == 0 and "bad.yaml" in str(err.value) and "stepz" in str(err.value)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    """A toy_reach store of certified planner demonstrations: labels that may train."""
    work = tmp_path_factory.mktemp("lerobot_round")
    path = str(work / "store.zarr")
    bootstrap_student(task="toy_reach", store=path, out_dir=str(work / "boot"), demos=2, steps=5,
                      report=lambda *_: None)
    return path


def _acting(tmp_path: Path) -> Path:
    """A pretrained_model folder as far as the round reads it before training (its config and weights file)."""
    folder = tmp_path / "acting" / "pretrained_model"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"type": "act", "chunk_size": 8, "n_action_steps": 4}))
    (folder / "model.safetensors").write_bytes(b"weights of the acting policy")
    return folder


def _digest(folder: Path) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())).hexdigest()


@pytest.mark.subprocess  # the trainer is a process
def test_a_failed_training_keeps_the_acting_policy_and_says_why(store, tmp_path):
    acting = _acting(tmp_path)
    before = _digest(acting.parent)
    stages: list[str] = []
    with pytest.raises(TrainFailed) as err:
        lerobot_round(policy=f"lerobot:{acting}", store=store, out_dir=str(tmp_path / "round"),
                      config={"steps": 4, "trainer": [sys.executable, str(FAKE_TRAINER)]}, task="toy_reach",
                      report=lambda s, f: stages.append(s))
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("lerobot-train failed (exit 1): " + BAD_CONFIG_LINE)
    assert str(tmp_path / "round" / "train.log") in msg
    log = (tmp_path / "round" / "train.log").read_text()  # the command, then all the trainer said
    assert log.startswith("$ ") and log.split("\n", 1)[1] == (DATA / "bad_config.log").read_text()
    assert {"quality checks", "dataset version", "export for LeRobot"} <= set(stages)
    assert _digest(acting.parent) == before and not list(tmp_path.rglob(LINEAGE_FILE))
    assert json.loads((tmp_path / "round" / "export" / "meta" / "info.json").read_text())["total_frames"] > 0


@pytest.mark.subprocess  # hg-dagger and the trainer as processes
def test_the_cli_gives_one_line_when_the_training_fails(store, tmp_path):
    acting = _acting(tmp_path)
    r = subprocess.run([sys.executable, "-m", "hg_dagger", "policy", "train-next", "--policy", f"lerobot:{acting}",
                        "--store", store, "--out", str(tmp_path / "round"), "--steps", "4", "--dataset", "cli",
                        "--trainer", sys.executable, str(FAKE_TRAINER)],
                       capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and BAD_CONFIG_LINE in errors[0], r.stderr
    assert "lerobot-train: starting" in r.stderr  # the progress lines came before it


def test_a_round_for_a_policy_server_exports_and_records_its_next_version(store, tmp_path):
    out = tmp_path / "ws_round"
    result = export_round(policy="ws://gpu-box:8000", store=store, out_dir=str(out), version="pi0-aaaa",
                          dataset="ws", report=lambda *_: None)
    assert Path(result["export"]) == out / "export" and result["frames"] > 0 and result["dataset"] == "ws@v1"
    answers = iter([None, "pi0-aaaa", "pi0-bbbb"])  # down while it restarts, the old version, then the new one
    new = watch_version(lambda: next(answers), "pi0-aaaa", timeout_s=10, every_s=0.01)
    assert new == "pi0-bbbb"
    event = record_new_version(result["round"], new)
    assert json.loads((out / LINEAGE_FILE).read_text()) == event
    assert (event["policy_version"], event["parent_version"], event["dataset"]) == ("pi0-bbbb", "pi0-aaaa", "ws@v1")
    assert watch_version(lambda: "pi0-aaaa", "pi0-aaaa", timeout_s=0.05, every_s=0.01) is None


@pytest.mark.subprocess  # the round's job is a spawned process, the trainer another
def test_the_apps_round_for_a_lerobot_policy_that_fails_to_train_keeps_it(store, tmp_path):
    acting = _acting(tmp_path)
    task_dir = tmp_path / "app" / "toy_reach"
    task_dir.mkdir(parents=True)
    (task_dir / LEROBOT_CONFIG).write_text(f"lerobot_train:\n  steps: 3\n  batch_size: 2\n  dataset: app\n"
                                           f"  trainer: [{sys.executable}, {FAKE_TRAINER}]\n")
    rounds = OwnTrainerRounds(task_dir, store, "toy_reach")
    job, first = rounds.start(f"lerobot:{acting}", "act-0123")
    assert first == "lerobot-train: 3 steps, batch 2"
    stages = []
    deadline = time.monotonic() + 240
    while not job.done and time.monotonic() < deadline:
        stages += [p.stage for p in job.poll()]
        time.sleep(0.05)
    assert job.done and job.result is None
    message, swap = rounds.finished(job.result, job.error)
    assert swap == "" and "\n" not in message and BAD_CONFIG_LINE in message
    assert message.endswith("the acting policy goes on") and "lerobot-train: starting" in stages
    assert (task_dir / "own_rounds" / "round-00" / "train.log").is_file()


@pytest.mark.subprocess  # the round's job is a spawned process
def test_the_apps_round_for_a_policy_server_records_its_next_version(store, tmp_path):
    rounds = OwnTrainerRounds(tmp_path / "app", store, "toy_reach")
    job, _ = rounds.start("ws://gpu-box:8000", "pi0-aaaa")
    assert job.wait(240) and job.error == "", job.error
    message, swap = rounds.finished(job.result, "")
    assert swap == "" and "Reconnect policy" in message and job.result["export"] in message
    assert rounds.watch("") == "" and rounds.watch("pi0-aaaa") == ""  # down, or back with the same version
    line = rounds.watch("pi0-bbbb")
    lineage = json.loads((Path(job.result["round"]).with_name(LINEAGE_FILE)).read_text())
    assert (lineage["policy_version"], lineage["parent_version"]) == ("pi0-bbbb", "pi0-aaaa") and "pi0-bbbb" in line
    assert rounds.watch("pi0-cccc") == ""  # recorded once


def _wait(loop, predicate, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = loop.slot.read()
        if predicate(snap):
            return snap
        time.sleep(0.02)
    raise AssertionError(f"timed out; last snapshot: phase {snap.phase}, message {snap.message!r}")


@pytest.mark.subprocess  # two policy servers
def test_the_live_loop_swaps_in_a_served_policy_from_the_next_episode(tmp_path):
    """SwapStudent with a policy spec (a round's lerobot:NEW; here a served student, ws://): the running episode
    ends with the acting policy, whose server keeps answering, and the next one acts with the new policy."""
    mapping = load_mapping("toy_reach")
    servers = []
    for seed in (0, 1):
        Student.create(mapping, seed=seed).save(tmp_path / f"s{seed}.pt")
        servers.append(ServerProcess(sys.executable, str(tmp_path / f"s{seed}.pt"), extra=["--task", "toy_reach"]))
    try:
        old_url, new_url = (s.wait_ready(120) for s in servers)
        store = str(tmp_path / "s.zarr")
        cfg = load_run_config(None, "toy_reach", calibrate_steps=0, max_episode_steps=60, num_envs=1)
        loop = ControlLoop(lambda: open_session(cfg, store, policy=old_url), view_size=0).start()
        try:
            _wait(loop, lambda s: s.phase == "idle" and not s.loading)
            loop.commands.put(live.StartEpisodes(1))
            first = _wait(loop, lambda s: s.phase == "running" and s.episode_step >= 5)
            loop.commands.put(live.SwapStudent(new_url))
            swapped = _wait(loop, lambda s: "new policy" in s.message)
            _wait(loop, lambda s: s.phase == "idle" and s.counters.episodes >= 1)
            loop.commands.put(live.StartEpisodes(1))
            second = _wait(loop, lambda s: s.episode_id not in (None, first.episode_id) and s.episode_step >= 1)
            assert second.policy_version != first.policy_version and second.policy_version in swapped.message
            _wait(loop, lambda s: s.phase == "idle" and s.counters.episodes >= 2)
        finally:
            loop.stop()
    finally:
        for s in servers:
            s.stop()
    st = EpisodeStore.open(store)
    a, b = (st.info(e) for e in (first.episode_id, second.episode_id))
    assert a.end.end_reason != EndReason.SAFETY_STOP and a.start.policy_version == first.policy_version
    assert b.start.policy_version == second.policy_version


@pytest.mark.app
@pytest.mark.subprocess  # policy servers, the round's job
def test_the_app_exports_a_round_for_a_policy_server_and_records_its_next_version(qtbot, tmp_path, settings, store):
    """"Train next" with a ws:// policy: the export for the server's owner; the server comes back on its address
    with other weights, the loop reconnects, and the app records the new version as the round's lineage."""
    mapping = load_mapping("toy_reach")
    for seed in (0, 1):
        Student.create(mapping, seed=seed).save(tmp_path / f"s{seed}.pt")
    old = ServerProcess(sys.executable, str(tmp_path / "s0.pt"), extra=["--task", "toy_reach"])
    servers = [old]
    op = None
    try:
        url = old.wait_ready(120)
        opts = AppOptions(task="toy_reach", store=store, student=url, operator="synthetic", name="op-ws",
                          home=str(tmp_path / "home"))
        op = OperatorApp(opts, settings)
        op.start()
        assert op.window is not None and op.loop is not None
        qtbot.addWidget(op.window)
        first = wait_snap(qtbot, op, lambda s: s.phase == "idle" and bool(s.policy_version))
        op.train_next()
        qtbot.waitUntil(lambda: op.job is None, timeout=WAIT_MS)
        text = op.window.rounds.message.text()
        assert "Reconnect policy" in text and "exported to" in text, text
        round_dir = tmp_path / "home" / "toy_reach" / "own_rounds" / "round-00"
        assert json.loads((round_dir / "round.json").read_text())["parent_version"] == first.policy_version

        old.stop()  # the owner restarts the server on the same address with the retrained weights
        new = ServerProcess(sys.executable, str(tmp_path / "s1.pt"),
                            extra=["--task", "toy_reach", "--port", url.rsplit(":", 1)[1]])
        servers.append(new)
        assert new.wait_ready(120) == url
        op.loop.commands.put(live.StartEpisodes(1))  # the old connection is gone: the policy is lost
        wait_snap(qtbot, op, lambda s: bool(s.policy_lost))
        op.loop.commands.put(live.StartEpisodes(1))  # reconnects, then starts
        after = wait_snap(qtbot, op, lambda s: s.policy_version not in ("", first.policy_version))
        # the record is the lineage file (the panel's line may give way to the loop's next message at once)
        qtbot.waitUntil(lambda: (round_dir / LINEAGE_FILE).is_file(), timeout=WAIT_MS)
        lineage = json.loads((round_dir / LINEAGE_FILE).read_text())
        assert (lineage["parent_version"], lineage["policy_version"]) == (first.policy_version, after.policy_version)
        assert close_app(qtbot, op) == 0
    finally:
        if op is not None and op.loop is not None:
            op.loop.stop()
        for s in servers:
            s.stop()
