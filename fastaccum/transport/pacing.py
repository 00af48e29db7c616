"""Read coalescing for ``fastaccum.Client``: when a stream pauses reading, and one timer that
resumes every paused stream of one window length.

After a body read a stream may stop reading for its window (``pause_reading()``), so the kernel
gathers the events that arrive meanwhile into one read. A read costs far more than an event
(docs/client.md has the figures), but a pause costs two ``epoll_ctl`` calls and pays only when a
window gathers several events. No byte waits longer than the window, and ``abort()`` first reads
what the kernel holds, so the aborted prefix holds every event that had arrived.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

__all__ = ("DEFAULT_COALESCE_MS", "BIG_READ_BYTES", "ReadPacer", "Resumer")

# docs/client.md, "Read coalescing": at 100 events/s per stream a 100 ms window gathers about ten
# events per read, and client CPU per token falls to a third of reading each event (a fifth of
# aiohttp's); the terminal event waits at most this long, a few tokens' decode time.
DEFAULT_COALESCE_MS = 100.0
# A read at least this large means the socket holds more: read on at once (a routed-experts line).
BIG_READ_BYTES = 65536
# Windows that end within this fraction of a window of the first due are resumed with it.
_RESUME_SLACK = 0.02


class ReadPacer:
    """Whether a stream pauses after a read: only while its windows pay off."""

    def __init__(self, coalesce_ms: float, read_timeout: float | None = None) -> None:
        window = max(0.0, coalesce_ms) / 1000.0
        if read_timeout is not None:
            window = min(window, read_timeout / 2)  # a window never looks like a silent server
        self.window = window  # seconds
        self._paused_last = False  # the read before this one was followed by a window

    def should_pause(self, nbytes: int, events: int, gap: float) -> bool:
        """After a read of ``nbytes`` that completed ``events``, ``gap`` seconds after the one
        before it."""
        if not self.window or nbytes >= BIG_READ_BYTES:
            return False
        # Keep pausing while a window gathers more than one event; after a window that gathered
        # one at most, pause again only once reads come faster than the window.
        pause = events > 1 if self._paused_last else gap < self.window
        self._paused_last = pause
        return pause


class Resumer:
    """Resumes paused streams when their window ends, with one loop timer for all of them.

    A timer per pause would cost a handle and a push and pop on the loop's heap (ten Python-level
    comparisons each with a thousand streams) per read; windows of one length end in the order
    they began, so a queue and a single timer do. Streams due within ``_RESUME_SLACK`` of the
    first are resumed together, a hair early rather than with a timer each.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, window: float) -> None:
        self._loop = loop
        self._window = window
        self._queue: collections.deque[tuple[float, Callable[[], None]]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, resume: Callable[[], None]) -> None:
        """Call ``resume`` when the window that starts now ends."""
        due = self._loop.time() + self._window
        self._queue.append((due, resume))
        if self._timer is None:
            self._timer = self._loop.call_at(due, self._fire)

    def _fire(self) -> None:
        queue = self._queue
        until = self._loop.time() + self._window * _RESUME_SLACK
        while queue and queue[0][0] <= until:
            queue.popleft()[1]()
        self._timer = self._loop.call_at(queue[0][0], self._fire) if queue else None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._queue.clear()
