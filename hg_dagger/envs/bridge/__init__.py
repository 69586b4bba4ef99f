"""The robot bridge: drive a robot (or any sim backend) in another process over TCP.

``hg-dagger bridge serve TASK`` runs the robot side (``BridgeServer``: sockets and sessions; ``Robot``: the
robot's states); ``BridgeEnv`` is the app side, a VecEnv. The wire protocol is in ``protocol`` and docs/bridge-protocol.md.
"""

from hg_dagger.envs.bridge.client import BridgeEnv
from hg_dagger.envs.bridge.protocol import (
    DEFAULT_PORT,
    PROTOCOL_VERSION,
    TOKEN_ENV,
    BridgeError,
    ErrorCode,
    Msg,
    ProtocolError,
    RobotState,
    load_token,
    new_token,
)
from hg_dagger.envs.bridge.robot import Robot, hold_action
from hg_dagger.envs.bridge.server import BridgeServer, ServerConfig, serve

__all__ = [
    "DEFAULT_PORT", "PROTOCOL_VERSION", "TOKEN_ENV", "BridgeEnv", "BridgeError", "BridgeServer", "ErrorCode", "Msg",
    "ProtocolError", "Robot", "RobotState", "ServerConfig", "hold_action", "load_token", "new_token", "serve",
]
