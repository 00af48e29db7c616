"""Double of vime.rollout.base_types: the train output."""

from dataclasses import dataclass
from typing import Any


@dataclass
class RolloutFnTrainOutput:
    samples: Any
    metrics: Any = None


@dataclass
class RolloutFnEvalOutput:
    data: Any
    metrics: Any = None
