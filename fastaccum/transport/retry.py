"""Retries of a request that failed before its first event: which failures qualify, and how long
to wait between attempts.

Before its first event a request has given the caller nothing, so sending it again loses and
duplicates nothing: a refused connection (a server restarting), a connection closed before or
inside the response head (a stale keep-alive connection, a crash), an overloaded or restarting
server's 429, 500, 502, 503 or 504, a body that ended before its first event. Once an event has
arrived, a failure is final: the caller may already hold the prefix, and a second request would
generate a second, different answer. A read timeout is never retried (the server may still hold
the request), nor is anything the server said about the request itself (a 4xx, an error event).
"""

from __future__ import annotations

import logging
import random

from fastaccum.errors import ServerError, ShardError, StreamConnectionError, StreamError, StreamTruncatedError

__all__ = ("RETRY_STATUSES", "FIRST_DELAY_S", "DEFAULT_RETRY_MAX_DELAY_S", "Retry", "check_retries", "LOG")

# Statuses that say "not now" rather than "not this request": rate limited, the server's own
# failure, a proxy's bad gateway, unavailable (SGLang answers 503 while it starts or is paused
# unhealthy), a gateway's timeout.
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
# The first wait; each later one doubles, up to the maximum.
FIRST_DELAY_S = 0.1
# slime's own client waits 1 s between its attempts.
DEFAULT_RETRY_MAX_DELAY_S = 1.0
# Waits are spread by this share either way, so a fleet of streams that failed together does not
# come back in step.
_JITTER = 0.25

LOG = logging.getLogger("fastaccum.transport")


def check_retries(retries: object, max_delay_s: object) -> None:
    """The checks of ``retries`` and ``retry_max_delay_s``, for every place that takes them."""
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be an int >= 0, not {retries!r}")
    if isinstance(max_delay_s, bool) or not isinstance(max_delay_s, (int, float)) or not max_delay_s >= 0:
        raise ValueError(f"retry_max_delay_s must be seconds >= 0, not {max_delay_s!r}")


class Retry:
    """One request's retries: at most ``retries`` more attempts, the waits doubling from
    ``FIRST_DELAY_S`` to ``max_delay_s``."""

    def __init__(self, retries: int, max_delay_s: float) -> None:
        check_retries(retries, max_delay_s)
        self.retries = retries
        self.max_delay_s = float(max_delay_s)
        self.done = 0  # retries made so far
        self.waited_s = 0.0

    def delay(self, exc: StreamError, events: int) -> float | None:
        """The wait before the next attempt after ``exc``, or None: ``exc`` is final (it came
        after ``events`` > 0, it is not a transient failure, or no retry is left)."""
        if self.done >= self.retries or events or not transient(exc):
            return None
        base = min(self.max_delay_s, FIRST_DELAY_S * 2.0**self.done)
        wait = base * random.uniform(1.0 - _JITTER, 1.0 + _JITTER)
        self.done += 1
        self.waited_s += wait
        return wait

    def gave_up(self, exc: StreamError) -> StreamError:
        """``exc``, its message saying how long it was retried (unchanged when it never was)."""
        if self.done and exc.args and isinstance(exc.args[0], str):
            exc.args = (f"{exc.args[0]} (after {self.done} retries over {self.waited_s:.1f} s)", *exc.args[1:])
        return exc


def transient(exc: StreamError) -> bool:
    """A failure that says nothing about the request itself: sending it again may succeed."""
    if isinstance(exc, ShardError):
        return False  # the shard's own Client retried inside it; a dead actor is the caller's to replace
    if isinstance(exc, StreamConnectionError):
        return True
    if isinstance(exc, ServerError):
        return exc.event_index is None and exc.status in RETRY_STATUSES  # a status, not an error event
    return isinstance(exc, StreamTruncatedError)  # the body ended before its first event
