"""Live view, plots, gate light and handover banner driven by real snapshots through a real LatestSlot."""

from __future__ import annotations

import re

import numpy as np
import pytest
from PyQt6.QtCore import QPointF
from PyQt6.QtWidgets import QWidget

from hg_dagger.contract.clock import now_ns
from hg_dagger.control.live import DeviceState, LatestSlot, Snapshot
from hg_dagger.ui import style
from hg_dagger.ui.gate import GateLight, HandoverBanner
from hg_dagger.ui.plots import ActionPlots, GatePlot, GrowingRange, History, ProgressPlot
from hg_dagger.ui.snapshots import SnapshotReader
from hg_dagger.ui.view import PLACEHOLDER, LiveView

pytestmark = [pytest.mark.app]

NAMES = ("dx", "dy", "dz", "gripper")


def snap(seq: int, **kw) -> Snapshot:
    base = dict(seq=seq, t_ns=1_000_000_000 + seq * 50_000_000, action_names=NAMES, episode_id="e-watched",
                policy_action=np.full(4, 0.1 * seq, np.float32), applied_action=np.full(4, 0.2, np.float32),
                human_action=np.full(4, np.nan, np.float32), uncertainty=0.01 * seq, confidence=0.5,
                progress=0.05 * seq, thresholds={"warn": 0.05, "trigger": 0.1, "gate": "confidence"})
    base.update(kw)
    return Snapshot(**base)


@pytest.fixture
def live(qtbot):
    """A real slot and a reader polling it on its QTimer at 60 Hz."""
    slot = LatestSlot()
    reader = SnapshotReader(slot, hz=60)
    reader.start()
    yield slot, reader
    reader.stop()


def publish_and_wait(qtbot, slot, reader, s: Snapshot) -> None:
    slot.publish(s)
    qtbot.waitUntil(lambda: reader.last is s, timeout=5000)


def test_reader_emits_each_new_snapshot_once(qtbot, live):
    slot, reader = live
    seen = []
    reader.snapshot.connect(seen.append)
    s1 = snap(1)
    publish_and_wait(qtbot, slot, reader, s1)
    qtbot.waitUntil(lambda: len(seen) >= 1, timeout=5000)
    s2 = snap(2)
    publish_and_wait(qtbot, slot, reader, s2)
    qtbot.wait(100)  # several more timer ticks with nothing new published
    assert seen[-2:] == [s1, s2] and seen.count(s2) == 1
    with pytest.raises(ValueError, match="refresh rate"):
        SnapshotReader(slot, hz=0)


def test_live_view_shows_frame_keeping_aspect_and_placeholder(qtbot, live):
    slot, reader = live
    view = LiveView()
    qtbot.addWidget(view)
    reader.snapshot.connect(view.show_snapshot)
    view.resize(600, 600)
    view.show()
    assert view.minimumWidth() >= 256 and view.minimumHeight() >= 256
    publish_and_wait(qtbot, slot, reader, snap(1, frame=None))
    assert not view.has_frame and view.message == PLACEHOLDER == "no camera for this task"
    frame = np.zeros((120, 240, 3), np.uint8)
    frame[:, :, 0] = 255
    publish_and_wait(qtbot, slot, reader, snap(2, frame=frame))
    assert view.frame_size == (240, 120)
    r = view.image_rect()
    assert r.width() == 600 and r.height() == 300 and r.top() == 150  # 2:1 letterboxed, centred
    img = view.grab().toImage()
    assert img.pixelColor(300, 300).red() > 200 and img.pixelColor(300, 20).red() < 60
    publish_and_wait(qtbot, slot, reader, snap(3, frame=np.zeros((4, 4), np.float32)))
    assert not view.has_frame and "uint8 [H, W, 3]" in view.message
    publish_and_wait(qtbot, slot, reader, snap(4))
    assert view.message == PLACEHOLDER


