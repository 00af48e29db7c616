"""GenerateStream and consume() over real loopback HTTP against the emulator, on both twins."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import aiohttp
import httpx
import numpy as np
import pytest
from client_helpers import PROMPT, SkippingClock, assert_matches, payload, run, run_with_clock, wait_until

from fastaccum import (
    ServerError,
    StreamConnectionError,
    StreamFormatError,
    StreamResult,
    StreamTimeoutError,
    StreamTruncatedError,
)
from fastaccum.emulator import ABORT_REASON, Emulator, writer
from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT, GenerateStream
from fastaccum.transport.consumer import StreamConsumer, consume


async def stream_once(url: str, body: dict[str, Any], **kwargs: Any) -> StreamResult:
    async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
        return await GenerateStream(session, f"{url}/generate", body, **kwargs).run()


@pytest.mark.parametrize("interval", [1, 20, 64])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_every_token_arrives(twin: ModuleType, incremental: bool, interval: int) -> None:
    emulator = Emulator(incremental_streaming_output=incremental, stream_interval=interval)
    mode = "incremental" if incremental else "cumulative"

    async def main() -> list[StreamResult]:
        async with emulator as url:
            return [await stream_once(url, payload(f"r-{m}-", 300), mode=m) for m in ("auto", mode)]

    for result, rid in zip(run(main()), ("r-auto-", f"r-{mode}-")):
        assert result.mode == mode and not result.aborted
        assert result.finish_reason == {"type": "length", "length": 300}
        assert result.events == len(writer.emission_points(300, interval))
        assert_matches(emulator, rid, result)


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_routed_experts_and_top_p(twin: ModuleType, incremental: bool) -> None:
    emulator = Emulator(
        incremental_streaming_output=incremental,
        enable_return_routed_experts=True,
        num_layers=6,
        topk=4,
        num_experts=64,
        stream_interval=7,
    )

    async def main() -> StreamResult:
        async with emulator as url:
            body = payload(
                "x-1",
                250,
                return_routed_experts=True,
                sampling_params={"custom_params": {"return_top_p_token_ids": True}},
            )
            return await stream_once(url, body, expert_shape=(6, 4))

    result = run(main())
    assert result.routed_experts is not None and result.routed_experts.shape == (len(PROMPT) + 249, 6, 4)
    assert_matches(emulator, "x-1", result, routed=True, top_p=True)


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_version_0_5_15_and_skip_tokenizer_init(twin: ModuleType, incremental: bool) -> None:
    emulator = Emulator(
        incremental_streaming_output=incremental, version="0.5.15", stream_interval=5, skip_tokenizer_init=True
    )

    async def main() -> StreamResult:
        async with emulator as url:
            return await stream_once(url, payload("v-1", 77))

    result = run(main())
    assert result.text is None and len(result) == 77
    assert_matches(emulator, "v-1", result)


def test_rate_limited_stream_drops_or_coalesces_frames(twin: ModuleType) -> None:
    async def main() -> None:
        for incremental in (False, True):
            emulator = Emulator(incremental_streaming_output=incremental, token_rate=20_000)
            async with emulator as url:
                result = await stream_once(url, payload("t-1", 2000))
            assert len(result) == 2000
            assert_matches(emulator, "t-1", result)

    run(main())


@pytest.mark.parametrize(
    ("fault", "error", "match"),
    [
        ({"kind": "error_event", "message": "too long", "code": 400, "at": 3}, ServerError, "too long"),
        ({"kind": "malformed_json", "at": 2}, StreamFormatError, "event 2"),
        ({"kind": "cut", "at": 4}, StreamTruncatedError, "event 4"),
        ({"kind": "http_500"}, ServerError, "HTTP 500"),
    ],
    ids=["error_event", "malformed_json", "cut", "http_500"],
)
def test_faults_raise_typed_errors(twin: ModuleType, fault: dict[str, Any], error: type[Exception], match: str) -> None:
    emulator = Emulator()

    async def main() -> tuple[GenerateStream, pytest.ExceptionInfo[Exception]]:
        async with emulator as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            stream = GenerateStream(session, f"{url}/generate", payload("f-1", 20, fastaccum_fault=fault))
            with pytest.raises(error, match=match) as info:
                await stream.run()
            return stream, info

    stream, info = run(main())
    exc = info.value
    if fault["kind"] == "http_500":
        assert isinstance(exc, ServerError) and exc.status == 500 and "InternalServerError" in exc.message
    elif fault["kind"] == "error_event":
        assert isinstance(exc, ServerError) and exc.status == 400 and exc.event_index == 3
    else:
        assert getattr(exc, "event_index", None) == fault["at"]
    if fault["kind"] != "http_500":
        prefix = stream.snapshot()  # the observed prefix survives the error
        assert len(prefix) == fault["at"] and not prefix.finished
        assert_matches(emulator, "f-1", prefix)


@pytest.mark.parametrize("kind", ["coalesce", "zero_token_terminal", "split"])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_benign_faults_still_give_the_full_result(twin: ModuleType, incremental: bool, kind: str) -> None:
    emulator = Emulator(incremental_streaming_output=incremental, fault={"kind": kind, "count": 4, "size": 5})

    async def main() -> StreamResult:
        async with emulator as url:
            return await stream_once(url, payload("b-1", 60))

    result = run(main())
    assert len(result) == 60 and result.finish_reason == {"type": "length", "length": 60}
    assert_matches(emulator, "b-1", result)


def test_read_timeout_during_a_stall(twin: ModuleType) -> None:
    clock = SkippingClock()

    async def main() -> None:
        fault = {"kind": "stall", "seconds": 3600, "at": 2}
        async with Emulator() as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            stream = GenerateStream(
                session, f"{url}/generate", payload("s-1", 10, fastaccum_fault=fault), read_timeout=60
            )
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.events == 2)
            clock.skip(61)  # the timeout passes without being waited for
            with pytest.raises(StreamTimeoutError, match="no bytes") as info:
                await asyncio.wait_for(task, 30)
        assert info.value.event_index == 2

    run_with_clock(main(), clock)


def test_connection_refused_and_http_400(twin: ModuleType) -> None:
    async def main() -> None:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(StreamConnectionError, match="failed"):
                await GenerateStream(session, "http://127.0.0.1:1/generate", payload("c-1", 3)).run()
        async with Emulator() as url:
            with pytest.raises(ServerError, match="HTTP 400") as info:
                await stream_once(url, {"rid": "no-prompt"})
            assert info.value.status == 400

    run(main())


def test_abort_keeps_the_prefix_and_closes_the_connection(twin: ModuleType) -> None:
    emulator = Emulator(token_rate=2000)

    async def main() -> tuple[StreamResult, GenerateStream]:
        async with emulator as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            stream = GenerateStream(session, f"{url}/generate", payload("a-1", 100_000))
            task = asyncio.create_task(stream.run())
            await wait_until(lambda: stream.tokens >= 50 and stream.events >= 10)  # progress while running
            stream.abort()
            result = await task
            await wait_until(lambda: emulator.stats.disconnects == 1)
            assert emulator.stats.disconnected_rids == ["a-1"] and emulator.running == 0
            return result, stream

    result, stream = run(main())
    assert result.aborted and not result.finished and len(result) >= 50
    assert stream.snapshot().aborted and len(stream.snapshot()) == len(result)
    assert_matches(emulator, "a-1", result)


def test_outer_cancel_propagates_and_closes_the_connection(twin: ModuleType) -> None:
    emulator = Emulator(token_rate=2000)

    async def main() -> None:
        async with emulator as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            stream = GenerateStream(session, f"{url}/generate", payload("o-1", 100_000))
            task = asyncio.create_task(stream.run())
            await wait_until(lambda: stream.tokens >= 20)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_until(lambda: emulator.stats.disconnects == 1)
            assert_matches(emulator, "o-1", stream.snapshot())

    run(main())


def test_abort_and_outer_cancel_together_propagate(twin: ModuleType) -> None:
    async def main() -> None:
        async with Emulator(token_rate=2000) as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            stream = GenerateStream(session, f"{url}/generate", payload("ac-1", 100_000))
            task = asyncio.create_task(stream.run())
            await wait_until(lambda: stream.tokens >= 5)
            stream.abort()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    run(main())


def test_abort_inside_the_run_task_via_a_wrapper(twin: ModuleType) -> None:
    """The task running run() is not cancelled for the caller: it continues normally afterwards."""

    async def main() -> None:
        async with Emulator(token_rate=2000) as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            stream = GenerateStream(session, f"{url}/generate", payload("w-1", 100_000))

            async def watch() -> None:
                await wait_until(lambda: stream.tokens >= 5)
                stream.abort()

            async def caller() -> int:
                watcher = asyncio.create_task(watch())
                result = await stream.run()
                await watcher
                await asyncio.sleep(0.01)  # would raise if a cancellation leaked out of run()
                task = asyncio.current_task()
                assert task is not None and task.cancelling() == 0
                return len(result)

            assert await asyncio.create_task(caller()) > 0

    run(main())


def test_abort_before_the_first_byte_gives_an_empty_prefix(twin: ModuleType) -> None:
    emulator = Emulator(max_running_requests=1, token_rate=100)

    async def main() -> None:
        async with emulator as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            blocker = asyncio.create_task(GenerateStream(session, f"{url}/generate", payload("blk", 100_000)).run())
            await wait_until(lambda: emulator.running == 1)
            stream = GenerateStream(session, f"{url}/generate", payload("e-1", 10))
            task = asyncio.create_task(stream.run())
            await wait_until(lambda: emulator.queued == 1)  # headers may be in, no byte of body yet
            stream.abort()
            result = await task
            assert result.aborted and len(result) == 0 and result.events == 0
            await wait_until(lambda: emulator.queued == 0 and emulator.stats.disconnects == 1)
            blocker.cancel()
            with pytest.raises(asyncio.CancelledError):
                await blocker

    run(main())


def test_abort_before_run_sends_nothing(twin: ModuleType) -> None:
    emulator = Emulator()

    async def main() -> StreamResult:
        async with emulator as url, aiohttp.ClientSession() as session:
            stream = GenerateStream(session, f"{url}/generate", payload("n-1", 10))
            stream.abort()
            return await stream.run()

    result = run(main())
    assert result.aborted and len(result) == 0 and emulator.stats.requests == 0


def test_abort_racing_the_terminal_event_returns_the_complete_result(twin: ModuleType) -> None:
    emulator = Emulator(fault={"kind": "stall", "at": "done", "seconds": 3600})

    async def main() -> StreamResult:
        async with emulator as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            stream = GenerateStream(session, f"{url}/generate", payload("race-1", 40))
            task = asyncio.create_task(stream.run())
            await wait_until(lambda: stream.tokens == 40)  # terminal fed, [DONE] held back by the server
            stream.abort()
            # The server holds [DONE] back for an hour: only the abort can have ended the read.
            result = await asyncio.wait_for(task, 30)
            await wait_until(lambda: emulator.stats.disconnects == 1)
            return result

    result = run(main())
    assert not result.aborted and result.finished and len(result) == 40
    assert_matches(emulator, "race-1", result)


def test_kept_after_a_cancel_is_the_prefix_or_the_complete_result(twin: ModuleType) -> None:
    """What a rollout abort that cancels the task reads: the observed prefix (aborted) while the
    stream runs, the complete result once the terminal event has arrived."""
    emulator = Emulator(token_rate=2000, fault={"kind": "stall", "at": "done", "seconds": 5})

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            cut = GenerateStream(session, f"{url}/generate", payload("k-1", 100_000))
            task = asyncio.create_task(cut.run())
            await wait_until(lambda: cut.tokens >= 20)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            whole = GenerateStream(session, f"{url}/generate", payload("k-2", 40))
            task = asyncio.create_task(whole.run())
            await wait_until(lambda: whole.tokens == 40)  # terminal fed, [DONE] held back
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            return cut.kept(), whole.kept()

    prefix, complete = run(main())
    assert prefix.aborted and not prefix.finished and len(prefix) >= 20
    assert_matches(emulator, "k-1", prefix)
    assert not complete.aborted and complete.finished and len(complete) == 40
    assert_matches(emulator, "k-2", complete)


def test_server_side_abort_is_a_finished_result(twin: ModuleType) -> None:
    emulator = Emulator(token_rate=2000, enable_return_routed_experts=True)

    async def main() -> StreamResult:
        async with emulator as url, aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            body = payload(
                "sa-1",
                100_000,
                return_routed_experts=True,
                sampling_params={"custom_params": {"return_top_p_token_ids": True}},
            )
            stream = GenerateStream(session, f"{url}/generate", body, expert_shape=emulator.expert_shape)
            task = asyncio.create_task(stream.run())
            await wait_until(lambda: stream.tokens >= 30)
            await session.post(f"{url}/abort_request", json={"rid": "sa-1"})
            return await task

    result = run(main())
    assert result.finish_reason == ABORT_REASON and not result.aborted
    assert_matches(emulator, "sa-1", result, routed=True, top_p=True)


def test_200_concurrent_streams_with_random_aborts(twin: ModuleType) -> None:
    """Three kinds of stream share one session. Some run to their end. Some are aborted at a random
    moment: before the POST went out, while queued, mid-stream or after the last byte, any of which
    may happen. And some are aborted mid-stream for certain: the server stalls before their event
    ``at``, and the client aborts once it has read the ``at`` events before the stall.

    The emulator decodes in step with its writes (no ``token_rate``): a paced decoder that falls
    behind a busy loop catches up in one coalesced event and could run past the stall.
    """
    rng = random.Random(1234)
    emulator = Emulator(max_running_requests=64, incremental_streaming_output=True, stream_interval=4)
    plans: list[tuple[str, str, int, float]] = []  # (rid, kind, max_new_tokens, seconds or event index)
    for i in range(200):
        kind = rng.choice(["full", "full", "timed", "midway"])
        when = rng.randrange(1, 8) if kind == "midway" else rng.uniform(0.0, 0.15)  # 50 tokens: 14 events
        plans.append((f"c-{i:03d}-", kind, rng.randrange(50, 400), when))

    async def main() -> list[StreamResult]:
        async with emulator as url:
            connector = aiohttp.TCPConnector(limit=0)
            async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT, connector=connector) as session:

                async def one(rid: str, kind: str, n: int, when: float) -> StreamResult:
                    body = payload(rid, n)
                    if kind == "midway":
                        body["fastaccum_fault"] = {"kind": "stall", "at": when, "seconds": 60}
                    stream = GenerateStream(session, f"{url}/generate", body)
                    if kind == "timed":
                        asyncio.get_running_loop().call_later(when, stream.abort)
                    task = asyncio.ensure_future(stream.run())
                    if kind == "midway":  # it may first wait in the queue: bounded by the stall, not 5 s
                        await wait_until(lambda: task.done() or stream.events >= when, timeout=60)
                        stream.abort()
                    return await task

                results = await asyncio.gather(*(one(*plan) for plan in plans))
            await wait_until(lambda: emulator.running == 0 and emulator.queued == 0)
            return results

    results = run(main())
    for (rid, kind, n, when), result in zip(plans, results):
        assert_matches(emulator, rid, result)
        if kind == "midway":
            assert result.aborted and not result.finished and when <= len(result) < n
        elif result.aborted:
            assert kind == "timed" and not result.finished and len(result) < n
        else:
            assert len(result) == n and result.finish_reason == {"type": "length", "length": n}
    # Every stream aborted mid-stream left the server early, and no stream that was not aborted did.
    left = set(emulator.stats.disconnected_rids)
    midway = {rid for (rid, kind, _, _) in plans if kind == "midway"}
    aborted = {rid for (rid, _, _, _), r in zip(plans, results) if r.aborted}
    assert len(midway) > 20 and midway <= left <= aborted


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_httpx_consume_matches_generate_stream(twin: ModuleType, incremental: bool) -> None:
    emulator = Emulator(incremental_streaming_output=incremental, enable_return_routed_experts=True, stream_interval=3)
    body = payload(
        "h-1", 120, return_routed_experts=True, sampling_params={"custom_params": {"return_top_p_token_ids": True}}
    )

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url:
            via_aiohttp = await stream_once(url, body, expert_shape=emulator.expert_shape)
            async with httpx.AsyncClient(timeout=None) as client:
                async with client.stream("POST", f"{url}/generate", json={**body, "stream": True}) as resp:
                    via_httpx = await consume(resp.aiter_raw(), expert_shape=emulator.expert_shape)
            return via_aiohttp, via_httpx

    a, b = run(main())
    for field in ("token_ids", "logprobs", "routed_experts", "top_p_token_ids", "top_p_token_offsets"):
        assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert (a.mode, a.text, a.finish_reason, a.meta_info, a.events) == (
        b.mode,
        b.text,
        b.finish_reason,
        b.meta_info,
        b.events,
    )


def test_stream_consumer_abort_and_cancel(twin: ModuleType) -> None:
    gen = writer.synthetic_generation("g-1", 30)
    events = [writer.sse(e) for e in writer.stream_events(gen, writer.WireOptions(incremental=True))]

    yielded: list[bytes] = []

    async def pieces(stop_after: int, hold_before_done: bool = False) -> AsyncIterator[bytes]:
        for event in events[:stop_after]:
            yielded.append(event)
            yield event
            await asyncio.sleep(0)
        await asyncio.sleep(10 if hold_before_done or stop_after < len(events) else 0)
        yield writer.DONE

    async def main() -> None:
        partial = StreamConsumer(pieces(10), mode="incremental")
        task = asyncio.create_task(partial.run())
        await wait_until(lambda: partial.events == 10)
        partial.abort()
        result = await task
        assert result.aborted and len(result) == 10

        racing = StreamConsumer(pieces(len(events), hold_before_done=True))
        task = asyncio.create_task(racing.run())
        await wait_until(lambda: racing.tokens == 30)
        racing.abort()
        result = await task
        assert not result.aborted and result.finished and len(result) == 30

        yielded.clear()
        task = asyncio.create_task(consume(pieces(5)))
        await wait_until(lambda: len(yielded) == 5)  # held before its sixth piece
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        with pytest.raises(StreamTruncatedError):
            await consume(_aiter(events[:3]))

    run(main())


async def _aiter(items: list[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


def test_run_twice_is_an_error(twin: ModuleType) -> None:
    async def main() -> None:
        consumer = StreamConsumer(_aiter([]))
        with pytest.raises(StreamTruncatedError):
            await consumer.run()
        with pytest.raises(RuntimeError, match="only once"):
            await consumer.run()

    run(main())
