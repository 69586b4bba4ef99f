"""The operator console: one window over a running control loop.

    window = MainWindow(slot, commands, settings=SettingsFile(...))   # slot: LatestSlot, commands: CommandQueue
    window.show()

The window reads the newest Snapshot on a QTimer and hands it to each view; every button, key and
menu entry only puts a Command into the queue. With ``review_store`` a Review page beside the console
holds the review workspace on that store (the one the session records to); it reads the store on its
own thread and adds the windows of each episode the session ends. Geometry and splitter positions persist in the
app's settings file (ui.settings: app.yaml in the config home, unless a settings object is given).
"""

from __future__ import annotations

from collections.abc import Callable

from PyQt6.QtCore import QByteArray, QEvent, QObject, Qt, pyqtSignal
from PyQt6.QtGui import QAction, QKeyEvent, QKeySequence
from PyQt6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QScrollArea,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from hg_dagger.control.live import CommandQueue, DeclineRequest, EStop, LatestSlot, Quit, Rewind, Snapshot
from hg_dagger.devices import KeyboardConfig, load_device_config
from hg_dagger.devices.keyboard import key_layout
from hg_dagger.ui import settings as saved
from hg_dagger.ui.controls import EpisodeControls, EStopPanel
from hg_dagger.ui.device_panel import DevicePanel
from hg_dagger.ui.fleet_view import FleetPanel
from hg_dagger.ui.gate import GateLight, HandoverBanner
from hg_dagger.ui.health import LoopHealthPanel
from hg_dagger.ui.keymap import DECLINE_KEY, ESTOP_KEY, FLEET_STOP_KEY, FLEET_TAKE_KEY, REWIND_S
from hg_dagger.ui.keys import KeyboardBridge
from hg_dagger.ui.plots import PlotsPanel
from hg_dagger.ui.review import ReviewWorkspace
from hg_dagger.ui.rounds import RoundsPanel, StatusLine
from hg_dagger.ui.snapshots import SnapshotReader
from hg_dagger.ui.view import LiveView

FLEET_EPISODES = 10  # episodes per robot the fleet's Start offers
NOT_A_PERSON = ("", "none", "synthetic", "expert")  # device kinds that answer a gate without the operator
WINDOW_SHORTCUTS = ((ESTOP_KEY, "emergency stop (in the console; in a dialog or this help Esc closes it)"),
                    (DECLINE_KEY.upper(), "let the student go on (while a request waits)"),
                    ("Backspace", f"rewind {REWIND_S:g} s and correct from there (while a request waits; simulation)"), ("F1", "this help"),
                    ("Ctrl+Q", "quit (open episodes end as operator aborts)"))


def fleet_rows(robots: int) -> list[tuple[str, str]]:
    """The fleet view's keys (one person, several robots)."""
    return [(FLEET_TAKE_KEY.upper(), "take the top request of the queue (it comes up large; your keys reach it)"),
            (f"1-{robots}", "take that robot, whether it asked or not"),
            (FLEET_STOP_KEY.upper(), "e-stop the robot on screen alone (the others run on)"),
            (f"Shift+{FLEET_STOP_KEY.upper()}", "clear the e-stop of the robot on screen"),
            (ESTOP_KEY, "e-stop every robot"),
            ("Ctrl+Enter", "start the episodes (as the Start button)")]


def shortcut_rows(robots: int = 1) -> list[tuple[str, str]]:
    """Window shortcuts, then the in-window keyboard device's keys (from configs/devices/keyboard.yaml)."""
    rows = (fleet_rows(robots) if robots > 1 else []) + list(WINDOW_SHORTCUTS)
    try:
        window_keys = {k for k, _ in WINDOW_SHORTCUTS}
        keyboard = load_device_config("keyboard")
        assert isinstance(keyboard, KeyboardConfig)  # devices/keyboard.yaml is a keyboard's config
        rows += [r for r in key_layout(keyboard) if r[0] not in window_keys]
    except Exception as exc:  # a broken keyboard config must not stop the help from opening
        rows.append(("-", f"keyboard device keys unavailable: {exc}"))
    return rows


