"""The rollout function and request-level abort: vime's ``abort`` swapped for ``request_abort``
while a rollout runs, which stops fastaccum's streams (cut: vLLM aborts on disconnect, and by its
cancel endpoint where a worker has one), buffers the groups that kept a prefix and waits until the
servers are idle."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import aiohttp

from fastaccum._core.dialects import vllm_abort_ids
from fastaccum._rollout import ModuleAbort, collect_groups, has_in_tree_request_abort, wait_until_idle
from fastaccum.vime._modules import modules
from fastaccum.vime._pools import CONTROL_TIMEOUT, registry, session
from fastaccum.vime._settings import Settings, router_url

__all__ = ("generate_rollout", "request_abort")

logger = logging.getLogger("fastaccum.vime")


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """vime's rollout function with request-level abort; delegates to vime's ``generate_rollout``
    with vime's module-level ``abort`` swapped for ``request_abort`` (restored afterwards).
    Evaluation never aborts and is delegated unchanged."""
    vime = modules()
    if evaluation:
        return vime.rollout.generate_rollout(args, rollout_id, data_source, evaluation=True)
    with _module_abort.swapped(vime.rollout):
        return vime.rollout.generate_rollout(args, rollout_id, data_source, evaluation=False)


async def request_abort(args: Any, rollout_id: int) -> list[list[Any]]:
    """Abort the rollout's in-flight work and return the groups to buffer for partial rollout.
    When it returns, every cut stream's connection is closed and the servers are idle."""
    vime = modules()
    path = getattr(args, "custom_generate_function_path", None)
    if not path or getattr(vime.misc.load_function(path), "abort_mode", None) != "request":
        # Another generate function: fastaccum cannot see its requests, vime's abort can.
        stock: list[list[Any]] = await _module_abort.original(modules().rollout)(args, rollout_id)
        return stock
    settings = Settings.from_args(args)
    state = vime.rollout.GenerateState(args)
    streams = registry()
    if has_in_tree_request_abort(state):
        # vime cancels the request-abort calls itself (generate commits each prefix as it is
        # cancelled) and buffers the same groups; it only does not wait for the servers.
        server_wide = state.active_server_generations > 0
        in_tree: list[list[Any]] = await _module_abort.original(modules().rollout)(args, rollout_id)
        if not server_wide:
            await _cancel_cut_requests(args, settings)
            await _wait_until_idle(args, settings)
        return in_tree
    assert not state.aborted, "request_abort called twice in one rollout"
    state.aborted = True  # before the first await: generate calls starting from now stop at once
    for stream in list(streams.request_streams):
        stream.abort()
    server_wide = streams.server_generations > 0
    if server_wide:
        await vime.server_control.abort_servers_until_idle(await _worker_urls(args))

    groups = await collect_groups(state, args, rollout_id, modules().Sample.Status.ABORTED, logger)
    if not server_wide:
        await _cancel_cut_requests(args, settings)
        await _wait_until_idle(args, settings)
    return groups


async def _worker_urls(args: Any) -> list[str]:
    response = await modules().http_utils.get(f"{router_url(args)}/workers")
    return [worker["url"] for worker in response["workers"]]


async def _cancel_cut_requests(args: Any, settings: Settings) -> None:
    """Name the cut requests to each worker's cancel endpoint, where it has one.

    vLLM aborts a request when its connection closes; the RLHF dev API's ``POST /abort_requests``
    (``{"request_ids": [...]}``; served only under ``VLLM_SERVER_DEV_MODE=1`` or ``--tokens-only``)
    ends them at once instead of at the next check. Whether a worker has it is probed once with a
    request id nobody holds (never with ``{}``, which aborts every request); a worker without it
    answers 404 and is left to the disconnect.
    """
    state = registry()
    rids, state.cut_rids = state.cut_rids, []
    if not rids or settings.cancel_endpoint == "off":
        return
    try:
        urls = await _worker_urls(args)
    except Exception as exc:  # the disconnect already aborts; the idle wait checks the outcome
        logger.warning("fastaccum: could not list workers for the cancel endpoint (%r)", exc)
        return
    http = session()
    for url in urls:
        if url not in state.cancel_endpoint:
            state.cancel_endpoint[url] = await _post_ok(http, url, [f"fastaccum-probe-{uuid.uuid4().hex}"])
        if state.cancel_endpoint[url]:
            await _post_ok(http, url, [name for rid in rids for name in vllm_abort_ids(rid)])


async def _post_ok(http: aiohttp.ClientSession, url: str, rids: list[str]) -> bool:
    try:
        async with http.post(f"{url}/abort_requests", json={"request_ids": rids}, timeout=CONTROL_TIMEOUT) as r:
            return r.status < 400
    except (TimeoutError, aiohttp.ClientError):
        return False


async def _wait_until_idle(args: Any, settings: Settings) -> None:
    """Poll each worker's ``/load`` until none runs a request; on timeout, abort server-wide.

    vLLM notices a closed connection asynchronously, and weight updates or offloading must not run
    under live requests.
    """
    vime = modules()
    http = session()
    await wait_until_idle(
        await _worker_urls(args),
        load=lambda url: _load(http, url),
        running=vime.server_control.num_requests_from_load,
        abort_until_idle=vime.server_control.abort_servers_until_idle,
        timeout=settings.idle_timeout,
        poll_interval=settings.idle_poll_interval,
        logger=logger,
    )


async def _load(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(f"{url}/load?include_inflight=true&inflight_limit=100", timeout=CONTROL_TIMEOUT) as r:
        r.raise_for_status()
        return await r.json(content_type=None)


# vime's module-level abort, swapped for request_abort while generate_rollout runs.
_module_abort = ModuleAbort(request_abort)
