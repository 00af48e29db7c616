"""Per-event-loop state of one adapter: the streams a rollout abort must stop, the requests it
cut, the connection pools (one ``Client`` per router URL, one aiohttp session), and the one place
that opens a stream."""

from __future__ import annotations

import asyncio
import dataclasses
import weakref
from typing import Any, Protocol

import aiohttp

from fastaccum._rollout.framework import Framework
from fastaccum._rollout.settings import RolloutSettings
from fastaccum._rollout.stats import RolloutStats
from fastaccum.result import StreamResult
from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT, GenerateStream
from fastaccum.transport.client import Client

__all__ = ("Registry", "Pools", "RolloutStream")


class RolloutStream(Protocol):
    """What the skeleton uses of a stream: a ``StreamConsumer`` (Client, aiohttp) or a stream read
    in a Ray actor (``fastaccum.ray.ShardStream``)."""

    @property
    def aborted(self) -> bool: ...

    @property
    def tokens(self) -> int: ...

    async def run(self) -> StreamResult: ...

    def abort(self) -> None: ...

    def kept(self) -> StreamResult: ...


class Pool(Protocol):
    """A router's pool of streams: ``Client``, or ``fastaccum.ray.ShardedClient``."""

    @property
    def closed(self) -> bool: ...

    def stream(self, *args: Any, **options: Any) -> RolloutStream: ...

    async def close(self) -> None: ...


@dataclasses.dataclass(eq=False)
class Registry:
    """What ``request_abort`` must stop and clean up, for one event loop (fully-async runs a
    second loop)."""

    request_streams: set[RolloutStream] = dataclasses.field(default_factory=set)
    server_generations: int = 0
    cut_rids: list[str] = dataclasses.field(default_factory=list)  # cut, not drained: the server may not know yet
    cancel_endpoint: dict[str, bool] = dataclasses.field(default_factory=dict)  # worker url -> has one
    session: aiohttp.ClientSession | None = None  # control calls, and streams on the aiohttp transport
    clients: dict[str, Pool] = dataclasses.field(default_factory=dict)  # one pool per router URL (and shards)
    mode_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


class Pools:
    """One adapter's registries, one per event loop."""

    def __init__(self, framework: Framework) -> None:
        self.framework = framework
        self.stats = RolloutStats()  # every loop's calls, for the rollout's log line and metrics
        self._registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Registry] = weakref.WeakKeyDictionary()

    def registry(self) -> Registry:
        """This event loop's registry."""
        loop = asyncio.get_running_loop()
        found = self._registries.get(loop)
        if found is None:
            found = self._registries[loop] = Registry()
        return found

    def registries(self) -> list[Registry]:
        return list(self._registries.values())

    def session(self, args: Any) -> aiohttp.ClientSession:
        """This loop's aiohttp session (sessions are loop-bound), sized like the framework's client."""
        state = self.registry()
        if state.session is None or state.session.closed:
            # aiohttp's default of 100 connections would throttle the framework's semaphore;
            # trust_env=False: rollout traffic is internal and must never go through a proxy.
            connector = aiohttp.TCPConnector(limit=self._limit(args))
            state.session = aiohttp.ClientSession(connector=connector, timeout=STREAM_TIMEOUT, trust_env=False)
        return state.session

    def client(self, args: Any, settings: RolloutSettings | None = None) -> Pool:
        """This loop's ``Client`` for the router (its connections are loop-bound), or with shards
        in the settings its ``ShardedClient``. A second router URL gets a pool of its own, so
        streams still running on the first are never cut."""
        clients = self.registry().clients
        url = self.framework.router_url(args)
        sharded = settings is not None and settings.sharded
        key = f"{url} (shards)" if sharded else url
        found = clients.get(key)
        if found is not None and not found.closed:
            return found
        # Client never reads proxy settings: rollout traffic is internal.
        options: dict[str, Any] = {"max_connections": self._limit(args), "dialect": self.framework.dialect}
        client: Pool
        if sharded:
            assert settings is not None
            from fastaccum.ray import ShardedClient  # Ray is an optional extra, loaded when asked for

            client = ShardedClient(url, shards=settings.shards, per_node=settings.shards_per_node, **options)
        else:
            client = Client(url, **options)
        clients[key] = client
        return client

    def _limit(self, args: Any) -> int:
        limit = self.framework.connection_limit(args)
        return limit if limit > 0 else 100

    def open_stream(
        self,
        args: Any,
        settings: RolloutSettings,
        payload: dict[str, Any],
        *,
        expert_shape: tuple[int, int] | None,
        headers: dict[str, str] | None,
    ) -> RolloutStream:
        """The stream for one call, on the configured transport (all keep one contract), in the
        settings' stream mode where the framework has one."""
        self.framework.announce(settings)
        mode = str(getattr(settings, "stream_mode", "auto"))
        if settings.transport == "client":
            return self.client(args, settings).stream(
                payload,
                mode=mode,
                expert_shape=expert_shape,
                max_event_bytes=settings.max_event_bytes,
                headers=headers,
                read_timeout=settings.read_timeout,
                coalesce_ms=settings.coalesce_ms,  # per call: the setting may change between calls
                abort_drain_s=settings.abort_drain_s,
                dialect=self.framework.dialect,
                retries=settings.retries,
                retry_max_delay_s=settings.retry_max_delay_s,
            )
        return GenerateStream(
            self.session(args),
            self.framework.router_url(args) + self.framework.generate_path,
            payload,
            mode=mode,
            expert_shape=expert_shape,
            max_event_bytes=settings.max_event_bytes,
            headers=headers,
            read_timeout=settings.read_timeout,
            retries=settings.retries,
            retry_max_delay_s=settings.retry_max_delay_s,
        )

    async def close_session(self) -> None:
        """Close this loop's connections (tests, and custom loops that end)."""
        state = self._registries.get(asyncio.get_running_loop())
        if state is None:
            return
        clients, state.clients = state.clients, {}
        for client in clients.values():
            await client.close()
        if state.session is not None:
            await state.session.close()
            state.session = None
