"""slime's record for the skeleton (what differs from vime: its modules, router, load endpoint and
server-wide abort), its per-loop pools, and the one place that opens a stream."""

from __future__ import annotations

import asyncio
from typing import Any

from fastaccum._rollout import CONTROL_TIMEOUT, Framework, Pools
from fastaccum.slime._modules import modules
from fastaccum.slime._settings import Settings

__all__ = ("Slime", "FRAMEWORK", "POOLS", "CONTROL_TIMEOUT")


class Slime(Framework):
    """THUDM/slime on SGLang: its router's /generate, SGLang's /v1/loads, slime's server-wide abort."""

    async def server_abort(self, args: Any, urls: list[str]) -> None:
        await modules().server_control.abort_servers_until_idle(urls)

    async def load(self, args: Any, url: str) -> Any:
        # The disconnect-driven abort is asynchronous (~2 s on SGLang 0.5.15), its propagation
        # through slime's router is unverified, and --offload-rollout must not free memory under
        # live requests: the idle wait reads SGLang's own count.
        get = modules().http_utils.get(f"{url}/v1/loads?include=core")
        return await asyncio.wait_for(get, CONTROL_TIMEOUT.total)

    def running(self, load: Any) -> int:
        return int(modules().server_control.num_requests_from_load(load))


FRAMEWORK = Slime("slime", "sglang", "sglang", "/generate", modules, Settings.from_args)
POOLS = Pools(FRAMEWORK)
