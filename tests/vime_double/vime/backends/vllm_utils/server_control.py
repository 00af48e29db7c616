"""Double of vime.backends.vllm_utils.server_control, per line (vime._line): on the request-abort
line ``POST /abort_requests {}`` then ``GET /load`` until idle; on the stock line one sweep of
``POST /abort_requests {}`` (``abort_inflight_requests``); the pause line has no such module."""

import asyncio

from vime._line import LINE
from vime.utils.http_utils import get, post

if LINE == "pause":
    raise ModuleNotFoundError(
        "No module named 'vime.backends.vllm_utils.server_control'", name="vime.backends.vllm_utils.server_control"
    )


async def abort_inflight_requests(urls):
    """One sweep: every worker's in-flight requests aborted; failures are the caller's to retry."""
    await asyncio.gather(*(post(f"{url.rstrip('/')}/abort_requests", {}, max_retries=3) for url in urls))


RETRY_INTERVAL = 0.05  # vime waits 3 s between sweeps


def _num_requests_from_load(load):
    if isinstance(load, list):
        return sum(_num_requests_from_load(item) for item in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return _num_requests_from_load(load["loads"])
    counts = [load.get("server_load", 0) if isinstance(load.get("server_load", 0), int) else 0]
    for key in ("inflight", "queues"):
        if key in load:
            counts.append(_num_requests_from_load(load[key]))
    for key in ("num_requests", "num_reqs"):
        if isinstance(load.get(key), int):
            counts.append(load[key])
    return max(counts)


async def _abort_server_until_idle(url, timeout=180.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await post(f"{url.rstrip('/')}/abort_requests", {}, max_retries=1, timeout=10)
        if _num_requests_from_load(await get(f"{url.rstrip('/')}/load?include_inflight=true&inflight_limit=100")) <= 0:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"Timed out draining vLLM server {url}")
        await asyncio.sleep(RETRY_INTERVAL)


async def _abort_servers_until_idle(urls, **kwargs):
    results = await asyncio.gather(*(_abort_server_until_idle(url) for url in urls), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise RuntimeError(f"Failed to abort all vLLM servers to a confirmed idle state: {failures}") from failures[0]


if LINE == "request-abort":  # what 2b83ea20 offers; 052693a8 has abort_inflight_requests alone
    num_requests_from_load = _num_requests_from_load
    abort_server_until_idle = _abort_server_until_idle
    abort_servers_until_idle = _abort_servers_until_idle
    del abort_inflight_requests
