"""Both transports (GenerateStream on aiohttp, fastaccum.Client) on both twins: one contract.

Abort at every phase, the server seeing the disconnect, error statuses, malformed responses from a
raw socket server, timeouts, keep-alive reuse, read coalescing with the drain at abort, timing, an
abort storm, and uvloop. No timing asserts: tests wait on conditions with generous timeouts.
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import client_helpers
import numpy as np
import pytest
import uvloop
from aiohttp import web
from client_helpers import (
    CHUNKED_HEAD,
    EVENTS,
    RawServer,
    SkippingClock,
    Transport,
    assert_matches,
    chunks,
    payload,
    run,
    run_with_clock,
)

import fastaccum
from fastaccum import (
    ServerError,
    StreamConnectionError,
    StreamFormatError,
    StreamResult,
    StreamTimeoutError,
    StreamTruncatedError,
)
from fastaccum.emulator import Emulator
from fastaccum.transport.consumer import StreamConsumer

# Abort storms and coalescing windows on a loaded 2-core machine: wait longer than test_client.py.
wait_until = functools.partial(client_helpers.wait_until, timeout=30.0)


class CountingEmulator(Emulator):
    """The emulator, also recording each request's client address (one per connection) and headers."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.peers: list[Any] = []
        self.headers: list[dict[str, str]] = []

    def make_app(self) -> web.Application:
        app = super().make_app()

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path == "/generate":
                self.peers.append(request.transport.get_extra_info("peername") if request.transport else None)
                self.headers.append(dict(request.headers))
            return await handler(request)

        app.middlewares.append(record)
        return app


# ---- tests ----------------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [1, 20])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_every_token_arrives(transport: Transport, incremental: bool, interval: int) -> None:
    emulator = Emulator(incremental_streaming_output=incremental, stream_interval=interval, token_rate=5000)

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            return await make(payload("e-1", 300)).run()

    result = run(main())
    assert result.finish_reason == {"type": "length", "length": 300} and not result.aborted
    assert_matches(emulator, "e-1", result)


def test_an_abort_before_run_sends_nothing_and_says_so(transport: Transport) -> None:
    """abort() before run(): no request is written, and the result says the server never held it
    (``request_sent`` False, so ``replay_complete``: nothing exists to replay)."""
    emulator = CountingEmulator()

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            stream = make(payload("early-1", 5))
            stream.abort()
            return await stream.run()

    result = run(main())
    assert result.aborted and not result.request_sent and result.replay_complete and not result.finished
    assert len(result) == 0 and emulator.stats.calls.get("/generate", 0) == 0


def test_an_abort_before_run_of_consume_reads_nothing_and_says_so(twin: ModuleType) -> None:
    """The same contract for a stream over any byte iterator (StreamConsumer, consume()'s base)."""
    read: list[bytes] = []

    async def pieces() -> AsyncIterator[bytes]:
        read.append(b"x")
        yield b"data: [DONE]\n\n"

    async def main() -> StreamResult:
        stream = StreamConsumer(pieces())
        stream.abort()
        return await stream.run()

    result = run(main())
    assert result.aborted and not result.request_sent and result.replay_complete and not read


def test_a_streams_events_are_its_results_events(transport: Transport) -> None:
    """One count of events: the stream's progress counter ends where ``result.events`` (and
    Client's timing) does; ``[DONE]`` is not an event of the stream's JSON."""

    async def main() -> tuple[Any, StreamResult]:
        async with Emulator(incremental_streaming_output=True) as url, transport.open(url) as make:
            stream = make(payload("ev-1", 7))
            return stream, await stream.run()

    stream, result = run(main())
    assert stream.events == result.events == 7
    if transport.kind == "client":
        assert result.timing is not None and result.timing.events == 7


def test_sequential_completed_streams_share_one_connection(transport: Transport) -> None:
    emulator = CountingEmulator(token_rate=5000)

    async def main() -> None:
        async with emulator as url, transport.open(url) as make:
            for i in range(4):
                assert len(await make(payload(f"k-{i}", 50)).run()) == 50

    run(main())
    assert len(emulator.peers) == 4 and len(set(emulator.peers)) == 1


def test_routed_experts_from_the_payloads_start_and_the_indexer_top_k(transport: Transport) -> None:
    """routed_experts_start_len is not echoed in the stream: the transports read it from the payload."""
    emulator = Emulator(enable_return_routed_experts=True, enable_return_indexer_topk=True, token_rate=5000)
    body = payload("rs-1", 30, return_routed_experts=True, return_indexer_topk=True, routed_experts_start_len=2)

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            return await make(body, expert_shape=(4, 2), indexer_shape=emulator.indexer_shape).run()

    result = run(main())
    truth = emulator.expected("rs-1", 30, prompt_tokens=4, routed_experts=True, routed_start=2, indexer_topk=True)
    assert result.routed_experts.shape == (4 + 30 - 1 - 2, 4, 2)
    assert np.array_equal(result.routed_experts, truth.routed_experts)
    assert np.array_equal(result.indexer_topk, truth.indexer_topk)


