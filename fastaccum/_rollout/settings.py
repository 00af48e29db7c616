"""The settings every adapter reads alike: the ``fastaccum_*`` keys of ``--custom-config-path``,
which slime and vime set onto ``args`` (unknown CLI flags are dropped, so these keys are the
adapters' only settings channel); all are read with ``getattr`` defaults."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fastaccum.transport.client import DEFAULT_ABORT_DRAIN_S, DEFAULT_COALESCE_MS

__all__ = ("RolloutSettings",)


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """What the skeleton reads; a framework's own settings extend it (docs/slime.md, docs/vime.md)."""

    abort_mode: str  # "request" | "server"
    transport: str  # "client" | "aiohttp"
    coalesce_ms: float
    abort_drain_s: float | None  # None: a request-level abort cuts (closes the connection)
    idle_timeout: float
    idle_poll_interval: float
    read_timeout: float | None
    max_event_bytes: int | None
    # Streams read in Ray actors (fastaccum.ray): this many shards, or this many on each node.
    shards: int | None = None
    shards_per_node: int | None = None

    @staticmethod
    def read(args: Any, *, transports: tuple[str, ...], why: str = "") -> dict[str, Any]:
        """The common fields from ``args``, checked; ``transports``: those the framework streams on
        (``why`` says why, when it is fewer)."""
        abort_mode = getattr(args, "fastaccum_abort_mode", None) or "request"
        if abort_mode not in ("request", "server"):
            raise ValueError(f"fastaccum_abort_mode must be 'request' or 'server', not {abort_mode!r}")
        transport = getattr(args, "fastaccum_transport", None) or "client"
        if transport not in transports:
            allowed = " or ".join(repr(t) for t in transports)
            raise ValueError(f"fastaccum_transport must be {allowed}{why}, not {transport!r}")
        raw_window = getattr(args, "fastaccum_coalesce_ms", None)
        try:
            coalesce_ms = DEFAULT_COALESCE_MS if raw_window is None else float(raw_window)
        except (TypeError, ValueError):
            coalesce_ms = math.nan
        if not coalesce_ms >= 0:
            raise ValueError(f"fastaccum_coalesce_ms must be a number >= 0, not {raw_window!r}")
        raw_drain = getattr(args, "fastaccum_abort_drain_s", DEFAULT_ABORT_DRAIN_S)
        try:
            abort_drain_s = None if raw_drain is None else float(raw_drain)
        except (TypeError, ValueError):
            abort_drain_s = math.nan
        if abort_drain_s is not None and not abort_drain_s >= 0:
            raise ValueError(f"fastaccum_abort_drain_s must be seconds >= 0 or null, not {raw_drain!r}")
        read_timeout = getattr(args, "fastaccum_read_timeout", None)
        max_event_bytes = getattr(args, "fastaccum_max_event_bytes", None)
        shards, per_node = _shards(args, transport)
        return {
            "abort_mode": abort_mode,
            "transport": transport,
            "coalesce_ms": coalesce_ms,
            "abort_drain_s": abort_drain_s,
            "idle_timeout": float(getattr(args, "fastaccum_idle_timeout", 30.0)),
            "idle_poll_interval": float(getattr(args, "fastaccum_idle_poll_interval", 0.5)),
            "read_timeout": None if read_timeout is None else float(read_timeout),
            "max_event_bytes": None if max_event_bytes is None else int(max_event_bytes),
            "shards": shards,
            "shards_per_node": per_node,
        }

    @property
    def sharded(self) -> bool:
        """Streams are read in Ray actors (fastaccum.ray), not in this loop."""
        return self.shards is not None or self.shards_per_node is not None

    @property
    def drains(self) -> bool:
        """A request-level abort reads on to the terminal abort event (Client's drain abort), so
        the call keeps what only that event carries (top-p rows, routed experts)."""
        return self.transport == "client" and self.abort_drain_s is not None


def _shards(args: Any, transport: str) -> tuple[int | None, int | None]:
    """(shards, shards_per_node): ``fastaccum_shards`` (0: none), else the framework's
    ``--use-distributed-post``, which places ``num_gpus_per_node`` actors on each node for its
    POSTs; the streams take the same placement. Only ``Client`` streams run in shards, so with
    the aiohttp transport that flag keeps meaning the framework's POSTs alone."""
    raw = getattr(args, "fastaccum_shards", None)
    if raw is not None:
        if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
            raise ValueError(f"fastaccum_shards must be a count of Ray actors (0: none), not {raw!r}")
        if raw and transport != "client":
            message = f"fastaccum_shards reads Client streams: set fastaccum_transport to 'client', not {transport!r}"
            raise ValueError(message)
        return raw or None, None
    if getattr(args, "use_distributed_post", False) and transport == "client":
        return None, max(1, int(getattr(args, "num_gpus_per_node", None) or 1))
    return None, None
