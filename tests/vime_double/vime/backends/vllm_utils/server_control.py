"""Double of vime.backends.vllm_utils.server_control: POST /abort_requests {} then GET /load until idle."""

import asyncio

from vime.utils.http_utils import get, post

RETRY_INTERVAL = 0.05  # vime waits 3 s between sweeps


def num_requests_from_load(load):
    if isinstance(load, list):
        return sum(num_requests_from_load(item) for item in load)
    if not isinstance(load, dict):
        return 0
    if "loads" in load:
        return num_requests_from_load(load["loads"])
    counts = [load.get("server_load", 0) if isinstance(load.get("server_load", 0), int) else 0]
    for key in ("inflight", "queues"):
        if key in load:
            counts.append(num_requests_from_load(load[key]))
    for key in ("num_requests", "num_reqs"):
        if isinstance(load.get(key), int):
            counts.append(load[key])
    return max(counts)


async def abort_server_until_idle(url, timeout=180.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        await post(f"{url.rstrip('/')}/abort_requests", {}, max_retries=1, timeout=10)
        if num_requests_from_load(await get(f"{url.rstrip('/')}/load?include_inflight=true&inflight_limit=100")) <= 0:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"Timed out draining vLLM server {url}")
        await asyncio.sleep(RETRY_INTERVAL)


async def abort_servers_until_idle(urls, **kwargs):
    results = await asyncio.gather(*(abort_server_until_idle(url) for url in urls), return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    if failures:
        raise RuntimeError(f"Failed to abort all vLLM servers to a confirmed idle state: {failures}") from failures[0]
