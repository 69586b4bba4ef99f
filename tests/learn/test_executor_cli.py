"""The executor options without starting Ray: every command takes them, nothing imports ray unless asked,
and bad options or an unreachable cluster are one line (exit 2) instead of a hang or a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hg_dagger.cli import build_parser, main

pytestmark = [pytest.mark.ray, pytest.mark.subprocess]


@pytest.mark.parametrize("argv", [
    ["auto", "--config", "c.yaml", "--out", "o"],
    ["run", "--task", "toy_reach", "--store", "s", "--operator", "synthetic"],
    ["eval", "--checkpoint", "c.pt", "--task", "toy_reach", "--out", "o"],
    ["replay", "s"],
])
def test_every_command_takes_the_executor_options(argv):
    args = build_parser().parse_args([*argv, "--executor", "ray", "--workers", "3", "--address", "auto"])
    assert (args.executor, args.workers, args.address) == ("ray", 3, "auto")
    assert build_parser().parse_args(argv).executor == "local"


def test_ray_is_imported_only_for_the_ray_executor(tmp_path):
    code = ("import sys\n"
            "from hg_dagger.cli import build_parser\n"
            "import hg_dagger.learn.auto, hg_dagger.learn.executor, hg_dagger.learn.evaluate, hg_dagger.review.replay\n"
            "from hg_dagger.learn.executor import make_executor\n"
            "with make_executor('local'):\n"
            "    pass\n"
            "build_parser()\n"
            "assert 'ray' not in sys.modules, 'ray imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@pytest.mark.parametrize(("extra", "message"), [
    (["--executor", "ray", "--address", "127.0.0.1:1"], "--address 127.0.0.1:1: no Ray cluster answers there"),
    (["--address", "127.0.0.1:1"], "--address is for --executor ray"),
    (["--executor", "ray", "--workers", "0"], "--workers must be >= 1"),
])
def test_bad_executor_options_are_one_line(tmp_path, capsys, extra, message):
    import ray

    if ray.is_initialized():  # another module's Ray would be reused instead of refused
        pytest.skip("a Ray runtime is running in this process")
    argv = ["eval", "--checkpoint", str(tmp_path / "c.pt"), "--task", "toy_reach", "--out", str(tmp_path / "o")]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
    assert not ray.is_initialized()
