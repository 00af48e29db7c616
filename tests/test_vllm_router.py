"""Through the real vllm-router (PyPI, vime's router): two emulator workers in vLLM's dialect behind it.

Streams pass through unchanged; vllm-router takes vLLM's abort path but hands the abort to one
worker of its choosing, so the drain names the request to every worker the router lists, and it
reaches the one that holds it; a cut reaches the worker as a disconnect. Both twins.
tests/live/test_vllm_router.py does the same in front of a real vLLM server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import subprocess
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import client_helpers
import numpy as np
import pytest
from client_helpers import PROMPT, run
from router_helpers import VLLM_ROUTER_AVAILABLE, start_vllm_router

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import Emulator

pytestmark = pytest.mark.skipif(
    not VLLM_ROUTER_AVAILABLE, reason="vllm-router is not installed (the test extra has it)"
)

wait_until = functools.partial(client_helpers.wait_until, timeout=30.0)


@contextlib.asynccontextmanager
async def routed(*workers: Emulator) -> AsyncIterator[str]:
    """vllm-router in front of the running emulators (started from a thread: they answer its
    health checks on this loop meanwhile)."""
    proc, url = await asyncio.to_thread(start_vllm_router, [w.url for w in workers])
    try:
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, 10)
        if proc.poll() is None:
            proc.kill()


def body(rid: str, n: int) -> dict[str, Any]:
    return {"token_ids": PROMPT, "request_id": rid, "sampling_params": {"max_tokens": n, "logprobs": 0}}


def holder(workers: tuple[Emulator, ...], rid: str) -> Emulator:
    (found,) = [w for w in workers if f"generate-tokens-{rid}" in w.stats.written]
    return found


def assert_truth(emulator: Emulator, rid: str, result: StreamResult) -> None:
    gen = emulator.expected(rid, len(result), prompt_tokens=len(PROMPT))
    assert np.array_equal(result.token_ids, np.asarray(gen.token_ids, dtype=np.int32))
    assert result.logprobs is not None and np.array_equal(result.logprobs, np.asarray(gen.logprobs))


def test_streams_pass_through_unchanged(twin: ModuleType) -> None:
    workers = (Emulator(dialect="vllm", token_rate=5000), Emulator(dialect="vllm", token_rate=5000))

    async def main() -> list[StreamResult]:
        async with workers[0], workers[1], routed(*workers) as url:
            async with fastaccum.Client(url, dialect="vllm") as client:
                return list(await asyncio.gather(*(client.stream(body(f"pt-{i}", 60)).run() for i in range(4))))

    results = run(main())
    assert {id(holder(workers, f"pt-{i}")) for i in range(4)} == {id(w) for w in workers}  # both used
    for i, result in enumerate(results):
        assert result.finish_reason == {"type": "length"} and len(result) == 60
        assert_truth(holder(workers, f"pt-{i}"), f"pt-{i}", result)


def test_the_drain_reaches_the_worker_that_holds_each_request(twin: ModuleType) -> None:
    workers = (Emulator(dialect="vllm", token_rate=500), Emulator(dialect="vllm", token_rate=500))

    async def main() -> list[tuple[StreamResult, Any]]:
        async with workers[0], workers[1], routed(*workers) as url:
            async with fastaccum.Client(url, dialect="vllm", abort_drain_s=60) as client:
                streams = [client.stream(body(f"dr-{i}", 100_000)) for i in range(4)]
                results = await client_helpers.abort_together(streams, tokens=5)
                await wait_until(lambda: all(w.running == 0 for w in workers))
                return [(r, s.abort_error) for s, r in zip(streams, results)]

    done = run(main())
    for i, (result, error) in enumerate(done):
        assert error is None
        assert result.aborted and result.replay_complete and result.finish_reason == {"type": "abort"}
        assert_truth(holder(workers, f"dr-{i}"), f"dr-{i}", result)
    assert sum(w.stats.aborted for w in workers) == 4
    assert sum(w.stats.disconnects for w in workers) == 0
    assert {id(holder(workers, f"dr-{i}")) for i in range(4)} == {id(w) for w in workers}


def test_a_cut_reaches_the_worker_as_a_disconnect(twin: ModuleType) -> None:
    workers = (Emulator(dialect="vllm", token_rate=500), Emulator(dialect="vllm", token_rate=500))

    async def main() -> StreamResult:
        async with workers[0], workers[1], routed(*workers) as url:
            async with fastaccum.Client(url, dialect="vllm", abort_drain_s=None) as client:
                result = await client_helpers.abort_after(client.stream(body("cut-1", 100_000)), 10)
            await wait_until(lambda: sum(w.stats.disconnects for w in workers) == 1)
            await wait_until(lambda: all(w.running == 0 for w in workers))
            return result

    result = run(main())
    assert result.aborted and not result.replay_complete
    assert_truth(holder(workers, "cut-1"), "cut-1", result)
