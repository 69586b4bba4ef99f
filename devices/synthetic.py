"""A synthetic operator: stands in for a person so human-gated runs work headless and in tests.

It watches each tick (``observe(obs_row, requested)``). When a handover is requested it decides once,
with probability ``availability``, whether it answers this request; if so it engages after
``reaction_delay_steps`` ticks and from then on sends ``command_fn(obs_row)`` plus Gaussian noise
(typically the planner expert's action mapped to the human motion space) until told to ``release()``.
Its commands go through the same command pipeline as a real device's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hg_dagger.contract.clock import now_ns
from hg_dagger.contract.command import COMMAND_DIM, RETURN, HumanCommand
from hg_dagger.devices.base import Device, DeviceError
from hg_dagger.devices.configs import SyntheticConfig

CommandFn = Callable[[object], np.ndarray]


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
        self._rng = np.random.default_rng(config.seed)
        self._connected = True  # nothing to open
        self._obs = None
        self._requested = False
        self._answering = False  # this request will be answered
        self._countdown = 0
        self._engaged = False
        self._engaged_ticks = 0
        self.requests = 0  # handover requests seen
        self.answered = 0  # requests this operator answered

    @classmethod
    def from_config(cls, config: SyntheticConfig, command_fn: CommandFn | None = None, **kwargs) -> SyntheticOperator:
        if command_fn is None:
            raise DeviceError("a synthetic operator needs command_fn=... (e.g. the planner expert's motion)")
        return cls(command_fn, config=config, **kwargs)

    @property
    def device_id(self) -> str:
        return f"synthetic:{self.config.seed}"

    @property
    def connected(self) -> bool:
        return self._connected

    @property
    def engaged(self) -> bool:
        return self._engaged

    @property
    def watching(self) -> bool:
        """Engaged, or reacting to a request it saw: the rows whose next observe() can change something."""
        return self._engaged or self._requested

    def connect(self) -> None:
        """Re-arm after disconnect(); a new operator starts connected."""
        self._connected = True
        self.pipeline.reset()

    def close(self) -> None:
        self._connected = False

    def disconnect(self) -> None:
        """Simulate losing the device: poll() returns None from now on."""
        self._connected = False

    def observe(self, obs_row, requested: bool) -> None:
        """This tick's observation (one env row) and whether a handover is being requested."""
        self._obs = obs_row
        if self._engaged:
            return
        if not requested:
            self._requested = False  # the request was withdrawn before the person answered
            return
        if not self._requested:  # a new request: does the person answer it at all?
            self._requested = True
            self.requests += 1
            self._answering = bool(self._rng.random() < self.config.availability)
            self._countdown = self.config.reaction_delay_steps
        elif self._answering:
            self._countdown -= 1
        if self._answering and self._countdown <= 0:
            self._engaged = True
            self._engaged_ticks = 0
            self.answered += 1

    def release(self) -> None:
        """Control went back to the policy: stop correcting; the next request starts afresh."""
        self._engaged = False
        self._requested = False
        self._answering = False

    def poll(self) -> HumanCommand | None:
        if not self._connected:
            return None
        raw = np.zeros(COMMAND_DIM, np.float32)
        buttons: frozenset[str] = frozenset()
        if self._engaged:
            cmd = np.asarray(self.command_fn(self._obs), np.float64).reshape(-1)
            if cmd.shape != (COMMAND_DIM,):
                raise DeviceError(f"synthetic operator: command_fn returned shape {cmd.shape}, expected ({COMMAND_DIM},)")
            if self.config.noise_std > 0:
                cmd[:6] += self._rng.normal(0.0, self.config.noise_std, 6)
            raw[:] = cmd
            self._engaged_ticks += 1
            limit = self.config.return_after_steps
            if limit is not None and self._engaged_ticks >= limit:
                buttons = frozenset({RETURN})
        return self._command(raw, hold=self._engaged, buttons=buttons, t_ns=now_ns())
