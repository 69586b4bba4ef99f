"""The main job end to end, on the fast toy task: demos -> BC student -> human-gated run -> validate."""

import pytest

from hg_dagger.cli import main
from hg_dagger.demo import run_demo
from hg_dagger.errors import HgDaggerError
from hg_dagger.store import EpisodeStore


def test_demo_records_demos_and_gated_episodes_that_validate(tmp_path):
    report = run_demo(tmp_path / "demo", task="toy_reach", demo_episodes=4, train_steps=50, gated_episodes=2,
                      eval_episodes=2, progress=False)
    assert report.violations == []
    assert report.episodes_by_mode == {"expert_demo": 4, "human_gated": 2}
    assert report.checkpoint.is_file()
    store = EpisodeStore.open(str(report.store), mode="r")
    gated = [i for i in store.episodes() if i.start.mode.value == "human_gated"]
    assert all(i.complete for i in gated)
    # only operator steps can be labels in a human-gated run, and the synthetic operator corrected something
    assert 0 < report.trainable_steps <= report.gated["human_steps"]
    assert any(line.startswith("validate:    ok") for line in report.lines())


def test_demo_never_appends_to_an_existing_store(tmp_path):
    (tmp_path / "store.zarr").mkdir()
    with pytest.raises(HgDaggerError, match="already exists"):
        run_demo(tmp_path, task="toy_reach", progress=False)
    assert main(["demo", "--out", str(tmp_path), "--task", "toy_reach", "--quiet"]) == 2


@pytest.mark.simulation
@pytest.mark.subprocess
@pytest.mark.slow
def test_the_fetch_demo_keeps_every_command_a_person_gave_where_the_monitor_clamped_it(tmp_path):
    """`make run`'s headless demo on Fetch: the safety monitor clamps some of the synthetic operator's commands.
    Those steps are the controller's, yet keep the raw device value; a step under the person's control without one
    says why in its flags, and validate agrees."""
    import numpy as np

    from hg_dagger.contract import ActionSource, ControlState, StepFlag

    report = run_demo(tmp_path / "demo", progress=False)
    assert report.violations == []
    store = EpisodeStore.open(str(report.store))
    clamped_kept = 0
    for info in store.episodes(mode="human_gated"):
        d = store.read_steps(info.episode_id, ["action_source", "control_state", "step_flags", "human_command", "t_device"])
        person = d["control_state"] == ControlState.HUMAN.code
        has_cmd = np.isfinite(d["human_command"]).all(axis=1)
        flags = d["step_flags"].astype(np.int64)
        why = (flags & int(StepFlag.DEVICE_LOST | StepFlag.INCOMPLETE_INPUT)) != 0
        assert (has_cmd | why)[person].all()
        assert (d["t_device"][person & has_cmd] > 0).all()
        clamped = person & ((flags & int(StepFlag.CLAMPED)) != 0) & has_cmd
        assert (d["action_source"][clamped] == ActionSource.SAFETY_CONTROLLER.code).all()
        clamped_kept += int(clamped.sum())
    assert clamped_kept >= 1, "the demo no longer has a clamped operator step: this test checks nothing"
