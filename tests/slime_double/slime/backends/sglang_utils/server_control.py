"""Stand-in for slime's server_control: the server-wide
abort that is repeated per worker until its load says idle, and the load reader it relies on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from slime.utils.http_utils import get, post

log = logging.getLogger(__name__)

IDLE_RECHECK_SECONDS = 3.0

# Keys a /v1/loads entry may carry: a precomputed total wins; otherwise running + waiting,
# each under either of its spellings.
_TOTAL_KEYS = ("num_reqs", "num_total_reqs", "total_reqs")
_PART_KEYS = (
    ("num_running_reqs", "total_running_reqs"),
    ("num_waiting_reqs", "total_waiting_reqs"),
)


def _first_present(entry: dict, names: tuple[str, ...]) -> Any:
    for name in names:
        if name in entry:
            return entry[name]
    return None


def _entry_count(entry: dict) -> int:
    for name in _TOTAL_KEYS:
        total = entry.get(name)
        if isinstance(total, int):
            return total
    parts = (_first_present(entry, names) for names in _PART_KEYS)
    return sum(part for part in parts if isinstance(part, int))


def num_requests_from_load(load: Any) -> int:
    """Requests a ``/v1/loads`` answer reports. Lists are summed, a ``loads`` wrapper is unwrapped,
    and anything that is not a dict counts as nothing."""
    count = 0
    todo = [load]
    while todo:
        item = todo.pop()
        if isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, dict):
            if "loads" in item:
                todo.append(item["loads"])
            else:
                count += _entry_count(item)
    return count


async def _send_abort_all(worker: str) -> None:
    try:
        await post(worker + "/abort_request", {"abort_all": True})
    except Exception as exc:
        log.warning("abort_all to %s failed: %r", worker, exc)


async def _requests_on(worker: str) -> int | None:
    """The worker's request count, or None when its load cannot be read."""
    try:
        answer = await get(worker + "/v1/loads?include=core")
    except Exception as exc:
        log.warning("reading the load of %s failed: %r", worker, exc)
        return None
    return num_requests_from_load(answer)


async def _quiesce(worker: str) -> None:
    # Abort, then look at the load; repeat every few seconds while work remains. Without a
    # readable load there is nothing to wait on, so one abort is all that happens.
    while True:
        await _send_abort_all(worker)
        left = await _requests_on(worker)
        if left is None or left <= 0:
            return
        await asyncio.sleep(IDLE_RECHECK_SECONDS)


async def abort_servers_until_idle(urls: list[str]) -> None:
    """Abort everything on every worker in ``urls`` and return once all of them are idle."""
    if urls:
        await asyncio.gather(*[_quiesce(worker) for worker in urls])
