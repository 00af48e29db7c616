"""Asking the servers which stream mode they use, before the first request: a mismatch fails there,
not at the first event."""

from __future__ import annotations

from typing import Any

import aiohttp

from fastaccum._rollout.settings import stream_mode_mismatch
from fastaccum.slime._pools import CONTROL_TIMEOUT, FRAMEWORK, POOLS
from fastaccum.slime._settings import Settings

__all__ = ("check_server_mode", "checked_modes", "CONTROL_TIMEOUT")


checked_modes: set[tuple[str, str]] = set()  # (router url, mode) pairs the servers agreed with


async def check_server_mode(args: Any, settings: Settings, session: aiohttp.ClientSession) -> None:
    """Fail before the first request when the servers stream in the other mode.

    Servers that do not expose ``/server_info`` are not checked here; then the first event that
    contradicts the configured mode fails in the core (strict length validation).
    """
    if settings.stream_mode == "auto" or not settings.check_server_mode:
        return
    key = (FRAMEWORK.router_url(args), settings.stream_mode)
    if key in checked_modes:
        return
    async with POOLS.registry().mode_lock:
        if key in checked_modes:
            return
        configured = settings.stream_mode == "incremental"
        for where, info in await _server_infos(args, session):
            server = info.get("incremental_streaming_output")
            if isinstance(server, bool) and server != configured:
                raise stream_mode_mismatch("slime", configured, where, server)
        checked_modes.add(key)


async def _server_infos(args: Any, session: aiohttp.ClientSession) -> list[tuple[str, dict[str, Any]]]:
    external = getattr(args, "rollout_external_engine_infos", None) or []
    infos = [
        (str(entry.get("url", "external engine")), entry["server_info"])
        for entry in external
        if isinstance(entry, dict) and isinstance(entry.get("server_info"), dict)
    ]
    if any("incremental_streaming_output" in info for _, info in infos):
        return infos
    router = FRAMEWORK.router_url(args)
    workers = await _get_json(session, f"{router}/workers")
    urls = [w["url"] for w in (workers or {}).get("workers", []) if isinstance(w, dict) and "url" in w]
    found = []
    for url in urls or [router]:
        for endpoint in ("/server_info", "/get_server_info"):
            info = await _get_json(session, url + endpoint)
            if isinstance(info, dict):
                found.append((url, info))
                break
    return found


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=CONTROL_TIMEOUT) as response:
            if response.status >= 400:
                return None
            return await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None
