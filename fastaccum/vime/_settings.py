"""The adapter's settings: vime's own flags and the ``fastaccum_*`` keys of ``--custom-config-path``."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from fastaccum.transport.client import DEFAULT_COALESCE_MS

__all__ = ("Settings", "router_url")


@dataclasses.dataclass(frozen=True)
class Settings:
    """vime's flags plus the ``fastaccum_*`` keys (docs/vime.md), all read with ``getattr`` defaults:
    vime sets every YAML key of ``--custom-config-path`` onto ``args``, as slime does.

    vLLM's stream is always incremental and vLLM has no per-request abort the stream could read on
    after (its abort is the disconnect), so there is no stream mode and no drain to configure.
    """

    abort_mode: str  # "request" (cut by disconnect) | "server" (vime's server-wide abort ends it)
    coalesce_ms: float
    idle_timeout: float
    idle_poll_interval: float
    read_timeout: float | None
    max_event_bytes: int | None
    cancel_endpoint: str  # "auto" (probe once per worker) | "off"

    @classmethod
    def from_args(cls, args: Any) -> Settings:
        abort_mode = getattr(args, "fastaccum_abort_mode", None) or "request"
        if abort_mode not in ("request", "server"):
            raise ValueError(f"fastaccum_abort_mode must be 'request' or 'server', not {abort_mode!r}")
        transport = getattr(args, "fastaccum_transport", None) or "client"
        if transport != "client":
            raise ValueError(f"fastaccum_transport must be 'client' for vime (vLLM's stream), not {transport!r}")
        raw_window = getattr(args, "fastaccum_coalesce_ms", None)
        try:
            coalesce_ms = DEFAULT_COALESCE_MS if raw_window is None else float(raw_window)
        except (TypeError, ValueError):
            coalesce_ms = math.nan
        if not coalesce_ms >= 0:
            raise ValueError(f"fastaccum_coalesce_ms must be a number >= 0, not {raw_window!r}")
        cancel = getattr(args, "fastaccum_cancel_endpoint", None) or "auto"
        if cancel not in ("auto", "off"):
            raise ValueError(f"fastaccum_cancel_endpoint must be 'auto' or 'off', not {cancel!r}")
        read_timeout = getattr(args, "fastaccum_read_timeout", None)
        max_event_bytes = getattr(args, "fastaccum_max_event_bytes", None)
        return cls(
            abort_mode=abort_mode,
            coalesce_ms=coalesce_ms,
            idle_timeout=float(getattr(args, "fastaccum_idle_timeout", 30.0)),
            idle_poll_interval=float(getattr(args, "fastaccum_idle_poll_interval", 0.5)),
            read_timeout=None if read_timeout is None else float(read_timeout),
            max_event_bytes=None if max_event_bytes is None else int(max_event_bytes),
            cancel_endpoint=cancel,
        )


def router_url(args: Any) -> str:
    return f"http://{args.vllm_router_ip}:{args.vllm_router_port}"
