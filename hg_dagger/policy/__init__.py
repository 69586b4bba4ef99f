"""The student policy and its checkpoints."""

from hg_dagger.policy.checkpoint import load_student, read_checkpoint, save_checkpoint, snapshot_bytes
from hg_dagger.policy.student import PolicyOutput, Student, StudentSpec, one_inference_thread

__all__ = ["PolicyOutput", "Student", "StudentSpec", "load_student", "read_checkpoint", "save_checkpoint",
           "one_inference_thread", "snapshot_bytes"]
