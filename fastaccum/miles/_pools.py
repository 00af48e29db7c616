"""Miles' record for the skeleton (what differs from slime and vime: its modules and worker list,
SGLang's ``/v1/loads``, Miles' own server-wide abort, its agent abort hook, its buffering rule),
the per-loop pools, and the servers' stream mode, asked before a rollout sends anything."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from fastaccum._rollout import CONTROL_TIMEOUT, Framework, Pools
from fastaccum._rollout.settings import stream_mode_mismatch
from fastaccum.miles._modules import legacy_modules, modules
from fastaccum.miles._settings import Settings

__all__ = ("Miles", "FRAMEWORK", "LEGACY", "POOLS", "check_stream_mode")


class Miles(Framework):
    """radixark/miles on SGLang, through its router's ``/generate``."""

    # Miles' abort buffers every pending group under --partial-rollout (a group that kept nothing
    # is asked for again from its prompt), so fastaccum's does too.
    buffers_every_group = True

    def __init__(self, rollout_modules: Callable[[], SimpleNamespace]) -> None:
        super().__init__("miles", "sglang", "sglang", "/generate", rollout_modules, Settings.from_args)

    def connection_limit(self, args: Any) -> int:
        """What Miles' ``GenerateState`` lets run at once (and its httpx client holds)."""
        engines = int(getattr(args, "rollout_num_gpus", 0) or 0) // max(int(args.rollout_num_gpus_per_engine or 1), 1)
        return int(getattr(args, "sglang_server_concurrency", 0) or 0) * engines

    async def worker_urls(self, args: Any) -> list[str]:
        """Miles' own list: its router's ``/workers`` (``/list_workers`` on old routers and Miles'
        own router), data-parallel ranks of one engine folded into one address."""
        return list(await self.modules().train.get_worker_urls(args))

    async def load(self, args: Any, url: str) -> Any:
        reading = self.modules().http_utils.get(f"{url}/v1/loads?include=core")
        return await asyncio.wait_for(reading, CONTROL_TIMEOUT.total)

    def running(self, load: Any) -> int:
        """Requests an SGLang ``/v1/loads`` answer counts, running and waiting, over its
        data-parallel ranks (``loads``; one flat entry from servers that answer so)."""
        entries = load.get("loads", [load]) if isinstance(load, dict) else []
        return sum(
            int(entry.get("num_running_reqs", 0)) + int(entry.get("num_waiting_reqs", 0))
            for entry in entries
            if isinstance(entry, dict)
        )

    async def server_abort(self, args: Any, urls: list[str]) -> None:
        """Miles' own abort, ``abort_all`` to each worker through Miles' ``post``, sent again while
        a worker still counts requests, until every one is idle; Miles sends it once and does not
        wait. After ``fastaccum_idle_timeout`` a ``TimeoutError`` names the workers still busy."""
        post = self.modules().http_utils.post
        settings = self.settings(args)
        clock = asyncio.get_running_loop()
        give_up = clock.time() + settings.idle_timeout
        while urls:
            await asyncio.gather(*(post(f"{url}/abort_request", {"abort_all": True}) for url in urls))
            answers = await asyncio.gather(*(self.load(args, url) for url in urls))
            urls = [url for url, answer in zip(urls, answers) if self.running(answer) > 0]
            if urls and clock.time() >= give_up:
                raise TimeoutError(f"SGLang workers {urls} still run requests after abort_all")
            if urls:
                await asyncio.sleep(settings.idle_poll_interval)

    async def before_collecting(self, args: Any) -> None:
        # Miles' abort asks an agent plugin (--custom-agent-function-path) to stop its trials, or
        # they would go on sending requests while their groups are awaited.
        await self.modules().misc.call_agent_abort_hook(args)


FRAMEWORK = Miles(modules)  # the rollout class's: inference_rollout_train.abort is swapped
LEGACY = Miles(legacy_modules)  # MILES_USE_LEGACY_ROLLOUT_V1's: sglang_rollout.abort is swapped
POOLS = Pools(FRAMEWORK)  # one per process for both: the same router, workers and calls


async def check_stream_mode(args: Any, settings: Settings) -> None:
    """Servers that stream in the other mode fail a rollout before it sends anything, naming both
    flags, instead of failing every call at its first event. A worker whose ``/server_info`` does
    not say is not checked here: the core refuses the first event that contradicts the mode."""
    if settings.stream_mode == "auto":
        return
    ours = settings.stream_mode == "incremental"
    for url in await FRAMEWORK.worker_urls(args):
        theirs = (await _server_info(url)).get("incremental_streaming_output")
        if isinstance(theirs, bool) and theirs != ours:
            raise stream_mode_mismatch("Miles", ours, url, theirs)


async def _server_info(url: str) -> dict[str, Any]:
    """A worker's ``/server_info`` (``/get_server_info`` on older SGLang) through Miles' own client;
    an answer that is not there says nothing."""
    get = FRAMEWORK.modules().http_utils.get
    for path in ("/server_info", "/get_server_info"):
        try:
            info = await asyncio.wait_for(get(url + path), CONTROL_TIMEOUT.total)
        except Exception:  # httpx's errors, a timeout, a body that is not JSON: try the next name
            continue
        return info if isinstance(info, dict) else {}
    return {}
