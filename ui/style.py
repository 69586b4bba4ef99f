"""One place for what colours and state names mean, so every widget says the same thing the same way.

Policy is blue, the human orange, the expert purple, safety red, a warning amber, autonomy green.
A request for the person has a look of its own, magenta (the strip flashes "TAKE OVER!"; the light names the
state, so the console says it once): it must never be mistaken for "you are in control" (steady orange).
"""

from __future__ import annotations

POLICY = "#2f6fd6"
HUMAN = "#f08a24"
EXPERT = "#8e44ad"
SAFETY = "#d62f2f"
WARNING = "#e0a800"
AUTONOMOUS = "#2e9e4f"
APPLIED = "#3a3a3a"
NEUTRAL = "#7a7f87"
REQUEST = "#c2185b"  # a gate asks for the person: flashes against REQUEST_DARK
REQUEST_DARK = "#4a0622"
CALM = "#eceef1"  # the reserved banner space while nothing is asked
OK = AUTONOMOUS
TEXT_ON_COLOUR = "#ffffff"

# control_state -> (headline, colour)
STATES: dict[str, tuple[str, str]] = {
    "autonomous": ("AUTONOMOUS", AUTONOMOUS),
    "warning": ("WARNING", WARNING),
    "handover_requested": ("HANDOVER REQUESTED", REQUEST),  # the strip alone says "TAKE OVER!"
    "human": ("YOU ARE IN CONTROL", HUMAN),
    "returning": ("RETURNING TO POLICY", POLICY),
    "safe_stop": ("SAFE STOP", SAFETY),
    "expert": ("EXPERT IN CONTROL", EXPERT),
}
# loop phases in which no control state applies: shown instead of a stale one
PHASES: dict[str, tuple[str, str]] = {
    "loading": ("LOADING", NEUTRAL),
    "idle": ("IDLE", NEUTRAL),
    "paused": ("PAUSED", NEUTRAL),
    "training": ("TRAINING NEXT STUDENT", NEUTRAL),
    "stopped": ("STOPPED", NEUTRAL),
    "between": ("BETWEEN EPISODES", NEUTRAL),  # running, and the watched row waits for its next episode
    "error": ("ERROR", SAFETY),
}

# health levels -> colour
LEVELS = {"ok": OK, "warn": WARNING, "bad": SAFETY}

BASE_FONT_PT = 11


def next_episode_words(seconds: float) -> str:
    """The pause before the next queued episode, as the phase line and the state light say it."""
    return f"next episode in {seconds:.1f} s"


def state_style(state: str) -> tuple[str, str]:
    """Headline and colour of a control state (an unknown state reads as itself, in grey)."""
    return STATES.get(state) or PHASES.get(state) or (state.upper().replace("_", " ") or "-", NEUTRAL)


def filled(colour: str, *, text: str = TEXT_ON_COLOUR, radius: int = 8, pt: int | None = None) -> str:
    """A stylesheet body for a solid coloured box with readable text."""
    size = f"font-size: {pt}pt;" if pt else ""
    return (f"background-color: {colour}; color: {text}; border-radius: {radius}px; "
            f"font-weight: bold; padding: 6px; {size}")


def level_style(level: str) -> str:
    """Stylesheet for a value label at a health level: calm when fine, coloured when not."""
    if level == "ok":
        return "color: palette(text); font-weight: normal;"
    return f"color: {LEVELS[level]}; font-weight: bold;"
