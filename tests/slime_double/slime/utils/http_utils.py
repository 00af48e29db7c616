"""Double of slime.utils.http_utils: one shared httpx client, a retrying post, a plain get."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import httpx

logger = logging.getLogger(__name__)

_http_client: httpx.AsyncClient | None = None


def get_rollout_num_engines(args: Any) -> int:
    explicit = getattr(args, "rollout_num_engines", None)
    if explicit is not None:
        return int(explicit)
    gpus = getattr(args, "rollout_num_gpus", None) or 0
    per_engine = getattr(args, "rollout_num_gpus_per_engine", None) or 1
    return max(1, gpus // per_engine) if gpus > 0 else 0


def init_http_client(args: Any) -> None:
    """Create the client once; nothing when there are no engines (as slime)."""
    global _http_client
    engines = get_rollout_num_engines(args)
    if engines <= 0 or _http_client is not None:
        return
    _http_client = httpx.AsyncClient(
        limits=httpx.Limits(max_connections=args.sglang_server_concurrency * engines),
        timeout=httpx.Timeout(None),
        trust_env=False,
    )


async def post(url: str, payload: Any, max_retries: int = 60, headers: dict | None = None) -> Any:
    """POST JSON; any failure is retried after 1 s, up to ``max_retries`` attempts."""
    for attempt in range(1, max_retries + 1):
        try:
            response = await _http_client.post(url, json=payload or {}, headers=headers)
            response.raise_for_status()
            body = await response.aread()
            try:
                return json.loads(body)
            except json.JSONDecodeError:
                return body.decode()
        except Exception:
            if attempt >= max_retries:
                raise
            logger.info("post %s failed (attempt %d/%d), retrying", url, attempt, max_retries)
            await asyncio.sleep(1)


async def get(url: str) -> Any:
    """GET JSON; no retry."""
    response = await _http_client.get(url)
    response.raise_for_status()
    return json.loads(await response.aread())
