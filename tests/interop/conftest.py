"""The interop tests run only in the LeRobot environment `make test-interop` builds (.venv-interop: torch 2.14.1,
lerobot 0.4.4); the main suite's environment has no lerobot, so there they are not collected."""

import importlib.util
import os
import tempfile

if importlib.util.find_spec("lerobot") is None:
    collect_ignore_glob = ["test_*.py"]
else:
    # LeRobot copies what it loads into the Hugging Face cache: keep that out of the user's, and never go online.
    os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="hg-dagger-interop-hf-"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
