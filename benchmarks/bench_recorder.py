"""Recorder benchmark: streaming steps into an EpisodeStore versus writing each episode in one go afterwards.

Scenarios: 31-d state + two 128x128 RGB cameras at 50 Hz, once with noisy synthetic frames and once with frames
rendered by the MuJoCo Fetch environment, and 31-d state only. For each it prints
  max    - producer unpaced, on_full="block": sustained steps/s (put to close), x real time, MB/s, CPU ms/step
  paced  - producer at --pace x real time, on_full="drop": dropped steps, hand-off p50/p99 (us), RSS over time
  base   - the same episodes collected in lists and written to the same zarr layout in one go per episode
  frames - stored bytes per camera frame next to PNG of the same frames (Pillow, default level 6, and level 1 as
           the LeRobot export writes them)
  lerobot- where the LeRobot environment exists (.venv-interop, `make test-interop`): LeRobot 0.4.4's own recorder
           (LeRobotDataset add_frame / save_episode, AV1 video) on the same steps: steps/s and video bytes per frame
and our/baseline throughput. Then a 10k-episode store: file count, open time, listing and loading times.

    python benchmarks/bench_recorder.py            # default run (several minutes on 2 cores shared with other work)
    python benchmarks/bench_recorder.py --quick    # smaller
    python benchmarks/bench_recorder.py --codecs   # image codec comparison only (bytes per frame, write, read)
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import zarr

from hg_dagger.contract import CollectionMode, EndReason, EpisodeEnd, EpisodeStart, TaskInfo, step_fields
from hg_dagger.store import EpisodeStore, layout

HZ = 50.0
ACTION_DIM = 4


def make_frames(n: int, size: int = 128, seed: int = 0) -> np.ndarray:
    """Smooth synthetic scenes (gradient floor, moving disc, mild sensor noise): roughly as compressible as renders."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    out = np.empty((n, size, size, 3), np.uint8)
    for i in range(n):
        cx, cy = 0.5 + 0.3 * np.cos(i / 9), 0.5 + 0.3 * np.sin(i / 7)
        disc = ((xx - cx) ** 2 + (yy - cy) ** 2) < 0.01
        img = np.stack([120 + 80 * yy, 90 + 60 * xx, 140 - 50 * yy * xx], -1)
        img[disc] = (200, 40, 40)
        img += rng.normal(0, 2.0, img.shape)
        out[i] = np.clip(img, 0, 255).astype(np.uint8)
    return out


def render_fetch(n: int) -> np.ndarray:
    """Frames of the Fetch pick-and-place camera (128x128, real MuJoCo rendering) while its planner works the task,
    rolled out through the engine (the expert's actions, the task's safety monitor) like any recorded episode."""
    from hg_dagger.control.engine import Engine, EpisodeRows, ExpertOnly, Trace, task_safety
    from hg_dagger.control.expert_runs import HoldStill
    from hg_dagger.control.safety import SafetyMonitor
    from hg_dagger.envs import make_env
    from hg_dagger.experts import make_expert

    env = make_env("fetch_pick_place_rgb", num_envs=1, seed=0)
    mapping = env.mapping
    ticks: list = []
    safety = SafetyMonitor(task_safety(mapping.task_id), num_envs=1, action_dim=mapping.action_dim)
    engine = Engine(env, HoldStill(mapping.action_dim), ExpertOnly(make_expert(mapping.task_id, mapping=mapping), mapping),
                    safety, rows=EpisodeRows(1), sinks=[Trace(ticks)])
    engine.run(episodes=None, stop=lambda: len(ticks) >= n)
    env.close()
    return np.stack([obs["rgb"][0] for obs, _ in ticks[:n]]).astype(np.uint8)


def png_bytes(frame: np.ndarray, level: int | None = None) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG", **({} if level is None else {"compress_level": level}))
    return buf.getvalue()


