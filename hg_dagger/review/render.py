"""The scene of an episode recorded without a camera, re-rendered through the simulator for a reviewer.

State tasks store numbers, not pictures. A reviewer still wants to see what happened, so the episode is
re-run exactly as replay verification re-runs it (``replay.replay_plan`` decides which episodes can be:
the recorded seed, the same task mapping, a simulator here) and the env's operator view
(``VecEnv.render_view``) is taken at every step. Frame t is the scene when step t's observation was taken,
before step t's action, so the frames line up with the recorded rows one to one.

    scene = render_episode(store, episode_id, size=240, progress=lambda done, total: ...)
    scene.frames            # uint8 (num_steps, 240, 240, 3)
    scene.diverged_at       # None, or the first step whose replayed state left the record

No Qt here: the review workspace runs this on a background thread and keeps the frames in a FrameCache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hg_dagger.errors import HgDaggerError
from hg_dagger.review.decisions import open_store
from hg_dagger.review.replay import NotReplayable, replay_plan, run_record

FRAME_SIZE = 240
"""Side of a re-rendered frame in pixels: big enough to see the gripper and object, small enough that a
150-step Fetch episode renders in seconds on two CPU cores."""
CACHE_BYTES = 512 * 2**20
"""Frames kept in memory per workspace (about 20 Fetch episodes of 150 steps at 240 px)."""


class NoScene(HgDaggerError):
    """The episode cannot be re-rendered here; the message says why (one line)."""


class RenderCancelled(Exception):
    """A render stopped because nobody waits for it any more (another episode was selected)."""


class _NoView(Exception):
    pass


@dataclass(frozen=True)
class Scene:
    """One episode's re-rendered frames and whether the re-run stayed on the record."""

    episode_id: str
    frames: np.ndarray  # uint8 (T, S, S, 3); frame t: the scene at step t's observation
    diverged_at: int | None = None  # first step whose replayed observation or outcome left the record
    divergence: str = ""  # what differed there (replay's reason)

    @property
    def nbytes(self) -> int:
        return int(self.frames.nbytes)

    def note(self) -> str:
        """One line for the viewer: where the scene stops being the record, or empty."""
        if self.diverged_at is None:
            return ""
        return (f"re-run left the record at step {self.diverged_at} ({self.divergence}); "
                "frames from there on are the simulator's, not what was recorded")


def render_episode(store, episode_id: str, *, size: int = FRAME_SIZE,
                   progress: Callable[[int, int], None] | None = None,
                   cancelled: Callable[[], bool] | None = None) -> Scene:
    """Re-run one committed episode from its recorded initial state with its applied actions and render every
    step's scene (``size`` x ``size`` RGB). NoScene (one line) when it cannot be re-run here; RenderCancelled
    when ``cancelled()`` turns true. ``progress(done, total)`` follows every frame."""
    st = open_store(store)
    info = st.info(episode_id)
    if not info.complete:
        raise NoScene(f"{st.url}: episode {episode_id} is incomplete (never committed): no scene to show")
    try:
        plan = replay_plan(info)
    except NotReplayable as exc:
        raise NoScene(f"no scene for episode {episode_id}: {exc.reason}") from None
    n = info.num_steps
    frames = np.zeros((n, int(size), int(size), 3), np.uint8)
    done = 0

    def view(t: int, env) -> None:
        nonlocal done
        if cancelled is not None and cancelled():
            raise RenderCancelled(episode_id)
        frame = env.render_view(0, int(size))
        if frame is None:
            raise _NoView
        frames[t] = frame
        done = t + 1
        if progress is not None:
            progress(done, n)

    try:
        first, _ = run_record(st, episode_id, plan.mapping, plan.seed, plan.images, view=view)
    except NotReplayable as exc:
        raise NoScene(f"no scene for episode {episode_id}: {exc.reason}") from None
    except _NoView:
        raise NoScene(f"no scene for episode {episode_id}: the {plan.mapping.backend} backend has no view") from None
    if done < n:  # the simulator ended the episode before the record did: hold its last picture
        frames[done:] = frames[done - 1] if done else 0
    if first is None:
        return Scene(episode_id, frames)
    return Scene(episode_id, frames, diverged_at=int(first[0]), divergence=first[3])


class FrameCache:
    """Re-rendered scenes kept in memory, least recently used dropped first beyond ``max_bytes``.

    Thread-safe: the render thread puts, the GUI thread gets."""

    def __init__(self, max_bytes: int = CACHE_BYTES):
        self.max_bytes = int(max_bytes)
        self._scenes: OrderedDict[tuple[str, str], Scene] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> Scene | None:
        with self._lock:
            scene = self._scenes.get(key)
            if scene is not None:
                self._scenes.move_to_end(key)
            return scene

    def put(self, key: tuple[str, str], scene: Scene) -> None:
        with self._lock:
            self._scenes[key] = scene
            self._scenes.move_to_end(key)
            while len(self._scenes) > 1 and self.nbytes > self.max_bytes:
                self._scenes.popitem(last=False)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._scenes.values())

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._scenes

    def __len__(self) -> int:
        return len(self._scenes)
