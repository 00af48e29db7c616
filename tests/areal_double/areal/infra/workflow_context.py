"""The shared aiohttp session of a workflow thread, made per event loop."""

from __future__ import annotations

import asyncio
import weakref

import aiohttp

from areal.infra.utils.http import DEFAULT_REQUEST_TIMEOUT, get_default_connector

_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()


async def get_aiohttp_session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        timeout = aiohttp.ClientTimeout(total=DEFAULT_REQUEST_TIMEOUT)
        session = _sessions[loop] = aiohttp.ClientSession(timeout=timeout, connector=get_default_connector())
    return session


async def close_aiohttp_session() -> None:
    """Not AReaL's: its task runner closes the session with its loop; the double's callers do."""
    session = _sessions.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()
