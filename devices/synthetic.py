"""A synthetic operator: stands in for a person so human-gated runs work headless and in tests.

It watches each tick (``observe(obs_row, requested)``). When a handover is requested it decides once,
with probability ``availability``, whether it answers this request; if so it engages after
``reaction_delay_steps`` ticks and from then on sends ``command_fn(obs_row)`` plus Gaussian noise
(typically the planner expert's action mapped to the human motion space) until told to ``release()``.
Its commands go through the same command pipeline as a real device's.

``SyntheticOperatorRows`` holds these rules for N env rows at once, as arrays: a session with many envs
answers every row's request in a few numpy calls. ``SyntheticOperator`` (the Device) is one row of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import COMMAND_DIM, RETURN, HumanCommand
from hg_dagger.devices.base import Device, DeviceError
from hg_dagger.devices.configs import DeviceConfig, SyntheticConfig

CommandFn = Callable[[object], np.ndarray]


class SyntheticOperatorRows:
    """One synthetic operator per row: request -> availability draw -> reaction delay -> engaged until released.

    Each row draws from its own generator (``seeds``), so a row answers the same way whatever the others do.
    """

    def __init__(self, config: SyntheticConfig, seeds: Sequence[int]):
        self.config = config
        self.seeds = [int(s) for s in seeds]
        n = len(self.seeds)
        self._rngs = [np.random.default_rng(s) for s in self.seeds]
        self.connected = np.ones(n, bool)
        self.requested = np.zeros(n, bool)  # a request this row's operator has seen and not yet answered or lost
        self.answering = np.zeros(n, bool)  # that request will be answered
        self.countdown = np.zeros(n, np.int64)
        self.engaged = np.zeros(n, bool)
        self.engaged_ticks = np.zeros(n, np.int64)
        self.requests = np.zeros(n, np.int64)  # handover requests seen
        self.answered = np.zeros(n, np.int64)  # requests answered

    @property
    def watching(self) -> np.ndarray:
        """Engaged, or reacting to a request it saw: the rows whose next observe() can change something."""
        return self.engaged | self.requested

    def observe(self, requested: np.ndarray) -> None:
        """Whether each row's handover is being requested this tick (bool [N])."""
        asked = ~self.engaged & np.asarray(requested, bool)
        self.requested &= asked | self.engaged  # a request withdrawn before the person answered is forgotten
        new = asked & ~self.requested
        self.countdown[asked & self.requested & self.answering] -= 1
        for r in np.flatnonzero(new):  # a new request: does the person answer it at all?
            self.answering[r] = bool(self._rngs[r].random() < self.config.availability)
        self.requested |= new
        self.requests += new
        self.countdown[new] = self.config.reaction_delay_steps
        engage = asked & self.answering & (self.countdown <= 0)
        self.engaged |= engage
        self.engaged_ticks[engage] = 0
        self.answered += engage

    def release(self, rows: int | slice | Sequence[int] | np.ndarray) -> None:
        """Control went back to the policy in ``rows``: stop correcting; the next request starts afresh."""
        self.engaged[rows] = False
        self.requested[rows] = False
        self.answering[rows] = False

    def speaking(self) -> np.ndarray:
        """The rows that send a command this tick: engaged, with their device connected."""
        return np.flatnonzero(self.engaged & self.connected)

    def commands(self, rows: np.ndarray, motion: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw commands of ``rows`` (speaking ones) from their intended ``motion`` [k, 7]: the noise on the six
        motion axes, and whether each row holds RETURN (its correction budget is used up)."""
        cmd = np.array(motion, np.float64)
        if self.config.noise_std > 0:
            for i, r in enumerate(rows):
                cmd[i, :6] += self._rngs[r].normal(0.0, self.config.noise_std, 6)
        self.engaged_ticks[rows] += 1
        limit = self.config.return_after_steps
        ret = np.zeros(len(rows), bool) if limit is None else self.engaged_ticks[rows] >= limit
        return cmd.astype(np.float32), ret


class SyntheticOperator(Device):
    config_class = SyntheticConfig

    def __init__(
        self,
        command_fn: CommandFn,
        reaction_delay_steps: int = 5,
        noise_std: float = 0.0,
        availability: float = 1.0,
        seed: int = 0,
        *,
        return_after_steps: int | None = None,
        config: SyntheticConfig | None = None,
    ):
        config = config or SyntheticConfig(
            reaction_delay_steps=reaction_delay_steps,
            noise_std=noise_std,
            availability=availability,
            seed=seed,
            return_after_steps=return_after_steps,
        )
        super().__init__(config)
        self.config: SyntheticConfig
        if not callable(command_fn):
            raise DeviceError("SyntheticOperator needs a callable command_fn(obs_row) -> motion [7]")
        self.command_fn = command_fn
        self._row = SyntheticOperatorRows(config, [config.seed])
        self._obs: object = None

    @classmethod
    def from_config(cls, config: DeviceConfig, command_fn: CommandFn | None = None, **kwargs: Any) -> SyntheticOperator:
        if command_fn is None:
            raise DeviceError("a synthetic operator needs command_fn=... (e.g. the planner expert's motion)")
        # the config of type 'synthetic' (make_device picks this class by it): a SyntheticConfig
        return cls(command_fn, config=cast(SyntheticConfig, config), **kwargs)

    @property
    def device_id(self) -> str:
        return f"synthetic:{self.config.seed}"

    @property
    def connected(self) -> bool:
        return bool(self._row.connected[0])

    @property
    def engaged(self) -> bool:
        return bool(self._row.engaged[0])

    @property
    def watching(self) -> bool:
        return bool(self._row.watching[0])

    @property
    def requests(self) -> int:
        return int(self._row.requests[0])

    @property
    def answered(self) -> int:
        return int(self._row.answered[0])

    def connect(self) -> None:
        """Re-arm after disconnect(); a new operator starts connected."""
        self._row.connected[0] = True
        self.pipeline.reset()

    def close(self) -> None:
        self._row.connected[0] = False

    def disconnect(self) -> None:
        """Simulate losing the device: poll() returns None from now on."""
        self._row.connected[0] = False

    def observe(self, obs_row: object, requested: bool) -> None:
        """This tick's observation (one env row) and whether a handover is being requested."""
        self._obs = obs_row
        self._row.observe(np.array([requested]))

    def release(self) -> None:
        """Control went back to the policy: stop correcting; the next request starts afresh."""
        self._row.release(0)

    def poll(self) -> HumanCommand | None:
        if not self.connected:
            return None
        raw = np.zeros(COMMAND_DIM, np.float32)
        buttons: frozenset[str] = frozenset()
        if self.engaged:
            cmd = np.asarray(self.command_fn(self._obs), np.float64).reshape(-1)
            if cmd.shape != (COMMAND_DIM,):
                raise DeviceError(f"synthetic operator: command_fn returned shape {cmd.shape}, expected ({COMMAND_DIM},)")
            sent, ret = self._row.commands(np.zeros(1, np.int64), cmd[None])
            raw = sent[0]
            if ret[0]:
                buttons = frozenset({RETURN})
        return self._command(raw, hold=self.engaged, buttons=buttons, t_ns=now_ns())
