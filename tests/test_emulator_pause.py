"""The emulator paused and given new weights as SGLang 0.5.23 and vLLM 0.32 do it, read through
both transports on both twins: every pause mode of both engines at several points of a response,
weight versions split where each engine says, tokens and routed-expert rows from the weights that
computed them, aborts while paused, several streams and new requests across a pause, and the
control endpoints' answers. Exact pause points come from the ``pause`` fault (the pause the fault
names, as if its call came when the request held ``at`` tokens); the endpoints are called too."""

from __future__ import annotations

import asyncio
import dataclasses
from types import ModuleType
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from client_helpers import PROMPT, Transport, run, wait_until

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import ABORT_REASON, ECHO_REASON, FAULT_KEY, VLLM_ID_PREFIX, Emulator, writer
from fastaccum.emulator.writer import Generation

SHAPE = (4, 2)  # the emulator's (layers, top-k)
P = len(PROMPT)
N = 24
RATE = 2000  # tokens/s: a response of N tokens takes about 12 ms
NEW = "ckpt-2"  # the second checkpoint's model path
LOADED = {
    "success": True,
    "message": "Succeeded to update model weights. Weight version updated to v2.",
    "num_paused_requests": 0,
}
VLLM_PATH = "/inference/v1/generate"


def sglang(rid: str, n: int = N, *, fault: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "input_ids": PROMPT,
        "rid": rid,
        "return_logprob": True,
        "return_routed_experts": True,
        "sampling_params": {"max_new_tokens": n},
        **extra,
    }
    if fault is not None:
        body[FAULT_KEY] = fault
    return body


def vllm(rid: str, n: int = N, *, fault: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"token_ids": PROMPT, "request_id": rid, "sampling_params": {"max_tokens": n, "logprobs": 0}}
    if fault is not None:
        body[FAULT_KEY] = fault
    return body


def greedy(**options: Any) -> Emulator:
    return Emulator(greedy=True, enable_return_routed_experts=True, token_rate=RATE, **options)


def truth(emulator: Emulator, n: int, *, tokens_from: int | None = None, rows_from: int | None = None) -> Generation:
    """The greedy answer of ``n`` tokens, the new weights computing the tokens from ``tokens_from``
    and the routed-expert rows from sequence position ``rows_from`` on (None: never)."""
    key, first = emulator.key_of("", PROMPT)
    base = ((0, emulator.model_path),)
    return emulator.expected(
        key,
        n,
        prompt_tokens=P,
        routed_experts=True,
        first_position=first,
        token_weights=base + (((tokens_from, NEW),) if tokens_from is not None else ()),
        row_weights=base + (((rows_from, NEW),) if rows_from is not None else ()),
    )


def assert_is(result: StreamResult, gen: Generation, *, rows: bool = True) -> None:
    """Tokens, log-probs, and (``rows``) every routed-expert row, one per position but the last."""
    n = len(gen.token_ids)
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert np.array_equal(result.logprobs, np.asarray(gen.logprobs, dtype=np.float64))
    if rows:
        assert gen.routed_experts is not None and result.routed_experts is not None
        assert result.routed_experts.shape == (P + n - 1, *SHAPE)
        assert np.array_equal(result.routed_experts, gen.routed_experts[: P + n - 1])


async def post(http: aiohttp.ClientSession, url: str, path: str, body: Any = None) -> tuple[int, Any]:
    async with http.post(url + path, json=body) as resp:
        raw = await resp.read()
        return resp.status, orjson.loads(raw) if resp.content_type == "application/json" else raw or None


async def get(http: aiohttp.ClientSession, url: str, path: str) -> tuple[int, Any]:
    async with http.get(url + path) as resp:
        raw = await resp.read()
        return resp.status, orjson.loads(raw) if resp.content_type == "application/json" else raw or None


async def load_new_weights(http: aiohttp.ClientSession, url: str, **extra: Any) -> tuple[int, Any]:
    return await post(http, url, "/update_weights_from_disk", {"model_path": NEW, "weight_version": "v2", **extra})


def events_of(body: bytes) -> list[Any]:
    return [orjson.loads(block[6:]) for block in body.split(b"\n\n") if block and block != b"data: [DONE]"]


