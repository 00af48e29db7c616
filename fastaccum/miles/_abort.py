"""The rollout with request-level abort, on both of Miles' rollout paths: ``InferenceRolloutFn``
(Miles' rollout class, the default) and ``generate_rollout`` (its v1 rollout function,
``MILES_USE_LEGACY_ROLLOUT_V1=1``). Both are the skeleton's lifecycle on Miles' record; only the
abort's signature and where the pending groups live differ."""

from __future__ import annotations

from typing import Any

from fastaccum._rollout import Lifecycle
from fastaccum.miles._modules import modules
from fastaccum.miles._pools import FRAMEWORK, LEGACY, POOLS, check_stream_mode
from fastaccum.miles._settings import Settings

__all__ = ("abort", "generate_rollout", "request_abort", "rollout_class", "log_rollout_data")


async def abort(state: Any, pendings: set[Any], rollout_id: int) -> list[list[Any]]:
    """What Miles' rollout class calls as ``inference_rollout_train.abort`` while
    ``InferenceRolloutFn`` runs: fastaccum's calls are aborted by rid (each keeps its prefix and
    replay rows), the groups of ``pendings`` are awaited and, with ``--partial-rollout``, returned
    for the buffer as Miles' abort returns them, and the servers are idle when it returns."""

    def own() -> Any:
        return _lifecycle.framework_abort()(state, pendings, rollout_id)

    return await _lifecycle.abort_calls(state.args, rollout_id, state, own_abort=own, pendings=pendings)


async def request_abort(args: Any, rollout_id: int) -> list[list[Any]]:
    """What Miles' v1 rollout calls as ``sglang_rollout.abort`` while ``generate_rollout`` runs:
    the same, its pending groups read from its ``GenerateState``."""
    return await _legacy.abort(args, rollout_id)


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """Miles' v1 rollout function (``MILES_USE_LEGACY_ROLLOUT_V1=1``) with request-level abort:
    ``miles.rollout.sglang_rollout.generate_rollout`` with its module-level ``abort`` swapped for
    ``request_abort`` while it runs. Evaluation is delegated unchanged."""
    return _legacy.generate_rollout(args, rollout_id, data_source, evaluation)


def _check_before(args: Any) -> None:
    if _legacy.ends_its_calls(args):
        modules().async_utils.run(check_stream_mode(args, Settings.from_args(args)))


_lifecycle = Lifecycle(FRAMEWORK, POOLS, abort)
_legacy = Lifecycle(LEGACY, POOLS, request_abort, before_rollout=_check_before)
# Miles' --custom-rollout-log-function-path (docs/miles.md); both lifecycles count into POOLS.stats
log_rollout_data = _lifecycle.log_rollout_data

_classes: dict[type, type] = {}


def rollout_class() -> type:
    """``fastaccum.miles.InferenceRolloutFn``: a subclass of the loaded Miles' own, made on first
    use (``import fastaccum.miles`` imports no Miles)."""
    base = modules().common.InferenceRolloutFn
    made = _classes.get(base)
    if made is None:
        made = _classes[base] = _subclass(base)
    return made


def _subclass(base: type) -> type:
    class InferenceRolloutFn(base):  # type: ignore[misc]  # Miles' class, known at run time
        """Miles' rollout class (``--rollout-function-path fastaccum.miles.InferenceRolloutFn``)
        with request-level abort: a training rollout runs Miles' own, with
        ``inference_rollout_train.abort`` swapped for fastaccum's while it runs (the servers'
        stream mode checked first); an evaluation runs Miles' own unchanged."""

        async def __call__(self, input: Any) -> Any:  # noqa: A002  # Miles' name
            if input.evaluation:
                with _lifecycle.evaluating(input.rollout_id):
                    return await super().__call__(input)
            args = self.state.args
            with _lifecycle.rolling_out(args, input.rollout_id):
                if _lifecycle.ends_its_calls(args):
                    await check_stream_mode(args, Settings.from_args(args))
                return await super().__call__(input)

    InferenceRolloutFn.__module__ = "fastaccum.miles"
    return InferenceRolloutFn
