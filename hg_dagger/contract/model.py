"""The one strict pydantic base for the project's configs and records (docs/architecture.md).

A key the model does not know is refused, so a misspelt key in a YAML file or a record fails naming the key
instead of being dropped. ``FrozenModel`` is the same for values that must not change once built (a task
mapping, a dataset manifest, a training rule).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FrozenModel(StrictModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
