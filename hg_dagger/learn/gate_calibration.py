"""The confidence gate's thresholds for a freshly trained student, calibrated on the states a policy drove and
stored in its checkpoint (docs/gates.md), so every session that loads the student starts from them. Below both
the trainer (which calibrates after each fit) and the console's rounds."""

from __future__ import annotations

from typing import Any

import numpy as np

from hg_dagger.contract import ActionSource, CollectionMode
from hg_dagger.control.gate_specs import ConfidenceGate
from hg_dagger.control.gate_thresholds import CalibrationRefused, quantile_thresholds
from hg_dagger.envs import load_mapping
from hg_dagger.store import EpisodeStore
from hg_dagger.store.trainable import flatten_td


def calibrate_student(store: str, checkpoint: str, task: str, *, gates: str | None = None) -> dict[str, Any]:
    """Calibrate the confidence gate for a freshly trained student and store the thresholds in its checkpoint,
    so every session with this student starts from them (policy.checkpoint). The samples are the student's
    uncertainty on the store's autonomous states (``autonomous_uncertainty``); the rule and rate are the task's
    gate config's (the run config's ``gates``, else configs/gates/<task>.yaml). Returns what was stored and a
    one-line message; with too few samples, or samples that cannot set a gate, nothing is stored and a session
    falls back to its own start-up calibration."""
    # deferred: it loads the run config and torch; importing this module stays free of them (tests/learn/test_eval.py: eval loads none)
    from hg_dagger.control.run_config import load_gate_config, load_run_config
    from hg_dagger.policy.checkpoint import store_gate_thresholds

    ref = gates if gates is not None else load_run_config(None, task).gates
    conf = next((g for g in load_gate_config(ref, task).gates if isinstance(g, ConfidenceGate) and g.enabled), None)
    if conf is None or conf.calibration is None:
        return {"thresholds": None, "message": f"task {task}: no calibrated confidence gate; nothing to store"}
    unc = autonomous_uncertainty(store, checkpoint, task)
    if len(unc) < conf.calibration.min_samples:
        return {"thresholds": None, "message": f"confidence gate not calibrated: {len(unc)} samples, "
                f"{conf.calibration.min_samples} needed"}
    try:
        thr = quantile_thresholds(np.asarray(unc, np.float64), conf.calibration)
    except CalibrationRefused as exc:
        return {"thresholds": None, "message": f"confidence gate not calibrated: {exc}"}
    thresholds = {"confidence": thr}
    store_gate_thresholds(checkpoint, thresholds)
    return {"thresholds": thresholds, "message": f"confidence gate calibrated for the student: warn {thr['warn']:.3g}, "
            f"trigger {thr['trigger']:.3g} (uncertainty p50 {thr['uncertainty']['p50']:.3g}, "
            f"p90 {thr['uncertainty']['p90']:.3g}, max {thr['uncertainty']['max']:.3g})"}


def autonomous_uncertainty(store: str, checkpoint: str, task: str, *, max_steps: int = 5000,
                           min_steps: int = 500) -> list[float]:
    """The student's uncertainty on the newest states where a policy acted on its own (human-gated
    episodes, action_source policy): the samples the confidence gate's quantile rule needs. With fewer
    than ``min_steps`` of those (an early round), the other recorded states of the task fill up."""
    # deferred: policy imports torch; importing this module stays free of it
    from hg_dagger.policy import Student

    mapping = load_mapping(task)
    student = Student.load(checkpoint, mapping)
    st = EpisodeStore.open(store, mode="r")
    keys = list(mapping.obs_spec())
    out: list[np.ndarray] = []
    n = 0
    infos = [i for i in st.episodes() if i.complete and i.start.task.task_id == task
             and i.start.mode != CollectionMode.EVAL]
    gated = [i for i in infos if i.start.mode == CollectionMode.HUMAN_GATED]
    for policy_only in (True, False):
        for info in reversed(gated if policy_only else infos):
            flat = flatten_td(st.load(info.episode_id, fields=[f"obs/{k}" for k in keys] + ["action_source"]))
            src = flat["action_source"]
            rows = src == ActionSource.POLICY.code if policy_only else src != ActionSource.POLICY.code
            if not rows.any():
                continue
            u = student.act({k: flat[f"obs/{k}"][rows] for k in keys}).uncertainty
            out.append(np.asarray(u, np.float32))
            n += int(rows.sum())
            if n >= max_steps:
                break
        if n >= min_steps:
            break
    return [float(x) for x in np.concatenate(out)[:max_steps]] if out else []
