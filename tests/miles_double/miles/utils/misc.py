"""Stand-in for miles.utils.misc: ``load_function`` (not cached: Miles imports on every call),
``SingletonMeta``, ``as_completed_async`` and the agent plugin's abort hook. Our own code."""

from __future__ import annotations

import asyncio
import importlib
import logging
from collections.abc import AsyncIterator, Iterable
from typing import Any

log = logging.getLogger(__name__)


def load_function(path: str | None) -> Any:
    """``package.module.name`` resolved to the object itself (a class stays a class); None for
    no path."""
    if not path:
        return None
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


class SingletonMeta(type):
    """Each class is built once; later calls return that instance, whatever their arguments."""

    _instances: dict[type, Any] = {}

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls not in SingletonMeta._instances:
            SingletonMeta._instances[cls] = super().__call__(*args, **kwargs)
        return SingletonMeta._instances[cls]

    @staticmethod
    def clear_all_instances() -> None:
        SingletonMeta._instances.clear()


async def as_completed_async(tasks: Iterable[asyncio.Future]) -> AsyncIterator[Any]:
    """Each task's result as it completes."""
    for next_done in asyncio.as_completed(list(tasks)):
        yield await next_done


async def call_agent_abort_hook(args: Any) -> None:
    """An agent plugin (``--custom-agent-function-path pkg.mod.fn``) may offer ``pkg.mod.abort``:
    awaited with ``args`` when a rollout is aborted, so its trials stop sending requests. A
    plugin without one is left alone; a hook that fails is logged, not raised."""
    path = getattr(args, "custom_agent_function_path", None)
    module = path.rpartition(".")[0] if path else ""
    if not module:
        return
    try:
        hook = load_function(f"{module}.abort")
    except (AttributeError, ModuleNotFoundError):
        return
    try:
        await hook(args)
    except Exception as exc:
        log.warning("agent abort hook %s.abort failed: %s", module, exc)