POINTS = pytest.mark.parametrize("at", [0, 12, N - 1], ids=["before-the-first-token", "mid-response", "before-the-end"])


# ---- SGLang: retract ----------------------------------------------------------------------------


@POINTS
def test_a_retract_pause_with_new_weights_splits_the_versions_where_the_new_weights_begin(
    transport: Transport, at: int
) -> None:
    emulator = greedy()

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make, aiohttp.ClientSession() as http:
            fault = {"kind": "pause", "at": at, "mode": "retract"}
            task = asyncio.ensure_future(make(sglang("r-1", fault=fault), expert_shape=SHAPE).run())
            await wait_until(lambda: emulator.paused == "retract")
            assert await load_new_weights(http, url) == (200, LOADED)  # retracted: the flush succeeds
            await post(http, url, "/continue_generation", {})
            return await task

    result = run(main())
    kept = at + 1  # the step in flight is committed before the request is retracted
    if kept == N:  # that step ended it: nothing was retracted
        assert result.weight_version_spans == ((0, N, "default"),) and result.meta_info["num_retractions"] == 0
        assert_is(result, truth(emulator, N))
        return
    assert result.weight_version_spans == ((0, kept, "default"), (kept, N, "v2"))
    assert result.meta_info["num_retractions"] == 1 and result.meta_info["weight_version"] == "v2"
    # The flushed cache: the re-prefill computed every row of prompt + prefix under the new weights.
    assert_is(result, truth(emulator, N, tokens_from=kept, rows_from=0))
    assert emulator.stats.retractions == 1


@pytest.mark.parametrize("flush", [True, False], ids=["flushed", "cache-kept"])
def test_a_retracted_request_decodes_what_the_new_weights_answer_to_its_prompt_and_prefix(
    twin: ModuleType, flush: bool
) -> None:
    emulator = greedy()

    async def main() -> tuple[StreamResult, StreamResult, int]:
        async with emulator as url, fastaccum.Client(url) as client, aiohttp.ClientSession() as http:
            stream = client.stream(sglang("r-1", 40, fault={"kind": "hold", "at": 10}), expert_shape=SHAPE)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens == 10)
            seen = stream.tokens
            paused = await post(http, url, "/pause_generation", {"mode": "retract"})
            assert paused == (200, {"message": "Generation paused successfully.", "status": "ok"})
            assert (await load_new_weights(http, url, flush_cache=flush))[0] == 200
            continued = await post(http, url, "/continue_generation", {})
            assert continued == (200, {"message": "Generation continued successfully.", "status": "ok"})
            result = await task
            kept = result.weight_version_spans[0][1]
            resumed = sglang("r-2", 40 - kept, input_ids=PROMPT + result.token_ids[:kept].tolist())
            return result, await client.stream(resumed, expert_shape=SHAPE).run(), seen

    result, fresh, seen = run(main())
    kept = result.weight_version_spans[0][1]
    # The step in flight when the call came was committed before the retraction.
    assert kept == seen + 1 and result.weight_version_spans == ((0, kept, "default"), (kept, 40, "v2"))
    assert fresh.token_ids.tolist() == result.token_ids[kept:].tolist()
    assert np.array_equal(fresh.logprobs, result.logprobs[kept:])
    assert fresh.routed_experts.shape == result.routed_experts.shape == (P + 40 - 1, *SHAPE)
    if flush:  # every row recomputed under the new weights: a fresh request's rows, row for row
        assert np.array_equal(fresh.routed_experts, result.routed_experts)
    else:  # the prompt was a cache hit and keeps the rows of its first prefill
        assert np.array_equal(fresh.routed_experts[P:], result.routed_experts[P:])
        assert np.array_equal(result.routed_experts, truth(emulator, 40, tokens_from=kept, rows_from=P).routed_experts)


