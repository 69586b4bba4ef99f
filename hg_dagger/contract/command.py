"""HumanCommand: what an operator device hands to the control loop each tick.

``raw`` is the device value as read (recorded as the step's human_command); ``motion`` is the same
command after deadzone, expo, scaling, rate limiting and the device->robot frame transform, still
normalized to [-1, 1]. The task mapping turns ``motion`` into the raw robot action.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

import numpy as np

COMMAND_DIM = 7  # x, y, z, roll, pitch, yaw, gripper
COMMAND_AXES = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")

# Button names every device maps its physical buttons onto.
TAKEOVER: Final = "takeover"  # operator-initiated takeover (a gate event)
RETURN: Final = "return"  # hand control back to the policy
ESTOP: Final = "estop"  # emergency stop -> SAFE_STOP
GRIPPER: Final = "gripper"  # toggle/close gripper


@dataclass(frozen=True, slots=True)
class HumanCommand:
    t_device: int  # when the device produced it, monotonic ns on our clock
    raw: np.ndarray  # float32 [COMMAND_DIM], as read from the device
    motion: np.ndarray  # float32 [COMMAND_DIM], processed, robot frame, in [-1, 1]
    engaged: bool  # hold-to-intervene state (after the release delay)
    buttons: frozenset[str] = field(default_factory=frozenset)
    device_id: str = ""
