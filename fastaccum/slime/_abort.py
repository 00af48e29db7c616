"""The rollout function and request-level abort: slime's ``abort`` swapped for ``request_abort``
while a rollout runs, which stops fastaccum's streams, buffers the groups that kept a prefix and
waits until the servers are idle."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastaccum._rollout import ModuleAbort, collect_groups, has_in_tree_request_abort, wait_until_idle
from fastaccum.slime._generate import generate
from fastaccum.slime._modules import modules
from fastaccum.slime._pools import registry, session
from fastaccum.slime._probe import CONTROL_TIMEOUT, check_server_mode
from fastaccum.slime._settings import Settings, router_url

__all__ = ("generate_rollout", "request_abort")

logger = logging.getLogger("fastaccum.slime")


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function with request-level abort; delegates to slime's ``generate_rollout``.

    slime's module-level ``abort`` is swapped for ``request_abort`` while the rollout runs, on both
    slime lines, and restored afterwards. Evaluation never aborts and is delegated unchanged.
    """
    slime = modules()
    if evaluation:
        return slime.rollout.generate_rollout(args, rollout_id, data_source, evaluation=True)
    if _generate_is_fastaccum(args):
        # Mode mismatches fail here, before the first rollout sends anything.
        slime.async_utils.run(_check_mode_for_rollout(args))
    with _module_abort.swapped(slime.rollout):
        return slime.rollout.generate_rollout(args, rollout_id, data_source, evaluation=False)


async def _check_mode_for_rollout(args: Any) -> None:
    await check_server_mode(args, Settings.from_args(args), session(args))


def _generate_is_fastaccum(args: Any) -> bool:
    path = getattr(args, "custom_generate_function_path", None)
    return bool(path) and modules().misc.load_function(path) is generate


async def request_abort(args: Any, rollout_id: int) -> list[list[Any]]:
    """Abort the rollout's in-flight work and return the groups to buffer for partial rollout.

    When it returns, every cut stream's connection is closed and the servers are idle.
    """
    slime = modules()
    path = getattr(args, "custom_generate_function_path", None)
    if not path or getattr(slime.misc.load_function(path), "abort_mode", None) != "request":
        # Another generate function: fastaccum cannot see its requests, slime's abort can.
        stock: list[list[Any]] = await _module_abort.original(modules().rollout)(args, rollout_id)
        return stock
    settings = Settings.from_args(args)
    state = slime.rollout.GenerateState(args)
    if has_in_tree_request_abort(state):
        # slime cancels the request-abort calls itself (generate commits each prefix as it is
        # cancelled) and buffers the same groups; it only does not wait for the servers, which
        # notice a closed connection at their next write and may still be decoding.
        server_wide = state.active_server_generations > 0
        in_tree: list[list[Any]] = await _module_abort.original(modules().rollout)(args, rollout_id)
        if not server_wide:
            await _wait_until_idle(args, settings)
        return in_tree
    assert not state.aborted, "request_abort called twice in one rollout"
    state.aborted = True  # before the first await: generate calls starting from now stop at once
    streams = registry()
    for stream in list(streams.request_streams):
        stream.abort()
    server_wide = streams.server_generations > 0
    if server_wide:
        # Top-p replay (or fastaccum_abort_mode: server) is on: those streams must end with their
        # terminal abort chunk, which only the server-wide abort produces.
        await slime.server_control.abort_servers_until_idle(await _worker_urls(args))

    groups = await collect_groups(state, args, rollout_id, modules().Sample.Status.ABORTED, logger)
    if not server_wide:
        await _wait_until_idle(args, settings)
    return groups


async def _worker_urls(args: Any) -> list[str]:
    response = await modules().http_utils.get(f"{router_url(args)}/workers")
    return [worker["url"] for worker in response["workers"]]


async def _wait_until_idle(args: Any, settings: Settings) -> None:
    """Poll the workers' loads until none runs a request; on timeout, abort server-wide.

    The disconnect-driven abort is asynchronous (~2 s on SGLang 0.5.15), its propagation through
    slime's router is unverified, and --offload-rollout must not free memory under live requests.
    """
    slime = modules()

    def load(url: str) -> Any:
        return asyncio.wait_for(slime.http_utils.get(f"{url}/v1/loads?include=core"), CONTROL_TIMEOUT.total)

    await wait_until_idle(
        await _worker_urls(args),
        load=load,
        running=slime.server_control.num_requests_from_load,
        abort_until_idle=slime.server_control.abort_servers_until_idle,
        timeout=settings.idle_timeout,
        poll_interval=settings.idle_poll_interval,
        logger=logger,
    )


# slime's module-level abort, swapped for request_abort while generate_rollout runs.
_module_abort = ModuleAbort(request_abort)
