"""``PreTrainedConfig.from_pretrained(dir)``: the folder's config.json as attributes (LeRobot's is a dataclass)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace


class PreTrainedConfig(SimpleNamespace):
    @classmethod
    def from_pretrained(cls, path: str) -> PreTrainedConfig:
        return cls(**json.loads((Path(path) / "config.json").read_text()))