def test_several_streams_retracted_at_once_each_split_where_it_stood(transport: Transport) -> None:
    emulator = greedy()
    AT = (0, 5, 14)  # tokens each holds when the pause call comes

    async def main() -> list[StreamResult]:
        async with emulator as url, transport.open(url) as make, aiohttp.ClientSession() as http:
            streams = [make(sglang(f"r-{at}", 60, fault={"kind": "hold", "at": at}), expert_shape=SHAPE) for at in AT]
            tasks = [asyncio.ensure_future(s.run()) for s in streams]
            await wait_until(lambda: [s.tokens for s in streams] == list(AT))
            await post(http, url, "/pause_generation", {"mode": "retract"})
            assert emulator.retracted == 3 and emulator.running == 0
            await load_new_weights(http, url)
            await post(http, url, "/continue_generation", {})
            return list(await asyncio.gather(*tasks))

    for at, result in zip(AT, run(main())):
        (_, kept, old), (_, end, new) = result.weight_version_spans
        assert (old, new, end, kept) == ("default", "v2", 60, at + 1)
        assert_is(result, truth(emulator, 60, tokens_from=kept, rows_from=0))
        assert result.meta_info["num_retractions"] == 1


# ---- SGLang: in place ---------------------------------------------------------------------------


@POINTS
def test_an_in_place_pause_keeps_the_old_rows_and_labels_the_step_in_flight_with_the_new_version(
    transport: Transport, at: int
) -> None:
    emulator = greedy()

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make, aiohttp.ClientSession() as http:
            fault = {"kind": "pause", "at": at, "mode": "in_place"}
            task = asyncio.ensure_future(make(sglang("r-1", fault=fault), expert_shape=SHAPE).run())
            await wait_until(lambda: emulator.paused == "in_place")
            # The running batch cannot be flushed: the weights are loaded all the same.
            status, answer = await load_new_weights(http, url)
            assert status == 400 and answer == {
                "success": False,
                "message": "Weights were updated, but the cache was not flushed because requests are still "
                "running or queued. Retract or finish them, then call /flush_cache.",
                "num_paused_requests": 0,
            }
            assert emulator.weights == NEW and emulator.weight_version == "v2"
            await post(http, url, "/continue_generation", {})
            return await task

    result = run(main())
    # The step in flight at the pause (token ``at``) ran under the old weights, and is labelled
    # with the version in force when it was committed, at continue: the new weights begin one later.
    old = ((0, at, "default"),) if at else ()
    assert result.weight_version_spans == (*old, (at, N, "v2"))
    assert result.meta_info["weight_version"] == "v2" and result.meta_info["num_retractions"] == 0
    tokens_from = at + 1 if at + 1 < N else None
    rows_from = P + at if P + at < P + N - 1 else None
    assert_is(result, truth(emulator, N, tokens_from=tokens_from, rows_from=rows_from))


def test_a_failed_flush_leaves_the_events_label_old_and_the_record_new(twin: ModuleType) -> None:
    """The scheduler holds the new version, the tokenizer the old: every event says ``default``
    until the finishing one, whose record splits where the scheduler changed."""
    emulator = greedy(incremental_streaming_output=True)

    async def main() -> bytes:
        async with emulator as url, aiohttp.ClientSession() as http:
            fault = {"kind": "pause", "at": 8, "mode": "in_place"}
            async with http.post(f"{url}/generate", json=sglang("r-1", stream=True, fault=fault)) as resp:
                await wait_until(lambda: emulator.paused == "in_place")
                assert (await load_new_weights(http, url))[0] == 400
                await post(http, url, "/continue_generation", {})
                return await resp.read()

    body = run(main())
    events = events_of(body)
    assert {e["meta_info"]["weight_version"] for e in events[:-1]} == {"default"}
    assert events[-1]["meta_info"]["weight_version"] == "v2"
    before_the_end = twin.StreamAccumulator()
    before_the_end.feed(writer.stream_bytes(events[:-1], done=False))
    held = N - len(events[-1]["output_ids"])  # the finishing event's delta may hold several
    assert held >= 8 and before_the_end.snapshot().weight_version_spans == ((0, held, "default"),)
    result = twin.accumulate([body])
    assert result.weight_version_spans == ((0, 8, "default"), (8, N, "v2"))


# ---- SGLang: abort ------------------------------------------------------------------------------


