"""The window's keyboard as the in-window keyboard device: Qt key events -> KeyEvent commands by name.

Names follow configs/devices/keyboard.yaml (letters lower case, "space", "enter", "up"/"down"/
"left"/"right", "shift", ...). Esc in the console is the emergency stop and never a motion key; Esc in
one of the window's dialogs (or its help) closes that dialog and stops nothing. N lets the student go on
while a request waits; Backspace rewinds it (simulation) to correct from before it. Auto-repeat is not a new press. When the window loses focus every held key is
let go (ReleaseKeys), so a key released elsewhere cannot leave the robot moving.

In the window's own dialogs (a question about an episode, the help) the keys are the robot's as in the
console, and never click a dialog's button: Space is the take-over and Enter the hand-back wherever the focus
is, so a dialog open on an episode never keeps the person from taking over, and a key meant for the robot
never discards or flags anything (Tab still moves between the dialog's fields; the mouse answers it). One
exception: a text field keeps its text while the person does not drive (``driving`` is False): a person
typing a reason means to type, and spaces and letters becoming a takeover and motion would record their
typing as a correction. The robot holds while a request waits; Tab out of the field (or Esc, closing the
dialog) and Space takes over; Enter in the field answers the dialog. While the person drives every key is
the robot's, and so it stays while any key of the drive is still held or for ``AFTER_DRIVE_S`` after control
left them: the Enter that hands back as the episode ends never lands in a reason field.
"""

from __future__ import annotations

import time

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

from hg_dagger.control.live import (
    ClearRobot,
    Command,
    CommandQueue,
    DeclineRequest,
    EStop,
    KeyEvent,
    ReleaseKeys,
    Rewind,
    StopRobot,
    TakeRobot,
)
from hg_dagger.ui.keymap import DECLINE_KEY, FLEET_STOP_KEY, FLEET_TAKE_KEY, REWIND_KEY, REWIND_S

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
AFTER_DRIVE_S = 1.0  # keys in a dialog stay the robot's this long after the person stopped driving
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



def _typing_at(obj: QObject) -> bool:
    """A key that reached ``obj`` is typed into a text field (``obj`` itself, or the focus it forwards to)."""
    return is_text_input(obj) or is_text_input(QApplication.focusWidget())


def typing_in_dialog(window: QWidget) -> bool:
    """The focus is in a text field of a dialog over ``window``: there keys stay text until the person drives."""
    focus = QApplication.focusWidget()
    return focus is not None and focus.window() is not window and is_text_input(focus)


def owned_by(w: QWidget, window: QWidget) -> bool:
    """``w`` is in ``window`` or in a window it owns, however deep (a dialog of a dialog, the help)."""
    top = w.window()
    while top is not None:
        if top is window:
            return True
        parent = top.parentWidget()
        top = parent.window() if parent is not None else None
    return False

