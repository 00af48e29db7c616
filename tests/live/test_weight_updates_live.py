"""Streams across a weight update that freezes requests instead of aborting them, against the real
engines (SGLang 0.5.23, vLLM 0.32 with its RL dev API), on the compiled and the pure twin:

- SGLang ``in_place``: a paused stream sends nothing and then goes on; without a weight change it
  is the uninterrupted answer, routed experts included. With ``update_weights_from_disk`` (the
  second tiny checkpoint, ``flush_cache: false``) it completes with the versions split and every
  routed-expert row (its KV cache is the old weights' by design: only counts are checked).
- SGLang ``retract`` with the second checkpoint and ``flush_cache: true``: the tokens before the
  pause are the first weights' greedy answer, those after it the second checkpoint's greedy
  answer to prompt + prefix, the versions split there, ``num_retractions`` >= 1.
- SGLang ``abort``: the stream ends aborted with its prefix and routed experts.
- An abort while paused ``in_place`` is answered at ``continue``: a drain that waits keeps the
  routed experts.
- vLLM ``keep`` (with and without ``clear_cache``) and a version change: the uninterrupted answer,
  the spans splitting at the right token; ``abort``: the abort chunk read, the prefix kept.

Each test restores the first weights and the version "default" for the tests after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from client_helpers import run
from live_helpers import MODEL, engines, in_thread, post_json, post_raw

import fastaccum
from fastaccum import StreamResult

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
EXPERTS = (2, 2)
N = 120
AT = 20  # tokens the stream holds when the pause comes


def sglang_body(n: int = N) -> dict[str, Any]:
    params = {"max_new_tokens": n, "temperature": 0}
    return {"input_ids": PROMPT, "return_logprob": True, "return_routed_experts": True, "sampling_params": params}


def vllm_body(n: int = N) -> dict[str, Any]:
    return {"model": MODEL, "token_ids": PROMPT, "sampling_params": {"max_tokens": n, "temperature": 0, "logprobs": 1}}


async def post(server: Any, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes]:
    status, reply = await in_thread(post_raw, server.url + path, body or {})
    return int(status), bytes(reply)


async def across_a_pause(
    client: fastaccum.Client, body: dict[str, Any], pause: Any, *, options: dict[str, Any] | None = None
) -> tuple[StreamResult, int]:
    """The stream, paused by ``pause()`` (a coroutine: pause, maybe update, continue) once it
    holds AT tokens; its result and the tokens it held when the pause was asked."""
    stream = client.stream({**body, "stream": True}, **(options or {}))
    task = asyncio.ensure_future(stream.run())
    while stream.tokens < AT and not task.done():
        await asyncio.sleep(0.002)
    held = stream.tokens
    await pause(stream)
    return await task, held


def assert_counts(result: StreamResult, *, routed: bool = True) -> None:
    assert len(result) == N and result.finished
    spans = result.weight_version_spans
    assert spans is not None and spans[0][0] == 0 and spans[-1][1] == N
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # every token in one run
    if routed:
        assert result.routed_experts is not None and result.routed_experts.shape == (len(PROMPT) + N - 1, *EXPERTS)


# ---- SGLang --------------------------------------------------------------------------------------


@pytest.fixture
def second_checkpoint(sglang: Any) -> Iterator[str]:
    """The second tiny checkpoint (other weights, the same tokenizer); the first weights and the
    version "default" are loaded again afterwards."""
    yield str(engines.model_dir(sglang.python, seed="b"))
    done = post_json(
        sglang.url + "/update_weights_from_disk", {"model_path": str(sglang.model), "weight_version": "default"}
    )
    assert done["success"], done


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_sglang_in_place_the_stream_waits_and_goes_on_to_the_uninterrupted_answer(
    sglang: Any, twin: ModuleType
) -> None:
    async def main() -> tuple[StreamResult, StreamResult, int, int]:
        async with fastaccum.Client(sglang.url, coalesce_ms=0) as client:
            whole = await client.stream({**sglang_body(), "stream": True}, expert_shape=EXPERTS).run()
            during: list[int] = []

            async def pause(stream: Any) -> None:
                assert (await post(sglang, "/pause_generation", {"mode": "in_place"}))[0] == 200
                before = stream.tokens
                await asyncio.sleep(5)  # the pause's length is the scenario: nothing may arrive in it
                during.append(stream.tokens - before)
                assert (await post(sglang, "/continue_generation"))[0] == 200

            result, held = await across_a_pause(client, sglang_body(), pause, options={"expert_shape": EXPERTS})
            return whole, result, held, during[0]

    whole, result, held, during = run(main())
    assert held >= AT and during <= 1  # at most the one token in flight when the pause came
    assert result.token_ids.tolist() == whole.token_ids.tolist()
    assert result.logprobs.tolist() == whole.logprobs.tolist()
    assert np.array_equal(result.routed_experts, whole.routed_experts)
    assert result.weight_version_spans == ((0, N, "default"),)
    assert_counts(result)


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_sglang_retract_with_new_weights_splits_the_versions_where_the_new_weights_begin(
    sglang: Any, twin: ModuleType, second_checkpoint: str
) -> None:
    async def main() -> tuple[StreamResult, StreamResult]:
        async with fastaccum.Client(sglang.url, coalesce_ms=0) as client:
            first = await client.generate(sglang_body(), expert_shape=EXPERTS)

            async def pause(stream: Any) -> None:
                assert (await post(sglang, "/pause_generation", {"mode": "retract"}))[0] == 200
                update = {"model_path": second_checkpoint, "weight_version": "v2", "flush_cache": True}
                status, reply = await post(sglang, "/update_weights_from_disk", update)
                assert status == 200, reply
                assert (await post(sglang, "/continue_generation"))[0] == 200

            result, _ = await across_a_pause(client, sglang_body(), pause, options={"expert_shape": EXPERTS})
            return first, result

    first, result = run(main())
    assert_counts(result)
    ((_, split, old), (_, _, new)) = result.weight_version_spans
    assert (old, new) == ("default", "v2") and AT <= split < N
    assert result.meta_info["num_retractions"] >= 1
    assert result.token_ids[:split].tolist() == first.token_ids[:split].tolist()  # the first weights' answer

    async def second_weights_answer() -> Any:
        async with fastaccum.Client(sglang.url) as client:
            prefix = result.token_ids[:split].tolist()
            body = {**sglang_body(N - split), "input_ids": PROMPT + prefix}
            return await client.generate(body, expert_shape=EXPERTS)

    assert result.token_ids[split:].tolist() == run(second_weights_answer()).token_ids.tolist()


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_sglang_in_place_with_new_weights_completes_with_both_versions(
    sglang: Any, twin: ModuleType, second_checkpoint: str
) -> None:
    async def main() -> StreamResult:
        async with fastaccum.Client(sglang.url, coalesce_ms=0) as client:

            async def pause(stream: Any) -> None:
                assert (await post(sglang, "/pause_generation", {"mode": "in_place"}))[0] == 200
                # A cache flush fails while requests run (HTTP 400, the weights swapped anyway): none.
                update = {"model_path": second_checkpoint, "weight_version": "v2", "flush_cache": False}
                status, reply = await post(sglang, "/update_weights_from_disk", update)
                assert status == 200, reply
                assert (await post(sglang, "/continue_generation"))[0] == 200

            result, _ = await across_a_pause(client, sglang_body(), pause, options={"expert_shape": EXPERTS})
            return result

    result = run(main())
    assert_counts(result)
    assert [v for _, _, v in result.weight_version_spans] == ["default", "v2"]
    assert result.meta_info["num_retractions"] == 0


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_sglang_an_abort_pause_ends_the_stream_with_its_prefix_and_routed_experts(
    sglang: Any, twin: ModuleType
) -> None:
    async def main() -> StreamResult:
        async with fastaccum.Client(sglang.url, coalesce_ms=0) as client:

            async def pause(stream: Any) -> None:
                # SGLang answers this pause once every stream has ended.
                assert (await post(sglang, "/pause_generation", {"mode": "abort"}))[0] == 200
                assert (await post(sglang, "/continue_generation"))[0] == 200

            result, _ = await across_a_pause(client, sglang_body(), pause, options={"expert_shape": EXPERTS})
            return result

    result = run(main())
    n = len(result)
    assert result.finish_reason["type"] == "abort" and result.replay_complete and AT <= n < N
    assert result.routed_experts.shape == (len(PROMPT) + n - 1, *EXPERTS)
    assert result.weight_version_spans == ((0, n, "default"),)


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_sglang_an_abort_while_paused_in_place_is_answered_at_continue_with_routed_experts(
    sglang: Any, twin: ModuleType
) -> None:
    async def main() -> tuple[StreamResult, Any]:
        async with fastaccum.Client(sglang.url, coalesce_ms=0, abort_drain_s=60) as client:
            stream = client.stream({**sglang_body(), "stream": True}, expert_shape=EXPERTS)
            task = asyncio.ensure_future(stream.run())
            while stream.tokens < AT:
                await asyncio.sleep(0.002)
            assert (await post(sglang, "/pause_generation", {"mode": "in_place"}))[0] == 200
            stream.abort()
            await asyncio.sleep(2)  # paused: the abort waits for continue, the drain with it
            assert not task.done()
            assert (await post(sglang, "/continue_generation"))[0] == 200
            return await task, stream.abort_error

    result, error = run(main())
    n = len(result)
    assert error is None and result.aborted and result.replay_complete and AT <= n < N
    assert result.routed_experts.shape == (len(PROMPT) + n - 1, *EXPERTS)


# ---- vLLM -----------------------------------------------------------------------------------------


@pytest.mark.live_vllm
@pytest.mark.parametrize("clear_cache", ["false", "true"])
def test_vllm_keep_with_a_version_change_is_the_uninterrupted_answer_split_at_the_pause(
    vllm: Any, twin: ModuleType, clear_cache: str
) -> None:
    async def main() -> tuple[StreamResult, StreamResult, list[int]]:
        async with fastaccum.Client(vllm.url, dialect="vllm", coalesce_ms=0) as client:
            whole = await client.stream({**vllm_body(), "stream": True}).run()
            seen: list[int] = []

            async def pause(stream: Any) -> None:
                assert (await post(vllm, f"/pause?mode=keep&clear_cache={clear_cache}"))[0] == 200
                seen.append(stream.tokens)
                assert (await post(vllm, "/update_weight_version", {"new_version": "v2"}))[0] == 200
                assert (await post(vllm, "/resume"))[0] == 200

            try:
                result, _ = await across_a_pause(client, vllm_body(), pause)
            finally:
                await post(vllm, "/update_weight_version", {"new_version": "default"})
            return whole, result, seen

    whole, result, seen = run(main())
    assert_counts(result, routed=False)
    assert result.token_ids.tolist() == whole.token_ids.tolist()
    assert np.allclose(result.logprobs, whole.logprobs, rtol=0, atol=0.1)
    ((_, split, old), (_, _, new)) = result.weight_version_spans
    assert (old, new) == ("default", "v2") and split == seen[0]  # the tokens sent before the pause


@pytest.mark.live_vllm
def test_vllm_an_abort_pause_ends_the_stream_with_its_abort_chunk_and_prefix(vllm: Any, twin: ModuleType) -> None:
    async def main() -> StreamResult:
        async with fastaccum.Client(vllm.url, dialect="vllm", coalesce_ms=0) as client:

            async def pause(stream: Any) -> None:
                assert (await post(vllm, "/pause?mode=abort"))[0] == 200
                assert (await post(vllm, "/resume"))[0] == 200

            result, _ = await across_a_pause(client, vllm_body(), pause)
            return result

    result = run(main())
    n = len(result)
    assert result.finish_reason == {"type": "abort"} and result.replay_complete and AT <= n < N
    assert result.weight_version_spans == ((0, n, "default"),)

    async def greedy() -> Any:
        async with fastaccum.Client(vllm.url, dialect="vllm") as client:
            return await client.generate(vllm_body(n))

    assert result.token_ids.tolist() == run(greedy()).token_ids.tolist()


@pytest.mark.live_vllm
def test_vllm_an_abort_while_paused_keep_is_drained(vllm: Any, twin: ModuleType) -> None:
    async def main() -> tuple[StreamResult, Any, bool]:
        async with fastaccum.Client(vllm.url, dialect="vllm", coalesce_ms=0, abort_drain_s=60) as client:
            stream = client.stream({**vllm_body(), "stream": True})
            task = asyncio.ensure_future(stream.run())
            while stream.tokens < AT:
                await asyncio.sleep(0.002)
            assert (await post(vllm, "/pause?mode=keep&clear_cache=false"))[0] == 200
            try:
                stream.abort()
                done, _ = await asyncio.wait({task}, timeout=5)
                answered_while_paused = bool(done)
            finally:
                assert (await post(vllm, "/resume"))[0] == 200
            return await task, stream.abort_error, answered_while_paused

    result, error, answered_while_paused = run(main())
    n = len(result)
    assert error is None and result.aborted and result.replay_complete and AT <= n < N
    assert answered_while_paused  # vLLM ends an aborted request while paused: no wait for /resume