def test_history_ring_adds_a_seq_once_and_keeps_ten_seconds():
    h = History(1, capacity=8)
    assert h.add(1, 0, [1.0]) and not h.add(1, 0, [1.0])
    for i in range(2, 12):
        h.add(i, int(i * 2e9), [float(i)])
    assert len(h) == 8
    x, v = h.window(10.0)
    assert list(v[:, 0]) == [6.0, 7.0, 8.0, 9.0, 10.0, 11.0] and x[-1] == 0.0 and x[0] == -10.0
    h.add(1, 0, [5.0])  # a seq going back is a new run
    assert len(h) == 1


def test_growing_range_grows_never_shrinks_and_waits_its_interval():
    clock = [0]
    r = GrowingRange(interval_s=0.5, margin=0.1, clock=lambda: clock[0])
    assert r.range is None and r.apply() is None
    r.add([np.nan, np.inf])  # nothing finite: nothing to fit
    assert r.apply() is None
    r.add([-1.0, 1.0])
    assert r.apply() == pytest.approx((-1.2, 1.2))  # the first range is set at once, with a margin
    r.add([0.5, -0.5])
    assert not r.pending and r.apply() is None  # inside: no change, so no axis redraw
    clock[0] = 100_000_000
    r.add([3.0])
    assert r.pending and r.apply() is None and r.due_in() == pytest.approx(0.4)  # too soon after the last change
    clock[0] = 600_000_000
    lo, hi = r.apply()
    assert lo == pytest.approx(-1.2) and hi == pytest.approx(3.0 + 0.42)  # only the side that needed it grew
    r.add([0.0])
    assert r.apply() is None and r.range == (lo, hi)  # never shrinks
    r.reset()
    r.add([0.1, 0.2])
    assert r.apply() == pytest.approx((0.09, 0.21))  # a new episode fits afresh, at once
    score = GrowingRange(include=(0.0,), clock=lambda: clock[0])
    score.add([0.3, 0.5])
    lo, hi = score.apply()
    assert lo < 0.0 < 0.3 < 0.5 < hi  # an included value is always on show
    flat = GrowingRange(clock=lambda: clock[0])
    flat.add([2.0, 2.0])
    assert flat.apply() == pytest.approx((1.0, 3.0))  # a flat line gets a span of its own scale
    flat.reset()
    flat.add([0.0])
    lo, hi = flat.apply()
    assert lo < 0.0 < hi < 0.01  # so small actions that follow are not drawn flat


def y_range(plot_item) -> tuple[float, float]:
    return tuple(plot_item.getViewBox().viewRange()[1])


def test_action_plot_range_grows_within_an_episode_and_refits_on_the_next(qtbot, live):
    slot, reader = live
    acts = ActionPlots()
    qtbot.addWidget(acts)
    reader.snapshot.connect(acts.show_snapshot)
    small = np.array([0.5, -0.5, 0.1, 1.0], np.float32)
    for i in range(1, 4):
        publish_and_wait(qtbot, slot, reader, snap(i, episode_id="ep-1", policy_action=small * i / 3,
                                                  applied_action=small * i / 3))
    # the first action sets the range at once; the later, larger ones widen it within the interval
    qtbot.waitUntil(lambda: y_range(acts.plots[0])[1] >= 0.5 and not acts.yranges[0].pending, timeout=5000)
    lo, hi = y_range(acts.plots[0])
    assert lo < 0.5 / 3 and 0.5 <= hi < 1.0
    publish_and_wait(qtbot, slot, reader, snap(4, episode_id="ep-1", policy_action=small * 0.5,
                                              applied_action=small * 0.5))
    assert y_range(acts.plots[0]) == (lo, hi)  # actions inside the range leave it as it is
    other = y_range(acts.plots[1])
    big = small.copy()
    big[0] = 3.0
    publish_and_wait(qtbot, slot, reader, snap(5, episode_id="ep-1", policy_action=big, applied_action=small))
    # grows within the interval, even with no further snapshot
    qtbot.waitUntil(lambda: y_range(acts.plots[0])[1] >= 3.0, timeout=5000)
    assert acts.curves[0]["policy"].boundingRect().contains(QPointF(0.0, 3.0))  # repainted where it now reaches
    assert y_range(acts.plots[0])[0] == lo and y_range(acts.plots[1]) == other  # each dim has its own range
    publish_and_wait(qtbot, slot, reader, snap(300, episode_id="ep-1", policy_action=small * 0.5,
                                              applied_action=small * 0.5))
    assert y_range(acts.plots[0])[1] >= 3.0  # the big action scrolled out, but within an episode it never shrinks
    # a new episode, the old one's actions scrolled out of the 10 s window: the range fits the new actions
    publish_and_wait(qtbot, slot, reader, snap(400, episode_id="ep-2", policy_action=small * 0.1,
                                              applied_action=small * 0.1))
    lo2, hi2 = y_range(acts.plots[0])
    assert lo2 <= 0.05 <= hi2 < 0.5