class HelpDialog(QDialog):
    """Keyboard shortcuts, readable at a glance."""

    def __init__(self, parent: QWidget | None = None, robots: int = 1):
        super().__init__(parent)
        self.setWindowTitle("hg-dagger: keyboard")
        rows = shortcut_rows(robots)
        self.table = QTableWidget(len(rows), 2)
        self.table.setHorizontalHeaderLabels(["Key", "Does"])
        vertical, horizontal = self.table.verticalHeader(), self.table.horizontalHeader()
        assert vertical is not None and horizontal is not None  # a table view always has its headers
        vertical.setVisible(False)
        horizontal.setStretchLastSection(True)
        for r, (key, meaning) in enumerate(rows):
            self.table.setItem(r, 0, QTableWidgetItem(key))
            self.table.setItem(r, 1, QTableWidgetItem(meaning))
        self.table.resizeColumnToContents(0)
        box = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        box.rejected.connect(self.reject)
        lay = QVBoxLayout(self)
        lay.addWidget(QLabel("Motion keys act only while Space (the deadman) is held. Keys typed into a text "
                             "field stay text."))
        self.task_keys = QLabel()  # which key moves which action of the current task
        self.task_keys.setWordWrap(True)
        lay.addWidget(self.task_keys)
        lay.addWidget(self.table)
        lay.addWidget(box)
        self.resize(560, 520)


class ReviewEscape(QObject):
    """Esc is the e-stop on the Review page too, where the keyboard bridge is off (its keys scrub and type there):
    an application event filter, so it works whatever widget of the window has focus. In a dialog Esc is the
    dialog's (it closes it), as on the console."""

    def __init__(self, window: MainWindow):
        super().__init__(window)
        self.window = window

    def eventFilter(self, obj: QObject | None, ev: QEvent | None) -> bool:  # noqa: N802 - Qt override
        # a KeyPress event always comes as a QKeyEvent
        if not isinstance(ev, QKeyEvent) or ev.type() != QEvent.Type.KeyPress or ev.key() != Qt.Key.Key_Escape or not self.window.reviewing:
            return False
        if not isinstance(obj, QWidget) or obj.window() is not self.window:
            return False
        if not ev.isAutoRepeat():
            self.window.commands.put(EStop(source="keyboard", reason="Esc key"))
        return True


