"""Stand-in for miles.utils.async_utils: one background event loop on a daemon thread, made on
first use (``get_async_loop()`` returns its holder, ``.loop`` the loop), on which ``run`` blocks
the caller until a coroutine is done."""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class AsyncLoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="miles-double-loop", daemon=True).start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_holder: AsyncLoopThread | None = None
_guard = threading.Lock()


def get_async_loop() -> AsyncLoopThread:
    global _holder
    with _guard:
        if _holder is None:
            _holder = AsyncLoopThread()
        return _holder


def run(coro: Any) -> Any:
    return get_async_loop().run(coro)