def test_a_cut_abort_closes_its_connection(transport: Transport) -> None:
    emulator = CountingEmulator(token_rate=2000)

    async def main() -> None:
        async with emulator as url, transport.open(url, abort_drain_s=None) as make:
            stream = make(payload("ab-1", 100_000))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 20)
            stream.abort()
            result = await task
            assert result.aborted and len(result) >= 20
            assert_matches(emulator, "ab-1", result)
            await wait_until(lambda: emulator.stats.disconnects == 1 and emulator.running == 0)
            assert len(await make(payload("ab-2", 30)).run()) == 30

    run(main())
    assert len(set(emulator.peers)) == 2


def test_abort_before_run_sends_nothing(transport: Transport) -> None:
    emulator = Emulator()

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            stream = make(payload("n-1", 10))
            stream.abort()
            return await stream.run()

    result = run(main())
    assert result.aborted and len(result) == 0 and emulator.stats.requests == 0


def test_abort_while_waiting_for_the_response_head(transport: Transport) -> None:
    async def main() -> None:
        raw = RawServer([], hold=60)
        async with raw as url, transport.open(url) as make:
            stream = make(payload("h-1", 10))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: raw.requests == 1)
            stream.abort()
            result = await task
            assert result.aborted and len(result) == 0 and stream.status is None
            await wait_until(lambda: raw.client_left == 1)

    run(main())


def test_abort_after_the_terminal_event_returns_the_complete_result(transport: Transport) -> None:
    emulator = Emulator(fault={"kind": "stall", "at": "done", "seconds": 30})

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            stream = make(payload("t-1", 40))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens == 40)
            stream.abort()
            result = await task
            await wait_until(lambda: emulator.stats.disconnects == 1)
            return result

    result = run(main())
    assert result.finished and not result.aborted and len(result) == 40


def test_outer_cancel_propagates_and_the_server_sees_it(transport: Transport) -> None:
    emulator = Emulator(token_rate=2000)

    async def main() -> None:
        async with emulator as url, transport.open(url) as make:
            stream = make(payload("o-1", 100_000))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_until(lambda: emulator.stats.disconnects == 1)
            assert_matches(emulator, "o-1", stream.kept())

    run(main())


@pytest.mark.parametrize("status", [400, 500, 503])
def test_error_statuses_are_server_errors_with_the_body(transport: Transport, status: int) -> None:
    body = b'{"error": "no room"}'
    parts = [
        b"HTTP/1.1 %d Oops\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (status, len(body), body)
    ]

    async def main() -> None:
        async with RawServer(parts) as url, transport.open(url) as make:
            with pytest.raises(ServerError, match=f"HTTP {status} from .*no room") as info:
                await make(payload("s-1", 10)).run()
            assert info.value.status == status and "no room" in info.value.message

    run(main())


def test_http_500_from_the_emulator(transport: Transport) -> None:
    async def main() -> None:
        async with Emulator() as url, transport.open(url) as make:
            with pytest.raises(ServerError, match="HTTP 500") as info:
                await make(payload("f-1", 10, fastaccum_fault={"kind": "http_500"})).run()
            assert info.value.status == 500 and "InternalServerError" in info.value.message

    run(main())


@pytest.mark.parametrize(
    ("parts", "kept"),
    [
        ([b"HTTP/1.1 2x0 OK\r\nContent-Length: 0\r\n\r\n"], 0),
        ([b"HTTP/1.1 200 OK\r\nBad Header\r\nContent-Length: 5\r\n\r\n"], 0),
        ([CHUNKED_HEAD + chunks(EVENTS[:3]), b"zz\r\n" + EVENTS[3]], 3),
        ([CHUNKED_HEAD + chunks(EVENTS[:2]), b"5\r\n" + EVENTS[2][:5] + b"XX"], 2),
    ],
    ids=["bad-status-line", "bad-header", "bad-chunk-size", "no-crlf-after-chunk"],
)
def test_malformed_responses_are_format_errors_that_keep_the_prefix(
    transport: Transport, parts: list[bytes], kept: int
) -> None:
    async def main() -> None:
        async with RawServer(parts) as url, transport.open(url) as make:
            stream = make(payload("m-1", 10))
            with pytest.raises(StreamFormatError, match="malformed"):
                await stream.run()
            assert len(stream.snapshot()) == kept

    run(main())


