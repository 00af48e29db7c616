"""Callbacks run when an event loop closes (AReaL's task runner closes its clients so)."""

from __future__ import annotations

import asyncio
import inspect
import weakref
from typing import Any

_registry: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]] = weakref.WeakKeyDictionary()


def register_loop_cleanup(callback: Any, *, loop: asyncio.AbstractEventLoop | None = None) -> None:
    _registry.setdefault(loop or asyncio.get_running_loop(), []).append(callback)


def run_until_closed(main: Any) -> Any:
    """Not AReaL's name: a task runner thread's loop, running ``main()`` and then, last registered
    first, every cleanup before it closes."""
    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(main())
    finally:
        for callback in reversed(_registry.pop(loop, [])):
            done = callback()
            if inspect.isawaitable(done):
                loop.run_until_complete(done)
        loop.close()