def stored_frame_bytes(path: str) -> tuple[int, int]:
    """(bytes of the shard objects, frames) over every camera array of a store."""
    total = frames = 0
    for meta in Path(path).rglob("zarr.json"):
        if meta.parent.parent.name == "obs" and meta.parent.name.startswith("cam_"):
            total += sum(p.stat().st_size for p in (meta.parent / "c").rglob("*") if p.is_file())
            frames += json.loads(meta.read_text())["shape"][0]
    return total, frames


INTEROP_PY = Path(__file__).resolve().parents[1] / ".venv-interop" / "bin" / "python"


def run_lerobot(frames: np.ndarray, steps: int, ep_len: int, tmp: str) -> dict | None:
    """LeRobot's recorder on the same workload, in the LeRobot environment (None where it does not exist)."""
    if not INTEROP_PY.exists():
        return None
    np.save(os.path.join(tmp, "lerobot_frames.npy"), frames)
    out = os.path.join(tmp, "lerobot.json")
    proc = subprocess.run([str(INTEROP_PY), str(Path(__file__).with_name("lerobot_record.py")),
                           os.path.join(tmp, "lerobot_frames.npy"), str(steps), str(ep_len), out],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"  lerobot: failed ({proc.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(Path(out).read_text())


def scenario_fields(cameras: bool):
    obs = {"state": ((31,), "float32")}
    if cameras:
        obs["cam_left"] = ((128, 128, 3), "uint8")
        obs["cam_right"] = ((128, 128, 3), "uint8")
    return step_fields(obs=obs, action_dim=ACTION_DIM)


def make_steps(n: int, cameras: bool, frames: np.ndarray | None = None) -> list[dict]:
    """A pool of distinct step dicts reused round-robin (generation cost stays out of the measurement)."""
    rng = np.random.default_rng(1)
    if cameras and frames is None:
        frames = make_frames(64)
    pool = []
    for i in range(n):
        s = {
            "t_obs": i * 20_000_000, "t_policy": i * 20_000_000 + 1000, "t_action_apply": i * 20_000_000 + 2000,
            "policy_action": rng.standard_normal(ACTION_DIM).astype(np.float32),
            "applied_action": rng.standard_normal(ACTION_DIM).astype(np.float32),
            "policy_confidence": np.float32(0.9), "action_source": np.uint8(0), "reward": np.float32(0),
            "obs/state": rng.standard_normal(31).astype(np.float32),
        }
        if cameras:
            s["obs/cam_left"] = frames[i % len(frames)]
            s["obs/cam_right"] = frames[(i + len(frames) // 2) % len(frames)]
        pool.append(s)
    return pool


def step_bytes(fields) -> int:
    return sum(int(np.prod(f.shape)) * f.np_dtype.itemsize for f in fields.values())


def start() -> EpisodeStart:
    return EpisodeStart(task=TaskInfo(task_id="bench"), mode=CollectionMode.HUMAN_GATED, control_hz=HZ)


def end(n: int) -> EpisodeEnd:
    return EpisodeEnd(end_reason=EndReason.SUCCESS, task_success=True, num_steps=n)


def cpu_s() -> float:
    """CPU seconds of this process, all threads: less sensitive to other jobs on the machine than wall time."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / 2**20


def run_ours(path, fields, pool, total, ep_len, *, pace: float | None, on_full: str):
    store = EpisodeStore.create(path)
    rec = store.recorder(flush_interval_s=0.5, queue_steps=8192, on_full=on_full)
    handoff = np.empty(total, np.int64)
    rss = []
    period = None if pace is None else 1.0 / (HZ * pace)
    t0 = time.perf_counter()
    eid = None
    for i in range(total):
        if i % ep_len == 0:
            if eid is not None:
                rec.end_episode(eid, end(ep_len))
            eid = rec.begin_episode(start(), fields)
        if period is not None:  # sleep (not spin) until this step is due: the writer needs the CPU
            ahead = t0 + i * period - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
        s = pool[i % len(pool)]
        a = time.perf_counter_ns()
        rec.put(eid, s)
        handoff[i] = time.perf_counter_ns() - a
        if (i + 1) % (total // 5) == 0:
            rss.append(rss_mb())
    rec.end_episode(eid, end(ep_len))
    rec.close()
    elapsed = time.perf_counter() - t0
    return elapsed, rec.stats, handoff, rss


def run_baseline(path, fields, pool, total, ep_len):
    """ReplayBuffer style: collect an episode in lists, then resize + write every array once per episode."""
    root = zarr.open_group(path, mode="w")
    arrays = {n: root.create_array(**layout.field_array_kwargs(f)) for n, f in fields.items()}
    rows = 0
    t0 = time.perf_counter()
    buf = []
    for i in range(total):
        buf.append(pool[i % len(pool)])
        if len(buf) == ep_len:
            for name, spec in fields.items():
                fill = np.full(spec.shape, layout.array_fill(spec), spec.np_dtype)
                col = np.asarray([s.get(name, fill) for s in buf], dtype=spec.np_dtype)
                arr = arrays[name]
                arr.resize((rows + len(buf), *arr.shape[1:]))
                arr[rows:rows + len(buf)] = col
            rows += len(buf)
            buf = []
    return time.perf_counter() - t0


def scenario(name, cameras, total, max_steps, ep_len, pace, tmp, frames=None, lerobot_steps=0):
    fields = scenario_fields(cameras)
    if cameras and frames is None:
        frames = make_frames(64)
    pool = make_steps(min(total, 2048), cameras, frames)
    mb = step_bytes(fields) / 1e6
    c0 = cpu_s()
    t_max, st_max, h_max, _ = run_ours(os.path.join(tmp, f"{name}-max"), fields, pool, max_steps, ep_len, pace=None, on_full="block")
    c_max = cpu_s() - c0
    t_pac, st_pac, h_pac, rss = run_ours(os.path.join(tmp, f"{name}-paced"), fields, pool, total, ep_len, pace=pace, on_full="drop")
    c0 = cpu_s()
    t_base = run_baseline(os.path.join(tmp, f"{name}-base"), fields, pool, max_steps, ep_len)
    c_base = cpu_s() - c0
    ours, base = max_steps / t_max, max_steps / t_base
    print(f"\n[{name}] max/base {max_steps} steps, paced {total} steps, episodes of {ep_len}, {mb * 1e3:.1f} kB/step")
    print(f"  max    : {ours:8.0f} steps/s = {ours / HZ:6.1f}x real time, {ours * mb:6.1f} MB/s, "
          f"dropped {st_max.dropped_steps}, hand-off p50 {np.percentile(h_max, 50) / 1e3:.1f} us "
          f"p99 {np.percentile(h_max, 99) / 1e3:.1f} us (blocking), {c_max / max_steps * 1e3:.2f} CPU ms/step")
    print(f"  paced  : {pace:.0f}x real time ({pace * HZ:.0f} steps/s offered, {total / t_pac:.0f} sustained): "
          f"dropped {st_pac.dropped_steps}, hand-off p50 {np.percentile(h_pac, 50) / 1e3:.1f} us "
          f"p99 {np.percentile(h_pac, 99) / 1e3:.1f} us, RSS MB at 20/40/60/80/100%: {' '.join(f'{r:.0f}' for r in rss)}")
    print(f"  base   : {base:8.0f} steps/s = {base / HZ:6.1f}x real time, {base * mb:6.1f} MB/s, "
          f"{c_base / max_steps * 1e3:.2f} CPU ms/step (one write per episode, after the fact)")
    print(f"  ratio  : ours/baseline = {ours / base:.2f}")
    from figures import record

    if cameras:
        stored, n = stored_frame_bytes(os.path.join(tmp, f"{name}-max"))
        png6 = np.mean([len(png_bytes(f)) for f in frames])
        png1 = np.mean([len(png_bytes(f, 1)) for f in frames])
        # the stored frames cycle through `frames` evenly, so PNG's mean over `frames` is over the same frames
        print(f"  frames : {stored / n:8.0f} bytes/frame stored ({frames.nbytes / len(frames) / (stored / n):.1f}x), "
              f"PNG {png6:.0f} (Pillow default level 6; ours/PNG {stored / n / png6:.2f}), "
              f"PNG level 1 {png1:.0f} (ours/PNG {stored / n / png1:.2f})")
        record(f"recorder {name}: bytes per frame", stored / n, unit="B", baseline=png6,
               baseline_name="PNG (Pillow, level 6)", target="<= PNG", met=stored / n <= png6, higher_is_better=False)
        lr = run_lerobot(frames, lerobot_steps, ep_len, tmp) if lerobot_steps else None
        if lr is not None:
            ours_cpu = c_max / max_steps * 1e3
            print(f"  lerobot: {lr['steps_per_s']:8.1f} steps/s over {lr['steps']} steps (LeRobot 0.4.4, AV1 video, lossy), "
                  f"{lr['cpu_ms_per_step']:.2f} CPU ms/step: ours/LeRobot = {ours / lr['steps_per_s']:.1f}x steps/s, "
                  f"{lr['cpu_ms_per_step'] / ours_cpu:.1f}x steps per CPU second; "
                  f"{lr['video_bytes_per_frame']:.0f} video bytes/frame (ours/AV1 {stored / n / lr['video_bytes_per_frame']:.1f})")
            record(f"recorder {name}: steps/s vs LeRobot", ours, unit="steps/s", baseline=lr["steps_per_s"],
                   baseline_name="LeRobot 0.4.4 recorder (AV1)", target=">= 20x", met=ours >= 20 * lr["steps_per_s"])
            record(f"recorder {name}: steps per CPU second vs LeRobot", 1e3 / ours_cpu, unit="steps/CPU-s",
                   baseline=1e3 / lr["cpu_ms_per_step"], baseline_name="LeRobot 0.4.4 recorder (AV1)", target=">= 20x",
                   met=lr["cpu_ms_per_step"] >= 20 * ours_cpu)

    record(f"recorder {name}: steps/s", ours, unit="steps/s", baseline=base, baseline_name="zarr, one write per episode")
    record(f"recorder {name}: steps dropped when paced at {pace:.0f}x real time", st_pac.dropped_steps, target="0",
           met=st_pac.dropped_steps == 0, higher_is_better=False)
    record(f"recorder {name}: hand-off p99", np.percentile(h_pac, 99) / 1e3, unit="us", target="< 10 us",
           met=np.percentile(h_pac, 99) / 1e3 < 10, higher_is_better=False)
    return ours / base


def ten_k(tmp, n_eps, ep_len):
    path = os.path.join(tmp, "tenk")
    fields = scenario_fields(False)
    pool = make_steps(ep_len, False)
    store = EpisodeStore.create(path)
    t0 = time.perf_counter()
    with store.recorder(flush_interval_s=0.5, on_full="block") as rec:  # every step stored: files and reads count all
        for _ in range(n_eps):
            eid = rec.begin_episode(start(), fields)
            for s in pool:
                rec.put(eid, s)
            rec.end_episode(eid, end(ep_len))
    t_rec = time.perf_counter() - t0
    assert rec.stats.dropped_steps == 0
    files = sum(len(f) for _, _, f in os.walk(path))
    size = sum(os.path.getsize(os.path.join(d, x)) for d, _, f in os.walk(path) for x in f) / 1e6
    t0 = time.perf_counter()
    store = EpisodeStore.open(path)
    t_open = time.perf_counter() - t0
    t0 = time.perf_counter()
    infos = store.episodes(complete=True)
    t_list = time.perf_counter() - t0
    t0 = time.perf_counter()
    store.read_steps(infos[n_eps // 2].episode_id)
    t_read = time.perf_counter() - t0
    import tensordict  # noqa: F401  (import cost is not batch time)

    t0 = time.perf_counter()
    n = sum(b.batch_size[0] for b in store.iter_batches(4096, fields=["obs/state", "applied_action"]))
    t_iter = time.perf_counter() - t0
    print(f"\n[{n_eps} episodes x {ep_len} steps, state only] recorded in {t_rec:.1f} s; {files} files, {size:.1f} MB")
    print(f"  open {t_open * 1e3:.0f} ms, episodes() {t_list * 1e3:.0f} ms, read one episode {t_read * 1e3:.1f} ms, "
          f"iter_batches {n / t_iter:.0f} steps/s ({n} steps)")


def codecs(sets: dict[str, np.ndarray]):
    """Bytes per frame and write/read MB/s of candidate image codecs on each frame set, next to PNG of the same
    frames; zarr arrays with the store's chunks and shards (candidates from imagecodecs only where it is installed)."""
    from zarr.codecs import BloscCodec, ZstdCodec

    from hg_dagger.store.codecs import FrameFilterCodec, RowMedianCodec

    zarr_cands = {
        "zstd-1": ([], [ZstdCodec(level=1, checksum=True)]),
        "zstd-3": ([], [ZstdCodec(level=3)]),
        "zstd-9": ([], [ZstdCodec(level=9)]),
        "blosc-lz4": ([], [BloscCodec(cname="lz4", clevel=5, shuffle="noshuffle", typesize=1)]),
        "row-median every chunk + zstd-1": ([RowMedianCodec()], [ZstdCodec(level=1, checksum=True)]),
        "frame filter per chunk + zstd-1 (chosen)": ([], [FrameFilterCodec(), ZstdCodec(level=1, checksum=True)]),
        "row-median + zstd-3": ([RowMedianCodec()], [ZstdCodec(level=3)]),
        "row-median + zstd-9": ([RowMedianCodec()], [ZstdCodec(level=9)]),
    }
    per_frame = {"PNG (Pillow level 6)": (lambda f: png_bytes(f), _png_decode),
                 "PNG (Pillow level 1)": (lambda f: png_bytes(f, 1), _png_decode)}
    try:
        import imagecodecs as ic

        per_frame.update({
            "WebP lossless (imagecodecs)": (lambda f: ic.webp_encode(f, lossless=True), ic.webp_decode),
            "JPEG-XL lossless effort 1": (lambda f: ic.jpegxl_encode(f, lossless=True, effort=1), ic.jpegxl_decode),
            "JPEG-LS (imagecodecs)": (ic.jpegls_encode, ic.jpegls_decode),
            "QOI (imagecodecs)": (ic.qoi_encode, ic.qoi_decode),
        })
    except ImportError:
        pass
    first = next(iter(sets.values()))
    n = layout.frames_per_chunk(scenario_fields(True)["obs/cam_left"])
    print(f"frames {first.shape[1:]}, chunks of {n} frames, shards of {n * layout.IMAGES_PER_SHARD_CHUNKS}; "
          + ", ".join(f"{k}: {len(v)} frames" for k, v in sets.items()))
    print(f"  {'codec':40}" + "".join(f" | {k + ' B/frame':>17} {'x PNG':>6} {'write MB/s':>10} {'read MB/s':>9}"
                                      for k in sets))

    def row(name, results):
        print(f"  {name:40}" + "".join(f" | {b:17.0f} {b / p:6.2f} {w:10.0f} {r:9.0f}" for b, p, w, r in results))

    png = {k: np.mean([len(png_bytes(f)) for f in v]) for k, v in sets.items()}
    for name, (enc, dec) in per_frame.items():
        results = []
        for k, frames in sets.items():
            t = time.perf_counter()
            blobs = [enc(f) for f in frames]
            tw = time.perf_counter() - t
            t = time.perf_counter()
            back = np.stack([dec(b) for b in blobs])
            tr = time.perf_counter() - t
            assert (back == frames).all(), name
            size = np.mean([len(b) for b in blobs])
            results.append((size, png[k], frames.nbytes / tw / 1e6, frames.nbytes / tr / 1e6))
        row(name, results)
    for name, (filters, comp) in zarr_cands.items():
        results = []
        for k, frames in sets.items():
            store = zarr.storage.MemoryStore()
            a = zarr.create_array(store, shape=frames.shape, dtype="uint8", chunks=(n, *frames.shape[1:]),
                                  shards=(n * layout.IMAGES_PER_SHARD_CHUNKS, *frames.shape[1:]), filters=filters,
                                  compressors=comp)
            t = time.perf_counter()
            a[:] = frames
            tw = time.perf_counter() - t
            t = time.perf_counter()
            back = a[:]
            tr = time.perf_counter() - t
            assert (back == frames).all(), name
            size = sum(len(v) for key, v in store._store_dict.items() if not key.endswith("zarr.json")) / len(frames)
            results.append((size, png[k], frames.nbytes / tw / 1e6, frames.nbytes / tr / 1e6))
        row(name, results)


def _png_decode(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the paced run (default 10000)")
    ap.add_argument("--max-steps", type=int, default=4000, help="steps of the unpaced and baseline runs (default 4000)")
    ap.add_argument("--episode", type=int, default=500, help="steps per episode (default 500 = 10 s at 50 Hz)")
    ap.add_argument("--pace", type=float, default=20.0, help="offered rate in the paced run, x real time")
    ap.add_argument("--episodes", type=int, default=10_000, help="episodes in the file-count/open-time store")
    ap.add_argument("--episode-steps", type=int, default=10, help="steps per episode in the 10k-episode store")
    ap.add_argument("--quick", action="store_true", help="2000 steps, 1000 episodes")
    ap.add_argument("--codecs", action="store_true", help="only compare image codecs")
    ap.add_argument("--frames", help="a .npy of (N, 128, 128, 3) uint8 frames: a third frame set (camera scenario and "
                                     "--codecs)")
    ap.add_argument("--frame-sets", default="noisy,rendered",
                    help="camera frame sets, of noisy (synthetic, sensor noise) and rendered (MuJoCo Fetch camera); "
                         "default both")
    ap.add_argument("--rendered-frames", type=int, default=600, help="rendered frames to make (default 600)")
    ap.add_argument("--lerobot-steps", type=int, default=1000,
                    help="steps of LeRobot's recorder per frame set where .venv-interop exists (0: skip; default 1000)")
    ap.add_argument("--only", choices=["cameras", "state", "episodes"], help="run one part only")
    ap.add_argument("--dir", help="where to write (default: a temporary directory, removed afterwards)")
    args = ap.parse_args()
    if args.quick:
        args.steps, args.max_steps, args.episodes = 2000, 2000, 1000
        args.rendered_frames, args.lerobot_steps = 300, min(args.lerobot_steps, 500)
    names = [x for x in args.frame_sets.split(",") if x]
    if args.codecs or args.only in (None, "cameras"):
        sets = {"noisy": make_frames(512 if args.codecs else 64)} if "noisy" in names else {}
        if "rendered" in names:
            sets["rendered"] = render_fetch(args.rendered_frames)
        if args.frames:
            sets[os.path.basename(args.frames)] = np.load(args.frames)
    if args.codecs:
        codecs(sets)
        return
    tmp = args.dir or tempfile.mkdtemp(prefix="bench_recorder_")
    try:
        print(f"cpu cores {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}, zarr {zarr.__version__}")
        if args.only in (None, "cameras"):
            for label, frames in sets.items():
                scenario(f"two cameras, {label} frames", True, args.steps, args.max_steps, args.episode, args.pace,
                         tmp, frames, lerobot_steps=args.lerobot_steps)
        if args.only in (None, "state"):
            scenario("state only", False, args.steps, args.max_steps, args.episode, args.pace, tmp)
        if args.only in (None, "episodes"):
            ten_k(tmp, args.episodes, args.episode_steps)
        print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB, "
              f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        if not args.dir:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
