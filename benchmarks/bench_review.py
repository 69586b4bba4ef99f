"""Review workspace and QC at scale: what opening the review browser, filtering it and QC of a whole store cost.

On a store of N short episodes (20 steps, state only), each ending with one or two human correction windows, it
times against a baseline measured in the same run (reading the catalog alone, ``EpisodeStore.open(url).episodes()``):

  open     - ``decisions.list_windows(store, WindowFilter())`` and the workspace rows (``model.rows_of_store``:
             the same rows plus each window's QC verdict and flags, replay status, mode, policy, day and privacy
             status), each on a freshly opened store, before and after QC; then the browser's table filled with
             those rows (``WindowBrowser.set_rows`` on Qt's offscreen platform: model, filter choices, counts);
  filter   - the browser's filters (status / task / operator / combined) over those rows in memory, and the same
             filters pushed down into ``list_windows``;
  qc       - ``qc.run_qc(store, write=True)`` over every episode, then a second run that must write nothing;
  layers   - ``EpisodeStore.write_labels`` (the review decisions written while building the store): ms per layer
             in the first and the last quarter of the writes; a flat cost means the last quarter, written into a
             store that already holds the others' layers, costs what the first did.

Times are the median of --repeat runs (QC runs once: its first run writes). A share of the windows carries a
review decision (approved / rejected / needs_fix) so status filters select something.

    python benchmarks/bench_review.py              # 10,000 episodes (several minutes on 2 shared cores)
    python benchmarks/bench_review.py --quick      # 1,000 episodes
    python benchmarks/bench_review.py --json out.json
    python benchmarks/bench_review.py --layers-only  # build the store and report only the write_labels figures
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import resource
import shutil
import statistics
import tempfile
import time

import numpy as np
from tqdm import tqdm

from hg_dagger.contract import (
    ActionSource,
    CollectionMode,
    CorrectionWindow,
    EndReason,
    EpisodeEnd,
    EpisodeStart,
    RecoveryOutcome,
    TaskInfo,
    step_fields,
)
from hg_dagger.contract.enums import ReviewStatus
from hg_dagger.contract.schema import ReviewDecision
from hg_dagger.review.decisions import WindowFilter, list_windows
from hg_dagger.review.qc import run_qc
from hg_dagger.store import EpisodeStore
from hg_dagger.ui.review.model import Filters, rows_of_store

HZ = 50.0
PERIOD_NS = int(1e9 / HZ)
ACTION_DIM = 4
STATE_DIM = 31
TASKS = ("toy_reach", "fetch_reach", "fetch_push")
OPERATORS = ("op-a", "op-b", "op-c", "op-d")
GATE_REASONS = ("uncertainty", "novelty", "operator")
OUTCOMES = (RecoveryOutcome.RECOVERY_SUCCESS, RecoveryOutcome.RECOVERY_SUCCESS, RecoveryOutcome.PARTIAL)
WINDOWS = ((4, 9), (12, 16))  # [handover_start, handover_end) of the first and second window
DECIDED = {7: ReviewStatus.APPROVED, 13: ReviewStatus.REJECTED, 29: ReviewStatus.NEEDS_FIX}  # every k-th episode


def fields():
    return step_fields(obs={"state": ((STATE_DIM,), "float32")}, action_dim=ACTION_DIM)


def make_steps(ep_len: int) -> tuple[list[dict], list[dict]]:
    """Policy and human versions of each step t (timestamps consistent, latency well inside the budget)."""
    rng = np.random.default_rng(0)
    policy, human = [], []
    for t in range(ep_len):
        base = (t + 1) * PERIOD_NS
        s = {
            "t_obs": base, "t_policy": base + 1_000_000, "t_action_apply": base + 2_000_000,
            "policy_action": rng.uniform(-0.5, 0.5, ACTION_DIM).astype(np.float32),
            "applied_action": rng.uniform(-0.5, 0.5, ACTION_DIM).astype(np.float32),
            "policy_confidence": np.float32(0.9), "action_source": np.uint8(ActionSource.POLICY.code),
            "reward": np.float32(0), "obs/state": rng.standard_normal(STATE_DIM).astype(np.float32),
        }
        policy.append(s)
        human.append({**s, "action_source": np.uint8(ActionSource.HUMAN.code),
                      "human_command": rng.uniform(-1, 1, 7).astype(np.float32)})
    return policy, human


def build(path: str, n_eps: int, ep_len: int) -> dict:
    """N episodes recorded with the recorder; episode i has 1 or 2 windows, a task/operator/gate reason by i, and
    every k-th episode (DECIDED) a review decision on its first window, written as a review label layer."""
    f = fields()
    policy, human = make_steps(ep_len)
    spans = [w for w in WINDOWS if w[1] <= ep_len]
    store = EpisodeStore.create(path)
    t0 = time.perf_counter()
    first_windows = {}
    with store.recorder(flush_interval_s=0.5, on_full="block") as rec:
        for i in tqdm(range(n_eps), desc="record", unit="ep", mininterval=1.0):
            op = OPERATORS[i % len(OPERATORS)]
            eid = rec.begin_episode(EpisodeStart(task=TaskInfo(task_id=TASKS[i % len(TASKS)]), operator=op,
                                                 mode=CollectionMode.HUMAN_GATED, control_hz=HZ), f)
            mine = spans[:1 + (i % 2)]
            for t in range(ep_len):
                rec.put(eid, human[t] if any(a <= t < b for a, b in mine) else policy[t])
            windows = [CorrectionWindow(parent_episode_id=eid, parent_step_id=a - 1, handover_start=a,
                                        handover_end=b, source=ActionSource.HUMAN, operator=op,
                                        gate_reason=GATE_REASONS[i % len(GATE_REASONS)],
                                        t_gate=policy[a - 1]["t_obs"], t_handover=human[a]["t_action_apply"],
                                        outcome=OUTCOMES[i % len(OUTCOMES)]) for a, b in mine]
            rec.end_episode(eid, EpisodeEnd(end_reason=EndReason.SUCCESS, task_success=True, num_steps=ep_len),
                            windows=windows)
            first_windows[eid] = (i, windows[0].window_id)
    assert rec.stats.dropped_steps == 0
    t_rec = time.perf_counter() - t0
    t0 = time.perf_counter()
    store = EpisodeStore.open(path, mode="a")
    decided = 0
    layer_s = []
    now = _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")
    for eid, (i, wid) in tqdm(first_windows.items(), desc="decide", unit="ep", mininterval=1.0):
        status = next((s for k, s in DECIDED.items() if i % k == 0), None)
        if status is None:
            continue
        d = ReviewDecision(window_id=wid, reviewer="rev-1", status=status,
                           replay_training_authorized=status == ReviewStatus.APPROVED,
                           notes="" if status == ReviewStatus.APPROVED else "bench", t_wall=now)
        t1 = time.perf_counter()
        store.write_labels(eid, author="review:rev-1", reviews=[d])
        layer_s.append(time.perf_counter() - t1)
        decided += 1
    t_dec = time.perf_counter() - t0
    quarter = max(1, len(layer_s) // 4)
    first_ms, last_ms = (statistics.mean(layer_s[:quarter]) * 1e3, statistics.mean(layer_s[-quarter:]) * 1e3)
    print(f"write_labels: {first_ms:.2f} ms a layer in the first quarter of {decided} decisions, {last_ms:.2f} ms in "
          f"the last", flush=True)
    files = sum(len(x) for _, _, x in os.walk(path))
    size = sum(os.path.getsize(os.path.join(d, x)) for d, _, fs in os.walk(path) for x in fs) / 1e6
    return {"record_s": t_rec, "decide_s": t_dec, "decisions": decided, "files": files, "mb": size,
            "layer_first_ms": first_ms, "layer_last_ms": last_ms}


def timed(fn, repeat: int):
    """(median seconds, last result) of fn() over `repeat` calls."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def browser_fill(rows, repeat: int) -> float:
    """Median seconds to fill a fresh WindowBrowser with ``rows`` (the GUI's share of opening the browser)."""
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PyQt6.QtWidgets import QApplication

    from hg_dagger.ui.review.browser import WindowBrowser

    app = QApplication.instance() or QApplication(["bench_review"])
    times = []
    for _ in range(repeat):
        b = WindowBrowser()
        t0 = time.perf_counter()
        b.set_rows(rows)
        app.processEvents()
        times.append(time.perf_counter() - t0)
        assert b.model.rowCount() == len(rows)
        b.deleteLater()
    return statistics.median(times)