class MainWindow(QMainWindow):
    """Camera view left, plots right, gate light, banner and e-stop on top, controls and panels below; the
    review workspace on a second page (``review_store``), the gate light, banner and e-stop staying in view."""

    train_requested = pyqtSignal()
    closed = pyqtSignal()  # the window was closed (the control loop has been told to quit)
    _user_split: bool  # set in _restore
    _view_narrowed: bool

    def __init__(self, slot: LatestSlot, commands: CommandQueue, *, settings: saved.SettingsFile | None = None,
                 scan: Callable[[], list] | None = None, refresh_hz: float = 30.0, review_store: str = "",
                 operator: str = "", robots: int = 1):
        super().__init__()
        self.robots = robots  # one person, several robots: the fleet view over the console (docs/fleet.md)
        self.setWindowTitle("hg-dagger")
        self.slot, self.commands = slot, commands
        self.settings = settings if settings is not None else saved.SettingsFile()
        self._quit_sent = False

        sound = self.settings.data.ui.sound
        self.banner = HandoverBanner(sound_enabled=sound)
        self.banner.declined.connect(lambda: self.commands.put(DeclineRequest()))
        self.banner.rewound.connect(lambda: self.commands.put(Rewind(seconds=REWIND_S)))
        self.gate = GateLight()
        self.estop = EStopPanel(commands)
        self.view = LiveView()
        self.plots = PlotsPanel()
        self.controls = EpisodeControls(commands)
        self.controls.dialog_anchor = self.plots
        self.device = DevicePanel(commands, scan=scan)
        self.health = LoopHealthPanel()
        self.rounds = RoundsPanel()
        self.rounds.train_requested.connect(self.train_requested)

        top = QGridLayout()  # banner over gate light, the e-stop beside both: a big target, latched text fits
        top.addWidget(self.banner, 0, 0)
        top.addWidget(self.gate, 1, 0)
        top.addWidget(self.estop, 0, 1, 2, 1)
        top.setColumnStretch(0, 3)
        top.setColumnStretch(1, 1)
        top.setVerticalSpacing(6)
        self.estop.setFixedHeight(self.banner.height() + 6 + self.gate.height())
        self.split_view = QSplitter(Qt.Orientation.Horizontal)
        self.split_view.setObjectName("split_view")
        self.split_view.addWidget(self.view)
        self.split_view.addWidget(self.plots)
        self.split_view.setStretchFactor(0, 1)
        self.split_view.setStretchFactor(1, 1)
        self.fleet: FleetPanel | None = None
        self._fleet_sized = False
        self._robot_shown = 0  # the robot whose plots are on show
        upper: QWidget = self.split_view
        if robots > 1:  # the robots and the queue left, the robot on screen large with its plots right
            self.fleet = FleetPanel(robots, commands)
            self.estop.button.setText(f"E-STOP ALL ({ESTOP_KEY})")
            self.split_fleet = QSplitter(Qt.Orientation.Horizontal)
            self.split_fleet.setObjectName("split_fleet")
            self.split_fleet.addWidget(self.fleet)
            self.split_fleet.addWidget(self.split_view)
            self.split_fleet.setStretchFactor(0, 1)
            self.split_fleet.setStretchFactor(1, 2)
            upper = self.split_fleet
            self.controls.count.setValue(FLEET_EPISODES * robots)  # Start keeps every robot busy a while
        self.tabs = QTabWidget()
        self.tabs.addTab(self.device, "Device")
        self.tabs.addTab(self.rounds, "Rounds")
        self.tabs.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        bottom = QWidget()
        row = QHBoxLayout(bottom)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.controls, 2)
        row.addWidget(self.tabs, 3)
        row.addWidget(self.health, 2)
        self.split_main = QSplitter(Qt.Orientation.Vertical)
        self.split_main.setObjectName("split_main")
        self.split_main.addWidget(upper)
        self.split_main.addWidget(bottom)
        self.split_main.setStretchFactor(0, 1)  # the controls get the height they need, the view and plots the rest
        self.split_main.setStretchFactor(1, 0)
        self.pages = QTabWidget()
        self.pages.setObjectName("pages")
        self.pages.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.pages.addTab(self.split_main, "Console")
        self.review: ReviewWorkspace | None = None
        if review_store:
            # the reviewer is asked at the first decision: a pseudonym of their own, never the operator's
            self.review = ReviewWorkspace([review_store], None, operator=operator, load=False)
            # in a scroll area: however tall the review page wants to be, the window (and the console in it)
            # still fits the screen
            scroll = QScrollArea()
            scroll.setObjectName("review_scroll")
            scroll.setWidgetResizable(True)
            scroll.setFrameShape(QFrame.Shape.NoFrame)
            scroll.setWidget(self.review)
            self.pages.addTab(scroll, "Review")
        tab_bar = self.pages.tabBar()
        assert tab_bar is not None  # a tab widget always has its bar
        tab_bar.setVisible(self.review is not None)
        central = QWidget()
        lay = QVBoxLayout(central)
        lay.addLayout(top)
        lay.addWidget(self.pages, 1)
        self.setCentralWidget(central)
        status_bar = self.statusBar()
        assert status_bar is not None  # a main window makes its status bar when asked for it
        self.status = StatusLine(status_bar)
        self._menus()

        self.views = (self.gate, self.banner, self.estop, self.view, self.plots, self.controls, self.device,
                      self.health, self.rounds, self.status) + ((self.fleet,) if self.fleet is not None else ())
        self.reader = SnapshotReader(slot, hz=refresh_hz, parent=self)
        self.reader.snapshot.connect(self.show_snapshot)
        self.keys = KeyboardBridge(self, commands)
        self.keys.fleet_size = robots
        app = QApplication.instance()
        assert app is not None  # a window is made in a running application
        app.installEventFilter(self.keys)
        self.review_esc = ReviewEscape(self)
        app.installEventFilter(self.review_esc)
        self._episodes_seen = 0
        self._last_state = ""
        self.pages.currentChanged.connect(self._page_changed)
        self._restore()
        self.reader.start()

    # ---- menus ------------------------------------------------------------------------------
    def _menus(self) -> None:
        m = self.menuBar()
        assert m is not None  # a main window makes its menu bar when asked for it
        file = m.addMenu("&File")
        assert file is not None  # addMenu(title) returns the menu it made
        self.quit_action = QAction("&Quit", self)
        self.quit_action.setShortcut(QKeySequence("Ctrl+Q"))
        self.quit_action.triggered.connect(self.quit)
        file.addAction(self.quit_action)
        opts = m.addMenu("&Options")
        assert opts is not None
        self.sound_action = QAction("&Sound on handover request", self)
        self.sound_action.setCheckable(True)
        self.sound_action.setChecked(self.banner.sound_enabled)
        self.sound_action.toggled.connect(self.set_sound)
        opts.addAction(self.sound_action)
        help_ = m.addMenu("&Help")
        assert help_ is not None
        self.help_action = QAction("&Keyboard shortcuts", self)
        self.help_action.setShortcut(QKeySequence(Qt.Key.Key_F1))
        self.help_action.triggered.connect(self.show_help)
        help_.addAction(self.help_action)
        self.addAction(self.help_action)  # F1 works with the menu closed
        if self.robots > 1:  # keyboard-only: the fleet's Start without the mouse (Space and Enter are the robot's)
            self.start_action = QAction("&Start episodes", self)
            self.start_action.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
            self.start_action.triggered.connect(self._start_by_key)
            self.addAction(self.start_action)
        self.addAction(self.quit_action)
        self.help_dialog: HelpDialog | None = None

    def _start_by_key(self) -> None:
        if self.controls.start.isEnabled():
            self.controls.start.click()

    def set_sound(self, on: bool) -> None:
        self.banner.sound_enabled = bool(on)
        self.settings.data.ui.sound = bool(on)
        self.settings.save()

    def show_help(self) -> None:
        if self.help_dialog is None:
            self.help_dialog = HelpDialog(self, self.robots)
        task, keys = self.banner.keymap_task, self.banner.keys_text
        self.help_dialog.task_keys.setText(f"<b>{task}</b>: {keys}" if task and keys else "")
        self.help_dialog.show()
        self.help_dialog.raise_()

    # ---- pages -------------------------------------------------------------------------------
    @property
    def reviewing(self) -> bool:
        return self.review is not None and self.pages.currentIndex() == 1

    def show_review(self) -> None:
        if self.review is not None:
            self.pages.setCurrentIndex(1)

    def show_console(self) -> None:
        self.pages.setCurrentIndex(0)

    def _page_changed(self, _index: int) -> None:
        """The keyboard drives the robot only on the console page; the review page reads the store when first
        shown."""
        reviewing = self.reviewing
        if reviewing:
            self.keys.release_all()  # no key may stay held as motion while the keys scrub the review
        self.keys.enabled = not reviewing
        review = self.review  # there is one while reviewing
        if reviewing and review is not None and not (review.rows_loaded or review.loading):
            review.reload()

    # ---- snapshots ---------------------------------------------------------------------------
    def show_snapshot(self, snap: Snapshot) -> None:
        person = snap.device.kind not in NOT_A_PERSON
        requested = snap.control_state == "handover_requested" and snap.estop is None and snap.phase == "running"
        self.keys.request_pending = requested and person
        self.keys.rewindable = snap.rewindable
        self.keys.robot = snap.robot
        if snap.robots and snap.robot != self._robot_shown:  # another robot on screen: its plots, not the last one's
            self._robot_shown = snap.robot
            for plot in (self.plots.gate, self.plots.progress, self.plots.actions):
                plot.history.clear()
        self.keys.robot_keys = person and snap.device.kind == "keyboard" and snap.phase == "running" and (
            requested or snap.control_state == "human")
        self.keys.driving = self.keys.robot_keys and snap.control_state == "human"
        for v in self.views:
            v.show_snapshot(snap)
        if self.review is not None:
            ended = snap.counters.episodes - self._episodes_seen
            if ended > 0:
                self.review.episodes_ended(ended)
            self._episodes_seen = snap.counters.episodes
            requested = snap.control_state == "handover_requested" and self._last_state != "handover_requested"
            if requested and self.reviewing and snap.device.kind not in NOT_A_PERSON:
                self.show_console()  # a gate asks for the operator: back to the robot
            self._last_state = snap.control_state
        if not self._user_split and snap.phase == "running" and snap.frame is None and not self._view_narrowed:
            self._view_narrowed = True  # a task without a camera: the plots take the room the view would
            width = sum(self.split_view.sizes())
            self.split_view.setSizes([width // 4, width - width // 4])
        title = f"hg-dagger - {snap.task}" if snap.task else "hg-dagger"
        if snap.robots:
            title += f" - {len(snap.robots)} robots"
        if self.windowTitle() != title:
            self.setWindowTitle(title)

    def set_training_progress(self, stage: str, fraction: float) -> None:
        self.rounds.set_training_progress(stage, fraction)

    def set_training_done(self, message: str, trained: str = "") -> None:
        self.rounds.set_training_done(message, trained)
        if self.review is not None and self.review.rows_loaded:
            self.review.reload()  # a round runs QC first: show its verdicts

    # ---- lifetime ----------------------------------------------------------------------------
    def _restore(self) -> None:
        s = self.settings
        geometry = saved.layout_bytes(s, "geometry")
        if geometry is None or not saved.restored(s, "geometry", self.restoreGeometry(QByteArray(geometry))):
            self.resize(1400, 900)
        self._split_restored = False
        self._view_narrowed = False
        for split in self._splits():
            key = split.objectName()
            state = saved.layout_bytes(s, key)
            if state is not None and saved.restored(s, key, split.restoreState(QByteArray(state))):
                self._split_restored = True
                if split is self.plots:
                    self.plots.user_sized = True
                if self.fleet is not None and split is self.split_fleet:
                    self._fleet_sized = True
        self._user_split = self._split_restored  # the person's own layout is never changed for them

    def _splits(self) -> tuple[QSplitter, ...]:
        """The splitters whose positions persist (the plots panel is one; the fleet's when there is a fleet)."""
        fleet = (self.split_fleet,) if self.fleet is not None else ()
        return (self.split_main, self.split_view, self.plots, *fleet)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        if not self._split_restored:
            self._split_restored = True
            self.default_split()
        elif self.fleet is not None and not self._fleet_sized:  # no saved fleet split yet: its default
            self._fleet_split()

    def default_split(self) -> None:
        """The first layout: the controls their natural height, the view and the plots the rest, side by side
        in equal parts, the plots' height shared by plot rows (PlotsPanel.fit)."""
        central, controls = self.centralWidget(), self.split_main.widget(1)
        assert central is not None and controls is not None  # set in __init__, never taken away
        central_layout = central.layout()
        assert central_layout is not None  # the central widget is made with its layout
        central_layout.activate()
        total = sum(self.split_main.sizes())
        bottom = controls.minimumSizeHint().height() + 12
        self.split_main.setSizes([max(1, total - bottom), bottom])
        if self.fleet is not None:
            self._fleet_split()
        width = sum(self.split_view.sizes())
        self.split_view.setSizes([width // 2, width - width // 2])
        self.plots.fit()

    def _fleet_split(self) -> None:
        """The robots and the queue get 45% of the width, the robot on screen and its plots the rest."""
        self._fleet_sized = True
        outer = sum(self.split_fleet.sizes()) or self.width()
        self.split_fleet.setSizes([outer * 9 // 20, outer - outer * 9 // 20])

    def save_layout(self) -> None:
        s = self.settings
        saved.store_layout(s, "geometry", self.saveGeometry().data())
        for split in self._splits():
            saved.store_layout(s, split.objectName(), split.saveState().data())
        s.save()

    def quit(self) -> None:
        """Ask the control thread to end (open episodes end as operator aborts), then close."""
        self.close()

    def _send_quit(self) -> None:
        if not self._quit_sent:
            self._quit_sent = True
            self.commands.put(Quit())

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt override
        self.save_layout()
        self.reader.stop()
        if self.review is not None:
            self.review.shutdown()
        app = QApplication.instance()
        assert app is not None  # the window closes in its running application
        app.removeEventFilter(self.keys)
        app.removeEventFilter(self.review_esc)
        self._send_quit()
        super().closeEvent(event)
        self.closed.emit()
