"""Stand-in for slime.utils.async_utils: coroutines are run on one long-lived event loop that
lives on a daemon thread, so every rollout of a process shares the same loop."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class _LoopThread:
    """Starts the loop thread on first use and keeps it for the life of the process."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None:
                fresh = asyncio.new_event_loop()
                worker = threading.Thread(target=fresh.run_forever, name="slime-double-loop", daemon=True)
                worker.start()
                self._loop = fresh
            return self._loop


_LOOP_THREAD = _LoopThread()


def get_async_loop() -> asyncio.AbstractEventLoop:
    return _LOOP_THREAD.loop()


def run(coro: Any) -> Any:
    """Block the caller until ``coro`` is done on the shared loop; re-raises its exception."""
    future = asyncio.run_coroutine_threadsafe(coro, get_async_loop())
    return future.result()
