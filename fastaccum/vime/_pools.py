"""Per-event-loop state: the streams a rollout abort must stop, the rids it cut, the connection
pools (one vLLM-dialect ``Client`` per router URL, one aiohttp session for control calls), with
the one place that opens a stream."""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Any

import aiohttp

from fastaccum.transport.client import Client, ClientStream
from fastaccum.vime._modules import modules
from fastaccum.vime._settings import Settings, router_url

__all__ = ("Registry", "registry", "session", "open_stream", "close_session", "CONTROL_TIMEOUT")

# Control calls (/workers, /load, /abort_requests) answer at once on a live server.
CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=10)


@dataclasses.dataclass(eq=False)
class Registry:
    """What ``request_abort`` must stop and clean up, for one event loop."""

    request_streams: set[ClientStream] = dataclasses.field(default_factory=set)
    server_generations: int = 0
    cut_rids: list[str] = dataclasses.field(default_factory=list)  # cut by disconnect, for the cancel endpoint
    cancel_endpoint: dict[str, bool] = dataclasses.field(default_factory=dict)  # worker url -> has one
    session: aiohttp.ClientSession | None = None
    clients: dict[str, Client] = dataclasses.field(default_factory=dict)  # one pool per router URL


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Registry] = weakref.WeakKeyDictionary()


def registry() -> Registry:
    """This event loop's registry."""
    loop = asyncio.get_running_loop()
    found = _registries.get(loop)
    if found is None:
        found = _registries[loop] = Registry()
    return found


def session() -> aiohttp.ClientSession:
    """This loop's aiohttp session for control calls (never through a proxy: internal traffic)."""
    state = registry()
    if state.session is None or state.session.closed:
        state.session = aiohttp.ClientSession(timeout=CONTROL_TIMEOUT, trust_env=False)
    return state.session


def _client(args: Any) -> Client:
    """This loop's ``Client`` for the router; a second router URL gets a pool of its own."""
    clients = registry().clients
    url = router_url(args)
    client = clients.get(url)
    if client is None or client.closed:
        client = clients[url] = Client(url, max_connections=_connection_limit(args), dialect="vllm")
    return client


def _connection_limit(args: Any) -> int:
    engines = int(modules().http_utils.get_rollout_num_engines(args))
    limit = int(getattr(args, "vllm_server_concurrency", 0) or 0) * engines
    return limit if limit > 0 else 100


def open_stream(
    args: Any,
    settings: Settings,
    payload: dict[str, Any],
    *,
    expert_shape: tuple[int, int] | None,
    headers: dict[str, str] | None,
) -> ClientStream:
    """The stream for one call: vLLM's /inference/v1/generate through ``fastaccum.Client``. vLLM
    aborts a request when its connection closes, so an abort cuts (abort_drain_s=None)."""
    return _client(args).stream(
        payload,
        expert_shape=expert_shape,
        max_event_bytes=settings.max_event_bytes,
        headers=headers,
        read_timeout=settings.read_timeout,
        coalesce_ms=settings.coalesce_ms,
        abort_drain_s=None,
        dialect="vllm",
    )


async def close_session() -> None:
    """Close this loop's connections (tests, and custom loops that end)."""
    state = _registries.get(asyncio.get_running_loop())
    if state is None:
        return
    clients, state.clients = state.clients, {}
    for client in clients.values():
        await client.close()
    if state.session is not None:
        await state.session.close()
        state.session = None
