"""The operator device: which one, is it connected and engaged, its raw axes live, and a way to switch
devices or calibrate one.

The device list comes from the devices package's hot-plug scanner (``DeviceScanner.scan``), called on
a slow QTimer while the panel is visible; tests and other front ends may pass their own ``scan``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from PyQt6.QtCore import QRectF, QSize, Qt, QTimer
from PyQt6.QtGui import QColor, QPainter, QPen
from PyQt6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.contract.command import COMMAND_AXES
from hg_dagger.control.live import CommandQueue, DeviceState, SetDevice, Snapshot
from hg_dagger.devices import DeviceError, make_device
from hg_dagger.devices.discovery import DeviceScanner
from hg_dagger.devices.wizard import CalibrationWizard
from hg_dagger.ui import style
from hg_dagger.ui.keymap import device_keys_line, task_key_rows

SCAN_MS = 2000


class AxisBar(QWidget):
    """One raw axis in [-1, 1] as a bar from the centre, with the deadzone drawn as a grey band."""

    def __init__(self, name: str, parent: QWidget | None = None, *, control: str = ""):
        super().__init__(parent)
        self.name = name
        self.control = control  # the key or stick that moves it, e.g. "W / S"
        self.value = 0.0
        self.deadzone = 0.0
        self.engaged = True  # drawn grey while the device is not engaged: then it moves nothing
        self.setMinimumHeight(18)
        self.setToolTip(f"{name}: {control}" if control else f"raw {name}")

    def sizeHint(self) -> QSize:
        return QSize(160, 18)

    @property
    def label(self) -> str:
        return f"{self.name}  [{self.control}]" if self.control else self.name

    def set(self, value: float, deadzone: float, engaged: bool = True) -> None:
        value = min(1.0, max(-1.0, float(value))) if math.isfinite(value) else 0.0  # plain floats: called per axis per frame
        if value != self.value or deadzone != self.deadzone or engaged != self.engaged:
            self.value, self.deadzone, self.engaged = value, deadzone, engaged
            self.update()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt override
        p = QPainter(self)
        w, h = self.width(), self.height()
        mid = w / 2
        p.fillRect(self.rect(), QColor("#eceef1"))
        dz = max(0.0, min(1.0, self.deadzone)) * mid
        if dz > 0:
            p.fillRect(QRectF(mid - dz, 0, 2 * dz, h), QColor("#c9ccd1"))
        inside = abs(self.value) <= self.deadzone or not self.engaged
        colour = QColor(style.NEUTRAL if inside else style.HUMAN)
        x = self.value * mid
        p.fillRect(QRectF(min(mid, mid + x), 3, abs(x), h - 6), colour)
        p.setPen(QPen(QColor("#444"), 1))
        p.drawLine(int(mid), 0, int(mid), h)
        p.drawText(QRectF(4, 0, w - 8, h), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, self.label)
        p.drawText(QRectF(4, 0, w - 8, h), Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight,
                   f"{self.value:+.2f}")
        p.end()


def default_scan() -> Callable[[], list]:
    """The devices package's scanner (keyboard first, then gamepads and SpaceMice)."""
    return DeviceScanner().scan


