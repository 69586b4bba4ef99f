"""One person at the fleet view, as a human operator model plays it into the real window (ui/operator_model.py).

The person of ``HumanOperatorModel`` (control.human_model) watches the robot on screen: they take over when it
asks, steer, let go, or let the student go on. At the fleet view they also look at the queue: when the robot on
screen neither asks nor is theirs and a request waits, they press P after a reaction time (a look-away now and
then, as the profile says) and the top request comes up on screen, where the same person answers it. No Qt here.
"""

from __future__ import annotations

import numpy as np

from hg_dagger.control.human_model import HUMAN, REQUESTED, HumanOperatorModel, KeyAction, draw_answer
from hg_dagger.ui.keymap import FLEET_TAKE_KEY

TAP_S = 0.08  # how long the take key is held


class FleetPersonModel:
    """``person`` (a HumanOperatorModel) plus the fleet view's take key; ``away`` makes them look elsewhere (no key
    at all) until that time, as a test asks."""

    def __init__(self, person: HumanOperatorModel, *, seed: int = 0):
        self.person = person
        self.rng = np.random.default_rng([int(seed), 45])
        self.takes = 0  # times the person pressed the take key
        self.away_until = 0.0  # the person looks away until then (the caller's clock)
        self._due: float | None = None  # when the person presses the take key
        self._up: float | None = None  # when the take key goes up

    @property
    def in_control(self) -> bool:
        return self.person.in_control

    def release_all(self, now: float) -> list[KeyAction]:
        out = self.person.release_all(now)
        if self._up is not None:
            out.append(KeyAction(now, FLEET_TAKE_KEY, False))
            self._up = None
        return out

    def step(self, snap, now: float) -> list[KeyAction]:
        out: list[KeyAction] = []
        if self._up is not None and now >= self._up:
            out.append(KeyAction(now, FLEET_TAKE_KEY, False))
            self._up = None
        if now < self.away_until:
            self._due = None
            return out
        mine = snap.control_state in (REQUESTED, HUMAN) or self.person.in_control
        if snap.queue and not mine and snap.phase == "running" and snap.estop is None:
            if self._due is None:
                look, _, reaction = draw_answer(self.person.profile, self.rng)
                self._due = now + look + reaction
            elif now >= self._due and self._up is None:
                out.append(KeyAction(now, FLEET_TAKE_KEY, True))
                self._up = now + TAP_S
                self._due = None
                self.takes += 1
        else:
            self._due = None
        return out + self.person.step(snap, now)