def test_human_curve_empties_when_no_human_command_is_in_the_window(qtbot, live):
    slot, reader = live
    acts = ActionPlots()
    qtbot.addWidget(acts)
    reader.snapshot.connect(acts.show_snapshot)
    publish_and_wait(qtbot, slot, reader, snap(1, human_action=np.full(4, 0.7, np.float32)))
    publish_and_wait(qtbot, slot, reader, snap(2))
    assert acts.curves[0]["human"].getData()[1][0] == pytest.approx(0.7)
    publish_and_wait(qtbot, slot, reader, snap(300))  # 15 s later: the correction has scrolled out
    assert len(acts.curves[0]["human"].getData()[0]) == 0 and len(acts.curves[0]["policy"].getData()[0]) == 1


def test_gate_plot_range_holds_the_score_the_confidence_and_the_thresholds(qtbot, live):
    slot, reader = live
    plot = GatePlot()
    qtbot.addWidget(plot)
    reader.snapshot.connect(plot.show_snapshot)
    publish_and_wait(qtbot, slot, reader, snap(1, uncertainty=0.02, confidence=0.9,
                                              thresholds={"warn": 0.05, "trigger": 1.4}))
    lo, hi = y_range(plot.plot.getPlotItem())
    assert lo <= 0.0 and hi >= 1.4  # the trigger line is on screen, not just the curves


def test_gate_plot_thresholds_and_curves(qtbot, live):
    slot, reader = live
    plot = GatePlot()
    qtbot.addWidget(plot)
    reader.snapshot.connect(plot.show_snapshot)
    for i in range(1, 6):
        publish_and_wait(qtbot, slot, reader, snap(i))
    x, y = plot.uncertainty.getData()
    assert len(x) == 5 and y[-1] == pytest.approx(0.05)
    warn, trig = plot.lines["warn"], plot.lines["trigger"]
    assert warn.isVisible() and warn.value() == pytest.approx(0.05) and "warn" in warn.label.format
    assert trig.isVisible() and trig.value() == pytest.approx(0.1) and "trigger" in trig.label.format
    items_before = len(plot.plot.getPlotItem().items)
    publish_and_wait(qtbot, slot, reader, snap(6, thresholds={"trigger": 0.2, "warn": None}))
    assert not warn.isVisible() and trig.value() == pytest.approx(0.2)
    assert len(plot.plot.getPlotItem().items) == items_before  # no new items per frame


