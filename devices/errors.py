"""The devices' one error, in a module of its own so calibration, the wizard and the Device interface all raise it
without importing each other."""

from __future__ import annotations

from hg_dagger.errors import HgDaggerError


class DeviceError(HgDaggerError):
    """An input device is missing, unreadable, or misconfigured."""