class KeyboardBridge(QObject):
    """An application-level event filter that turns key presses anywhere in ``window`` into commands.

    Install with ``QApplication.instance().installEventFilter(bridge)``; keys typed into text inputs
    (spin boxes, line edits) stay text. Mapped keys are consumed, so Space never clicks a focused button.
    The window sets ``request_pending`` (N declines then; Backspace rewinds where ``rewindable``), ``robot_keys`` (keys in its dialogs drive the robot
    then) and ``driving`` (in their text fields too) from each snapshot.
    """

    def __init__(self, window: QWidget, commands: CommandQueue):
        super().__init__(window)
        self.window = window
        self.commands = commands
        self.held: set[str] = set()
        self.enabled = True
        self.request_pending = False
        self.rewindable = False  # a request can be rewound (Backspace): the task runs in a simulator that replays
        self.robot_keys = False
        self.fleet_size = 0  # one person, several robots: 1-N take a robot, P the top request, X stops one
        self.robot = 0  # the robot on screen (of a fleet)
        self._driving = False
        self._drove_until = 0.0  # monotonic seconds: a person's drive reaches this far in a dialog's keys

    @property
    def driving(self) -> bool:
        """The person has control (robot_keys is also True then)."""
        return self._driving

    @driving.setter
    def driving(self, value: bool) -> None:
        if self._driving and not value:
            self._drove_until = time.monotonic() + AFTER_DRIVE_S
        self._driving = value

    def _just_drove(self) -> bool:
        """A drive is still in the person's hands: one of its keys is held, or it ended a moment ago."""
        return bool(self.held) or time.monotonic() < self._drove_until

    def release_all(self) -> None:
        self.held.clear()
        self.commands.put(ReleaseKeys())

    def eventFilter(self, obj: QObject | None, ev: QEvent | None) -> bool:  # noqa: N802 - Qt override
        assert ev is not None  # Qt always passes the event
        t = ev.type()
        if t in (QEvent.Type.KeyPress, QEvent.Type.KeyRelease):
            # (a key press or release always comes as a QKeyEvent)
            if not self.enabled or not isinstance(obj, QWidget) or not isinstance(ev, QKeyEvent):
                return False
            down = t == QEvent.Type.KeyPress
            if obj.window() is self.window:
                return self._key(obj, ev, down)
            if ev.key() != K.Key_Escape and self._owned(obj):  # Esc in a dialog is the dialog's: it closes it
                if ev.key() in (K.Key_Tab, K.Key_Backtab) and not self.driving:
                    return False  # moving between the dialog's fields
                if not _typing_at(obj) or self.driving or self._just_drove():
                    # the robot's keys, never a button's; a drive that has just ended (the episode with it)
                    # keeps them in a text field too: its held keys, and what is pressed while one is held or a
                    # moment after
                    return self._key(obj, ev, down, forced=True)
            return False
        if t == QEvent.Type.WindowDeactivate and (obj is self.window or (
                self.held and isinstance(obj, QWidget) and obj.isWindow() and self._owned(obj))):
            self.release_all()  # focus left for another window: no key may stay held as motion
        elif t == QEvent.Type.FocusIn and self.held and is_text_input(obj) and isinstance(obj, QWidget) \
                and obj.window() is self.window and not self.robot_keys:
            self.release_all()  # typing starts: no key may stay held as motion
        return False

    def _owned(self, w: QWidget) -> bool:
        """``w`` is in a window the main window owns (a dialog, the help), not the main window itself."""
        return w.window() is not self.window and owned_by(w, self.window)

    def _key(self, obj: QWidget, ev: QKeyEvent, down: bool, *, forced: bool = False) -> bool:
        key = ev.key()
        if key == K.Key_Escape:
            if down and not ev.isAutoRepeat():
                self.commands.put(EStop(source="keyboard", reason="Esc key"))
            return True
        held = key_name(key) in self.held
        if not (forced or held or self.robot_keys) and _typing_at(obj):
            return False
        if key not in _MODIFIER_KEYS and ev.modifiers() & _SHORTCUT_MODIFIERS:
            return False  # Ctrl+Q and friends are shortcuts, not motion
        name = key_name(key)
        if name is None:
            return False
        if ev.isAutoRepeat():
            return True
        if self.fleet_size > 1 and name not in self.held and self._fleet_key(name, ev, down):
            return True
        if name == DECLINE_KEY and self.request_pending and name not in self.held:
            if down:
                self.commands.put(DeclineRequest())
            return True
        if name == REWIND_KEY and self.request_pending and self.rewindable and name not in self.held:
            if down:
                self.commands.put(Rewind(seconds=REWIND_S))
            return True
        if down:
            self.held.add(name)
        elif name in self.held:
            self.held.discard(name)
        else:
            return True  # the release of a press that was text (Tab out of a field): nothing to let go of
        self.commands.put(KeyEvent(name, down))
        return True

    def _fleet_key(self, name: str, ev: QKeyEvent, down: bool) -> bool:
        """The fleet's keys: a robot's number takes it, P the top request, X stops the robot on screen (Shift+X
        clears it). True when the key was one of them."""
        cmd: Command
        if name.isdigit() and 1 <= int(name) <= self.fleet_size:
            cmd = TakeRobot(int(name) - 1)
        elif name == FLEET_TAKE_KEY:
            cmd = TakeRobot(None)
        elif name == FLEET_STOP_KEY:
            shift = bool(ev.modifiers() & Qt.KeyboardModifier.ShiftModifier)
            cmd = ClearRobot(self.robot, by="keyboard") if shift else StopRobot(self.robot, by="keyboard")
        else:
            return False
        if down:
            self.commands.put(cmd)
        return True
