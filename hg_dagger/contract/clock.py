"""One monotonic clock for every timestamp: int64 nanoseconds from time.monotonic_ns().

Robot-side times are mapped onto it with a measured offset; the mapping's uncertainty becomes
alignment_error_ms. Wall-clock time is never used for ordering.
"""

from __future__ import annotations

import datetime as _dt
import time
from dataclasses import dataclass

now_ns = time.monotonic_ns

NO_TIME = -1  # sentinel for "did not happen" in int64 time arrays


def wall_stamp() -> str:
    """UTC wall-clock time to the second, for records people read (created_wall, generated); never for ordering."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class ClockMapping:
    """Maps a remote monotonic clock onto ours: local = remote + offset_ns, +/- error_ns.

    Estimated by ping/pong (NTP style): offset from the exchange with the smallest round trip,
    error bound = half that round trip.
    """

    offset_ns: int = 0
    error_ns: int = 0

    def to_local(self, remote_ns: int) -> int:
        return int(remote_ns) + self.offset_ns

    @property
    def error_ms(self) -> float:
        return self.error_ns / 1e6

    @classmethod
    def from_exchanges(cls, exchanges: list[tuple[int, int, int]]) -> ClockMapping:
        """exchanges: (t_send_local, t_remote, t_recv_local) triples."""
        if not exchanges:
            raise ValueError("clock mapping needs at least one ping/pong exchange")
        best = min(exchanges, key=lambda e: e[2] - e[0])
        t0, tr, t1 = best
        return cls(offset_ns=(t0 + t1) // 2 - tr, error_ns=(t1 - t0) // 2)
