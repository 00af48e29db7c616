"""Per-event-loop state: the streams a rollout abort must stop, and the connection pools (one
``Client`` per router URL, one aiohttp session), with the one place that opens a stream."""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Any

import aiohttp

from fastaccum.slime._modules import modules
from fastaccum.slime._settings import Settings, router_url
from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT, GenerateStream
from fastaccum.transport.client import Client
from fastaccum.transport.consumer import StreamConsumer

__all__ = ("Registry", "registry", "session", "open_stream", "close_session")


@dataclasses.dataclass(eq=False)
class Registry:
    """What ``request_abort`` must stop, for one event loop (fully-async runs a second loop)."""

    request_streams: set[StreamConsumer] = dataclasses.field(default_factory=set)
    server_generations: int = 0
    session: aiohttp.ClientSession | None = None  # control calls, and streams on the aiohttp transport
    clients: dict[str, Client] = dataclasses.field(default_factory=dict)  # one pool per router URL
    mode_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Registry] = weakref.WeakKeyDictionary()


def registry() -> Registry:
    """This event loop's registry."""
    loop = asyncio.get_running_loop()
    found = _registries.get(loop)
    if found is None:
        found = _registries[loop] = Registry()
    return found


def session(args: Any) -> aiohttp.ClientSession:
    """This loop's aiohttp session (sessions are loop-bound), sized like slime's own client."""
    state = registry()
    if state.session is None or state.session.closed:
        # aiohttp's default of 100 connections would throttle slime's semaphore; trust_env=False:
        # rollout traffic is internal and must never go through a proxy.
        connector = aiohttp.TCPConnector(limit=_connection_limit(args))
        state.session = aiohttp.ClientSession(connector=connector, timeout=STREAM_TIMEOUT, trust_env=False)
    return state.session


def _client(args: Any) -> Client:
    """This loop's ``Client`` for the router (its connections are loop-bound). A second router URL
    gets a pool of its own, so streams still running on the first are never cut."""
    clients = registry().clients
    url = router_url(args)
    client = clients.get(url)
    if client is None or client.closed:
        # Client never reads proxy settings: rollout traffic is internal.
        client = clients[url] = Client(url, max_connections=_connection_limit(args))
    return client


def _connection_limit(args: Any) -> int:
    engines = int(modules().http_utils.get_rollout_num_engines(args))
    limit = int(getattr(args, "sglang_server_concurrency", 0) or 0) * engines
    return limit if limit > 0 else 100


def open_stream(
    args: Any,
    settings: Settings,
    payload: dict[str, Any],
    *,
    expert_shape: tuple[int, int] | None,
    headers: dict[str, str] | None,
) -> StreamConsumer:
    """The stream for one call, on the configured transport (both keep one contract)."""
    if settings.transport == "client":
        return _client(args).stream(
            payload,
            mode=settings.stream_mode,
            expert_shape=expert_shape,
            max_event_bytes=settings.max_event_bytes,
            headers=headers,
            read_timeout=settings.read_timeout,
            coalesce_ms=settings.coalesce_ms,  # per call: the setting may change between calls
            abort_drain_s=settings.abort_drain_s,
        )
    return GenerateStream(
        session(args),
        router_url(args) + "/generate",
        payload,
        mode=settings.stream_mode,
        expert_shape=expert_shape,
        max_event_bytes=settings.max_event_bytes,
        headers=headers,
        read_timeout=settings.read_timeout,
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
