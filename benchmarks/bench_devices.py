"""Device poll cost and event-to-command latency, next to bare baselines measured in the same run.

    python benchmarks/bench_devices.py [--n 5000] [--write docs/benchmarks.md]

Gamepad: an SDL virtual joystick (SDL's own driver, attached as in tests/devices/test_devices_gamepad.py) is
opened by Gamepad.connect(); events are posted into pygame's real queue. Figures:
  - idle poll:          Gamepad.poll() with an empty queue   vs  pygame.event.get(JOY types) alone
  - event -> command:   post one JOYAXISMOTION, poll, time until the HumanCommand is returned
                        vs  post one event and pygame.event.get it back
SpaceMouse: report bytes replayed in place of hidapi's handle (there is no device here).
  - report -> command:  one 7-byte report pending, SpaceMouse.poll()  vs  struct.unpack_from alone
The rest of poll-to-applied (mapping, safety, env.step) belongs to the control loop's benchmark.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import re
import struct
import time
from pathlib import Path

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import numpy as np  # noqa: E402
import pygame  # noqa: E402

from hg_dagger.devices import SpaceMouseConfig, load_device_config, make_device  # noqa: E402
from hg_dagger.devices.gamepad import JOY_EVENTS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- devices:begin -->", "<!-- devices:end -->"


def _virtual_pads():
    spec = importlib.util.spec_from_file_location("_pads", ROOT / "tests" / "support" / "devices.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.VirtualPads()


def _stats(ns: list[int]) -> tuple[float, float]:
    a = np.asarray(ns, np.float64) / 1e3
    return float(np.percentile(a, 50)), float(np.percentile(a, 99))


def _timeit(fn, n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


class _ReplayHid:
    def __init__(self):
        self.pending: list[bytes] = []

    def read(self, max_length):
        return list(self.pending.pop()) if self.pending else []

    def close(self):
        pass


def bench_gamepad(n: int, tmp: Path) -> dict[str, tuple[float, float]]:
    pads = _virtual_pads()
    pads.detach_all()
    pads.attach()
    pad = make_device(load_device_config("gamepad").model_copy(update={"calibration_dir": tmp}))
    pad.connect()
    pygame.event.clear()
    iid = pad._instance_id
    out = {}
    out["pygame.event.get(JOY types), empty queue"] = _stats(_timeit(lambda: pygame.event.get(eventtype=JOY_EVENTS), n))
    out["Gamepad.poll(), empty queue"] = _stats(_timeit(pad.poll, n))

    values = np.random.default_rng(0).uniform(-1, 1, n)

    def post_get(i=[0]):  # noqa: B006 - a counter
        pygame.event.post(pygame.event.Event(pygame.JOYAXISMOTION, instance_id=iid, joy=iid, axis=1, value=values[i[0] % n]))
        i[0] += 1
        pygame.event.get(eventtype=JOY_EVENTS)

    def post_poll(i=[0]):  # noqa: B006
        pygame.event.post(pygame.event.Event(pygame.JOYAXISMOTION, instance_id=iid, joy=iid, axis=1, value=values[i[0] % n]))
        i[0] += 1
        pad.poll()

    out["post 1 event + pygame.event.get"] = _stats(_timeit(post_get, n))
    out["post 1 event + Gamepad.poll -> HumanCommand"] = _stats(_timeit(post_poll, n))
    pad.close()
    pads.detach_all()
    return out


def bench_spacemouse(n: int, tmp: Path) -> dict[str, tuple[float, float]]:
    hid = _ReplayHid()
    dev = make_device(SpaceMouseConfig(calibration_dir=tmp), hid_device=hid)
    dev.connect()
    report = bytes.fromhex("01 5e 01 a2 fe 38 ff")
    out = {}
    out["struct.unpack_from('<3h') alone"] = _stats(_timeit(lambda: struct.unpack_from("<3h", report, 1), n))
    out["SpaceMouseParser.feed(report)"] = _stats(_timeit(lambda: dev.parser.feed(report), n))

    def poll_one():
        hid.pending.append(report)
        dev.poll()

    out["1 report pending + SpaceMouse.poll -> HumanCommand"] = _stats(_timeit(poll_one, n))
    return out


def render(results: dict[str, dict[str, tuple[float, float]]], n: int) -> str:
    lines = [
        BEGIN,
        "## Devices",
        "",
        f"`python benchmarks/bench_devices.py --n {n}` ({platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, Python {platform.python_version()}, pygame {pygame.version.ver}, "
        f"{time.strftime('%Y-%m-%d')}, load average {os.getloadavg()[0]:.1f} from other work on the machine). "
        f"Times in microseconds, {n} samples each; the bare baseline of each group was measured in the same run. "
        "Shipped configs (gamepad: deadzone, expo, rate limit; SpaceMouse: frame rotation). p99 on a shared "
        "machine mostly measures preemption by other processes.",
        "",
        "| group | measurement | p50 µs | p99 µs |",
        "|---|---|---:|---:|",
    ]
    for group, rows in results.items():
        for name, (p50, p99) in rows.items():
            lines.append(f"| {group} | {name} | {p50:.1f} | {p99:.1f} |")
    lines += [
        "",
        "Event -> command is the device's share of poll-to-applied latency: the time from an input event "
        "sitting in the queue to the processed HumanCommand. At 25 Hz (40 ms per tick) the wait for the "
        "next poll (up to one tick) dominates; the control loop's own benchmark covers mapping, safety and env.step.",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_section(path: Path, section: str) -> None:
    """Replace only the Devices section (between its markers); create the file if needed."""
    text = path.read_text() if path.exists() else "# Benchmarks\n\n"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END) + r"\n?", lambda _: section, text, flags=re.S)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--write", type=Path, default=None, help="update the Devices section of this markdown file")
    args = ap.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results = {
            "gamepad": bench_gamepad(args.n, Path(tmp)),
            "spacemouse": bench_spacemouse(args.n, Path(tmp)),
        }
    section = render(results, args.n)
    print(section)
    from figures import record

    # (group, measured row index, its bare baseline's row index)
    for group, i, b in (("gamepad", 1, 0), ("gamepad", 3, 2), ("spacemouse", 1, 0), ("spacemouse", 2, 0)):
        names = list(results[group])
        record(f"{group}: {names[i]} p50", results[group][names[i]][0], unit="us",
               baseline=results[group][names[b]][0], baseline_name=names[b], higher_is_better=False)
    if args.write:
        write_section(args.write, section)
        print(f"wrote the Devices section of {args.write}")


if __name__ == "__main__":
    main()
