"""Run every benchmark and regenerate the summary table at the top of docs/benchmarks.md.

    python benchmarks/run_all.py --quick          # a short pass (about 15 minutes on 2 cores)
    python benchmarks/run_all.py                  # the full runs
    python benchmarks/run_all.py --only env app   # some of them; the other rows of the table are kept

Each benchmark runs in its own process with HG_BENCH_FIGURES set, and reports one row per figure
(benchmarks/figures.py): value, the baseline it measured in the same run, the target where there is
one. The table gets the ratio value / baseline, whether the target holds, and the date and machine
load of the run that produced the row. The sections below the table keep each benchmark's own detail.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "benchmarks.md"
BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"

# name -> (script, quick arguments, full arguments)
BENCHMARKS: dict[str, tuple[str, list[str], list[str]]] = {
    "env": ("bench_env.py", ["--quick", "--reps", "1", "--sizes", "1", "8"], []),
    "bridge": ("bench_bridge.py", ["--steps", "300"], []),
    "hold": ("bench_hold.py", ["--quick"], []),
    "recorder": ("bench_recorder.py", ["--quick"], []),
    "devices": ("bench_devices.py", ["--n", "1000"], []),
    "experts": ("bench_experts.py", ["--episodes", "8", "--mw-episodes", "2", "--latency-reps", "50"], []),
    "gates": ("bench_gates.py", ["--quick"], []),
    "app": ("bench_app.py", ["--quick"], []),
    "dagger": ("bench_dagger.py", ["--quick", "--skip-learning"], []),
    "review": ("bench_review.py", ["--episodes", "1000"], []),
    "export": ("bench_export.py", ["--episodes", "1000", "--cam-episodes", "50"], []),
    "executor": ("bench_executor.py", ["--quick"], []),
    "datasets": ("bench_datasets.py", ["--episodes", "1000"], []),
}
ENV = {"QT_QPA_PLATFORM": "offscreen", "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy",
       "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}


def run_one(name: str, quick: bool, timeout_s: float) -> dict:
    script, quick_args, full_args = BENCHMARKS[name]
    with tempfile.TemporaryDirectory(prefix=f"bench_{name}_") as tmp:
        path = Path(tmp) / "figures.json"
        env = {**os.environ, **ENV, "HG_BENCH_FIGURES": str(path)}
        cmd = [sys.executable, str(ROOT / "benchmarks" / script), *(quick_args if quick else full_args)]
        load0, t0 = os.getloadavg()[0], time.time()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
            code, tail = proc.returncode, (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [""]
        except subprocess.TimeoutExpired:
            code, tail = -1, [f"stopped after {timeout_s:.0f} s"]
        try:
            rows = json.loads(path.read_text()) if path.exists() else []
        except ValueError as exc:  # a script that died while writing its figures: say so in its row
            rows, code, tail = [], code or 1, [f"{script}: its figures file is not JSON ({exc})"]
    return {"benchmark": name, "script": script, "args": cmd[2:], "exit_code": code, "error": tail[0] if code else "",
            "seconds": round(time.time() - t0, 1), "load": round((load0 + os.getloadavg()[0]) / 2, 1),
            "date": _dt.date.today().isoformat(), "quick": quick, "figures": rows}


def _num(v: float | None) -> str:
    if v is None:
        return "-"
    if v == int(v) and abs(v) < 1e6:
        return f"{int(v):,}"
    return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _ratio(f: dict) -> str:
    if f["value"] is None or not f["baseline"]:
        return "-"
    return f"{f['value'] / f['baseline']:.2f}"


def table(results: list[dict]) -> str:
    lines = [
        "| benchmark | figure | target | value | baseline (same run) | ratio | met | run |",
        "|---|---|---|---:|---|---:|---|---|",
    ]
    for r in results:
        run = f"{r['date']}, {'quick' if r['quick'] else 'full'}, load {r['load']}, {r['seconds']:.0f} s"
        if r["exit_code"]:
            lines.append(f"| {r['benchmark']} | **failed** (exit {r['exit_code']}): {r['error'][:120]} | | | | | | {run} |")
            continue
        for f in r["figures"]:
            unit = f" {f['unit']}" if f["unit"] else ""
            base = f"{_num(f['baseline'])}{unit} ({f['baseline_name']})" if f["baseline"] is not None else "-"
            met = {True: "yes", False: "**no**", None: ""}[f["met"]]
            lines.append(f"| {r['benchmark']} | {f['name']} | {f['target'] or '-'} | {_num(f['value'])}{unit} | {base} "
                         f"| {_ratio(f)} | {met} | {run} |")
    return "\n".join(lines)


def write_docs(results: list[dict], command: str) -> None:
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    block = (f"{BEGIN}\n## Summary (generated by `{command}`)\n\n"
             f"{os.cpu_count()} CPU cores. Ratios compare a figure with the baseline the same benchmark measured in "
             "the same run; the load column is the machine's load average during that benchmark (other work skews "
             "absolute figures more than ratios). Details of each benchmark are in the sections below.\n\n"
             f"{table(results)}\n<!-- run_all:data {json.dumps(results)} -->\n{END}")
    if BEGIN in text:
        text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    else:
        head, _, rest = text.partition("\n")
        text = f"{head}\n\n{block}\n{rest}"
    DOCS.write_text(text)


def previous_results() -> list[dict]:
    """The rows of the last run, so --only keeps the others."""
    if not DOCS.exists():
        return []
    m = re.search(r"<!-- run_all:data (.*?) -->", DOCS.read_text(), flags=re.S)
    return json.loads(m.group(1)) if m else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the short pass of every benchmark")
    ap.add_argument("--only", nargs="+", choices=list(BENCHMARKS), help="run these; keep the other rows")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds per benchmark before it is stopped")
    ap.add_argument("--no-docs", action="store_true", help="print the table, leave docs/benchmarks.md alone")
    args = ap.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    kept = [r for r in previous_results() if r["benchmark"] not in names and r["benchmark"] in BENCHMARKS]
    results = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}: {BENCHMARKS[name][0]} ...", flush=True)
        r = run_one(name, args.quick, args.timeout)
        status = f"failed (exit {r['exit_code']}): {r['error']}" if r["exit_code"] else f"{len(r['figures'])} figures"
        print(f"[{i}/{len(names)}] {name}: {status} in {r['seconds']:.0f} s, load {r['load']}", flush=True)
        results.append(r)
    order = list(BENCHMARKS)
    merged = sorted(kept + results, key=lambda r: order.index(r["benchmark"]))
    print()
    print(table(merged))
    if not args.no_docs:
        command = "python benchmarks/run_all.py" + (" --quick" if args.quick else "")
        write_docs(merged, command)
        print(f"\nwrote the summary table of {DOCS.relative_to(ROOT)}")
    return 1 if any(r["exit_code"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
