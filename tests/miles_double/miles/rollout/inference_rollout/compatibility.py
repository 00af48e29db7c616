"""Stand-in for miles.rollout.inference_rollout.compatibility: how Miles loads the functions its
flags name. A rollout path naming a class is built with the constructor input; a function is
wrapped to the class's call. A generate path naming a class is built with no argument; a function
whose first parameter is not ``input`` (three or more) is slime's shape, ``(args, sample,
sampling_params[, evaluation])``, and is wrapped; anything else is Miles' own and called as is."""

from __future__ import annotations

import inspect
from typing import Any

from miles.rollout.base_types import GenerateFnOutput, RolloutFnEvalOutput, RolloutFnTrainOutput
from miles.utils.async_utils import run
from miles.utils.misc import load_function


class LegacyRolloutFnAdapter:
    def __init__(self, input: Any, fn: Any) -> None:
        self.args, self.data_source, self.fn = input.args, input.data_source, fn

    def __call__(self, input: Any) -> Any:
        output = self.fn(self.args, input.rollout_id, self.data_source, evaluation=input.evaluation)
        if isinstance(output, (RolloutFnTrainOutput, RolloutFnEvalOutput)):
            return output
        return RolloutFnEvalOutput(data=output) if input.evaluation else RolloutFnTrainOutput(samples=output)


def load_rollout_function(input: Any, path: str) -> Any:
    fn = load_function(path)
    return fn(input) if inspect.isclass(fn) else LegacyRolloutFnAdapter(input, fn)


def call_rollout_function(fn: Any, input: Any) -> Any:
    """A coroutine the rollout returns runs on Miles' background loop."""
    output = fn(input)
    return run(output) if inspect.iscoroutine(output) else output


class LegacyGenerateFnAdapter:
    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.takes_evaluation = "evaluation" in inspect.signature(fn).parameters

    async def __call__(self, input: Any) -> Any:
        extra = {"evaluation": input.evaluation} if self.takes_evaluation else {}
        output = await self.fn(input.args, input.sample, input.sampling_params, **extra)
        return output if isinstance(output, GenerateFnOutput) else GenerateFnOutput(samples=output)


def _is_legacy_generate_fn(fn: Any) -> bool:
    names = list(inspect.signature(fn).parameters)
    return len(names) >= 3 and names[0] != "input"


def load_generate_function(path: str | None) -> Any:
    fn = load_function(path)
    if fn is None:
        return None
    if inspect.isclass(fn):
        return fn()
    return LegacyGenerateFnAdapter(fn) if _is_legacy_generate_fn(fn) else fn
