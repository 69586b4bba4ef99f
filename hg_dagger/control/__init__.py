"""The control loop: gates that ask for a person, the handover state machine, the independent safety
monitor, and the session that runs one tick (obs -> student -> gates -> handover -> operator -> mapping
-> safety -> env.step -> recorder)."""

from hg_dagger.control.gate_chunk import ChunkGate  # registers the chunk gate type with the shipped ones
from hg_dagger.control.gate_novelty import NoveltyGate  # registers the novelty gate type
from hg_dagger.control.gate_scores import GateInputs
from hg_dagger.control.gate_specs import GateConfig
from hg_dagger.control.gate_spread import SpreadGate  # registers the spread gate type
from hg_dagger.control.gate_thresholds import calibrate_threshold
from hg_dagger.control.gates import GateEngine
from hg_dagger.control.handover import HandoverConfig, HandoverMachine
from hg_dagger.control.limits import ActionLimits, StateBox
from hg_dagger.control.safety import SafetyConfig, SafetyMonitor

__all__ = [
    "ActionLimits", "ChunkGate", "GateConfig", "GateEngine", "GateInputs", "HandoverConfig", "HandoverMachine",
    "NoveltyGate", "SafetyConfig", "SafetyMonitor", "SpreadGate", "StateBox", "calibrate_threshold",
]
