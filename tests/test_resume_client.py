"""A sample interrupted and resumed through the transports, on both twins, against a greedy
emulator (a request for prompt + k generated tokens continues the first, as a greedy model's
does): resume_payload + join give the uninterrupted answer, token for token and routed-expert row
for row, over two and three segments, drained or cut, streamed or not, SGLang and vLLM. The live
tiers hold the same against the real engines (tests/live/test_resume_live.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from client_helpers import PROMPT, Transport, abort_after, run

import fastaccum
from fastaccum import StreamLengthError, StreamResult
from fastaccum.emulator import Emulator

SHAPE = (4, 2)  # the emulator's default (layers, top-k)
N = 60
RATE = 400  # tokens/s: an abort lands well before the budget's end


def sglang(n: int = N, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": n, "temperature": 0}
    return {
        "input_ids": PROMPT,
        "return_logprob": True,
        "return_routed_experts": True,
        "sampling_params": params,
        **extra,
    }


def vllm(n: int = N) -> dict[str, Any]:
    return {"token_ids": PROMPT, "sampling_params": {"max_tokens": n, "temperature": 0, "logprobs": 0}}


def same_sample(joined: StreamResult, whole: StreamResult) -> None:
    assert joined.token_ids.tolist() == whole.token_ids.tolist()
    assert np.array_equal(joined.logprobs, whole.logprobs)
    # The finish is the last request's, as its server said it (a length finish names its own budget).
    assert joined.text == whole.text and joined.finish_reason["type"] == whole.finish_reason["type"]
    assert joined.routed_experts.shape == (len(PROMPT) + N - 1, *SHAPE)
    assert np.array_equal(joined.routed_experts, whole.routed_experts)  # row for row, none repeated


async def interrupted(make: Any, body: dict[str, Any], stops: list[int], dialect: str = "sglang") -> StreamResult:
    """The sample asked for in segments, each aborted once the sample holds the next of ``stops``
    tokens, the last run to its end."""
    held: StreamResult | None = None
    for stop in [*stops, None]:
        ask = body if held is None else fastaccum.resume_payload(body, held, dialect=dialect)
        stream = make(ask, expert_shape=SHAPE)
        part = await stream.run() if stop is None else await abort_after(stream, stop - (len(held) if held else 0))
        assert part.aborted == (stop is not None) and (stop is None or len(part) < N)
        held = part if held is None else fastaccum.join(held, part, prompt_tokens=len(PROMPT))
    assert held is not None
    return held


@pytest.mark.parametrize("stops", [[20], [15, 40]], ids=["two-segments", "three-segments"])
def test_a_drained_sample_resumed_is_the_uninterrupted_answer(transport: Transport, stops: list[int]) -> None:
    emulator = Emulator(enable_return_routed_experts=True, greedy=True, token_rate=RATE)

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, transport.open(url, abort_drain_s=30, coalesce_ms=0) as make:
            whole = await make(sglang(), expert_shape=SHAPE).run()
            return whole, await interrupted(make, sglang(), stops)

    whole, joined = run(main())
    same_sample(joined, whole)
    if transport.kind == "client":  # a drained abort holds its rows: the resume asked only for the rest
        assert joined.replay_complete
    assert joined.meta_info["prompt_tokens"] == len(PROMPT) and joined.completion_tokens == N


def test_a_non_streaming_sample_resumed_is_the_uninterrupted_answer(twin: Any) -> None:
    emulator = Emulator(enable_return_routed_experts=True, greedy=True, token_rate=RATE)

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=30, coalesce_ms=0) as client:
            whole = await client.generate(sglang(), expert_shape=SHAPE)
            assert isinstance(whole, StreamResult)

            def make(body: dict[str, Any], **options: Any) -> Any:
                return client.stream({**body, "stream": False}, **options)

            async def abort_at(stream: Any, tokens: int) -> StreamResult:  # no event before the answer
                task = asyncio.ensure_future(stream.run())
                start = emulator.stats.tokens
                while emulator.stats.tokens < start + tokens:
                    await asyncio.sleep(0.002)
                stream.abort()
                return await task

            first = await abort_at(make(sglang(), expert_shape=SHAPE), 25)
            assert first.aborted and 25 <= len(first) < N
            rest = await make(fastaccum.resume_payload(sglang(), first), expert_shape=SHAPE).run()
            return whole, fastaccum.join(first, rest)

    whole, joined = run(main())
    same_sample(joined, whole)


def test_vllm_resumes_from_the_routed_experts_prompt_start(twin: Any) -> None:
    emulator = Emulator(dialect="vllm", enable_return_routed_experts=True, greedy=True, token_rate=RATE)

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, fastaccum.Client(url, dialect="vllm", abort_drain_s=30, coalesce_ms=0) as client:
            whole = await client.stream({**vllm(), "stream": True}, expert_shape=SHAPE).run()
            joined = await interrupted(client.stream, {**vllm(), "stream": True}, [15, 40], dialect="vllm")
            return whole, joined

    whole, joined = run(main())
    same_sample(joined, whole)


def test_a_resume_without_the_start_length_repeats_rows_and_join_refuses_it(twin: Any) -> None:
    """What frameworks that resume by hand do: the prompt + kept tokens asked for again, every row
    sent again, the two arrays concatenated."""
    emulator = Emulator(enable_return_routed_experts=True, greedy=True, token_rate=RATE)

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=30, coalesce_ms=0) as client:
            first = await abort_after(client.stream(sglang(), expert_shape=SHAPE), 20)
            by_hand = fastaccum.resume_payload(sglang(), first)
            del by_hand["routed_experts_start_len"]
            return first, await client.stream(by_hand, expert_shape=SHAPE).run()

    first, rest = run(main())
    repeated = len(PROMPT) + len(first) - 1
    with pytest.raises(StreamLengthError, match="rows repeat") as error:
        fastaccum.join(first, rest)
    assert error.value.actual - error.value.expected == repeated
