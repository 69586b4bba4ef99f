"""benchmarks/figures.py: what a benchmark records reaches run_all as JSON, whatever number types it used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.subprocess]

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def test_numpy_figures_are_written_as_json(tmp_path):
    """A target checked on numpy values gives numpy's bool; it used to stop the JSON half-way, and run_all failed
    on the truncated file."""
    out = tmp_path / "figures.json"
    code = ("import numpy as np; from figures import record; "
            "record('drift', np.float32(1.2), unit='mm', baseline=np.float64(55.0), target='<= 2 mm', "
            "met=np.float32(1.2) <= 2.0, higher_is_better=np.bool_(False))")
    subprocess.run([sys.executable, "-c", code], cwd=BENCH, env={**os.environ, "HG_BENCH_FIGURES": str(out)},
                   check=True, timeout=60)
    rows = json.loads(out.read_text())
    assert rows == [{"name": "drift", "value": rows[0]["value"], "unit": "mm", "baseline": 55.0, "baseline_name": "",
                     "target": "<= 2 mm", "met": True, "higher_is_better": False}]
    assert abs(rows[0]["value"] - 1.2) < 1e-6
