"""SpaceMouse: the real HID report parser and device code fed with report bytes.

The physical device is replaced by ``ReplayHid``, a stand-in for hidapi's device handle (read/close)
that returns recorded reports; everything after the read is the production code path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hg_dagger.contract.command import GRIPPER, TAKEOVER
from hg_dagger.devices import Calibration, DeviceError, load_device_config, make_device
from hg_dagger.devices.configs import SpaceMouseConfig
from hg_dagger.devices.processing import ProcessingConfig
from hg_dagger.devices.spacemouse import SpaceMouse, SpaceMouseParser

DATA = Path(__file__).parents[1] / "data" / "devices"


def reports(name: str) -> list[bytes]:
    lines = (DATA / name).read_text().splitlines()
    return [bytes.fromhex(line) for line in lines if line.strip() and not line.startswith("#")]


class ReplayHid:
    """Stands in for an open hidapi device: read() hands out queued reports, [] when none are pending."""

    def __init__(self):
        self.pending: list[bytes] = []
        self.unplugged = False
        self.closed = False

    def queue(self, *items: bytes) -> None:
        self.pending.extend(items)

    def read(self, max_length: int) -> list[int]:
        if self.unplugged:
            raise OSError("read error")  # what hidapi raises when the device is gone
        return list(self.pending.pop(0)[:max_length]) if self.pending else []

    def close(self) -> None:
        self.closed = True


def plain(tmp_path, **kw) -> SpaceMouseConfig:
    base = dict(calibration_dir=tmp_path, processing=ProcessingConfig(hold={"engage_on": "always"}))
    return SpaceMouseConfig(**(base | kw))


def test_split_reports_parse_to_axes_and_buttons():
    p = SpaceMouseParser()
    stream = reports("spacemouse_split.hex")
    seen = []
    for r in stream:
        ok = p.feed(r)
        seen.append((ok, p.counts.tolist(), p.buttons))
    assert seen[0] == (True, [350, 0, 0, 0, 0, 0], 0)
    assert seen[2] == (True, [350, 0, -200, 0, 0, 0], 0)
    assert seen[3] == (True, [350, 0, -200, 0, 0, 175], 0)
    assert seen[4][2] == 1 and seen[5][2] == 0 and seen[7][2] == 2
    assert seen[6] == (False, [350, 0, -200, 0, 0, 175], 0)  # unknown report id 0x17: ignored, state kept
    assert seen[-1] == (True, [0] * 6, 0)
    assert p.reports == len(stream) - 1


def test_combined_report_sets_all_six_axes():
    p = SpaceMouseParser()
    stream = reports("spacemouse_combined.hex")
    p.feed(stream[0])
    assert p.counts.tolist() == [350, -350, 0, 100, -100, 175]
    p.feed(stream[1])
    assert p.pressed(0) and p.pressed(1) and not p.pressed(2)


def test_forced_split_format_reads_only_translation_from_a_long_report():
    p = SpaceMouseParser("split")
    p.feed(reports("spacemouse_combined.hex")[0])
    assert p.counts.tolist() == [350, -350, 0, 0, 0, 0]
    assert not SpaceMouseParser("combined").feed(reports("spacemouse_split.hex")[0])


def test_poll_reads_every_pending_report_and_scales(tmp_path):
    hid = ReplayHid()
    dev = SpaceMouse(plain(tmp_path, rotation_scale=0.5), hid_device=hid)
    dev.connect()
    hid.queue(*reports("spacemouse_split.hex")[:4])
    cmd = dev.poll()
    assert not hid.pending
    np.testing.assert_array_equal(cmd.raw, [350, 0, -200, 0, 0, 175, -1])  # counts as read; gripper open
    np.testing.assert_allclose(cmd.motion, [1.0, 0, -200 / 350, 0, 0, 0.25, -1], atol=1e-6)
    assert cmd.device_id == "spacemouse:injected"


def test_shipped_config_transforms_to_the_robot_frame(tmp_path):
    cfg = load_device_config("spacemouse").model_copy(update={"calibration_dir": tmp_path})
    hid = ReplayHid()
    dev = make_device(cfg, hid_device=hid)
    dev.connect()
    assert dev.poll().engaged is False  # cap untouched: not engaged (engage on motion)
    hid.queue(bytes.fromhex("01 00 00 a2 fe 00 00"))  # cap pulled toward the user: y = -350
    cmd = dev.poll()
    # device y (toward the user) -> robot -x; full deflection, rate limited to 0.3 per tick
    assert cmd.engaged and cmd.motion[0] == pytest.approx(0.3) and not cmd.motion[1:6].any()
    assert dev.poll().motion[0] == pytest.approx(0.6)


def test_button_tap_and_gripper_toggle(tmp_path):
    hid = ReplayHid()
    dev = SpaceMouse(plain(tmp_path), hid_device=hid)
    dev.connect()
    split = reports("spacemouse_split.hex")
    hid.queue(split[4], split[5])  # button 0 down and up between two polls
    cmd = dev.poll()
    assert cmd.buttons == {TAKEOVER} and cmd.raw[6] == -1
    hid.queue(split[7])  # button 1 (gripper) down: toggles closed
    cmd = dev.poll()
    assert cmd.buttons == {GRIPPER} and cmd.raw[6] == 1 and cmd.motion[6] == 1
    assert dev.poll().raw[6] == 1  # still held: no second toggle
    hid.queue(split[8], split[7])  # release and press again: opens
    assert dev.poll().raw[6] == -1


def test_read_error_means_device_lost(tmp_path):
    hid = ReplayHid()
    dev = SpaceMouse(plain(tmp_path), hid_device=hid)
    dev.connect()
    hid.queue(reports("spacemouse_split.hex")[0])
    assert dev.poll().motion[0] == pytest.approx(1.0)
    hid.unplugged = True
    assert dev.poll() is None and not dev.connected
    assert dev.poll() is None
    dev.close()
    assert hid.closed


def test_no_spacemouse_attached_is_a_clear_error(tmp_path):
    dev = make_device(plain(tmp_path, vendor_ids=[0x256F], product_ids=[0xFFFE]))
    with pytest.raises(DeviceError, match="no SpaceMouse found"):
        dev.connect()
    assert dev.poll() is None


def test_calibration_removes_rest_drift_and_is_saved(tmp_path):
    hid = ReplayHid()
    dev = SpaceMouse(plain(tmp_path), hid_device=hid, device_key="256f:c635:ABC")
    dev.connect()
    drift = bytes.fromhex("01 0c 00 f9 ff 00 00")  # x = +12, y = -7 at rest
    hid.queue(drift)
    assert dev.poll().motion[0] == pytest.approx(12 / 350)
    messages = []
    cal = dev.calibrate(center_s=0.0, prompt=messages.append)
    assert cal.axes[0].center == 12 and cal.axes[1].center == -7 and cal.axes[2].center == 0
    path = Calibration.path_for(tmp_path, "spacemouse", "256f:c635:ABC")
    assert path.is_file() and str(path) in messages[-1]
    assert not dev.poll().motion[:6].any()  # drift now reads as rest
    again = SpaceMouse(plain(tmp_path), hid_device=ReplayHid(), device_key="256f:c635:ABC")
    again.connect()
    assert again.calibration == cal
