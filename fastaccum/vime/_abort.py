"""The rollout function and ``request_abort``: the skeleton's, on vime's record."""

from __future__ import annotations

from typing import Any

from fastaccum._rollout import Lifecycle
from fastaccum.vime._pools import FRAMEWORK, POOLS

__all__ = ("generate_rollout", "request_abort", "with_request_abort", "log_rollout_data")


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """vime's rollout function with request-level abort; delegates to vime's ``generate_rollout``
    with vime's module-level ``abort`` swapped for ``request_abort`` (restored afterwards).
    Evaluation never aborts and is delegated unchanged."""
    return _lifecycle.generate_rollout(args, rollout_id, data_source, evaluation)


async def request_abort(args: Any, rollout_id: int) -> list[list[Any]]:
    """Abort the rollout's in-flight work and return the groups to buffer for partial rollout.
    When it returns, every stream fastaccum stopped is drained or closed and the servers are idle."""
    return await _lifecycle.abort(args, rollout_id)


_lifecycle = Lifecycle(FRAMEWORK, POOLS, request_abort)
# A rollout function of your own, run as generate_rollout runs vime's (docs/vime.md)
with_request_abort = _lifecycle.with_request_abort
# vime's --custom-rollout-log-function-path (docs/vime.md, "Rollout metrics")
log_rollout_data = _lifecycle.log_rollout_data
