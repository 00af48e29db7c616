"""Non-streaming requests through the transports, on both twins: ``"stream": false`` is sent as
given and its answer read by the core into what the stream gives; an abort drains it by id (SGLang
answers the open request with its partial output, routed experts included); a batch reads through
``Client.generate``."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from client_helpers import PROMPT, Transport, assert_matches, payload, run, wait_until

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import ABORT_REASON, Emulator

SHAPE = (4, 2)  # the emulator's default (layers, top-k)


def answer(rid: str, n: int, **extra: Any) -> dict[str, Any]:
    return payload(rid, n, stream=False, return_routed_experts=True, **extra)


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


def test_generate_reads_a_batch_as_one_result_per_request(twin: Any) -> None:
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
