"""The adapter's settings: slime's own flags and the ``fastaccum_*`` keys of ``--custom-config-path``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fastaccum.transport.client import DEFAULT_ABORT_DRAIN_S, DEFAULT_COALESCE_MS

__all__ = ("Settings", "router_url")


@dataclasses.dataclass(frozen=True)
class Settings:
    """slime's flags plus the ``fastaccum_*`` keys of ``--custom-config-path`` (docs/slime.md).

    slime sets every YAML key onto ``args`` and silently drops unknown CLI flags, so these keys are
    the plugin's only settings channel; all are read with ``getattr`` defaults.
    """

    stream_mode: str  # "cumulative" | "incremental" | "auto"
    abort_mode: str  # "request" | "server"
    transport: str  # "client" | "aiohttp"
    coalesce_ms: float
    abort_drain_s: float | None  # None: a request-level abort cuts (closes the connection)
    idle_timeout: float
    idle_poll_interval: float
    read_timeout: float | None
    max_event_bytes: int | None
    check_server_mode: bool

    @classmethod
    def from_args(cls, args: Any) -> Settings:
        incremental = getattr(args, "sglang_incremental_streaming_output", getattr(args, "sglang_stream_output", False))
        mode = getattr(args, "fastaccum_stream_mode", None) or ("incremental" if incremental else "cumulative")
        if mode not in ("cumulative", "incremental", "auto"):
            raise ValueError(f"fastaccum_stream_mode must be 'cumulative', 'incremental' or 'auto', not {mode!r}")
        if mode != "auto" and (mode == "incremental") != bool(incremental):
            raise ValueError(
                f"fastaccum_stream_mode={mode!r} contradicts --sglang-incremental-streaming-output="
                f"{bool(incremental)}; drop the key or set it to 'auto'"
            )
        abort_mode = getattr(args, "fastaccum_abort_mode", None) or "request"
        if abort_mode not in ("request", "server"):
            raise ValueError(f"fastaccum_abort_mode must be 'request' or 'server', not {abort_mode!r}")
        transport = getattr(args, "fastaccum_transport", None) or "client"
        if transport not in ("client", "aiohttp"):
            raise ValueError(f"fastaccum_transport must be 'client' or 'aiohttp', not {transport!r}")
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
        return cls(
            stream_mode=mode,
            abort_mode=abort_mode,
            transport=transport,
            coalesce_ms=coalesce_ms,
            abort_drain_s=abort_drain_s,
            idle_timeout=float(getattr(args, "fastaccum_idle_timeout", 30.0)),
            idle_poll_interval=float(getattr(args, "fastaccum_idle_poll_interval", 0.5)),
            read_timeout=None if read_timeout is None else float(read_timeout),
            max_event_bytes=None if max_event_bytes is None else int(max_event_bytes),
            check_server_mode=bool(getattr(args, "fastaccum_check_server_mode", True)),
        )

    @property
    def drains(self) -> bool:
        """A request-level abort reads on to the terminal abort event (Client's drain abort), so
        the call keeps what only that event carries (top-p rows, routed experts)."""
        return self.transport == "client" and self.abort_drain_s is not None


def router_url(args: Any) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
