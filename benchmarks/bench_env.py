"""Env-steps/s of each backend through our VecEnv next to bare gymnasium stepping of the same task.

Both sides run in this process, interleaved (best of --reps), with the same pre-drawn random
actions and the same horizon/reset rule. "bare" is what a user would write with gymnasium alone:
gym.make(...) (default wrappers; Meta-World's goal-observable variant, as ours) per row, a Python loop over rows, reset when an episode ends; for
the RGB task the bare side renders with the same lean mujoco.Renderer settings. Rates are env-steps per
CPU second of this process (robust to other jobs on a shared machine), wall rate alongside. Ratio = ours / bare;
overhead = 1 - ratio (target <= 5%). If benchmarks/bench_bridge.py exists its run(task) figures are
printed too. --write-docs replaces the "Environments" section of docs/benchmarks.md.

    MUJOCO_GL=egl .venv/bin/python benchmarks/bench_env.py [--quick] [--write-docs]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import platform
import sys
import time
import warnings
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
from tqdm import tqdm  # noqa: E402

from hg_dagger.envs import load_mapping, make_env  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs" / "benchmarks.md"
SECTION = "## Environments"
BEGIN, END = "<!-- envs:begin -->", "<!-- envs:end -->"


# --------------------------------------------------------------------------- bare gymnasium
class BareRows:
    """The same task stepped with gymnasium alone: one gym env per row, reset at the horizon."""

    def __init__(self, task: str, num_envs: int, seed: int):
        m = load_mapping(task)
        self.horizon, self.n = m.horizon, num_envs
        self.renderer = None
        opts = m.backend_options
        if m.backend == "fetch":
            import gymnasium as gym

            with contextlib.redirect_stderr(io.StringIO()):
                import gymnasium_robotics
            gym.register_envs(gymnasium_robotics)
            self.envs = [gym.make(opts["gym_id"], max_episode_steps=m.horizon) for _ in range(num_envs)]
            for i, e in enumerate(self.envs):
                e.reset(seed=seed + i)
            if "camera" in opts:
                self._lean_camera(self.envs[0].unwrapped.model, opts["camera"])
        elif m.backend == "metaworld":
            import gymnasium as gym

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                import metaworld  # noqa: F401 - registers Meta-World/*
                self.envs = [
                    gym.make("Meta-World/goal_observable", env_name=opts["env_name"], seed=seed + i) for i in range(num_envs)
                ]
                for e in self.envs:
                    e.reset()
        else:
            raise ValueError(f"no bare gymnasium equivalent for backend {m.backend}")
        self.t = np.zeros(num_envs, int)

    def _lean_camera(self, model, cam_cfg):
        import mujoco

        model.vis.quality.shadowsize = 0
        model.vis.quality.offsamples = 0
        self.renderer = mujoco.Renderer(model, 128, 128)
        for name in ("mjRND_SHADOW", "mjRND_REFLECTION", "mjRND_SKYBOX"):
            self.renderer.scene.flags[getattr(mujoco.mjtRndFlag, name)] = 0
        cam = mujoco.MjvCamera()
        cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        cam.lookat[:] = cam_cfg["lookat"]
        cam.distance, cam.azimuth, cam.elevation = cam_cfg["distance"], cam_cfg["azimuth"], cam_cfg["elevation"]
        self.cam = cam

    def step(self, actions: np.ndarray) -> None:
        for i, e in enumerate(self.envs):
            _, _, term, trunc, _ = e.step(actions[i])
            self.t[i] += 1
            if self.renderer is not None:
                self.renderer.update_scene(e.unwrapped.data, camera=self.cam)
                self.renderer.render()
            if term or trunc or self.t[i] >= self.horizon:
                e.reset()
                self.t[i] = 0

    def close(self) -> None:
        if self.renderer is not None:
            self.renderer.close()
        for e in self.envs:
            e.close()


# --------------------------------------------------------------------------- measurement
def _rate(step, actions: np.ndarray) -> tuple[float, float]:
    """(env-steps per CPU second of this process, env-steps per wall second). CPU time is what the
    ratio uses: on a shared machine wall time mostly measures the other processes."""
    c0, t0 = time.process_time(), time.perf_counter()
    for a in actions:
        step(a)
    n = actions.shape[0] * actions.shape[1]
    return n / max(time.process_time() - c0, 1e-9), n / (time.perf_counter() - t0)


def measure(task: str, num_envs: int, env_steps: int, reps: int, bare: bool) -> dict:
    m = load_mapping(task)
    steps = max(3, env_steps // num_envs)
    rng = np.random.default_rng(0)
    actions = rng.uniform(-1, 1, (steps, num_envs, m.action_dim)).astype(np.float32)
    ours = make_env(task, num_envs=num_envs, seed=0)
    base = BareRows(task, num_envs, seed=0) if bare else None
    best_ours = best_bare = best_wall = 0.0
    try:
        ours.step(actions[0])  # warm-up
        if base is not None:
            base.step(actions[0])
        for _ in range(reps):
            cpu, wall = _rate(ours.step, actions)
            best_ours, best_wall = max(best_ours, cpu), max(best_wall, wall)
            if base is not None:
                best_bare = max(best_bare, _rate(base.step, actions)[0])
    finally:
        ours.close()
        if base is not None:
            base.close()
    row = {"task": task, "backend": m.backend, "num_envs": num_envs, "ours": best_ours, "wall": best_wall, "steps": steps}
    if base is not None:
        row["bare"] = best_bare
        row["ratio"] = best_ours / best_bare
    return row


def table(rows: list[dict]) -> str:
    lines = [
        "| task | backend | num_envs | ours, env-steps/CPU-s | bare gymnasium, env-steps/CPU-s | ratio ours/bare | overhead | ours, env-steps/s wall |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        bare = f"{r['bare']:,.0f}" if "bare" in r else "n/a"
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "n/a"
        over = f"{(1 - r['ratio']) * 100:+.1f}%" if "ratio" in r else "n/a"
        lines.append(
            f"| {r['task']} | {r['backend']} | {r['num_envs']} | {r['ours']:,.0f} | {bare} | {ratio} | {over} | {r['wall']:,.0f} |"
        )
    return "\n".join(lines)


def bridge_figures(task: str) -> str | None:
    path = Path(__file__).with_name("bench_bridge.py")
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("bench_bridge", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    figures = module.run(task)
    return "\n".join(f"- {k}: {v:,.3f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in figures.items())


def write_docs(body: str) -> None:
    """Replace (or append) this benchmark's marked section; other sections stay as they are."""
    text = DOCS.read_text() if DOCS.exists() else "# Benchmarks\n"
    section = f"{BEGIN}\n{SECTION}\n\n{body.strip()}\n{END}"
    if BEGIN in text and END in text:
        start, stop = text.index(BEGIN), text.index(END) + len(END)
        text = text[:start] + section + text[stop:]
    else:
        text = text.rstrip() + "\n\n" + section + "\n"
    DOCS.write_text(text)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (a smoke run, figures noisier)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--write-docs", action="store_true", help="replace the Environments section of docs/benchmarks.md")
    args = p.parse_args()
    scale = 0.25 if args.quick else 1.0
    # (task, env-steps per measurement, compare with bare gymnasium)
    plan = [
        ("toy_reach", 20000, False),
        ("fetch_pick_place", 300, True),
        ("fetch_pick_place_rgb", 120, True),
        ("mw_pick_place", 300, True),
    ]
    jobs = [(t, n, int(s * scale), b) for t, s, b in plan for n in args.sizes]
    rows = []
    for task, n, env_steps, bare in tqdm(jobs, desc="bench_env", unit="config"):
        rows.append(measure(task, n, env_steps, args.reps, bare))
    out = table(rows)
    print(out)
    from figures import record

    for r in rows:
        record(f"env {r['task']} x{r['num_envs']}: env-steps per CPU second", r["ours"], unit="steps/s",
               baseline=r.get("bare"), baseline_name="bare gymnasium" if "bare" in r else "")
    bridge = bridge_figures("fetch_reach")
    if bridge:
        print("\nbridge (benchmarks/bench_bridge.py, fetch_reach):\n" + bridge)
    if args.write_docs:
        import mujoco

        load = os.getloadavg()[0]
        body = (
            f"`benchmarks/bench_env.py` on {platform.machine()} with {os.cpu_count()} CPU cores shared with other jobs "
            f"(load average {load:.1f} at the end of the run), Python {platform.python_version()}, "
            f"mujoco {mujoco.__version__}, MUJOCO_GL={os.environ['MUJOCO_GL']}. Best of {args.reps} interleaved runs; "
            "rates are env-steps per CPU second of the benchmark process, so other jobs on the machine skew the ratio "
            "less than wall time would (wall rate alongside); under such load repeated runs still vary by about "
            "+-10% per row. Random actions, reset at the horizon. \"bare gymnasium\" is gym.make per row (default "
            "wrappers; Meta-World's goal-observable variant, as ours) stepped in a Python loop; for the RGB task it "
            "renders with the same lean settings. Ratio > 1 means our adapter was faster than the bare loop (it steps "
            "the unwrapped envs, skipping gymnasium's wrappers, and pays for check_action, clip_raw and the signals).\n\n"
            + out
        )
        if bridge:
            body += "\n\nRobot bridge over loopback (fetch_reach), from benchmarks/bench_bridge.py:\n\n" + bridge
        write_docs(body)
        print(f"wrote the '{SECTION[3:]}' section of {DOCS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
