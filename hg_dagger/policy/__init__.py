"""Policies: the built-in student and its checkpoints, and the policy sources a ``--policy SPEC`` opens (a student
checkpoint, a policy server speaking openpi's protocol, a LeRobot folder served from LeRobot's own Python)."""

from hg_dagger.policy.checkpoint import load_student, read_checkpoint, save_checkpoint, snapshot_bytes
from hg_dagger.policy.remote import PolicyOptions, RemotePolicy
from hg_dagger.policy.sources import (
    POLICIES,
    PolicySource,
    close_policy,
    is_remote,
    open_policy,
    policy_source,
)
from hg_dagger.policy.student import PolicyOutput, Student, StudentSpec, one_inference_thread
from hg_dagger.policy.wire import PolicyError

__all__ = ["POLICIES", "PolicyError", "PolicyOptions", "PolicyOutput", "PolicySource", "RemotePolicy", "Student",
           "StudentSpec", "close_policy", "is_remote", "load_student", "one_inference_thread", "open_policy",
           "policy_source", "read_checkpoint", "save_checkpoint", "snapshot_bytes"]