@POINTS
def test_an_abort_pause_ends_each_stream_one_token_later_and_echoes_the_queued_ones(
    transport: Transport, at: int
) -> None:
    emulator = greedy(max_running_requests=2)

    async def main() -> list[StreamResult]:
        async with emulator as url, transport.open(url) as make:
            pausing = make(sglang("r-1", fault={"kind": "pause", "at": at, "mode": "abort"}), expert_shape=SHAPE)
            tasks = [asyncio.ensure_future(s.run()) for s in (make(sglang("r-0", 200), expert_shape=SHAPE), pausing)]
            tasks.append(asyncio.ensure_future(make(sglang("r-2", 200), expert_shape=SHAPE).run()))
            return list(await asyncio.gather(*tasks))

    other, paused, queued = run(main())
    for result in (other, paused):
        assert not result.aborted and result.finish_reason == ABORT_REASON
        assert_is(result, truth(emulator, len(result)))  # every routed-expert row it holds
        assert result.weight_version_spans == ((0, len(result), "default"),)
    # One more step after the pause, then the abort: the abort ends it even at its last token.
    assert len(paused) == at + 1
    assert not queued.aborted and queued.finish_reason == ECHO_REASON and len(queued) == 0
    assert emulator.paused == "abort" and emulator.stats.aborted == 3


def test_an_abort_pause_returns_once_every_stream_ended_and_new_requests_wait_for_continue(twin: ModuleType) -> None:
    emulator = greedy()

    async def main() -> tuple[list[StreamResult], bytes, StreamResult]:
        async with emulator as url, fastaccum.Client(url) as client, aiohttp.ClientSession() as http:
            hold = {"kind": "hold", "at": 3}
            streams = [client.stream(sglang(f"r-{i}", 200, fault=hold), expert_shape=SHAPE) for i in range(2)]
            tasks = [asyncio.ensure_future(s.run()) for s in streams]
            await wait_until(lambda: all(s.tokens == 3 for s in streams))
            assert (await post(http, url, "/pause_generation", {}))[0] == 200  # mode "abort" by default
            assert emulator.running == emulator.queued == 0  # every stream ended before the answer
            ended = list(await asyncio.gather(*tasks))
            # While paused a new streaming request gets its headers, then nothing.
            async with http.post(f"{url}/generate", json=sglang("n-1", stream=True)) as resp:
                assert resp.status == 200 and resp.content_type == "text/event-stream"
                whole = asyncio.ensure_future(client.generate(sglang("n-2"), expert_shape=SHAPE))
                await wait_until(lambda: emulator.stats.requests == 4)
                assert emulator.stats.tokens == sum(len(r) for r in ended) and emulator.running == 0
                assert (await load_new_weights(http, url))[0] == 200
                await post(http, url, "/continue_generation", {})
                body = await resp.read()
            answer = await whole
            assert isinstance(answer, StreamResult)
            return ended, body, answer

    ended, body, answer = run(main())
    for result in ended:  # one more step after the call
        assert not result.aborted and len(result) == 4 and result.finish_reason == ABORT_REASON
        assert_is(result, truth(emulator, len(result)))
    # They reached the scheduler after the update: the new weights' answer, the new version's label.
    for result in (twin.accumulate([body]), answer):
        assert result.finished and result.weight_version_spans == ((0, N, "v2"),)
        assert_is(result, truth(emulator, N, tokens_from=0, rows_from=0), rows=result is answer)


# ---- SGLang: an abort while paused --------------------------------------------------------------


