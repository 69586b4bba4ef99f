"""One row per measured figure, for benchmarks/run_all.py's table.

A benchmark calls ``record`` for each figure it prints: its value, the baseline measured in the same run
(what the ratio compares against), and the target where there is one. When the environment variable
HG_BENCH_FIGURES names a file, the rows are written there as JSON when the script ends; otherwise
``record`` does nothing, so running a benchmark by hand is unchanged.
"""

from __future__ import annotations

import atexit
import json
import os
from typing import Any

_ROWS: list[dict[str, Any]] = []
ENV = "HG_BENCH_FIGURES"


def record(name: str, value: float | None, *, unit: str = "", baseline: float | None = None,
           baseline_name: str = "", target: str = "", met: bool | None = None, higher_is_better: bool = True) -> None:
    """One figure. ``target`` is text ("<= 5 ms", ">= 1000 steps/s"); ``met`` says whether it holds (None: no
    target, or not decidable). The ratio value / baseline is computed by run_all."""
    _ROWS.append({"name": name, "value": None if value is None else float(value), "unit": unit,
                  "baseline": None if baseline is None else float(baseline), "baseline_name": baseline_name,
                  "target": target, "met": None if met is None else bool(met),  # numpy's bool is no JSON
                  "higher_is_better": bool(higher_is_better)})


def _flush() -> None:
    path = os.environ.get(ENV)
    if path and _ROWS:
        with open(path, "w") as f:
            json.dump(_ROWS, f, indent=1)


atexit.register(_flush)
