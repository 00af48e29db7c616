"""Double of slime's server_control: the server-wide abort that repeats until engines are idle."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slime.utils.http_utils import get, post

logger = logging.getLogger(__name__)

ABORT_RETRY_INTERVAL_SECONDS = 3


def num_requests_from_load(load: Any) -> int:
    """Requests in a /v1/loads answer: lists summed, a ``loads`` key followed, totals preferred."""
    if isinstance(load, list):
        return sum(num_requests_from_load(part) for part in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return num_requests_from_load(load["loads"])
    for key in ("num_reqs", "num_total_reqs", "total_reqs"):
        if isinstance(load.get(key), int):
            return load[key]
    running = load.get("num_running_reqs", load.get("total_running_reqs"))
    waiting = load.get("num_waiting_reqs", load.get("total_waiting_reqs"))
    return sum(v for v in (running, waiting) if isinstance(v, int))


async def abort_server_until_idle(url: str, retry_interval: float = ABORT_RETRY_INTERVAL_SECONDS) -> None:
    while True:
        try:
            await post(f"{url}/abort_request", {"abort_all": True})
        except Exception as exc:
            logger.warning("abort_all failed for %s: %s", url, exc)
        try:
            remaining = num_requests_from_load(await get(f"{url}/v1/loads?include=core"))
        except Exception as exc:  # no load answer: one abort is all slime does
            logger.warning("load query failed for %s: %s", url, exc)
            return
        if remaining <= 0:
            return
        await asyncio.sleep(retry_interval)


async def abort_servers_until_idle(urls: list[str]) -> None:
    await asyncio.gather(*(abort_server_until_idle(url) for url in urls))
