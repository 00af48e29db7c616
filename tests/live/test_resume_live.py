"""Non-streaming requests and the resume contract against the real engines (SGLang 0.5.23 with
routed experts, vLLM 0.32 without: docs/live.md says why), on the compiled and the pure twin:

- ``Client.generate`` (``"stream": false``) reads the server's answer into what its stream gives;
- aborting a running non-streaming request keeps its prefix (SGLang: with the routed experts of
  every kept token), which is the greedy answer cut to its length;
- a sample aborted at k tokens and resumed with ``resume_payload`` + ``join``, in two and in three
  segments, is the uninterrupted greedy answer: the same tokens, log-probs within the engine's
  own noise, and (SGLang) the same routed-expert rows, none repeated.
"""

from __future__ import annotations

import asyncio
import urllib.request
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from client_helpers import abort_after, run
from live_helpers import MODEL, get_json, in_thread

import fastaccum
from fastaccum import StreamResult

SGLANG_PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
EXPERTS = (2, 2)  # the tiny model's (layers, top-k)
LONG = 2000  # a request an abort always lands in
N = 40
# A resumed request prefills the kept tokens that the uninterrupted one decoded one by one: other
# matmul shapes, so bf16 log-probs move a little (as between a request alone and in a batch).
LOGPROB_NOISE = 0.1


