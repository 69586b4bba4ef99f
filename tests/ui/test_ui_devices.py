"""The device panel: a hot-plug list from a scan, SetDevice from the combo, live axes from snapshots, and
calibration dialogs over the devices package's wizard (keyboard, and an SDL virtual gamepad)."""

from __future__ import annotations

import numpy as np
import pytest
from PyQt6.QtWidgets import QDialogButtonBox

from hg_dagger.control.live import CommandQueue, DeviceState, LatestSlot, SetDevice, Snapshot
from hg_dagger.devices import load_device_config, make_device
from hg_dagger.devices.discovery import KEYBOARD, DeviceInfo, DeviceScanner
from hg_dagger.devices.wizard import CalibrationWizard
from hg_dagger.ui import style
from hg_dagger.ui.device_panel import CalibrationDialog, DevicePanel
from hg_dagger.ui.snapshots import SnapshotReader

pytestmark = [pytest.mark.app]

PAD = DeviceInfo(kind="gamepad", name="Xbox 360 Controller", device_id="gamepad:0300abcd", config="gamepad",
                 index=0, map="xinput", detail="6 axes, 11 buttons, 1 hats")


@pytest.fixture
def live(qtbot):
    slot = LatestSlot()
    reader = SnapshotReader(slot, hz=60)
    reader.start()
    yield slot, reader, CommandQueue()
    reader.stop()


def publish_and_wait(qtbot, slot, reader, s: Snapshot) -> None:
    slot.publish(s)
    qtbot.waitUntil(lambda: reader.last is s, timeout=5000)


def test_device_list_follows_the_scan_and_sends_set_device(qtbot, live):
    slot, reader, q = live
    plugged = [KEYBOARD]
    panel = DevicePanel(q, scan=lambda: list(plugged))
    qtbot.addWidget(panel)
    panel.show()
    assert [panel.combo.itemData(i) for i in range(panel.combo.count())] == ["keyboard"]
    plugged.append(PAD)  # plugged in
    panel.rescan()
    assert panel.combo.count() == 2 and "Xbox 360 Controller" in panel.combo.itemText(1)
    panel.combo.setCurrentIndex(1)
    panel.combo.activated.emit(1)
    assert q.drain() == [SetDevice("gamepad")]
    plugged.remove(PAD)  # unplugged
    panel.rescan()
    assert panel.combo.count() == 1


def test_the_real_scanner_lists_the_keyboard_first(qtbot, live):
    _, _, q = live
    panel = DevicePanel(q, scan=DeviceScanner(spacemice=False).scan)
    qtbot.addWidget(panel)
    panel.show()
    assert panel.combo.itemData(0) == "keyboard"


def test_live_axes_and_state(qtbot, live):
    slot, reader, q = live
    panel = DevicePanel(q, scan=lambda: [KEYBOARD])
    qtbot.addWidget(panel)
    reader.snapshot.connect(panel.show_snapshot)
    panel.show()
    raw = np.array([0.5, -1.0, 0.05, 0, 0, 0, 1.0], np.float32)
    dev = DeviceState(device_id="gamepad:0300abcd", kind="gamepad", connected=True, engaged=True, axes=raw,
                      buttons=("takeover", "hold"), deadzone=(0.1,) * 6 + (0.0,))
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=1, device=dev))
    assert [b.value for b in panel.bars] == pytest.approx(raw.tolist())
    assert [b.name for b in panel.bars] == ["x", "y", "z", "roll", "pitch", "yaw", "gripper"]
    assert panel.bars[0].deadzone == pytest.approx(0.1) and panel.bars[6].deadzone == 0.0
    assert panel.ident.text() == "gamepad: gamepad:0300abcd" and panel.link.text() == "connected"
    assert panel.engaged.text() == "ENGAGED" and style.HUMAN in panel.engaged.styleSheet()
    assert panel.buttons.text() == "Buttons: takeover, hold"
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=2, phase="running",
                                                   device=DeviceState(device_id="keyboard", kind="keyboard")))
    assert panel.link.text() == "NOT CONNECTED" and panel.buttons.text() == "Buttons: none"
    assert not panel.calibrate.isEnabled()  # never while episodes run
    assert all(b.value == 0.0 for b in panel.bars)


def test_calibrating_the_keyboard_needs_nothing(qtbot, live):
    slot, reader, q = live
    panel = DevicePanel(q, scan=lambda: [KEYBOARD])
    qtbot.addWidget(panel)
    reader.snapshot.connect(panel.show_snapshot)
    panel.show()
    publish_and_wait(qtbot, slot, reader, Snapshot(seq=1, phase="idle"))
    panel.calibrate.click()
    dlg = panel.dialog
    qtbot.waitUntil(dlg.isVisible, timeout=5000)
    assert "needs no calibration" in dlg.instructions.text()
    dlg.box.button(QDialogButtonBox.StandardButton.Close).click()
    qtbot.waitUntil(lambda: not dlg.isVisible(), timeout=5000)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_calibration_dialog_steps_through_the_phases(qtbot, pads, tmp_path):
    pads.attach()
    cfg = load_device_config("gamepad").model_copy(update={"calibration_dir": tmp_path})
    pad = make_device(cfg)
    pad.connect()
    clock = Clock()
    dlg = CalibrationDialog(CalibrationWizard(pad, center_s=2.0, range_s=6.0, clock=clock), owns_device=True)
    qtbot.addWidget(dlg)
    dlg.open()
    qtbot.waitUntil(lambda: dlg.wizard._samples > 0, timeout=5000)
    assert dlg.step.text() == "Step 1 of 2: center" and dlg.instructions.text()
    clock.t = 2.5
    qtbot.waitUntil(lambda: dlg.wizard.phase == "range", timeout=5000)
    qtbot.waitUntil(lambda: dlg.step.text() == "Step 2 of 2: range", timeout=5000)
    clock.t = 9.0
    qtbot.waitUntil(lambda: dlg.wizard.finished, timeout=5000)
    assert dlg.wizard.phase == "done" and str(tmp_path) in dlg.instructions.text()
    assert dlg.progress.value() == 100 and not dlg.timer.isActive()
    dlg.box.button(QDialogButtonBox.StandardButton.Close).click()
    assert not pad.connected


def test_cancelling_calibration_saves_nothing(qtbot, pads, tmp_path):
    pads.attach()
    pad = make_device(load_device_config("gamepad").model_copy(update={"calibration_dir": tmp_path}))
    pad.connect()
    dlg = CalibrationDialog(CalibrationWizard(pad, clock=Clock()), owns_device=True)
    qtbot.addWidget(dlg)
    dlg.open()
    dlg.box.button(QDialogButtonBox.StandardButton.Cancel).click()
    assert dlg.wizard.phase == "cancelled" and not pad.connected and not list(tmp_path.iterdir())
