"""AReaL's HTTP helper: a request tried ``max_retries`` times (at least once), 1 s apart, any
failure (a connection error, a timeout, an error status) counted, then one RuntimeError."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

DEFAULT_RETRIES = 1
DEFAULT_REQUEST_TIMEOUT = 3600


def get_default_connector() -> aiohttp.TCPConnector:
    return aiohttp.TCPConnector(limit=0, use_dns_cache=False, force_close=True)


async def arequest_with_retry(
    addr: str,
    endpoint: str,
    payload: dict[str, Any] | None = None,
    session: aiohttp.ClientSession | None = None,
    method: str = "POST",
    max_retries: int | None = None,
    timeout: float | None = None,
    retry_delay: float = 1.0,
) -> Any:
    timeout = DEFAULT_REQUEST_TIMEOUT if timeout is None else timeout
    attempts = max_retries or DEFAULT_RETRIES
    url = f"http://{addr}{endpoint}"
    limit = aiohttp.ClientTimeout(total=timeout, sock_connect=timeout, connect=timeout)
    own = session is None
    http = aiohttp.ClientSession(timeout=limit, connector=get_default_connector()) if own else session
    last: BaseException | None = None
    try:
        for attempt in range(attempts):
            try:
                call = http.get(url, timeout=limit) if method == "GET" else http.post(url, json=payload, timeout=limit)
                async with call as response:
                    response.raise_for_status()
                    kind = response.content_type or ""
                    if kind == "application/json":
                        return await response.json()
                    return await (response.text() if kind.startswith("text/") else response.read())
            except (TimeoutError, aiohttp.ClientError) as exc:
                last = exc
                if attempt < attempts - 1:
                    await asyncio.sleep(retry_delay)
    finally:
        if own:
            await http.close()
    raise RuntimeError(
        f"Failed after {attempts} retries each. Payload: {payload}. Addr: {addr}. "
        f"Endpoint: {endpoint}. Last error: {last!r}"
    )