def measure(path: str, n_eps: int, repeat: int) -> dict:
    r: dict = {}
    t_cat, infos = timed(lambda: EpisodeStore.open(path).episodes(), repeat)
    assert len(infos) == n_eps
    r["catalog_s"] = t_cat
    t_lw, windows = timed(lambda: list_windows(EpisodeStore.open(path), WindowFilter()), repeat)
    r["list_windows_s"], r["windows"] = t_lw, len(windows)
    t_rows, rows = timed(lambda: rows_of_store(path), repeat)
    r["rows_s"] = t_rows
    assert len(rows) == len(windows)
    r["browser_s"] = browser_fill(rows, repeat)
    print(f"catalog {t_cat:.3f} s, list_windows {t_lw:.3f} s, workspace rows {t_rows:.3f} s, "
          f"browser filled in {r['browser_s']:.3f} s", flush=True)

    filters = {
        "status=pending": (Filters(status="pending"), WindowFilter(status="pending")),
        "status=approved": (Filters(status="approved"), WindowFilter(status="approved")),
        f"task={TASKS[1]}": (Filters(task=TASKS[1]), WindowFilter(task=TASKS[1])),
        f"operator={OPERATORS[2]}": (Filters(operator=OPERATORS[2]), WindowFilter(operator=OPERATORS[2])),
        "task+operator+status": (Filters(task=TASKS[0], operator=OPERATORS[0], status="pending"),
                                 WindowFilter(task=TASKS[0], operator=OPERATORS[0], status="pending")),
    }
    r["filters"] = {}
    for name, (ui_f, api_f) in filters.items():
        t_mem, kept = timed(lambda ui_f=ui_f: [x for x in rows if ui_f.accepts(x)], max(repeat, 5))
        t_api, got = timed(lambda api_f=api_f: list_windows(EpisodeStore.open(path), api_f), repeat)
        assert {x.window_id for x in kept} == {w.window_id for w in got}, name
        r["filters"][name] = {"rows": len(kept), "memory_s": t_mem, "list_windows_s": t_api}

    t0 = time.perf_counter()
    s1 = run_qc(path, write=True, progress=True)
    r["qc1_s"] = time.perf_counter() - t0
    r["qc1_layers"] = s1.layers_written
    print(f"qc run 1 {r['qc1_s']:.1f} s", flush=True)
    r["qc_windows"] = sum(len(e.windows) for e in s1.episodes)
    r["qc_windows_passed"] = sum(w.passed for e in s1.episodes for w in e.windows)
    assert len(s1.episodes) == n_eps and not s1.errors, s1.errors[:3]
    t0 = time.perf_counter()
    s2 = run_qc(path, write=True, progress=True)
    r["qc2_s"] = time.perf_counter() - t0
    r["qc2_layers"] = s2.layers_written
    assert s2.layers_written == 0 and s2.unchanged == n_eps, (s2.layers_written, s2.unchanged)
    t_rows2, rows2 = timed(lambda: rows_of_store(path), repeat)
    r["rows_after_qc_s"] = t_rows2
    r["rows_qc_passed"] = sum(x.qc == "passed" for x in rows2)
    r["browser_after_qc_s"] = browser_fill(rows2, repeat)
    return r


