"""The window's keyboard as the in-window keyboard device: Qt key events -> KeyEvent commands by name.

Names follow configs/devices/keyboard.yaml (letters lower case, "space", "enter", "up"/"down"/
"left"/"right", "shift", ...). Esc is the emergency stop and never a motion key. Auto-repeat is not a
new press. When the window loses focus every held key is let go (ReleaseKeys), so a key released
elsewhere cannot leave the robot moving.
"""

from __future__ import annotations

from PyQt6.QtCore import QEvent, QObject, Qt
from PyQt6.QtGui import QKeyEvent
from PyQt6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QLineEdit,
    QPlainTextEdit,
    QTextEdit,
    QWidget,
)

from hg_dagger.control.live import CommandQueue, EStop, KeyEvent, ReleaseKeys

K = Qt.Key
_NAMED = {
    K.Key_Space: "space", K.Key_Return: "enter", K.Key_Enter: "enter",
    K.Key_Up: "up", K.Key_Down: "down", K.Key_Left: "left", K.Key_Right: "right",
    K.Key_Shift: "shift", K.Key_Control: "ctrl", K.Key_Alt: "alt", K.Key_Tab: "tab",
    K.Key_Backspace: "backspace", K.Key_Delete: "delete", K.Key_Home: "home", K.Key_End: "end",
    K.Key_PageUp: "page up", K.Key_PageDown: "page down", K.Key_Comma: ",", K.Key_Period: ".",
    K.Key_Minus: "-", K.Key_Plus: "+", K.Key_Equal: "=", K.Key_Slash: "/", K.Key_Semicolon: ";",
}
_MODIFIER_KEYS = {K.Key_Shift, K.Key_Control, K.Key_Alt, K.Key_Meta}
_SHORTCUT_MODIFIERS = (Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.AltModifier
                       | Qt.KeyboardModifier.MetaModifier)
TEXT_INPUTS = (QLineEdit, QAbstractSpinBox, QTextEdit, QPlainTextEdit)


def key_name(key: int | Qt.Key) -> str | None:
    """The keyboard device's name for a Qt key, or None for keys it has no name for (and for Esc)."""
    key = Qt.Key(key)
    if K.Key_A.value <= key.value <= K.Key_Z.value:
        return chr(key.value).lower()
    if K.Key_0.value <= key.value <= K.Key_9.value:
        return chr(key.value)
    if K.Key_F1.value <= key.value <= K.Key_F12.value:
        return None  # function keys stay the window's shortcuts (F1: help)
    return _NAMED.get(key)


def is_text_input(w: QObject | None) -> bool:
    """Widgets where typed keys are text, not robot motion (an editable combo box counts)."""
    if isinstance(w, QComboBox):
        return w.isEditable()
    return isinstance(w, TEXT_INPUTS)


class KeyboardBridge(QObject):
    """An application-level event filter that turns key presses anywhere in ``window`` into commands.

    Install with ``QApplication.instance().installEventFilter(bridge)``; keys typed into text inputs
    (spin boxes, line edits) stay text. Mapped keys are consumed, so Space never clicks a focused button.
    """

    def __init__(self, window: QWidget, commands: CommandQueue):
        super().__init__(window)
        self.window = window
        self.commands = commands
        self.held: set[str] = set()
        self.enabled = True

    def release_all(self) -> None:
        self.held.clear()
        self.commands.put(ReleaseKeys())

    def eventFilter(self, obj: QObject, ev: QEvent) -> bool:  # noqa: N802 - Qt override
        t = ev.type()
        if t in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease):
            if not self.enabled or not isinstance(obj, QWidget):
                return False
            if obj.window() is self.window:
                return self._key(obj, ev, t == QEvent.Type.KeyPress)
            if ev.key() == K.Key_Escape and self._owned(obj):
                return self._key(obj, ev, t == QEvent.Type.KeyPress)  # Esc stops from the window's dialogs too
            return False
        if t == QEvent.Type.WindowDeactivate and obj is self.window:
            self.release_all()
        elif t == QEvent.Type.FocusIn and self.held and is_text_input(obj) and isinstance(obj, QWidget) \
                and obj.window() is self.window:
            self.release_all()  # typing starts: no key may stay held as motion
        return False

    def _owned(self, w: QWidget) -> bool:
        top = w.window()
        while top is not None:
            if top is self.window:
                return True
            parent = top.parentWidget()
            top = parent.window() if parent is not None else None
        return False

    def _key(self, obj: QWidget, ev: QKeyEvent, down: bool) -> bool:
        key = ev.key()
        if key == K.Key_Escape:
            if down and not ev.isAutoRepeat():
                self.commands.put(EStop(source="keyboard", reason="Esc key in the app window"))
            return True
        if is_text_input(obj) or is_text_input(QApplication.focusWidget()):
            return False
        if key not in _MODIFIER_KEYS and ev.modifiers() & _SHORTCUT_MODIFIERS:
            return False  # Ctrl+Q and friends are shortcuts, not motion
        name = key_name(key)
        if name is None:
            return False
        if ev.isAutoRepeat():
            return True
        if down:
            self.held.add(name)
        else:
            self.held.discard(name)
        self.commands.put(KeyEvent(name, down))
        return True