def test_a_reset_mid_stream_is_end_of_input(transport: Transport) -> None:
    async def main() -> None:
        async with RawServer([CHUNKED_HEAD + chunks(EVENTS[:4])], hold=0.2) as url, transport.open(url) as make:
            stream = make(payload("r-1", 10))
            with pytest.raises(StreamTruncatedError):
                await stream.run()
            assert len(stream.snapshot()) == 4
        # The terminal event arrived: a missing end of the chunked body loses nothing.
        async with RawServer([CHUNKED_HEAD + chunks(EVENTS)], hold=0.2) as url, transport.open(url) as make:
            result = await make(payload("r-2", 10)).run()
            assert result.finished and len(result) == 10

    run(main())


def test_content_length_and_close_delimited_bodies(transport: Transport) -> None:
    body = b"".join(EVENTS) + b"data: [DONE]\n\n"
    with_length = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + body

    async def main() -> None:
        async with RawServer([with_length]) as url, transport.open(url) as make:
            assert len(await make(payload("cl-1", 10)).run()) == 10
        async with RawServer([until_close], hold=0.1) as url, transport.open(url) as make:
            assert len(await make(payload("cl-2", 10)).run()) == 10

    run(main())


def test_read_timeout_during_a_stall(transport: Transport) -> None:
    """The server goes silent after two events; once ``read_timeout`` passes (the clock is moved,
    not waited for) the stream fails naming the event, keeping what arrived."""
    clock = SkippingClock()

    async def main() -> None:
        fault = {"kind": "stall", "seconds": 3600, "at": 2}
        async with Emulator() as url, transport.open(url) as make:
            stream = make(payload("st-1", 10, fastaccum_fault=fault), read_timeout=60)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.events == 2)
            clock.skip(61)
            with pytest.raises(StreamTimeoutError, match="no bytes") as info:
                await asyncio.wait_for(task, 30)
            assert info.value.event_index == 2 and len(stream.snapshot()) == 2

    run_with_clock(main(), clock)


def test_no_read_timeout_before_its_time(transport: Transport) -> None:
    """The same silence, the clock moved short of ``read_timeout``: the stream still waits, and
    the server's next bytes end it normally."""
    clock = SkippingClock()

    async def main() -> StreamResult:
        fault = {"kind": "stall", "seconds": 50, "at": 2}
        async with Emulator() as url, transport.open(url) as make:
            stream = make(payload("st-2", 10, fastaccum_fault=fault), read_timeout=60)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.events == 2)
            clock.skip(51)  # past the server's silence, not past the timeout
            return await asyncio.wait_for(task, 30)

    result = run_with_clock(main(), clock)
    assert result.finished and len(result) == 10


def test_a_refused_connection_says_refused_and_names_the_address_once(transport: Transport) -> None:
    async def main() -> None:
        async with transport.open("http://127.0.0.1:1") as make:
            with pytest.raises(
                StreamConnectionError, match="^POST http://127.0.0.1:1/generate failed: connection refused"
            ) as info:
                await make(payload("c-1", 3)).run()
            assert str(info.value).count("127.0.0.1") == 1

    run(main())


def test_headers_per_client_and_per_request(transport: Transport) -> None:
    emulator = CountingEmulator()

    async def main() -> None:
        async with emulator as url, transport.open(url, headers={"X-Team": "rl"}) as make:
            await make(payload("hd-1", 5), headers={"X-SMG-Routing-Key": "sample-7"}).run()

    run(main())
    assert emulator.headers[0]["X-Team"] == "rl" and emulator.headers[0]["X-SMG-Routing-Key"] == "sample-7"


def test_200_streams_with_random_aborts(transport: Transport) -> None:
    rng = random.Random(99)
    emulator = Emulator(max_running_requests=64, incremental_streaming_output=True, stream_interval=4)
    plans = [
        (
            f"st-{i:03d}-",
            rng.choice(["full", "timed", "midway"]),
            rng.randrange(50, 300),
            rng.uniform(0.0, 0.15),
            rng.randrange(1, 8),
        )
        for i in range(200)
    ]

    async def main() -> list[StreamResult]:
        async with emulator as url, transport.open(url) as make:

            async def one(rid: str, kind: str, n: int, delay: float, at: int) -> StreamResult:
                body = payload(rid, n)
                if kind == "midway":
                    body["fastaccum_fault"] = {"kind": "stall", "at": at, "seconds": 60}
                stream = make(body)
                if kind == "timed":
                    asyncio.get_running_loop().call_later(delay, stream.abort)
                task = asyncio.ensure_future(stream.run())
                if kind == "midway":
                    await wait_until(lambda: task.done() or stream.events >= at, timeout=60)
                    stream.abort()
                return await task

            results = await asyncio.gather(*(one(*plan) for plan in plans))
            await wait_until(lambda: emulator.running == 0 and emulator.queued == 0)
            return results

    results = run(main())
    for (rid, kind, n, _, at), result in zip(plans, results):
        assert_matches(emulator, rid, result)
        if kind == "midway":
            assert result.aborted and at <= len(result) < n
        elif not result.aborted:
            assert len(result) == n
    midway = {p[0] for p in plans if p[1] == "midway"}
    assert midway <= set(emulator.stats.disconnected_rids)


