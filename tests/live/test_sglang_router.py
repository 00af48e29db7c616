"""Through the real sglang-router (PyPI 0.3.2, the Rust gateway slime launches) in front of the live
SGLang 0.5.23 server, its one worker, in both stream modes.

Streams pass through unchanged (equal to the worker's own answer); the drain abort, which the router
answers with 404, reaches the worker through ``GET /workers``; a cut reaches it too; and the router
rebuilds the request body without ``return_routed_experts``, so no routed experts come through it
(tests/test_router.py pins the same against emulator workers).
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from client_helpers import Transport, abort_after, run
from live_helpers import get_json, in_thread, post_json, post_raw
from router_helpers import ROUTER_AVAILABLE, start_router

import fastaccum
from fastaccum import StreamResult

pytestmark = [
    pytest.mark.live_sglang,
    pytest.mark.skipif(not ROUTER_AVAILABLE, reason="sglang-router is not installed (the test extra has it)"),
]

GENERATE = "/generate"
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
EXPERTS = (2, 2)  # the tiny model's (layers, top-k)
LONG = 2000  # a stream an abort always lands in
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}


def body(rid: str, *, routed: bool = False, **params: Any) -> dict[str, Any]:
    request: dict[str, Any] = {"input_ids": PROMPT, "rid": rid, "return_logprob": True, "sampling_params": params}
    if routed:
        request["return_routed_experts"] = True
    return request


def direct(server: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The worker's own non-streaming answer (asked directly, under a rid of its own)."""
    return dict(post_json(server.url + GENERATE, {**request, "rid": f"ref-{request['rid']}"}))


def logprobs_of(ref: dict[str, Any]) -> list[float]:
    return [logprob for logprob, _, _ in ref["meta_info"]["output_token_logprobs"]]


async def wait_idle(server: Any, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        (entry,) = (await in_thread(get_json, server.url + "/v1/loads"))["loads"]
        if entry["num_running_reqs"] == entry["num_waiting_reqs"] == 0:
            return
        assert time.monotonic() < deadline, "the worker still holds requests"
        await asyncio.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def routers() -> Iterator[dict[str, tuple[subprocess.Popen[bytes], str]]]:
    """The running router by its worker's URL (session-wide: the tests of one server may be split
    by the twins' order), stopped at the end."""
    started: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        yield started
    finally:
        for proc, _ in started.values():
            _stop(proc)


@pytest.fixture
def routed(sglang: Any, routers: dict[str, tuple[subprocess.Popen[bytes], str]]) -> str:
    """The URL of sglang-router in front of the live server, its one worker (one router at a time:
    a router left in front of a server that was stopped goes first)."""
    if sglang.url not in routers or routers[sglang.url][0].poll() is not None:
        for url in list(routers):
            _stop(routers.pop(url)[0])
        routers[sglang.url] = start_router([sglang.url])
    return routers[sglang.url][1]


def test_a_stream_through_the_router_equals_the_workers_own_answer(
    sglang: Any, routed: str, transport: Transport
) -> None:
    request = body(f"rt-{transport.kind}", max_new_tokens=32, temperature=0)
    ref = direct(sglang, request)

    async def main() -> StreamResult:
        async with transport.open(routed) as make:
            result: StreamResult = await make(request, path=GENERATE).run()
            return result

    result = run(main())
    meta = ref["meta_info"]
    assert result.token_ids.tolist() == ref["output_ids"]
    assert result.logprobs is not None and result.logprobs.tolist() == logprobs_of(ref)
    assert result.text == ref["text"] and result.finish_reason == meta["finish_reason"]
    assert (result.meta_info["prompt_tokens"], result.completion_tokens) == (meta["prompt_tokens"], 32)
    assert result.meta_info["id"] == request["rid"]  # the router forwards the rid: the worker runs it under it


def test_the_drain_abort_reaches_the_worker_through_its_listing(sglang: Any, routed: str, twin: ModuleType) -> None:
    assert post_raw(routed + "/abort_request", {"rid": "nothing"}) == (404, b"")
    assert [worker["url"] for worker in get_json(routed + "/workers")["workers"]] == [sglang.url]
    request = body("rt-drain-1", max_new_tokens=LONG, temperature=0)

    async def main() -> tuple[StreamResult, Any, int]:
        async with fastaccum.Client(routed) as client:  # the default drain (2 s)
            stream = client.stream(request)
            result = await abort_after(stream, 10, timeout=120)
            sent = client._aborts_for("sglang").sent
        await wait_idle(sglang)
        return result, stream.abort_error, sent

    result, error, sent = run(main())
    assert error is None
    assert result.aborted and result.replay_complete and result.finish_reason == ABORTED
    assert sent == 2  # one to the router (404), then one to the worker it lists
    n = len(result)
    assert 10 <= n < LONG and result.meta_info["completion_tokens"] == n
    ref = direct(sglang, body("rt-drain-1-prefix", max_new_tokens=n, temperature=0))
    assert result.token_ids.tolist() == ref["output_ids"]
    assert result.logprobs is not None and result.logprobs.tolist() == logprobs_of(ref)


def test_a_cut_through_the_router_returns_the_worker_to_idle(sglang: Any, routed: str, twin: ModuleType) -> None:
    async def main() -> StreamResult:
        async with fastaccum.Client(routed, abort_drain_s=None) as client:
            result = await abort_after(client.stream(body("rt-cut-1", max_new_tokens=LONG)), 10, timeout=120)
        await wait_idle(sglang)  # the router drops the worker's connection at its next write
        return result

    result = run(main())
    assert result.aborted and not result.replay_complete and result.finish_reason is None


def test_the_pypi_router_drops_return_routed_experts(sglang: Any, routed: str, twin: ModuleType) -> None:
    """sglang-router 0.3.2 rebuilds the request body from the fields it knows: the worker never sees
    ``return_routed_experts``. slime's images install a fork that keeps it (docs/client.md)."""
    request = body("rt-experts", routed=True, max_new_tokens=24, temperature=0)

    async def main() -> tuple[StreamResult, StreamResult]:
        async with fastaccum.Client(routed) as client:
            through = await client.stream(request, expert_shape=EXPERTS).run()
        async with fastaccum.Client(sglang.url) as client:
            straight = await client.stream({**request, "rid": "rt-experts-direct"}, expert_shape=EXPERTS).run()
        return through, straight

    through, straight = run(main())
    assert straight.routed_experts is not None and straight.routed_experts.shape == (len(PROMPT) + 24 - 1, *EXPERTS)
    assert through.finished and through.routed_experts is None
    assert through.token_ids.tolist() == straight.token_ids.tolist()
