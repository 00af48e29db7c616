"""Stand-in for slime.utils.http_utils: one shared httpx client made by
``init_http_client``, a ``post`` that retries, a ``get`` that does not, and the engine count."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

log = logging.getLogger(__name__)

POST_ATTEMPTS = 60
POST_RETRY_DELAY_SECONDS = 1.0

# Set once by init_http_client; the tests close and clear it between environments.
_http_client: httpx.AsyncClient | None = None


def get_rollout_num_engines(args: Any) -> int:
    """Engines serving rollouts: ``rollout_num_engines`` when set, else GPUs per engine division.

    Zero when neither is configured (the semaphore then has no capacity).
    """
    configured = getattr(args, "rollout_num_engines", None)
    if configured is not None:
        return int(configured)
    total_gpus = getattr(args, "rollout_num_gpus", None) or 0
    if total_gpus <= 0:
        return 0
    gpus_each = getattr(args, "rollout_num_gpus_per_engine", None) or 1
    return max(total_gpus // gpus_each, 1)


def _new_client(connection_limit: int) -> httpx.AsyncClient:
    # No timeout (generations are long), no proxies from the environment, HTTP/1.1.
    return httpx.AsyncClient(
        limits=httpx.Limits(max_connections=connection_limit),
        timeout=httpx.Timeout(None),
        trust_env=False,
    )


def init_http_client(args: Any) -> None:
    """Create the shared client on the first call; skipped when there are no engines."""
    global _http_client
    if _http_client is not None:
        return
    engines = get_rollout_num_engines(args)
    if engines > 0:
        _http_client = _new_client(args.sglang_server_concurrency * engines)


def _decode_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode()  # a non-JSON answer comes back as text


async def _post_once(url: str, payload: Any, headers: dict | None) -> Any:
    reply = await _http_client.post(url, json=payload or {}, headers=headers)
    reply.raise_for_status()
    return _decode_body(await reply.aread())


async def post(url: str, payload: Any, max_retries: int = POST_ATTEMPTS, headers: dict | None = None) -> Any:
    """POST ``payload`` as JSON. Every failure is retried after a 1 s pause; the last one raises."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return await _post_once(url, payload, headers)
        except Exception:
            if attempt >= max_retries:
                raise
            log.info("POST %s: attempt %d of %d failed, will retry", url, attempt, max_retries)
        await asyncio.sleep(POST_RETRY_DELAY_SECONDS)


async def get(url: str) -> Any:
    """GET and decode JSON; a failure raises at once."""
    reply = await _http_client.get(url)
    reply.raise_for_status()
    body = await reply.aread()
    return json.loads(body)
