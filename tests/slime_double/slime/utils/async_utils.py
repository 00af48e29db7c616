"""Double of slime.utils.async_utils: coroutines run on one background event loop thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

_loop: asyncio.AbstractEventLoop | None = None
_lock = threading.Lock()


def get_async_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, daemon=True, name="slime-double-loop").start()
        return _loop


def run(coro: Any) -> Any:
    """Block until ``coro`` finishes on the background loop; its exception is raised here."""
    return asyncio.run_coroutine_threadsafe(coro, get_async_loop()).result()
