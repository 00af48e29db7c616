"""vime's record for the skeleton (what differs from slime: its modules, router, load endpoint and
the server-wide abort this vime line has), its per-loop pools, and the one place that opens a
stream."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp

from fastaccum._core.dialects import vllm_abort_ids
from fastaccum._rollout import CONTROL_TIMEOUT, Framework, Pools, RolloutSettings
from fastaccum.vime._modules import modules
from fastaccum.vime._settings import Settings

__all__ = ("Vime", "FRAMEWORK", "POOLS", "CONTROL_TIMEOUT")


class Vime(Framework):
    """vllm-project/vime on vLLM, each line as probed (fastaccum.vime._modules)."""

    async def worker_urls(self, args: Any) -> list[str]:
        """The router's workers: ``GET /workers``, else vllm-router's older ``GET /list_workers``."""
        try:
            return await super().worker_urls(args)
        except Exception:
            response = await modules().http_utils.get(f"{self.router_url(args)}/list_workers")
            return [str(url) for url in response["urls"]]

    async def load(self, args: Any, url: str) -> Any:
        http = POOLS.session(args)
        async with http.get(f"{url}/load?include_inflight=true&inflight_limit=100", timeout=CONTROL_TIMEOUT) as r:
            r.raise_for_status()
            return await r.json(content_type=None)

    def running(self, load: Any) -> int:
        """Requests a worker's ``/load`` counts: vime's own reading where this line has it, else
        vLLM's ``server_load`` (requests running and queued)."""
        server_control = modules().server_control
        if server_control is not None and hasattr(server_control, "num_requests_from_load"):
            return int(server_control.num_requests_from_load(load))
        return int(load.get("server_load", 0)) if isinstance(load, dict) else 0

    async def server_abort(self, args: Any, urls: list[str]) -> None:
        """End every request on these workers, the way this vime line does, and return when they
        are idle."""
        vime = modules()
        if vime.server_abort == "until-idle":
            await vime.server_control.abort_servers_until_idle(urls)
            return
        settings = Settings.from_args(args)
        deadline = asyncio.get_running_loop().time() + settings.idle_timeout
        if vime.server_abort == "pause":
            # pause?mode=abort ends every running request with its abort chunk; resume lets the
            # next rollout in. vime's own abort does the same.
            await asyncio.gather(*(_post(args, f"{url.rstrip('/')}/pause?mode=abort") for url in urls))
            try:
                await self._idle(args, urls, deadline, settings.idle_poll_interval)
            finally:
                await asyncio.gather(*(_post(args, f"{url.rstrip('/')}/resume") for url in urls))
            return
        again = vime.server_control.abort_inflight_requests
        await again(urls)
        await self._idle(args, urls, deadline, settings.idle_poll_interval, again=again)

    async def after_cut(self, args: Any, settings: RolloutSettings) -> None:
        await _cancel_cut_requests(args, settings)

    async def _idle(self, args: Any, urls: list[str], deadline: float, interval: float, again: Any = None) -> None:
        """Poll ``/load`` until no worker runs a request (``again``: the abort to repeat meanwhile,
        as vime re-sweeps); past the deadline, a ``TimeoutError`` names the busy workers."""
        busy = list(urls)
        while busy:
            loads = await asyncio.gather(*(self.load(args, url) for url in busy))
            busy = [url for url, answer in zip(busy, loads) if self.running(answer) > 0]
            if not busy:
                return
            if asyncio.get_running_loop().time() >= deadline:
                raise TimeoutError(f"vLLM workers {busy} still run requests after the server-wide abort")
            if again is not None:
                await again(busy)
            await asyncio.sleep(interval)


async def _cancel_cut_requests(args: Any, settings: RolloutSettings) -> None:
    """Name the cut requests to each worker's cancel endpoint, where it has one.

    vLLM aborts a request when its connection closes; the RLHF dev API's ``POST /abort_requests``
    (``{"request_ids": [...]}``; served only under ``VLLM_SERVER_DEV_MODE=1`` or ``--tokens-only``)
    ends them at once instead of at the next check. Whether a worker has it is probed once with a
    request id nobody holds (never with ``{}``, which aborts every request); a worker without it
    answers 404 and is left to the disconnect.
    """
    state = POOLS.registry()
    rids, state.cut_rids = state.cut_rids, []
    if not rids or (isinstance(settings, Settings) and settings.cancel_endpoint == "off"):
        return
    try:
        urls = await FRAMEWORK.worker_urls(args)
    except Exception as exc:  # the disconnect already aborts; the idle wait checks the outcome
        FRAMEWORK.logger.warning("fastaccum: could not list workers for the cancel endpoint (%r)", exc)
        return
    http = POOLS.session(args)
    for url in urls:
        if url not in state.cancel_endpoint:
            state.cancel_endpoint[url] = await _post_ok(http, url, [f"fastaccum-probe-{uuid.uuid4().hex}"])
        if state.cancel_endpoint[url]:
            await _post_ok(http, url, [name for rid in rids for name in vllm_abort_ids(rid)])


async def _post_ok(http: aiohttp.ClientSession, url: str, rids: list[str]) -> bool:
    try:
        async with http.post(f"{url}/abort_requests", json={"request_ids": rids}, timeout=CONTROL_TIMEOUT) as r:
            return r.status < 400
    except (TimeoutError, aiohttp.ClientError):
        return False


async def _post(args: Any, url: str) -> None:
    async with POOLS.session(args).post(url, json={}, timeout=CONTROL_TIMEOUT) as r:
        r.raise_for_status()


FRAMEWORK = Vime("vime", "vllm", "vllm", "/inference/v1/generate", modules, Settings.from_args)
POOLS = Pools(FRAMEWORK)