def test_progress_and_action_plots(qtbot, live):
    slot, reader = live
    prog, acts = ProgressPlot(), ActionPlots()
    for w in (prog, acts):
        qtbot.addWidget(w)
        reader.snapshot.connect(w.show_snapshot)
    human = np.array([0.3, np.nan, np.nan, 1.0], np.float32)
    for i in range(1, 4):
        publish_and_wait(qtbot, slot, reader, snap(i, human_action=human if i == 2 else None))
    assert len(prog.curve.getData()[0]) == 3
    assert [p.titleLabel.text for p in acts.plots] == list(NAMES)
    c = acts.curves[0]
    assert len(c["policy"].getData()[1]) == 3 and c["policy"].getData()[1][-1] == pytest.approx(0.3)
    hx = c["human"].getData()[1]
    assert np.isnan(hx[0]) and hx[1] == pytest.approx(0.3) and np.isnan(hx[2])  # a gap where no human command
    assert c["policy"].opts["pen"].color().name() == style.POLICY
    assert c["human"].opts["pen"].color().name() == style.HUMAN
    plots_before = list(acts.plots)
    publish_and_wait(qtbot, slot, reader, snap(4))
    assert acts.plots == plots_before  # same plot items, new data
    publish_and_wait(qtbot, slot, reader, snap(5, action_names=("a", "b"), policy_action=np.zeros(2),
                                                  applied_action=np.zeros(2), human_action=None))
    assert [p.titleLabel.text for p in acts.plots] == ["a", "b"] and len(acts.curves[1]["applied"].getData()[0]) == 1


def test_gate_light_names_state_and_colour(qtbot, live):
    slot, reader = live
    light = GateLight()
    qtbot.addWidget(light)
    reader.snapshot.connect(light.show_snapshot)
    expected = {"autonomous": style.AUTONOMOUS, "warning": style.WARNING, "human": style.HUMAN,
                "safe_stop": style.SAFETY, "expert": style.EXPERT, "returning": style.POLICY}
    for i, (state, colour) in enumerate(expected.items(), start=1):
        publish_and_wait(qtbot, slot, reader, snap(i, phase="running", control_state=state, gate_reason=f"why {state}"))
        assert light.state == state and light.colour == colour
        assert light.headline.text() == style.STATES[state][0] and light.reason.text() == f"why {state}"
    publish_and_wait(qtbot, slot, reader, snap(10, phase="running", control_state="handover_requested",
                                               gate_reason="confidence+progress_stall"))
    assert light.reason.toolTip() == ("the student is unsure here; no progress for a while "
                                      "(confidence, progress_stall)")  # a person's words, and the gates' names
    publish_and_wait(qtbot, slot, reader, snap(11, phase="running", control_state="handover_requested",
                                               gate_reason="policy_failed"))
    assert light.reason.toolTip() == "the task is going backwards (policy_failed)"
    publish_and_wait(qtbot, slot, reader, snap(20, phase="estopped", control_state="safe_stop",
                                               estop=("pedal", "foot down")))
    assert light.reason.text() == "e-stop: foot down" and light.colour == style.SAFETY
    publish_and_wait(qtbot, slot, reader, snap(21, phase="idle", control_state="autonomous"))
    assert light.headline.text() == "IDLE" and light.colour == style.NEUTRAL  # not a green "autonomous"
    publish_and_wait(qtbot, slot, reader, snap(22, phase="error", message="env failed: no GL"))
    assert light.headline.text() == "ERROR" and light.reason.text() == "env failed: no GL"
    # running, but the watched row's episode ended and the next waits: not a green "autonomous" either
    publish_and_wait(qtbot, slot, reader, snap(23, phase="running", episode_id=None, next_start_in_s=1.5))
    assert light.headline.text() == "BETWEEN EPISODES" and light.colour == style.NEUTRAL
    assert light.reason.text() == "next episode in 1.5 s"
    publish_and_wait(qtbot, slot, reader, snap(24, phase="running", control_state="autonomous"))
    assert light.headline.text() == "AUTONOMOUS" and light.colour == style.AUTONOMOUS


