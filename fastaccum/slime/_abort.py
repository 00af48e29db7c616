"""The rollout function and ``request_abort`` (the skeleton's, on slime's record), with slime's own
step before a rollout: the servers' stream mode is checked before anything is sent."""

from __future__ import annotations

from typing import Any

from fastaccum._rollout import Lifecycle
from fastaccum.slime._modules import modules
from fastaccum.slime._pools import FRAMEWORK, POOLS
from fastaccum.slime._probe import check_server_mode
from fastaccum.slime._settings import Settings

__all__ = ("generate_rollout", "request_abort", "with_request_abort", "log_rollout_data")


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function with request-level abort; delegates to slime's ``generate_rollout``.

    slime's module-level ``abort`` is swapped for ``request_abort`` while the rollout runs, on both
    slime lines, and restored afterwards. Evaluation never aborts and is delegated unchanged.
    """
    return _lifecycle.generate_rollout(args, rollout_id, data_source, evaluation)


async def request_abort(args: Any, rollout_id: int) -> list[list[Any]]:
    """Abort the rollout's in-flight work and return the groups to buffer for partial rollout.

    When it returns, every cut stream's connection is closed and the servers are idle.
    """
    return await _lifecycle.abort(args, rollout_id)


def _check_mode_first(args: Any) -> None:
    """Before a rollout whose generate function streams through fastaccum: a stream mode the
    servers do not share fails here, before anything is sent."""
    path = getattr(args, "custom_generate_function_path", None)
    if path and getattr(modules().misc.load_function(path), "abort_mode", None) == "request":
        modules().async_utils.run(_check_mode(args))


async def _check_mode(args: Any) -> None:
    await check_server_mode(args, Settings.from_args(args), POOLS.session(args))  # the session is loop-bound


_lifecycle = Lifecycle(FRAMEWORK, POOLS, request_abort, before_rollout=_check_mode_first)
# A rollout function of your own, run as generate_rollout runs slime's (docs/slime.md, "Your own
# rollout function"): ``generate_rollout = with_request_abort(my_rollout)``.
with_request_abort = _lifecycle.with_request_abort
# slime's --custom-rollout-log-function-path (docs/slime.md, "Rollout metrics")
log_rollout_data = _lifecycle.log_rollout_data