def test_an_abort_while_paused_in_place_is_drained_at_continue_with_its_routed_experts(twin: ModuleType) -> None:
    emulator = greedy()

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=60) as client, aiohttp.ClientSession() as http:
            stream = client.stream(
                sglang("r-1", 200, fault={"kind": "pause", "at": 8, "mode": "in_place"}), expert_shape=SHAPE
            )
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.paused == "in_place" and stream.tokens == 8)
            stream.abort()
            await wait_until(lambda: emulator.stats.aborted == 1)
            # Kept as it is: the new version labels the step still in flight.
            await post(http, url, "/update_weight_version", {"new_version": "v2", "abort_all_requests": False})
            assert emulator.running == 1 and not task.done()
            await post(http, url, "/continue_generation", {})
            return await task

    result = run(main())
    assert result.aborted and result.finish_reason == ABORT_REASON and len(result) == 9
    assert result.weight_version_spans == ((0, 8, "default"), (8, 9, "v2"))
    assert_is(result, truth(emulator, 9))


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_an_abort_while_retracted_is_the_queue_echo_at_once(twin: ModuleType, incremental: bool) -> None:
    emulator = greedy(incremental_streaming_output=incremental)

    async def main() -> tuple[bytes, StreamResult]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=60) as client, aiohttp.ClientSession() as http:
            fault = {"kind": "pause", "at": 8, "mode": "retract"}
            async with http.post(f"{url}/generate", json=sglang("r-1", 200, stream=True, fault=fault)) as resp:
                await wait_until(lambda: emulator.retracted == 1)
                await post(http, url, "/abort_request", {"rid": "r-1"})
                body = await resp.read()
            stream = client.stream(sglang("r-2", 200, fault={**fault, "mode": "retract"}), expert_shape=SHAPE)
            await post(http, url, "/continue_generation", {})
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.retracted == 1)
            stream.abort()
            result = await task
            assert emulator.paused == "retract"  # the echo came during the pause
            return body, result

    body, result = run(main())
    gen = dataclasses.replace(truth(emulator, 9), rid="r-1", num_retractions=1)
    echo = writer.echo_event(gen, writer.WireOptions(incremental=incremental), 9)
    assert events_of(body)[-1] == orjson.loads(orjson.dumps(echo))  # no routed experts, no num_retractions
    assert (echo["output_ids"] == [gen.token_ids[8]]) is incremental  # the last id again
    assert result.aborted and result.finish_reason == ECHO_REASON and result.routed_experts is None
    assert_is(result, truth(emulator, 9), rows=False)
    assert "num_retractions" not in result.meta_info and result.weight_version_spans == ((0, 9, "default"),)


# ---- SGLang: versions, updates, health ---------------------------------------------------------


@pytest.mark.parametrize("abort_all", [True, False], ids=["aborts-by-default", "kept"])
def test_update_weight_version_aborts_every_request_unless_told_not_to(twin: ModuleType, abort_all: bool) -> None:
    emulator = greedy()
    n = 200 if abort_all else 60

    async def main() -> list[StreamResult]:
        async with emulator as url, fastaccum.Client(url) as client, aiohttp.ClientSession() as http:
            hold = {"kind": "hold", "at": 3}
            streams = [client.stream(sglang(f"r-{i}", n, fault=hold), expert_shape=SHAPE) for i in range(2)]
            tasks = [asyncio.ensure_future(s.run()) for s in streams]
            await wait_until(lambda: all(s.tokens == 3 for s in streams))
            body: dict[str, Any] = (
                {"new_version": "v2"} if abort_all else {"new_version": "v2", "abort_all_requests": False}
            )
            answer = await post(http, url, "/update_weight_version", body)
            assert answer == (200, {"success": True, "message": "Weight version updated to v2", "new_version": "v2"})
            return list(await asyncio.gather(*tasks))

    for result in run(main()):
        (_, split, old), (_, end, new) = result.weight_version_spans
        assert (old, new, end, result.finish_reason == ABORT_REASON) == ("default", "v2", len(result), abort_all)
        assert_is(result, truth(emulator, len(result)))  # the same weights throughout
        # The step in flight when the call came is committed after the change, so labelled with it.
        assert split == 3
        if abort_all:  # that step, then the abort
            assert len(result) == 4 and result.finish_reason == ABORT_REASON
        else:
            assert len(result) == n


def test_an_update_outside_a_pause_waits_for_every_request_and_holds_new_ones(twin: ModuleType) -> None:
    emulator = greedy()

    async def main() -> tuple[StreamResult, StreamResult, StreamResult]:
        async with emulator as url, fastaccum.Client(url) as client, aiohttp.ClientSession() as http:
            # r-0 stays in flight until aborted; r-1 is mid-response when the update comes.
            blocking = asyncio.ensure_future(client.stream(sglang("r-0", 60, fault={"kind": "retract"})).run())
            await wait_until(lambda: emulator.retracted == 1)
            stream = client.stream(sglang("r-1", 60, fault={"kind": "hold", "at": 3}), expert_shape=SHAPE)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens == 3)
            update = asyncio.ensure_future(load_new_weights(http, url))
            await wait_until(lambda: emulator.scheduler.updating)
            later = asyncio.ensure_future(client.stream(sglang("r-2"), expert_shape=SHAPE).run())
            await wait_until(lambda: emulator.stats.requests == 3)
            first = await task  # r-1 runs to its end under the old weights
            assert emulator.queued == 0 and not update.done()  # r-2 waits behind the update, r-0 holds it
            await post(http, url, "/abort_request", {"rid": "r-0"})
            assert await update == (200, LOADED)
            return await blocking, first, await later

    blocking, first, later = run(main())
    assert blocking.finish_reason == ECHO_REASON
    assert first.finished and first.weight_version_spans == ((0, 60, "default"),)
    assert_is(first, truth(emulator, 60))
    assert later.weight_version_spans == ((0, N, "v2"),)
    assert_is(later, truth(emulator, N, tokens_from=0, rows_from=0))


