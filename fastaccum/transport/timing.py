"""What ``fastaccum.Client`` measures of one request: first byte, first token, the gaps between
reads that completed events, and the ``StreamTiming`` built from them."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import time
from collections.abc import Callable
from typing import Protocol

from fastaccum.errors import StreamTimeoutError
from fastaccum.result import StreamTiming

__all__ = ("GapHistogram", "ReadTimeout", "RequestClock", "now", "timeout_error")

now = time.monotonic

# Inter-event gap histogram: 16 log-spaced buckets per doubling from 1 us (about 4.4% wide), up
# to 2**30 us (18 minutes), O(1) memory and one log2 per read that completed events.
_BUCKETS_PER_DOUBLING = 16
_BUCKETS = 30 * _BUCKETS_PER_DOUBLING


class GapHistogram:
    """Gaps between event reads, in log-spaced buckets: p50 and p99 within a bucket's width, the
    largest gap exact."""

    def __init__(self) -> None:
        self.counts = [0] * _BUCKETS
        self.count = 0
        self.largest = 0.0

    def record(self, gap: float) -> None:
        if gap > self.largest:
            self.largest = gap
        bucket = int(math.log2(gap * 1e6) * _BUCKETS_PER_DOUBLING) if gap > 1e-6 else 0
        self.counts[min(bucket, _BUCKETS - 1)] += 1
        self.count += 1

    def quantiles(self) -> tuple[float | None, float | None]:
        """p50 and p99: the middle of the bucket holding each rank (one pass in C)."""
        count = self.count
        if not count:
            return None, None
        running = list(itertools.accumulate(self.counts))
        p50, p99 = (
            # The bucket's geometric middle, but never beyond the largest gap seen.
            min(2.0 ** ((bisect.bisect_left(running, rank) + 0.5) / _BUCKETS_PER_DOUBLING) * 1e-6, self.largest)
            for rank in (max(1, math.ceil(0.5 * count)), max(1, math.ceil(0.99 * count)))
        )
        return p50, p99


class Progress(Protocol):
    @property
    def tokens(self) -> int: ...


class RequestClock:
    """Monotonic marks of one request (0.0: not yet), from the moment it was written."""

    def __init__(self) -> None:
        self.sent = 0.0
        self.ended = 0.0
        self.first_byte = 0.0
        self.first_token = 0.0
        self.last_read = 0.0  # also what the read timeout measures silence from
        self.last_event = 0.0
        self.reads = 0
        self.gaps = GapHistogram()

    def request_sent(self) -> None:
        self.sent = self.last_read = now()

    def read(self) -> float:
        """A read arrived: its time."""
        stamp = self.last_read = now()
        self.reads += 1
        if not self.first_byte:
            self.first_byte = stamp
        return stamp

    def events_read(self, stamp: float, progress: Progress) -> None:
        """The read at ``stamp`` completed events of the stream whose token count is
        ``progress.tokens`` (a property of the core, asked only until the first token)."""
        if self.last_event:
            self.gaps.record(stamp - self.last_event)
        self.last_event = stamp
        if not self.first_token and progress.tokens:
            self.first_token = stamp

    def end(self) -> None:
        if not self.ended and self.sent:
            self.ended = now()

    def timing(self, *, tokens: int, bytes_received: int, events: int, retries: int = 0) -> StreamTiming | None:
        """What was measured so far (None before the request was written)."""
        if not self.sent:
            return None
        end = self.ended or now()
        rate = None
        if self.first_token and self.last_event > self.sent:
            rate = tokens / (self.last_event - self.sent)
        gap_p50, gap_p99 = self.gaps.quantiles()
        return StreamTiming(
            first_byte_s=self.first_byte - self.sent if self.first_byte else None,
            first_token_s=self.first_token - self.sent if self.first_token else None,
            duration_s=end - self.sent,
            gap_p50_s=gap_p50,
            gap_p99_s=gap_p99,
            gap_max_s=self.gaps.largest if self.gaps.count else None,
            tokens_per_s=rate,
            tokens=tokens,
            bytes=bytes_received,
            events=events,
            reads=self.reads,
            retries=retries,
        )


def timeout_error(url: str, seconds: float | None, status: int | None, events: int) -> StreamTimeoutError:
    """The error of a read timeout: before the response head, or after ``events`` events."""
    if status is None:
        return StreamTimeoutError(f"no response from {url} within {seconds} s")
    return StreamTimeoutError(f"no bytes from {url} for {seconds} s after {events} events", event_index=events)


class ReadTimeout:
    """Calls ``expired()`` once no byte has arrived for ``seconds`` (None: never).

    One timer per silence, not per read: when it fires early because reads came meanwhile, it is
    set again for what is left of the silence since the last read."""

    def __init__(self, clock: RequestClock, seconds: float | None, expired: Callable[[], None]) -> None:
        self.seconds = seconds
        self._clock = clock
        self._expired = expired
        self._timer: asyncio.TimerHandle | None = None

    def arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self.seconds is not None:
            self._timer = loop.call_later(self.seconds, self._check, loop)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        assert self.seconds is not None
        idle = now() - self._clock.last_read
        if idle < self.seconds * 0.999:  # timer granularity: a timer may fire a hair early
            self._timer = loop.call_later(self.seconds - idle, self._check, loop)
            return
        self._timer = None
        self._expired()
