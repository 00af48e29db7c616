"""Double of slime.rollout.base_types: the rollout function's outputs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class RolloutFnTrainOutput:
    samples: list
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    data: dict
    metrics: dict[str, Any] | None = None