def test_health_waits_then_503_and_ready_is_503_while_paused() -> None:
    quick, patient = greedy(health_check_timeout_s=0.01), greedy(health_check_timeout_s=60)

    async def main() -> None:
        async with quick as url, patient as other, aiohttp.ClientSession() as http:
            assert (await get(http, url, "/ready"))[0] == (await get(http, url, "/health"))[0] == 200
            await post(http, url, "/pause_generation", {"mode": "retract"})
            assert (await get(http, url, "/ready"))[0] == 503  # at once
            assert (await get(http, url, "/health"))[0] == 503  # once no word came within the timeout
            await post(http, url, "/continue_generation", {})
            assert (await get(http, url, "/health"))[0] == (await get(http, url, "/ready"))[0] == 200
            # A health check that the continue answers.
            await post(http, other, "/pause_generation", {"mode": "in_place"})
            health = asyncio.ensure_future(get(http, other, "/health"))
            await wait_until(lambda: patient.stats.calls.get("/health") == 1)
            await post(http, other, "/continue_generation", {})
            assert (await health)[0] == 200

    run(main())


def test_sglang_control_endpoints_refuse_what_sglang_refuses() -> None:
    async def main() -> None:
        async with greedy() as url, aiohttp.ClientSession() as http:
            status, answer = await post(http, url, "/pause_generation", {"mode": "freeze"})
            assert status == 422 and answer["detail"][0]["loc"] == ["body", "mode"]
            assert (await post(http, url, "/update_weights_from_disk", {"weight_version": "v2"}))[0] == 422
            assert (await post(http, url, "/update_weight_version", {}))[0] == 422
            # Idle: the flush succeeds; without a version the labels stay.
            assert await post(http, url, "/update_weights_from_disk", {"model_path": NEW}) == (
                200,
                {"success": True, "message": "Succeeded to update model weights.", "num_paused_requests": 0},
            )

    run(main())


# ---- vLLM ---------------------------------------------------------------------------------------


def vllm_emulator(**options: Any) -> Emulator:
    return greedy(dialect="vllm", vllm_server_dev_mode=True, weight_version="default", **options)


def test_a_vllm_abort_pause_ends_each_stream_with_the_abort_chunk_and_queues_new_requests(transport: Transport) -> None:
    emulator = vllm_emulator()

    async def main() -> tuple[list[StreamResult], StreamResult]:
        async with emulator as url, transport.open(url) as make, aiohttp.ClientSession() as http:

            def stream(body: dict[str, Any]) -> Any:
                return make(body, path=VLLM_PATH, dialect="vllm", expert_shape=SHAPE)

            pausing = stream(vllm("v-1", 200, fault={"kind": "pause", "at": 6, "mode": "abort"}))
            ended = await asyncio.gather(stream(vllm("v-0", 200)).run(), pausing.run())
            assert await get(http, url, "/is_paused") == (200, {"is_paused": True})
            later = asyncio.ensure_future(stream(vllm("v-2")).run())
            await wait_until(lambda: emulator.queued == 1)  # queued, not aborted
            assert await post(http, url, "/resume") == (200, {"status": "resumed"})
            return list(ended), await later

    ended, later = run(main())
    for result in ended:
        assert not result.aborted and result.finish_reason == {"type": "abort"}
        assert result.weight_version_spans == ((0, len(result), "default"),)
        assert_is(result, truth(emulator, len(result)))
    assert len(ended[1]) == 6  # vLLM aborts between steps: no token more
    assert later.finished and not later.aborted
    assert_is(later, truth(emulator, N))