class DevicePanel(QGroupBox):
    """Current device, the task's key map with each action dimension live, pressed buttons; a device combo
    (sends SetDevice) and Calibrate...

    With a task known (``snap.task``) there is one bar per action dimension, named by the task's action
    names and the control that moves it ("shoulder_vel [W / S]"); without one, the device's seven command
    axes. While the device is not engaged the bars are grey and the panel says keys move nothing."""

    def __init__(self, commands: CommandQueue, parent: QWidget | None = None, *,
                 scan: Callable[[], list] | None = None):
        super().__init__("Operator device", parent)
        self.commands = commands
        self._scan = scan
        self.available: list = []
        self.problems: list[str] = []
        self.ident = QLabel("-")
        self.ident.setStyleSheet("font-weight: bold;")
        self.link = QLabel("-")
        self.engaged = QLabel("-")
        self.buttons = QLabel("Buttons: none")
        self.keys_line = QLabel()
        self.keys_line.setObjectName("device_keys")
        self.keys_line.setWordWrap(True)
        self.keys_line.setStyleSheet(f"color: {style.NEUTRAL};")
        self.bars: list[AxisBar] = []
        self.slots: list[int] = []  # DeviceState.axes index of each bar
        self._keymap: tuple[str, str] | None = None  # (task, device kind) the bars are built for
        self.grid = QGridLayout()
        self.combo = QComboBox()
        self.combo.setToolTip("Switch the operator device")
        self.combo.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.combo.activated.connect(self._chosen)
        self.calibrate = QPushButton("Calibrate...")
        self.calibrate.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.calibrate.setToolTip("Calibrate the device chosen above (not while episodes run)")
        self.calibrate.clicked.connect(self.open_calibration)
        self.dialog: CalibrationDialog | None = None
        self.timer = QTimer(self)
        self.timer.setInterval(SCAN_MS)
        self.timer.timeout.connect(self.rescan)
        self._phase = "idle"

        lay = QVBoxLayout(self)
        top = QHBoxLayout()
        top.addWidget(self.ident, 1)
        top.addWidget(self.link)
        top.addWidget(self.engaged)
        lay.addLayout(top)
        lay.addLayout(self.grid)
        lay.addWidget(self.keys_line)
        lay.addWidget(self.buttons)
        row = QHBoxLayout()
        row.addWidget(self.combo, 1)
        row.addWidget(self.calibrate)
        lay.addLayout(row)
        self._state: DeviceState | None = None
        self.set_keymap("", "")
        self.show_device(DeviceState())

    # ---- device list --------------------------------------------------------------------------
    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self.rescan()
        self.timer.start()

    def hideEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.timer.stop()
        super().hideEvent(event)

    def rescan(self) -> None:
        """Refresh the combo from the scanner, keeping the choice when it is still there."""
        if self._scan is None:
            self._scan = default_scan()
        try:
            found = list(self._scan())
        except Exception as exc:  # a scanner failure must not take the window down
            found, self.problems = [], [f"device scan failed: {exc}"]
            self.combo.setToolTip(self.problems[0])
        key = [(getattr(d, "device_id", str(d)), getattr(d, "path", "")) for d in found]
        if key == [(getattr(d, "device_id", str(d)), getattr(d, "path", "")) for d in self.available]:
            return
        current = self.combo.currentData()
        self.available = found
        self.combo.clear()
        for d in found:
            label = d.describe() if hasattr(d, "describe") else str(d)
            self.combo.addItem(label, getattr(d, "device_id", str(d)))
        i = self.combo.findData(current if current is not None else self._active_id())
        if i >= 0:
            self.combo.setCurrentIndex(i)

    def _active_id(self) -> str | None:
        return self._state.device_id if self._state is not None else None

    def selected(self):
        i = self.combo.currentIndex()
        return self.available[i] if 0 <= i < len(self.available) else None

    def _chosen(self, i: int) -> None:
        info = self.available[i]
        self.commands.put(SetDevice(getattr(info, "config", str(info))))

    # ---- live state ---------------------------------------------------------------------------
    def show_snapshot(self, snap: Snapshot) -> None:
        self._phase = snap.phase
        self.calibrate.setEnabled(snap.phase != "running" and self.selected() is not None)
        if (snap.task, snap.device.kind) != self._keymap:
            self.set_keymap(snap.task, snap.device.kind)
        self.show_device(snap.device, loading=snap.loading or snap.phase == "loading")

    def set_keymap(self, task: str, kind: str) -> None:
        """One bar per action dimension of ``task`` with the control of device ``kind`` that moves it."""
        self._keymap = (task, kind)
        rows = []
        if task:
            try:
                rows = task_key_rows(task, kind)
            except Exception as exc:  # an unknown or broken task config: the raw axes, and say why
                self.keys_line.setText(f"key map unavailable: {exc}")
                rows = []
        for bar in self.bars:
            self.grid.removeWidget(bar)
            bar.deleteLater()
        if rows:
            self.bars = [AxisBar(r.action, control=r.control) for r in rows]
            self.slots = [r.slot if r.slot is not None else -1 for r in rows]
            self.keys_line.setText(device_keys_line(kind))
        else:
            self.bars = [AxisBar(a) for a in COMMAND_AXES]
            self.slots = list(range(len(COMMAND_AXES)))
        cols = 2 if len(self.bars) > 4 else 1
        for i, bar in enumerate(self.bars):
            self.grid.addWidget(bar, i // cols, i % cols)
        self._state = None  # redraw everything for the new bars

    def show_device(self, d: DeviceState, *, loading: bool = False) -> None:
        if d is not self._state:
            prev, self._state = self._state, d
            if prev is None or (prev.device_id, prev.kind) != (d.device_id, d.kind):
                self.ident.setText(f"{d.kind or 'no device'}: {d.device_id}" if d.device_id else (d.kind or "no device"))
            link = "loading..." if loading else "connected" if d.connected else "NOT CONNECTED"
            if self.link.text() != link:
                self.link.setText(link)
                colour = style.NEUTRAL if loading else style.OK if d.connected else style.SAFETY
                self.link.setStyleSheet(f"color: {colour}; font-weight: bold;")
            engaged = "ENGAGED" if d.engaged else "not engaged: moves nothing"
            if self.engaged.text() != engaged:
                self.engaged.setText(engaged)
                self.engaged.setStyleSheet(style.filled(style.HUMAN, radius=4) if d.engaged else
                                           f"color: {style.NEUTRAL};")
            axes = d.axes if d.axes is not None else np.zeros(len(COMMAND_AXES), np.float32)
            for bar, i in zip(self.bars, self.slots, strict=True):
                value = float(axes[i]) if 0 <= i < len(axes) else 0.0
                bar.set(value, float(d.deadzone[i]) if 0 <= i < len(d.deadzone) else 0.0, bool(d.engaged))
            text = "Buttons: " + (", ".join(d.buttons) if d.buttons else "none")
            if self.buttons.text() != text:
                self.buttons.setText(text)

    # ---- calibration --------------------------------------------------------------------------
    def open_calibration(self) -> None:
        """Build the chosen device, connect it, and run its calibration wizard in a dialog."""
        info = self.selected()
        if info is None:
            return
        try:
            config = info.device_config() if hasattr(info, "device_config") else info
            device = make_device(config)
            device.connect()
            wizard = CalibrationWizard(device)
        except (DeviceError, OSError, ValueError) as exc:
            self.dialog = CalibrationDialog(None, self, error=f"cannot calibrate {info.describe()}: {exc}")
        else:
            self.dialog = CalibrationDialog(wizard, self, owns_device=True)
        self.dialog.open()


class CalibrationDialog(QDialog):
    """Steps an operator through a device's calibration phases; the wizard is ticked on a QTimer."""

    TICK_MS = 20

    def __init__(self, wizard, parent: QWidget | None = None, *, owns_device: bool = False, error: str = ""):
        super().__init__(parent)
        self.setWindowTitle("Calibrate device")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setMinimumWidth(420)
        self.wizard = wizard
        self.owns_device = owns_device
        self.step = QLabel()
        self.step.setStyleSheet("font-weight: bold; font-size: 13pt;")
        self.instructions = QLabel()
        self.instructions.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.box = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.box.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        for w in (self.step, self.instructions, self.progress, self.box):
            lay.addWidget(w)
        self.timer = QTimer(self)
        self.timer.setInterval(self.TICK_MS)
        self.timer.timeout.connect(self.tick)
        if wizard is None:
            self.step.setText("Calibration unavailable")
            self.instructions.setText(error)
            self._finish_buttons()
        else:
            self._show()
            if not wizard.finished:
                self.timer.start()
            else:
                self._finish_buttons()

    def tick(self) -> None:
        self.wizard.tick()
        self._show()
        if self.wizard.finished:
            self.timer.stop()
            self._finish_buttons()

    def _show(self) -> None:
        w = self.wizard
        n, total = w.phase_number
        self.step.setText(f"Step {n} of {total}: {w.phase}" if total and not w.finished else w.phase.capitalize())
        self.instructions.setText(w.instructions)
        self.progress.setValue(int(100 * w.progress))

    def _finish_buttons(self) -> None:
        self.box.setStandardButtons(QDialogButtonBox.StandardButton.Close)
        close = self.box.button(QDialogButtonBox.StandardButton.Close)
        assert close is not None  # just set as the box's button
        close.clicked.connect(self.accept)

    def done(self, result: int) -> None:  # noqa: D401 - Qt override
        """Closing cancels an unfinished calibration and lets go of the device the panel opened."""
        self.timer.stop()
        if self.wizard is not None:
            self.wizard.cancel()
            if self.owns_device:
                self.wizard.device.close()
        super().done(result)
