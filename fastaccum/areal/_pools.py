"""AReaL's record for the skeleton: its servers addressed one by one (no router), its retry and
timeout settings read from AReaL's own config, and the per-loop pools of one engine."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any

from fastaccum._rollout import Framework, Pools, RolloutSettings
from fastaccum._rollout.pools import RolloutStream
from fastaccum.areal._modules import modules

__all__ = ("AReaL", "EnginePools", "pools_of", "settings_of")

# AReaL's own connector has no connection limit (aiohttp's limit=0); a Client needs one, so it
# takes AReaL's cap for its httpx clients (HTTPX_MAX_CONNECTIONS): no stream ever waits for one.
_CONNECTIONS = 4096


def settings_of(config: Any) -> RolloutSettings:
    """The skeleton's settings for an engine: its ``fastaccum_*`` attributes, if a config carries
    any, else the defaults; AReaL's ``request_retries`` (attempts, at least one, as its
    ``arequest_with_retry`` counts them) and ``request_timeout`` (seconds) where no ``fastaccum_*``
    key says otherwise."""
    fields = RolloutSettings.read(config, transports=("client",), why=" (AReaL's engine streams on fastaccum.Client)")
    if getattr(config, "fastaccum_retries", None) is None:
        fields["retries"] = max(int(getattr(config, "request_retries", 1) or 1), 1) - 1
    if getattr(config, "fastaccum_read_timeout", None) is None:
        timeout = getattr(config, "request_timeout", None)
        # AReaL bounds a whole non-streaming request; a stream is bounded by its silence, so an
        # answer longer than request_timeout that keeps arriving is never cut.
        fields["read_timeout"] = float(timeout) if timeout else None
    return RolloutSettings(**fields)


def base_url(address: str) -> str:
    """``http://host:port`` for one of AReaL's server addresses (``host:port``, IPv6 bracketed)."""
    return address if "://" in address else f"http://{address}"


class AReaL(Framework):
    """AReaL on SGLang: one engine's servers, each addressed directly by the address AReaL picked
    for the request (``args`` is that address: AReaL has no router in front of its servers)."""

    def __init__(self, config: Any) -> None:
        super().__init__("areal", "sglang", "sglang", "/generate", modules, lambda _: settings_of(config))
        self.config = config

    def router_url(self, args: Any) -> str:
        return base_url(str(args))

    def connection_limit(self, args: Any) -> int:
        return _CONNECTIONS


class EnginePools:
    """One engine's pools (one ``Client`` per server and event loop) and its settings, read once."""

    def __init__(self, config: Any) -> None:
        self.framework = AReaL(config)
        self.pools = Pools(self.framework)
        self.settings = settings_of(config)
        self._cleanups: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()

    def open(self, address: str, payload: dict[str, Any]) -> RolloutStream:
        """One streaming request to ``address``; its loop's connections close with the loop where
        AReaL can say so (a workflow thread's loop: AsyncTaskRunner's cleanup)."""
        loop = asyncio.get_running_loop()
        register = modules().register_loop_cleanup
        if loop not in self._cleanups and register is not None:
            register(self.pools.close_session, loop=loop)
            self._cleanups.add(loop)
        return self.pools.open_stream(address, self.settings, payload, expert_shape=None, headers=None)

    async def close(self) -> None:
        """This loop's connections."""
        await self.pools.close_session()


_POOLS: weakref.WeakKeyDictionary[Any, EnginePools] = weakref.WeakKeyDictionary()


def pools_of(engine: Any) -> EnginePools:
    """The pools of one AReaL engine (the inner ``RemoteInfEngine``), made on first use."""
    found = _POOLS.get(engine)
    if found is None:
        found = _POOLS[engine] = EnginePools(engine.config)
    return found
