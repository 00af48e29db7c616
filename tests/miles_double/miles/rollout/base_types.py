"""Stand-in for miles.rollout.base_types: what a rollout class and a generate function are built
with, called with and return."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RolloutFnConstructorInput:
    args: Any
    data_source: Any


@dataclass(frozen=True)
class RolloutFnTrainInput:
    rollout_id: int
    weight_version: int | None = None  # the engines' weight version, None before the first update

    @property
    def evaluation(self) -> bool:
        return False


@dataclass(frozen=True)
class RolloutFnEvalInput:
    rollout_id: int
    generate_state: Any = None
    weight_version: str | None = None
    hf_dir: str | None = None

    @property
    def evaluation(self) -> bool:
        return True


@dataclass
class RolloutFnTrainOutput:
    samples: list
    metrics: dict[str, Any] | None = None


@dataclass
class RolloutFnEvalOutput:
    data: dict
    metrics: dict[str, Any] | None = None


@dataclass(frozen=True)
class GenerateFnInput:
    state: Any
    sample: Any
    sampling_params: dict[str, Any]
    evaluation: bool

    @property
    def args(self) -> Any:
        return self.state.args


@dataclass(frozen=True)
class GenerateFnOutput:
    samples: Any  # one Sample, or a list of them


def call_rollout_fn(fn: Any, *args: Any, evaluation: bool, **kwargs: Any) -> Any:
    """The v1 rollout function's call: a bare result is wrapped in the output type."""
    output = fn(*args, **kwargs, evaluation=evaluation)
    if isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
        return output
    return RolloutFnEvalOutput(data=output) if evaluation else RolloutFnTrainOutput(samples=output)
