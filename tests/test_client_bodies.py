"""Non-streaming requests through the transports, on both twins: ``"stream": false`` is sent as
given and its answer read by the core into what the stream gives; an abort drains it by id (SGLang
answers the open request with its partial output, routed experts included); a batch reads through
``Client.generate``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import orjson
import pytest
from client_helpers import PROMPT, RawServer, Transport, assert_matches, payload, run, wait_until

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import ABORT_REASON, Emulator
from fastaccum.emulator.writer import WireOptions, chunk_encode, normal_event, synthetic_generation

SHAPE = (4, 2)  # the emulator's default (layers, top-k)


def answer(rid: str, n: int, **extra: Any) -> dict[str, Any]:
    return payload(rid, n, stream=False, return_routed_experts=True, **extra)


def whole_answer(gen: Any) -> dict[str, Any]:
    """SGLang's non-streaming answer of a generation: its cumulative stream's terminal event."""
    n = len(gen.token_ids)
    return normal_event(gen, WireOptions(), 0, n, terminal=True, finish_reason=gen.finish_reason, first=True)


def test_a_non_streaming_answer_is_the_streams_result(transport: Transport) -> None:
    emulator = Emulator(enable_return_routed_experts=True, incremental_streaming_output=True)

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, transport.open(url) as make:
            streamed = await make(payload("nb-1", 40, return_routed_experts=True), expert_shape=SHAPE).run()
            whole = await make(answer("nb-1", 40), expert_shape=SHAPE).run()
            return streamed, whole

    streamed, whole = run(main())
    assert_matches(emulator, "nb-1", whole, routed=True)
    assert whole.token_ids.tolist() == streamed.token_ids.tolist() and whole.finish_reason == streamed.finish_reason
    assert np.array_equal(whole.routed_experts, streamed.routed_experts)
    assert whole.routed_experts.shape == (len(PROMPT) + 40 - 1, *SHAPE) and whole.events == 1


def test_an_abort_drains_a_running_non_streaming_request_and_keeps_its_replay_data(twin: Any) -> None:
    emulator = Emulator(enable_return_routed_experts=True, token_rate=400)

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=60) as client:
            stream = client.stream(answer("nb-abort", 100_000), expert_shape=SHAPE)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.stats.tokens >= 20, timeout=30)  # the server is decoding it
            stream.abort()
            return await asyncio.wait_for(task, 30)

    result = run(main())
    assert result.aborted and result.replay_complete and result.finish_reason == ABORT_REASON
    assert 20 <= len(result) < 100_000
    assert result.routed_experts.shape == (len(PROMPT) + len(result) - 1, *SHAPE)
    assert_matches(emulator, "nb-abort", result, routed=True)


def test_generate_reads_one_answer_and_stream_refuses_a_batch(twin: Any) -> None:
    emulator = Emulator(enable_return_routed_experts=True)

    async def main() -> Any:
        async with emulator as url, fastaccum.Client(url) as client:
            one = await client.generate(payload("nb-one", 9))
            with pytest.raises(ValueError, match=r"a non-streaming batch .*use Client.generate\(\)"):
                client.stream({"input_ids": [PROMPT, PROMPT], "stream": False})
            return one

    one = run(main())
    assert isinstance(one, StreamResult) and len(one) == 9
    assert_matches(emulator, "nb-one", one)


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_generate_reads_a_batch_answer_as_one_result_per_request_in_order(twin: Any, framing: str) -> None:
    """SGLang answers a batch (``input_ids`` a list of prompts) with a JSON list, one answer per
    prompt (the emulator does not batch: a raw server sends an answer the writer made)."""
    gens = [
        synthetic_generation(f"nb-batch-{i}", 30 + i, prompt_tokens=len(PROMPT), expert_shape=SHAPE) for i in range(3)
    ]
    body = b"[" + b",".join(orjson.dumps(whole_answer(g)) for g in gens) + b"]"
    if framing == "chunked":
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        parts = [head, *(chunk_encode(body[i : i + 1000])[:-5] for i in range(0, len(body), 1000)), b"0\r\n\r\n"]
    else:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        parts = [head, body[:777], body[777:]]
    server = RawServer(parts, pause=0)

    async def main() -> Any:
        async with server as url, fastaccum.Client(url) as client:
            return await client.generate({"input_ids": [PROMPT] * 3, "return_routed_experts": True}, expert_shape=SHAPE)

    results = run(main())
    assert isinstance(results, list) and [len(r) for r in results] == [30, 31, 32]
    for gen, result in zip(gens, results):
        assert result.token_ids.tolist() == list(gen.token_ids) and result.finish_reason == gen.finish_reason
        assert np.array_equal(result.routed_experts, gen.routed_experts)


def test_vllm_answers_whole_through_the_client(twin: Any) -> None:
    emulator = Emulator(dialect="vllm", enable_return_routed_experts=True)
    body = {"token_ids": PROMPT, "request_id": "nb-v", "sampling_params": {"max_tokens": 12, "logprobs": 0}}

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, dialect="vllm") as client:
            result = await client.generate(body, expert_shape=SHAPE)
            assert isinstance(result, StreamResult)
            return result

    result = run(main())
    gen = emulator.expected("nb-v", 12, prompt_tokens=len(PROMPT))
    assert result.token_ids.tolist() == list(gen.token_ids) and result.finish_reason == {"type": "length"}
    assert result.routed_experts.shape == (len(PROMPT) + 12 - 1, *SHAPE)
    assert result.meta_info["usage"]["completion_tokens"] == 12


def test_an_abort_drains_a_running_non_streaming_vllm_request_and_keeps_its_prefix(twin: Any) -> None:
    """vLLM answers an aborted non-streaming request with the tokens it decoded, finish "abort"."""
    emulator = Emulator(dialect="vllm", enable_return_routed_experts=True, token_rate=400)
    body = {"token_ids": PROMPT, "request_id": "nb-v-abort", "sampling_params": {"max_tokens": 100_000, "logprobs": 0}}

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, dialect="vllm", abort_drain_s=60) as client:
            stream = client.stream({**body, "stream": False}, expert_shape=SHAPE)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.stats.tokens >= 20, timeout=30)
            stream.abort()
            return await asyncio.wait_for(task, 30)

    result = run(main())
    assert result.aborted and result.replay_complete and result.finish_reason == {"type": "abort"}
    n = len(result)
    assert 20 <= n < 100_000 and result.events == 1
    gen = emulator.expected("nb-v-abort", n, prompt_tokens=len(PROMPT), routed_experts=True)
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.routed_experts.shape == (len(PROMPT) + n - 1, *SHAPE)