def test_a_vllm_wait_pause_returns_once_the_running_requests_finished(twin: ModuleType) -> None:
    emulator = vllm_emulator()

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, fastaccum.Client(url, dialect="vllm") as client, aiohttp.ClientSession() as http:
            hold = {"kind": "hold", "at": 3}
            running = asyncio.ensure_future(client.stream(vllm("v-1", 400, fault=hold), expert_shape=SHAPE).run())
            await wait_until(lambda: emulator.stats.tokens == 3)
            pause = asyncio.ensure_future(post(http, url, "/pause?mode=wait"))
            await wait_until(lambda: emulator.paused == "wait")
            later = asyncio.ensure_future(client.stream(vllm("v-2"), expert_shape=SHAPE).run())
            await wait_until(lambda: emulator.queued == 1)
            assert await pause == (200, {"status": "paused"})
            # The call came at token 3 and returned once all 400 were decoded; nothing decodes now.
            assert emulator.stats.tokens == 400 and all(r.final is not None for r in emulator.scheduler.running)
            assert emulator.queued == 1 and VLLM_ID_PREFIX + "v-2" not in emulator.stats.written
            await post(http, url, "/resume")
            return await running, await later

    first, later = run(main())
    assert first.finished and not first.aborted and len(first) == 400
    assert_is(first, truth(emulator, 400))
    assert_is(later, truth(emulator, N))


@POINTS
@pytest.mark.parametrize("clear_cache", [True, False], ids=["preempted", "frozen"])
def test_a_vllm_keep_pause_freezes_streams_and_a_new_version_labels_the_rest(
    transport: Transport, clear_cache: bool, at: int
) -> None:
    emulator = vllm_emulator()

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make, aiohttp.ClientSession() as http:
            fault = {"kind": "pause", "at": at, "mode": "keep", "clear_cache": clear_cache}
            task = asyncio.ensure_future(
                make(vllm("v-1", fault=fault), path=VLLM_PATH, dialect="vllm", expert_shape=SHAPE).run()
            )
            await wait_until(lambda: emulator.paused == "keep")
            answer = await post(http, url, "/update_weight_version", {"new_version": "v2"})
            assert answer == (200, {"success": True, "new_version": "v2"})
            assert await get(http, url, "/weight_info") == (200, {"weight_version": "v2"})
            assert emulator.running == 1 and emulator.stats.preemptions == int(clear_cache)
            await post(http, url, "/resume")
            return await task

    result = run(main())
    old = ((0, at, "default"),) if at else ()  # no token under the old version: all under the new
    assert result.finished and result.weight_version_spans == (*old, (at, N, "v2"))
    assert_is(result, truth(emulator, N))  # the same weights: the uninterrupted answer, every row


def test_a_vllm_abort_while_paused_keep_ends_the_stream_at_once(twin: ModuleType) -> None:
    emulator = vllm_emulator()

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, dialect="vllm", abort_drain_s=60) as client:
            stream = client.stream(
                vllm("v-1", 200, fault={"kind": "pause", "at": 10, "mode": "keep"}), expert_shape=SHAPE
            )
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.paused == "keep" and stream.tokens == 10)
            stream.abort()
            result = await task
            assert emulator.paused == "keep"
            return result

    result = run(main())
    assert result.aborted and result.finish_reason == {"type": "abort"} and len(result) == 10
    assert result.weight_version_spans == ((0, 10, "default"),)
    assert_is(result, truth(emulator, 10))


def test_vllm_pause_endpoints_are_the_dev_mode_api() -> None:
    async def main() -> None:
        async with greedy(dialect="vllm") as plain, vllm_emulator() as dev, aiohttp.ClientSession() as http:
            assert (await post(http, plain, "/pause"))[0] == 404
            assert await get(http, dev, "/is_paused") == (200, {"is_paused": False})
            status, answer = await post(http, dev, "/pause?mode=retract")
            assert status == 422 and answer["detail"][0]["loc"] == ["query", "mode"]
            assert await post(http, dev, "/pause?mode=keep&clear_cache=false") == (200, {"status": "paused"})
            assert await get(http, dev, "/is_paused") == (200, {"is_paused": True})

    run(main())