def sglang_body(n: int, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": n, "temperature": 0}
    return {
        "input_ids": SGLANG_PROMPT,
        "return_logprob": True,
        "return_routed_experts": True,
        "sampling_params": params,
        **extra,
    }


def vllm_body(n: int, **extra: Any) -> dict[str, Any]:
    params = {"max_tokens": n, "temperature": 0, "logprobs": 1}
    return {"model": MODEL, "token_ids": SGLANG_PROMPT, "sampling_params": params, **extra}


def assert_same_sample(joined: StreamResult, whole: StreamResult, *, routed: bool) -> None:
    assert joined.token_ids.tolist() == whole.token_ids.tolist()
    assert joined.logprobs is not None and whole.logprobs is not None
    assert np.allclose(joined.logprobs, whole.logprobs, rtol=0, atol=LOGPROB_NOISE)
    assert joined.finish_reason is not None and whole.finish_reason is not None
    assert joined.finish_reason["type"] == whole.finish_reason["type"]
    if routed:
        assert whole.routed_experts is not None and joined.routed_experts is not None
        assert joined.routed_experts.shape == whole.routed_experts.shape == (len(SGLANG_PROMPT) + N - 1, *EXPERTS)
        assert np.array_equal(joined.routed_experts, whole.routed_experts)


async def segments(client: fastaccum.Client, body: dict[str, Any], stops: list[int], **options: Any) -> StreamResult:
    """The sample asked for in segments, each drained once the sample holds the next of ``stops``
    tokens, the last run to its end; their join."""
    dialect = "vllm" if "token_ids" in body else "sglang"
    held: StreamResult | None = None
    for stop in [*stops, None]:
        ask = body if held is None else fastaccum.resume_payload(body, held, dialect=dialect)
        stream = client.stream(ask, **options)
        if stop is None:
            part = await stream.run()
        else:
            part = await abort_after(stream, stop - (len(held) if held else 0), timeout=120)
            assert part.aborted and part.replay_complete and len(part) + (len(held) if held else 0) < N
        held = part if held is None else fastaccum.join(held, part)
    assert held is not None
    return held


# ---- SGLang -----------------------------------------------------------------------------------------


@pytest.mark.live_sglang
def test_sglang_generate_reads_the_answer_the_stream_gives(sglang: Any, twin: ModuleType) -> None:
    async def main() -> tuple[Any, StreamResult]:
        async with fastaccum.Client(sglang.url) as client:
            whole = await client.generate(sglang_body(N), expert_shape=EXPERTS)
            streamed = await client.stream({**sglang_body(N), "stream": True}, expert_shape=EXPERTS).run()
            return whole, streamed

    whole, streamed = run(main())
    assert isinstance(whole, StreamResult) and whole.events == 1
    assert whole.token_ids.tolist() == streamed.token_ids.tolist() and whole.text == streamed.text
    assert whole.logprobs is not None and whole.logprobs.tolist() == streamed.logprobs.tolist()
    assert whole.finish_reason == streamed.finish_reason
    assert np.array_equal(whole.routed_experts, streamed.routed_experts)


@pytest.mark.live_sglang
def test_sglang_an_aborted_non_streaming_request_keeps_its_prefix_and_routed_experts(
    sglang: Any, twin: ModuleType
) -> None:
    async def main() -> StreamResult:
        async with fastaccum.Client(sglang.url, abort_drain_s=30) as client:
            stream = client.stream({**sglang_body(LONG), "stream": False}, expert_shape=EXPERTS)
            task = asyncio.ensure_future(stream.run())
            while (await in_thread(get_json, sglang.url + "/v1/loads"))["loads"][0]["num_running_reqs"] < 1:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # decoding (about 150 tokens/s): the abort keeps a prefix
            stream.abort()
            return await task

    result = run(main())
    n = len(result)
    assert result.aborted and result.replay_complete and result.finish_reason["type"] == "abort"
    assert 1 <= n < LONG
    assert result.routed_experts is not None and result.routed_experts.shape == (len(SGLANG_PROMPT) + n - 1, *EXPERTS)

    async def greedy() -> Any:
        async with fastaccum.Client(sglang.url) as client:
            return await client.generate(sglang_body(n), expert_shape=EXPERTS)

    ref = run(greedy())
    assert result.token_ids.tolist() == ref.token_ids.tolist()
    assert np.array_equal(result.routed_experts, ref.routed_experts)


@pytest.mark.live_sglang
@pytest.mark.parametrize("stops", [[12], [10, 25]], ids=["two-segments", "three-segments"])
def test_sglang_a_resumed_sample_is_the_uninterrupted_greedy_answer(
    sglang: Any, twin: ModuleType, stops: list[int]
) -> None:
    async def main() -> tuple[StreamResult, StreamResult]:
        async with fastaccum.Client(sglang.url, abort_drain_s=30, coalesce_ms=0) as client:
            whole = await client.stream({**sglang_body(N), "stream": True}, expert_shape=EXPERTS).run()
            joined = await segments(client, {**sglang_body(N), "stream": True}, stops, expert_shape=EXPERTS)
            return whole, joined

    whole, joined = run(main())
    assert_same_sample(joined, whole, routed=True)


# ---- vLLM -------------------------------------------------------------------------------------------


def running(url: str) -> float:
    """Requests the vLLM engine runs now, from its Prometheus metrics (its /load counts none here)."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("vllm:num_requests_running"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("vLLM's /metrics has no vllm:num_requests_running")


@pytest.mark.live_vllm
def test_vllm_generate_reads_the_answer_the_stream_gives(vllm: Any, twin: ModuleType) -> None:
    async def main() -> tuple[Any, StreamResult]:
        async with fastaccum.Client(vllm.url, dialect="vllm") as client:
            whole = await client.generate(vllm_body(N))
            streamed = await client.stream({**vllm_body(N), "stream": True}).run()
            return whole, streamed

    whole, streamed = run(main())
    assert isinstance(whole, StreamResult) and whole.events == 1
    assert whole.token_ids.tolist() == streamed.token_ids.tolist()
    assert whole.logprobs is not None and whole.logprobs.tolist() == streamed.logprobs.tolist()
    assert whole.finish_reason == streamed.finish_reason
    assert whole.meta_info["usage"]["completion_tokens"] == N


@pytest.mark.live_vllm
def test_vllm_an_aborted_non_streaming_request_keeps_its_prefix(vllm: Any, twin: ModuleType) -> None:
    async def main() -> StreamResult:
        async with fastaccum.Client(vllm.url, dialect="vllm", abort_drain_s=30) as client:
            stream = client.stream({**vllm_body(LONG), "stream": False})
            task = asyncio.ensure_future(stream.run())
            while await in_thread(running, vllm.url) < 1:
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)  # decoding: the abort keeps a prefix
            stream.abort()
            return await task

    result = run(main())
    n = len(result)
    assert result.aborted and result.replay_complete and result.finish_reason == {"type": "abort"}
    assert 1 <= n < LONG

    async def greedy() -> Any:
        async with fastaccum.Client(vllm.url, dialect="vllm") as client:
            return await client.generate(vllm_body(n))

    assert result.token_ids.tolist() == run(greedy()).token_ids.tolist()


@pytest.mark.live_vllm
@pytest.mark.parametrize("stops", [[12], [10, 25]], ids=["two-segments", "three-segments"])
def test_vllm_a_resumed_sample_is_the_uninterrupted_greedy_answer(
    vllm: Any, twin: ModuleType, stops: list[int]
) -> None:
    async def main() -> tuple[StreamResult, StreamResult]:
        async with fastaccum.Client(vllm.url, dialect="vllm", abort_drain_s=30, coalesce_ms=0) as client:
            whole = await client.stream({**vllm_body(N), "stream": True}).run()
            joined = await segments(client, {**vllm_body(N), "stream": True}, stops)
            return whole, joined

    whole, joined = run(main())
    assert_same_sample(joined, whole, routed=False)
