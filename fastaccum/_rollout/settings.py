"""The settings every adapter reads alike: the ``fastaccum_*`` keys of ``--custom-config-path``,
which slime and vime set onto ``args`` (unknown CLI flags are dropped, so these keys are the
adapters' only settings channel). The framework sets whatever the file holds, so a key fastaccum
does not know is refused, naming the known ones: a misspelt key would otherwise be ignored."""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any, ClassVar

from fastaccum.errors import SettingsError
from fastaccum.transport.client import DEFAULT_ABORT_DRAIN_S, DEFAULT_COALESCE_MS, DEFAULT_RETRY_MAX_DELAY_S

__all__ = ("RolloutSettings", "DEFAULT_RETRIES", "stream_mode_mismatch")

# slime's own client tries a failed POST 60 times, 1 s apart: a server restart survives that.
DEFAULT_RETRIES = 60


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """What the skeleton reads; a framework's own settings extend it (docs/slime.md, docs/vime.md)
    and add their keys to ``KEYS``."""

    KEYS: ClassVar[tuple[str, ...]] = (
        "fastaccum_abort_mode",
        "fastaccum_transport",
        "fastaccum_coalesce_ms",
        "fastaccum_abort_drain_s",
        "fastaccum_idle_timeout",
        "fastaccum_idle_poll_interval",
        "fastaccum_read_timeout",
        "fastaccum_max_event_bytes",
        "fastaccum_retries",
        "fastaccum_retry_max_delay_s",
        "fastaccum_shards",
    )

    abort_mode: str  # "request" | "server"
    transport: str  # "client" | "aiohttp"
    coalesce_ms: float
    abort_drain_s: float | None  # None: a request-level abort cuts (closes the connection)
    idle_timeout: float
    idle_poll_interval: float
    read_timeout: float | None
    max_event_bytes: int | None
    retries: int = DEFAULT_RETRIES  # a request that failed before its first event is sent again
    retry_max_delay_s: float = DEFAULT_RETRY_MAX_DELAY_S
    # Streams read in Ray actors (fastaccum.ray): this many shards, or this many on each node.
    shards: int | None = None
    shards_per_node: int | None = None

    @classmethod
    def read(cls, args: Any, *, transports: tuple[str, ...], why: str = "") -> dict[str, Any]:
        """The common fields from ``args``, checked, after refusing a ``fastaccum_*`` key that
        ``cls.KEYS`` does not name; ``transports``: those the framework streams on (``why`` says
        why, when it is fewer)."""
        check_keys(args, cls.KEYS)
        abort_mode = getattr(args, "fastaccum_abort_mode", None) or "request"
        if abort_mode not in ("request", "server"):
            raise SettingsError(f"fastaccum_abort_mode must be 'request' or 'server', not {abort_mode!r}")
        transport = getattr(args, "fastaccum_transport", None) or "client"
        if transport not in transports:
            allowed = " or ".join(repr(t) for t in transports)
            raise SettingsError(f"fastaccum_transport must be {allowed}{why}, not {transport!r}")
        raw_window = getattr(args, "fastaccum_coalesce_ms", None)
        try:
            coalesce_ms = DEFAULT_COALESCE_MS if raw_window is None else float(raw_window)
        except (TypeError, ValueError):
            coalesce_ms = math.nan
        if not coalesce_ms >= 0:
            raise SettingsError(f"fastaccum_coalesce_ms must be a number >= 0, not {raw_window!r}")
        raw_drain = getattr(args, "fastaccum_abort_drain_s", DEFAULT_ABORT_DRAIN_S)
        try:
            abort_drain_s = None if raw_drain is None else float(raw_drain)
        except (TypeError, ValueError):
            abort_drain_s = math.nan
        if abort_drain_s is not None and not abort_drain_s >= 0:
            raise SettingsError(f"fastaccum_abort_drain_s must be seconds >= 0 or null, not {raw_drain!r}")
        read_timeout = getattr(args, "fastaccum_read_timeout", None)
        max_event_bytes = getattr(args, "fastaccum_max_event_bytes", None)
        shards, per_node = _shards(args, transport)
        retries = getattr(args, "fastaccum_retries", None)
        retries = DEFAULT_RETRIES if retries is None else retries
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise SettingsError(f"fastaccum_retries must be a count >= 0 (0: never retry), not {retries!r}")
        raw_delay = getattr(args, "fastaccum_retry_max_delay_s", None)
        try:
            retry_max_delay_s = DEFAULT_RETRY_MAX_DELAY_S if raw_delay is None else float(raw_delay)
        except (TypeError, ValueError):
            retry_max_delay_s = math.nan
        if not retry_max_delay_s >= 0:
            raise SettingsError(f"fastaccum_retry_max_delay_s must be seconds >= 0, not {raw_delay!r}")
        return {
            "abort_mode": abort_mode,
            "transport": transport,
            "coalesce_ms": coalesce_ms,
            "abort_drain_s": abort_drain_s,
            "idle_timeout": float(getattr(args, "fastaccum_idle_timeout", 30.0)),
            "idle_poll_interval": float(getattr(args, "fastaccum_idle_poll_interval", 0.5)),
            "read_timeout": None if read_timeout is None else float(read_timeout),
            "max_event_bytes": None if max_event_bytes is None else int(max_event_bytes),
            "retries": retries,
            "retry_max_delay_s": retry_max_delay_s,
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
            raise SettingsError(f"fastaccum_shards must be a count of Ray actors (0: none), not {raw!r}")
        if raw and transport != "client":
            message = f"fastaccum_shards reads Client streams: set fastaccum_transport to 'client', not {transport!r}"
            raise SettingsError(message)
        return raw or None, None
    if getattr(args, "use_distributed_post", False) and transport == "client":
        return None, max(1, int(getattr(args, "num_gpus_per_node", None) or 1))
    return None, None


def check_keys(args: Any, known: tuple[str, ...]) -> None:
    """Refuse a ``fastaccum_*`` attribute of ``args`` that no setting reads, naming the nearest
    known key and listing them all."""
    names = vars(args) if hasattr(args, "__dict__") else {}
    unknown = sorted(name for name in names if name.startswith("fastaccum_") and name not in known)
    if not unknown:
        return
    hints = []
    for name in unknown:
        near = difflib.get_close_matches(name, known, n=1)
        hints.append(f"{name!r} (did you mean {near[0]!r}?)" if near else repr(name))
    raise SettingsError(
        f"unknown fastaccum setting{'s' if len(unknown) > 1 else ''} {', '.join(hints)}; "
        f"the known keys are {', '.join(sorted(known))}"
    )


def stream_mode_mismatch(framework: str, incremental: bool, where: str, server: bool) -> ValueError:
    """A server that streams in the other mode than the framework's flag says (slime and Miles
    hand ``--sglang-*`` flags to the servers they start), naming both flags, before anything is
    sent: otherwise every call would fail at its first event."""
    return ValueError(
        f"stream mode mismatch: {framework} runs with --sglang-incremental-streaming-output "
        f"{'on' if incremental else 'off'}, but the SGLang server at {where} reports "
        f"--incremental-streaming-output {'on' if server else 'off'}; make them agree "
        f"(or set fastaccum_stream_mode: auto)"
    )
