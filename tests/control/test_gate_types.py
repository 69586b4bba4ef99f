"""Gate types are records of one registry (gate_types.GATES): the shipped types read a gate file through it, an
unknown type is one line naming the gate and the registered types, and the gate type docs/extending.md ("A gate
type") shows - its module and its gate file, taken from the page - runs in the engine and in a session on toy_reach
with nothing of ours edited."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
from pydantic import BaseModel
from support.docs import section_blocks

from hg_dagger import config
from hg_dagger.contract.enums import EventKind
from hg_dagger.control.build import build_session
from hg_dagger.control.gate_scores import GateInputs, OperatorScorer
from hg_dagger.control.gate_specs import ConfidenceGate, GateConfig
from hg_dagger.control.gate_types import GATES, GateSpecBase, GateType, operator_words
from hg_dagger.control.gates import TRIGGER, WARN, GateEngine
from hg_dagger.control.run_config import load_run_config
from hg_dagger.envs import make_env
from hg_dagger.errors import ConfigError
from hg_dagger.policy import Student
from hg_dagger.registry import RegistryError
from hg_dagger.store import EpisodeStore, validate_store
from hg_dagger.ui.gate import gate_words

SHIPPED = {"confidence", "risk", "progress_stall", "progress_eta", "constraint", "signal", "policy_failed", "operator",
           "chunk", "spread", "novelty"}
SECTION = "A gate type"


def test_each_shipped_gate_type_is_one_record_read_by_its_type():
    ours = {n for n in GATES.names() if GATES.origin(n) == "hg_dagger"}
    assert ours == SHIPPED
    for name in ours:
        record = GATES.get(name)
        assert record.spec.model_fields["type"].default == name
    assert {n for n in ours if GATES.get(n).grace} == {"confidence", "risk", "progress_stall", "progress_eta",
                                                        "novelty"}
    cfg = GateConfig.model_validate({"gates": [{"type": "signal", "name": "collision", "signal": "c"},
                                              {"type": "confidence", "trigger": 0.3}]})
    assert [type(g).__name__ for g in cfg.gates] == ["SignalGate", "ConfidenceGate"]
    assert GateConfig.model_validate(cfg.model_dump()) == cfg  # what an episode stores reads back the same
    assert operator_words("confidence") == "the student is unsure here"
    assert operator_words("collision") == "a collision is close"  # a well-known name of a signal gate
    assert operator_words("my_gate") is None


def test_an_unknown_gate_type_is_one_line_naming_the_gate_and_the_registered_types(tmp_path):
    p = tmp_path / "g.yaml"
    p.write_text("kind: gates\ngates:\n  - {type: confidence, trigger: 0.5}\n  - {type: efort, name: push}\n")
    with pytest.raises(ConfigError) as exc:
        config.check(p)
    lines = str(exc.value).splitlines()
    assert len(lines) == 1, lines
    assert str(p) in lines[0] and "gates.1" in lines[0] and "'push'" in lines[0] and "'efort'" in lines[0]
    assert all(name in lines[0] for name in SHIPPED) and "hg_dagger.gates" in lines[0]

    p.write_text("kind: gates\ngates:\n  - {trigger: 0.5}\n")
    with pytest.raises(ConfigError, match="gates.0: a gate: give its type"):
        config.check(p)


def test_a_spec_model_that_is_not_its_type_s_is_refused():
    class Loose(GateSpecBase):
        type: str = "confidence"
        trigger: float = 1.0

    with pytest.raises(ValueError, match="not the spec of gate type 'confidence'"):
        GateConfig(gates=[Loose()])
    GateConfig(gates=[ConfidenceGate()])  # the registered spec is taken as it is

    class Untyped(BaseModel):
        trigger: float = 1.0

    with pytest.raises(RegistryError, match="Literal"):
        GateType(spec=Untyped, scorer=OperatorScorer)


@pytest.fixture(scope="module")
def effort(tmp_path_factory):
    """The documented module, loaded as ``hgd_effort`` and registered as its entry point would; its gate file."""
    blocks = section_blocks("extending.md", SECTION)
    module = types.ModuleType("hgd_effort")
    sys.modules["hgd_effort"] = module
    exec(compile(blocks["python"], "hgd_effort.py", "exec"), module.__dict__)
    GATES.register("effort", module.EFFORT, origin="hgd-effort", replace=True)
    gates = tmp_path_factory.mktemp("effort") / "effort.yaml"
    gates.write_text(blocks["yaml"])
    yield module, gates
    sys.modules.pop("hgd_effort", None)


def _inp(action):
    a = np.asarray(action, np.float32)
    n = len(a)
    return GateInputs(step=np.full(n, 50, np.int64), t_ns=1, action=a, uncertainty=np.zeros(n, np.float32), obs={})


def test_the_documented_gate_type_warns_and_triggers_on_its_own_score(effort):
    module, path = effort
    cfg = config.load(path, GateConfig)
    assert [g.name for g in cfg.gates][-1] == "effort" and "confidence" in [g.name for g in cfg.gates]
    spec = next(g for g in cfg.gates if g.type == "effort")
    assert isinstance(spec, module.EffortGate) and (spec.warn, spec.trigger) == (0.6, 0.8)

    engine = GateEngine(GateConfig(gates=[spec]), num_envs=3, step_dt=0.04, action_dim=2)
    out = engine.update(_inp([[0.1, -0.2], [0.1, -0.7], [0.95, 0.0]]), np.ones(3, bool))
    assert out.level.tolist() == [0, WARN, TRIGGER]
    trigger = next(e for row, e in out.events if row == 2 and e.kind == EventKind.GATE_TRIGGER)
    assert trigger.reason == "effort" and trigger.values["effort"]["effort"] == pytest.approx(0.95)
    described = engine.describe()["gates"][0]
    assert described["type"] == "effort" and described["trigger"] == 0.8
    assert gate_words("confidence+effort") == ("the student is unsure here; the student drives flat out "
                                               "(confidence, effort)")


def test_the_documented_gate_type_asks_for_the_operator_in_a_session_on_toy_reach(effort, tmp_path):
    """A fresh student drives at a few hundredths of full speed: a variant of the documented gate file (extends it,
    effort trigger 0.02) asks for the operator; the episodes record the type in their gate config."""
    _, path = effort
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"kind: gates\nextends: {path}\nname: effort_low\n"
                       "gates:\n  - {type: effort, warn: null, trigger: 0.02}\n  - {type: confidence, enabled: false}\n")
    gates = config.load(variant, GateConfig)
    env = make_env("toy_reach", num_envs=2, seed=0)
    student = Student.create(env.mapping, seed=0, ensemble=3, hidden=(32, 32))
    cfg = load_run_config(None, "toy_reach", num_envs=2, gates=gates, calibrate_steps=0,
                          **{"operator.return_after_steps": 12})
    rec = EpisodeStore.create(str(tmp_path / "store")).recorder(flush_interval_s=0.05)
    summary = build_session(cfg, rec, student, env=env).run(2, progress=False)
    rec.close()
    store = EpisodeStore.open(str(tmp_path / "store"))
    assert not validate_store(store)
    assert summary.gate_triggers > 0 and summary.human_steps > 0
    for info in store.episodes():
        asked = [e for e in info.end.events if e.kind == EventKind.GATE_TRIGGER and "effort" in e.reason.split("+")]
        assert asked and asked[0].values["effort"]["effort"] >= 0.02
        recorded = {g["name"]: g for g in info.start.gate_config["gates"]}
        assert recorded["effort"]["type"] == "effort" and recorded["effort"]["trigger"] == 0.02
        assert "confidence" not in recorded  # disabled in the variant
