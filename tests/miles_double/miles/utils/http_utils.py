"""Stand-in for miles.utils.http_utils: one shared httpx client (``init_http_client``, sized as
Miles sizes it), a ``post`` that tries up to 60 times a second apart, a ``get`` that does not
retry, and the data-parallel suffix folded out of worker URLs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx

log = logging.getLogger(__name__)

_http_client: httpx.AsyncClient | None = None


def init_http_client(args: Any) -> None:
    """The shared client, once, when the rollout has GPUs: ``sglang_server_concurrency`` per
    engine, no timeout."""
    global _http_client
    if not args.rollout_num_gpus or _http_client is not None:
        return
    limit = args.sglang_server_concurrency * args.rollout_num_gpus // args.rollout_num_gpus_per_engine
    _http_client = httpx.AsyncClient(limits=httpx.Limits(max_connections=limit), timeout=httpx.Timeout(None))


def router_worker_base_urls(urls: list[str]) -> list[str]:
    """``url@<rank>`` (a data-parallel rank of one engine) becomes ``url``, each address once."""
    bases: list[str] = []
    for url in urls:
        base, at, rank = url.rpartition("@")
        address = base if at and rank.isdigit() else url
        if address not in bases:
            bases.append(address)
    return bases


async def post(url: str, payload: Any, max_retries: int = 60, action: str = "post", headers: Any = None) -> Any:
    """JSON in, JSON (or text) out; any failure is tried again after a second, the last raised."""
    assert _http_client is not None, "init_http_client() was not called"
    for attempt in range(1, max_retries + 1):
        try:
            reply = await _http_client.post(url, json=payload or {}, headers=headers)
            reply.raise_for_status()
            try:
                return reply.json()
            except ValueError:
                return reply.text
        except Exception:
            if attempt == max_retries:
                raise
            log.info("POST %s failed (attempt %d of %d)", url, attempt, max_retries)
        await asyncio.sleep(1)
    return None


async def get(url: str) -> Any:
    assert _http_client is not None, "init_http_client() was not called"
    reply = await _http_client.get(url)
    reply.raise_for_status()
    return reply.json()