# ---- fastaccum.Client only ------------------------------------------------------------------


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_abort_with_coalescing_keeps_every_token_the_server_wrote(twin: ModuleType, loop: str) -> None:
    """The server writes events 0..at-1 and stalls; the client, paused by a long window, has read
    only part of them when it aborts: the drain at abort must read the rest from the socket."""
    emulator = Emulator(incremental_streaming_output=True)
    at = 30

    async def main() -> tuple[StreamResult, int]:
        async with emulator as url, fastaccum.Client(url, coalesce_ms=2000) as client:
            stream = client.stream(payload("d-1", 200, fastaccum_fault={"kind": "stall", "at": at, "seconds": 60}))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.stats.written.get("d-1") == at)
            before = stream.tokens
            stream.abort()
            result = await task
            assert result.timing is not None and result.timing.reads >= 2
            await wait_until(lambda: emulator.stats.disconnects == 1)
            return result, before

    runner = asyncio.run if loop == "asyncio" else uvloop.run
    result, before = runner(main())
    assert result.aborted and len(result) == at == emulator.stats.written["d-1"]
    assert before < at  # the window held bytes in the kernel: the drain was needed
    assert_matches(emulator, "d-1", result)


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_client_on_uvloop_and_timing(twin: ModuleType, loop: str) -> None:
    emulator = Emulator(incremental_streaming_output=True, token_rate=2000)

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url, fastaccum.Client(url, coalesce_ms=20) as client:
            stream = client.stream(payload("u-1", 400))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 10)
            running = stream.timing
            return await task, running

    runner = asyncio.run if loop == "asyncio" else uvloop.run
    result, running = runner(main())
    assert len(result) == 400 and result.finished
    assert running is not None and running.first_token_s is not None
    timing = result.timing
    assert timing is not None and timing.tokens == 400 and timing.events == result.events
    assert timing.first_byte_s is not None and timing.first_token_s is not None
    assert timing.first_byte_s <= timing.first_token_s <= timing.duration_s
    assert timing.gap_p50_s is not None and timing.gap_p99_s is not None and timing.gap_max_s is not None
    assert timing.gap_p50_s <= timing.gap_p99_s <= timing.gap_max_s
    assert timing.reads < timing.events  # coalescing gathered events into reads
    assert_matches(emulator, "u-1", result)


def test_gap_quantiles_are_within_the_histograms_resolution() -> None:
    """StreamTiming's p50/p99 come from a log histogram: within about 4.5% of the exact quantile."""
    from fastaccum.transport.timing import GapHistogram

    rng = random.Random(7)
    gaps = [rng.lognormvariate(-4.6, 1.2) for _ in range(5000)]  # around 10 ms, spread over decades
    histogram = GapHistogram()
    for gap in gaps:
        histogram.record(gap)
    ordered = sorted(gaps)
    p50, p99 = histogram.quantiles()
    assert p50 == pytest.approx(ordered[2500 - 1], rel=0.045)
    assert p99 == pytest.approx(ordered[4950 - 1], rel=0.045)
    assert histogram.largest == max(gaps)


def test_max_connections_bounds_the_pool(twin: ModuleType) -> None:
    emulator = CountingEmulator(token_rate=5000)

    async def main() -> None:
        async with emulator as url, fastaccum.Client(url, max_connections=2) as client:
            results = await asyncio.gather(*(client.stream(payload(f"p-{i}", 40)).run() for i in range(8)))
            assert all(len(r) == 40 for r in results)
            assert client.connections <= 2

    run(main())
    assert len(set(emulator.peers)) <= 2


def test_a_compressed_body_is_refused(twin: ModuleType) -> None:
    parts = [b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"]

    async def main() -> None:
        async with RawServer(parts) as url, fastaccum.Client(url) as client:
            with pytest.raises(StreamFormatError, match="Content-Encoding: gzip"):
                await client.stream(payload("z-1", 3)).run()

    run(main())


def test_client_arguments(twin: ModuleType) -> None:
    with pytest.raises(ValueError, match="http://"):
        fastaccum.Client("https://example.com")
    with pytest.raises(ValueError, match="max_connections"):
        fastaccum.Client("http://127.0.0.1:1", max_connections=0)
    with pytest.raises(ValueError, match="invalid HTTP header"):
        fastaccum.Client("http://127.0.0.1:1", headers={"X": "a\r\nb"})