def report(n_eps: int, ep_len: int, b: dict, r: dict) -> None:
    cat = r["catalog_s"]
    print(f"\n{n_eps} episodes x {ep_len} steps, {r['windows']} windows ({b['decisions']} decided); built in "
          f"{b['record_s']:.1f} s + {b['decide_s']:.1f} s decisions; {b['files']} files, {b['mb']:.1f} MB")
    print(f"write_labels: {b['layer_first_ms']:.2f} ms a layer over the first quarter of the decisions (baseline), "
          f"{b['layer_last_ms']:.2f} ms over the last ({b['layer_last_ms'] / b['layer_first_ms']:.2f}x)")
    width = 50
    print(f"\n{'measurement':{width}} {'ms':>10} {'x catalog':>10} {'us/episode':>11}")

    def line(name, s):
        print(f"{name:{width}} {s * 1e3:10.1f} {s / cat:10.2f} {s / n_eps * 1e6:11.1f}")

    line("catalog: open + episodes() (baseline)", cat)
    line("list_windows(WindowFilter())", r["list_windows_s"])
    line("workspace rows (rows_of_store)", r["rows_s"])
    for name, f in r["filters"].items():
        line(f"  filter {name} in memory ({f['rows']} rows)", f["memory_s"])
        line(f"  filter {name} via list_windows", f["list_windows_s"])
    line(f"qc run 1 ({r['qc1_layers']} layers written)", r["qc1_s"])
    line(f"qc run 2 ({r['qc2_layers']} layers written)", r["qc2_s"])
    line(f"workspace rows after QC ({r['rows_qc_passed']} passed)", r["rows_after_qc_s"])
    line("browser table filled (WindowBrowser.set_rows)", r["browser_s"])
    line("browser table filled, rows after QC", r["browser_after_qc_s"])
    from figures import record

    record(f"review {n_eps} episodes: workspace rows", r["rows_s"] * 1e3, unit="ms", baseline=cat * 1e3,
           baseline_name="catalog", higher_is_better=False)
    record(f"review {n_eps} episodes: workspace rows after QC", r["rows_after_qc_s"] * 1e3, unit="ms",
           baseline=r["rows_s"] * 1e3, baseline_name="rows before QC", higher_is_better=False)
    record(f"review {n_eps} episodes: QC of the store", r["qc1_s"] * 1e3, unit="ms", baseline=cat * 1e3,
           baseline_name="catalog", higher_is_better=False)
    record(f"review {n_eps} episodes: write_labels, last quarter", b["layer_last_ms"], unit="ms",
           baseline=b["layer_first_ms"], baseline_name="first quarter", target="flat (ratio <= 1.5)",
           met=b["layer_last_ms"] <= 1.5 * b["layer_first_ms"], higher_is_better=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, default=10_000, help="episodes in the store (default 10000)")
    ap.add_argument("--episode-steps", type=int, default=20, help="steps per episode (default 20)")
    ap.add_argument("--quick", action="store_true", help="1000 episodes")
    ap.add_argument("--repeat", type=int, default=3, help="runs per read measurement; the median is reported")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--dir", help="where to build the store (default: a temporary directory, removed afterwards)")
    ap.add_argument("--layers-only", action="store_true", help="build the store, report write_labels only")
    args = ap.parse_args()
    if args.quick:
        args.episodes = 1000
    if args.episode_steps < WINDOWS[0][1]:
        ap.error(f"--episode-steps must be at least {WINDOWS[0][1]} (the first window ends there)")
    tmp = args.dir or tempfile.mkdtemp(prefix="bench_review_")
    path = os.path.join(tmp, "store")
    try:
        load0 = os.getloadavg()[0]
        print(f"cpu cores {os.cpu_count()}, load average {load0:.1f}")
        b = build(path, args.episodes, args.episode_steps)
        if args.layers_only:
            print(f"{args.episodes} episodes: write_labels {b['layer_first_ms']:.2f} ms a layer over the first "
                  f"quarter of {b['decisions']} decisions, {b['layer_last_ms']:.2f} ms over the last "
                  f"({b['layer_last_ms'] / b['layer_first_ms']:.2f}x); load average {os.getloadavg()[0]:.1f}")
            return
        r = measure(path, args.episodes, args.repeat)
        report(args.episodes, args.episode_steps, b, r)
        load1 = os.getloadavg()[0]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"\npeak RSS {rss:.0f} MB, load average at the start {load0:.1f}, at the end {load1:.1f}")
        if args.json:
            out = {"episodes": args.episodes, "episode_steps": args.episode_steps, "repeat": args.repeat,
                   "cpu_count": os.cpu_count(), "load_start": load0, "load_end": load1, "peak_rss_mb": rss,
                   "build": b, **r}
            with open(args.json, "w") as fh:
                json.dump(out, fh, indent=2)
            print(f"figures written to {args.json}")
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