def test_handover_banner_keeps_its_size_and_has_a_look_for_each_state(qtbot, live):
    slot, reader = live
    parent = QWidget()
    qtbot.addWidget(parent)
    banner = HandoverBanner(parent, sound_enabled=False)
    reader.snapshot.connect(banner.show_snapshot)
    declines = []
    banner.declined.connect(lambda: declines.append(1))
    parent.show()
    alerts = []
    banner.alerted.connect(lambda: alerts.append(1))
    keyboard = DeviceState(device_id="keyboard", kind="keyboard", connected=True)
    base = dict(phase="running", task="toy_reach", device=keyboard)
    publish_and_wait(qtbot, slot, reader, snap(1, control_state="warning", **base))
    height = banner.height()
    assert banner.isVisible() and banner.look == "calm" and not banner.decline.isVisible()
    assert "hold Space to steer" in banner.hint.text() and "W / S: shoulder_vel" in banner.hint.text()
    t_req = now_ns() - 1_400_000_000
    publish_and_wait(qtbot, slot, reader, snap(2, control_state="handover_requested", t_request_ns=t_req,
                                               request_wait_s=3.2, **base))
    assert banner.look == "request" and banner.label.text() == "TAKE OVER!   waiting 3.2 s"  # the loop's wait
    assert "hold Space to take control" in banner.hint.text() and banner.decline.isVisible()
    colours = set()
    qtbot.waitUntil(lambda: colours.add(banner.colour) or len(colours) == 2, timeout=5000)
    assert colours == {style.REQUEST, style.REQUEST_DARK}
    publish_and_wait(qtbot, slot, reader, snap(3, control_state="handover_requested", t_request_ns=t_req, **base))
    m = re.fullmatch(r"TAKE OVER!   waiting (\d+\.\d) s", banner.label.text())  # no figure sent: since the stamp
    assert m and 1.4 <= float(m.group(1)) < 60 and len(alerts) == 1  # once per request, not per snapshot
    banner.decline.click()
    assert declines == [1]
    publish_and_wait(qtbot, slot, reader, snap(4, control_state="human", t_request_ns=t_req, **base))
    assert banner.look == "human" and banner.label.text() == "YOU ARE IN CONTROL" and not banner.flash.isActive()
    assert banner.hint.text().startswith("let go of Space or press Enter / B to hand back")  # first: never cut off
    assert style.HUMAN in banner.styleSheet() and style.REQUEST not in banner.styleSheet()  # a look of its own
    publish_and_wait(qtbot, slot, reader, snap(5, control_state="handover_requested", t_request_ns=now_ns(), **base))
    assert banner.look == "request" and len(alerts) == 2
    publish_and_wait(qtbot, slot, reader, snap(6, control_state="autonomous", **base))  # request withdrawn
    assert banner.look == "calm" and banner.isVisible() and not banner.decline.isVisible()
    assert banner.height() == height  # every look in the same reserved space
    gamepad = DeviceState(device_id="gamepad:1", kind="gamepad", connected=True)
    publish_and_wait(qtbot, slot, reader, snap(7, **{**base, "device": gamepad}, control_state="handover_requested",
                                               t_request_ns=now_ns()))
    assert "hold LB to take control" in banner.hint.text()


def test_progress_in_the_task_units_stays_in_view(qtbot, live):
    """Fetch reports minus the object's distance to the goal (metres): negative values must be on screen."""
    slot, reader = live
    prog = ProgressPlot()
    qtbot.addWidget(prog)
    reader.snapshot.connect(prog.show_snapshot)
    for i, p in enumerate((-0.31, -0.25, -0.12), start=1):
        publish_and_wait(qtbot, slot, reader, snap(i, progress=p))
    def in_view():
        lo, hi = prog.plot.getPlotItem().viewRange()[1]
        assert lo <= -0.31 and hi >= -0.12 and hi < 0.5

    qtbot.waitUntil(in_view, timeout=5000)  # a growth falls due within the range's interval


def test_a_nearly_flat_signal_is_shown_at_its_own_scale():
    r = GrowingRange()
    r.add([-0.321345, -0.32135])
    lo, hi = r.apply()
    assert hi - lo >= 0.1 * 0.32135, "noise in the sixth digit must not fill the plot"
    assert lo <= -0.32135 and hi >= -0.321345
