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
