"""vllm-router (vime's router, PyPI 0.1.17) in front of the live vLLM server and an emulator worker.

Two workers, because what matters is where an abort goes: vllm-router takes vLLM's abort path but
forwards it to one worker of its own choosing, so with one worker it looks right and with two it
misses. The second worker is the emulator in vLLM's dialect (a second real engine does not fit on
two cores beside the first); each test looks at the streams the router gave the live server.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest
from client_helpers import run, wait_until
from live_helpers import MODEL, get_json, in_thread, post_json
from router_helpers import VLLM_ROUTER_AVAILABLE, start_vllm_router

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import Emulator

pytestmark = [
    pytest.mark.live_vllm,
    pytest.mark.skipif(not VLLM_ROUTER_AVAILABLE, reason="vllm-router is not installed (the test extra has it)"),
]

GENERATE = "/inference/v1/generate"
PROMPT = [21, 22, 23, 24, 25, 26, 27, 28]


def body(rid: str, n: int) -> dict[str, Any]:
    return {
        "model": MODEL,
        "token_ids": PROMPT,
        "request_id": rid,
        "sampling_params": {"max_tokens": n, "temperature": 0, "logprobs": 1},
    }


@contextlib.asynccontextmanager
async def routed(live: Any) -> AsyncIterator[tuple[str, Emulator]]:
    emulator = Emulator(dialect="vllm", token_rate=300)
    async with emulator as emulated:
        proc, url = await asyncio.to_thread(start_vllm_router, [live.url, emulated])
        try:
            yield url, emulator
        finally:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(proc.wait, 10)
            if proc.poll() is None:
                proc.kill()


def on_live(emulator: Emulator, rid: str) -> bool:
    return f"generate-tokens-{rid}" not in emulator.stats.written


def test_streams_through_the_router_equal_the_servers_answer(vllm: Any, twin: ModuleType) -> None:
    async def main() -> list[tuple[str, StreamResult, bool]]:
        async with routed(vllm) as (url, emulator), fastaccum.Client(url, dialect="vllm") as client:
            rids = [f"rt-{i}" for i in range(4)]
            results = await asyncio.gather(*(client.stream(body(rid, 32)).run() for rid in rids))
            return [(rid, result, on_live(emulator, rid)) for rid, result in zip(rids, results)]

    done = run(main())
    live = [(rid, result) for rid, result, here in done if here]
    assert live, "the router sent no stream to the live server"
    for rid, result in live:
        ref = post_json(vllm.url + GENERATE, body(f"ref-{rid}", 32))["choices"][0]
        assert result.token_ids.tolist() == ref["token_ids"]
        assert result.logprobs is not None and result.logprobs.tolist() == [
            c["logprob"] for c in ref["logprobs"]["content"]
        ]


def test_the_drain_reaches_the_live_worker_behind_the_router(vllm: Any, twin: ModuleType) -> None:
    async def main() -> list[tuple[StreamResult, Any, bool]]:
        async with routed(vllm) as (url, emulator):
            async with fastaccum.Client(url, dialect="vllm", abort_drain_s=60) as client:
                streams = [client.stream(body(f"rd-{i}", 1500)) for i in range(4)]
                tasks = [asyncio.ensure_future(s.run()) for s in streams]
                await wait_until(lambda: all(s.tokens >= 5 for s in streams), 120)
                for stream in streams:
                    stream.abort()
                results = await asyncio.gather(*tasks)
                return [
                    (r, s.abort_error, on_live(emulator, f"rd-{i}")) for i, (s, r) in enumerate(zip(streams, results))
                ]

    done = run(main())
    assert any(here for _, _, here in done), "the router sent no stream to the live server"
    for result, error, _ in done:
        assert error is None
        assert result.aborted and result.replay_complete and result.finish_reason == {"type": "abort"}


def test_a_cut_through_the_router_returns_the_live_worker_to_idle(vllm: Any, twin: ModuleType) -> None:
    async def main() -> StreamResult:
        async with routed(vllm) as (url, emulator):
            async with fastaccum.Client(url, dialect="vllm", abort_drain_s=None) as client:
                for i in range(4):  # round robin: one of the first two goes to the live server
                    stream = client.stream(body(f"rc-{i}", 1500))
                    task = asyncio.ensure_future(stream.run())
                    await wait_until(lambda s=stream: s.tokens >= 5, 120)
                    stream.abort()
                    result = await task
                    if on_live(emulator, f"rc-{i}"):
                        break
                else:
                    raise AssertionError("the router sent no stream to the live server")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while (await in_thread(get_json, vllm.url + "/load"))["server_load"] != 0:
                assert loop.time() < deadline, "the live server still holds the cut request"
                await asyncio.sleep(0.05)
            return result

    result = run(main())
    assert result.aborted and not result.replay_complete
