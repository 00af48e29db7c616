"""fastaccum.Client's drain abort, on both twins: ``abort()`` asks the server to abort the rid and
reads on until the terminal abort event, so the result keeps what SGLang sends only there (routed
experts, top-p rows); at the deadline, or when the abort cannot be sent, it cuts as before.

GenerateStream (aiohttp) only cuts: test_transport.py covers the cut on both transports.
"""

from __future__ import annotations

import asyncio
import functools
from types import ModuleType
from typing import Any

import aiohttp
import client_helpers
import numpy as np
import pytest
from aiohttp import web
from client_helpers import (
    PROMPT,
    SkippingClock,
    abort_after,
    abort_together,
    assert_matches,
    payload,
    run,
    run_with_clock,
)

import fastaccum
from fastaccum import ServerError, StreamResult, StreamTimeoutError
from fastaccum.emulator import ABORT_REASON, Emulator
from fastaccum.transport.abort_sender import PARALLEL

wait_until = functools.partial(client_helpers.wait_until, timeout=30.0)
# A drain deadline no loaded CI machine reaches, where the test is about what a drain reads.
LONG = 60.0
ECHO_REASON = {"type": "abort", "message": "Abort in waiting queue"}


class AbortCountingEmulator(Emulator):
    """The emulator, also recording every rid it was sent, and every /abort_request: its rid and
    its connection."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.rids: list[str] = []
        self.abort_rids: list[str] = []
        self.abort_peers: set[Any] = set()

    def make_app(self) -> web.Application:
        app = super().make_app()

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path == "/generate":
                self.rids.append((await request.json()).get("rid"))
            if request.path == "/abort_request":
                self.abort_rids.append((await request.json()).get("rid"))
                self.abort_peers.add(request.transport.get_extra_info("peername") if request.transport else None)
            return await handler(request)

        app.middlewares.append(record)
        return app


# ---- the terminal abort event is read --------------------------------------------------------


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_a_drained_abort_keeps_the_routed_experts_of_every_kept_token(twin: ModuleType, incremental: bool) -> None:
    emulator = AbortCountingEmulator(
        incremental_streaming_output=incremental, enable_return_routed_experts=True, token_rate=2000
    )

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            stream = client.stream(payload("d-1", 100_000, return_routed_experts=True), expert_shape=(4, 2))
            result = await abort_after(stream, 30)
            assert client.idle_connections == 1  # the response ended: its connection is reused
            return result

    result = run(main())
    assert result.aborted and result.replay_complete and result.finish_reason == ABORT_REASON
    assert len(result) >= 30 and result.routed_experts is not None
    assert result.routed_experts.shape == (len(PROMPT) + len(result) - 1, 4, 2)
    assert_matches(emulator, "d-1", result, routed=True)
    assert emulator.abort_rids == ["d-1"] and emulator.stats.disconnects == 0


def test_after_a_drained_abort_kept_and_run_say_aborted_alike(twin: ModuleType) -> None:
    """One meaning of ``aborted``: the drained terminal abort event is the abort the caller asked
    for, in ``run()``'s result and in ``kept()`` afterwards."""
    emulator = AbortCountingEmulator(token_rate=2000)

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            stream = client.stream(payload("d-kept", 100_000))
            result = await abort_after(stream, 5)
            return result, stream.kept()

    result, kept = run(main())
    assert result.finish_reason == ABORT_REASON and kept.finish_reason == ABORT_REASON
    assert result.aborted and kept.aborted and len(kept) == len(result)


def test_a_drained_abort_keeps_the_indexer_top_k_and_routed_experts_from_their_start(twin: ModuleType) -> None:
    emulator = Emulator(enable_return_routed_experts=True, enable_return_indexer_topk=True, token_rate=2000)
    body = payload("ix-1", 100_000, return_routed_experts=True, return_indexer_topk=True, routed_experts_start_len=3)

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            stream = client.stream(body, expert_shape=(4, 2), indexer_shape=emulator.indexer_shape)
            return await abort_after(stream, 20)

    result = run(main())
    n = len(result)
    assert result.replay_complete and n >= 20
    truth = emulator.expected(
        "ix-1", n, prompt_tokens=len(PROMPT), routed_experts=True, routed_start=3, indexer_topk=True
    )
    assert result.routed_experts.shape == (len(PROMPT) + n - 1 - 3, 4, 2)
    assert np.array_equal(result.routed_experts, truth.routed_experts)
    assert result.indexer_topk.shape == (len(PROMPT) + n - 1, *emulator.indexer_shape)
    assert np.array_equal(result.indexer_topk, truth.indexer_topk)


def test_a_drained_abort_keeps_a_top_p_row_per_kept_token(twin: ModuleType) -> None:
    emulator = Emulator(token_rate=2000)
    body = payload("tp-1", 100_000, sampling_params={"custom_params": {"return_top_p_token_ids": True}})

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            return await abort_after(client.stream(body), 20)

    result = run(main())
    assert result.replay_complete and result.top_p_token_offsets is not None
    assert len(result.top_p_token_offsets) == len(result) + 1
    assert_matches(emulator, "tp-1", result, top_p=True)


def test_a_request_aborted_in_the_queue_ends_with_the_echo(twin: ModuleType) -> None:
    emulator = Emulator(max_running_requests=1, token_rate=2000)

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            first = asyncio.ensure_future(client.stream(payload("q-0", 100_000)).run())
            stream = client.stream(payload("q-1", 50))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.queued == 1)
            stream.abort()
            result = await task
            first.cancel()
            return result

    result = run(main())
    assert result.aborted and result.replay_complete and len(result) == 0
    assert result.finish_reason == ECHO_REASON


def test_a_retracted_request_ends_with_the_echo_holding_its_tokens(twin: ModuleType) -> None:
    emulator = Emulator(fault={"kind": "retract", "at": 5})

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            stream = client.stream(payload("r-1", 200))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: emulator.retracted == 1)
            stream.abort()
            return await task

    result = run(main())
    assert result.aborted and result.replay_complete and result.finish_reason == ECHO_REASON
    assert len(result) == 6  # one more than the five events carried: the echo holds every decoded token
    assert_matches(emulator, "r-1", result)


def test_an_abort_racing_the_normal_end_returns_the_normal_result(twin: ModuleType) -> None:
    emulator = Emulator()

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            stream = client.stream(payload("n-1", 40))
            result = await stream.run()
            stream.abort()  # after the end: nothing to do
            return result

    result = run(main())
    assert not result.aborted and result.finish_reason == {"type": "length", "length": 40}


# ---- when the server does not end the request -------------------------------------------------


def test_the_deadline_cuts_a_drain_the_server_never_ends(twin: ModuleType) -> None:
    """The server takes the abort and goes on decoding: the stream reads on, waiting for the
    terminal event, until ``abort_drain_s`` passes (the clock is moved, not waited for); then it
    is cut, and ``abort_error`` says why."""
    emulator = Emulator(token_rate=2000)
    emulator.abort = lambda *args, **kwargs: 0  # type: ignore[method-assign]  # answers 200, aborts nothing
    clock = SkippingClock()

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=60) as client:
            stream = client.stream(payload("dl-1", 1_000_000))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 20)
            stream.abort()
            at_abort = stream.tokens
            await wait_until(lambda: stream.tokens >= at_abort + 20)  # still reading: the drain waits
            assert not task.done()
            clock.skip(61)
            result = await asyncio.wait_for(task, 30)
            await wait_until(lambda: emulator.stats.disconnects == 1 and emulator.running == 0)
            return result, stream.abort_error

    result, error = run_with_clock(main(), clock)
    assert result.aborted and not result.replay_complete and not result.finished
    assert_matches(emulator, "dl-1", result)
    assert isinstance(error, StreamTimeoutError)
    assert str(error) == (
        "the server did not end request dl-1 within abort_drain_s=60 s of its abort: the stream was cut"
    )


def test_closing_the_client_ends_a_drain_at_once_and_says_why(twin: ModuleType) -> None:
    """A stream waiting for its abort's terminal event ends when its Client closes, with its
    prefix, as a cut: the deadline is not waited out (the clock never moves here)."""
    emulator = Emulator(token_rate=2000)
    emulator.abort = lambda *args, **kwargs: 0  # type: ignore[method-assign]  # answers 200, aborts nothing

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url:
            client = fastaccum.Client(url, abort_drain_s=3600)
            stream = client.stream(payload("close-1", 1_000_000))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 20)
            stream.abort()
            await wait_until(lambda: emulator.stats.calls.get("/abort_request", 0) == 1)
            await client.close()
            return await asyncio.wait_for(task, 30), stream.abort_error

    result, error = run(main())
    assert result.aborted and not result.replay_complete
    assert_matches(emulator, "close-1", result)
    assert isinstance(error, fastaccum.StreamConnectionError) and str(error) == "the Client was closed"


# ---- an abort before the server answered ------------------------------------------------------


class HeldRequests(AbortCountingEmulator):
    """A server that takes a while to pick up each /generate request (a loaded machine): until
    ``release`` is set, the request is on the wire but the server does not hold its rid yet, so an
    abort that arrives then finds nothing to abort (as SGLang's and vLLM's abort do)."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.release = asyncio.Event()

    def make_app(self) -> web.Application:
        app = super().make_app()

        @web.middleware
        async def hold(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path == "/generate":
                await self.release.wait()
            return await handler(request)

        app.middlewares.insert(0, hold)
        return app


def test_an_abort_sent_before_the_server_holds_the_request_is_sent_again_at_its_first_event(
    twin: ModuleType,
) -> None:
    emulator = HeldRequests(token_rate=2000)

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=10) as client:
            stream = client.stream(payload("early-1", 1_000_000))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.timing is not None)  # written
            stream.abort()
            await wait_until(lambda: emulator.abort_rids == ["early-1"])  # it found nothing to abort
            emulator.release.set()
            result = await task
            await wait_until(lambda: emulator.running == 0)
            return result, stream.abort_error

    result, error = run(main())
    assert error is None and emulator.abort_rids == ["early-1", "early-1"]
    assert result.aborted and result.replay_complete and result.finish_reason == ABORT_REASON
    assert emulator.stats.disconnects == 0
    assert_matches(emulator, "early-1", result)


def test_an_abort_before_the_request_is_written_says_the_server_never_saw_it(twin: ModuleType) -> None:
    emulator = AbortCountingEmulator(token_rate=2000)

    async def main() -> tuple[StreamResult, Any]:
        # One connection: the second stream waits for it, its request not yet written.
        async with emulator as url, fastaccum.Client(url, max_connections=1, abort_drain_s=LONG) as client:
            first = client.stream(payload("busy-1", 40))
            waiting = client.stream(payload("never-1", 40))
            tasks = [asyncio.ensure_future(first.run()), asyncio.ensure_future(waiting.run())]
            await asyncio.sleep(0)
            waiting.abort()
            done = await asyncio.gather(*tasks)
            return done[1], waiting.abort_error

    result, error = run(main())
    assert result.aborted and not result.request_sent and not result.finished
    assert result.replay_complete  # nothing exists on the server to replay
    assert len(result) == 0 and result.timing is None and error is None
    assert "never-1" not in emulator.rids and not emulator.abort_rids


class NoAbortEndpoint(Emulator):
    """A server with /generate only: no /abort_request and no /workers."""

    def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        return app


def test_an_abort_that_cannot_be_sent_cuts_at_once_and_says_why(twin: ModuleType) -> None:
    emulator = NoAbortEndpoint(token_rate=2000)

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=30) as client:
            stream = client.stream(payload("na-1", 1_000_000))
            result = await abort_after(stream, 20)
            await wait_until(lambda: emulator.stats.disconnects == 1)
            return result, stream.abort_error

    result, error = run(main())
    assert result.aborted and not result.replay_complete
    assert isinstance(error, ServerError) and error.status == 404 and "no /abort_request" in str(error)


class RefusingAborts(Emulator):
    """A server whose /abort_request fails (503), as an overloaded one may."""

    async def _abort_request(self, request: web.Request) -> web.Response:
        return web.json_response({"error": "overloaded"}, status=503)


def test_an_abort_the_server_refuses_cuts_at_once_and_quotes_its_answer(twin: ModuleType) -> None:
    emulator = RefusingAborts(token_rate=2000)

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            stream = client.stream(payload("rf-1", 1_000_000))
            result = await abort_after(stream, 20)
            await wait_until(lambda: emulator.stats.disconnects == 1)
            return result, stream.abort_error

    result, error = run(main())
    assert result.aborted and not result.replay_complete
    assert isinstance(error, ServerError) and error.status == 503
    assert "/abort_request" in str(error) and "overloaded" in str(error)


# ---- where the abort goes, and how many --------------------------------------------------------


def test_many_aborts_at_once_share_a_few_connections(twin: ModuleType) -> None:
    emulator = AbortCountingEmulator(token_rate=50)  # paced for a loaded machine: how many, not how fast
    n = 64

    async def main() -> list[StreamResult]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            results = await abort_together([client.stream(payload(f"m-{i:03d}", 100_000)) for i in range(n)])
            # The emulator releases a request after its last write, which the client may read first.
            await wait_until(lambda: emulator.running == 0)
            return results

    results = run(main())
    assert all(r.aborted and r.replay_complete and r.finish_reason == ABORT_REASON for r in results)
    assert sorted(emulator.abort_rids) == [f"m-{i:03d}" for i in range(n)]
    assert len(emulator.abort_peers) <= 1 + PARALLEL  # the first abort goes alone: is it a router?


class FakeRouter:
    """What a router offers the abort: /generate passed through to one worker, the worker list at
    /workers, and no /abort_request."""

    def __init__(self, workers: list[str]) -> None:
        self.workers = workers
        self._runner: web.AppRunner | None = None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async with aiohttp.ClientSession() as session, session.post(self.workers[0] + "/generate", data=body) as up:
            async for piece in up.content.iter_any():
                await response.write(piece)
        await response.write_eof()
        return response

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": url} for url in self.workers]})

    async def __aenter__(self) -> str:
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/workers", self._workers)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


def test_through_a_router_the_abort_goes_to_every_listed_worker(twin: ModuleType) -> None:
    holder = AbortCountingEmulator(enable_return_routed_experts=True, token_rate=2000)
    other = AbortCountingEmulator()

    async def main() -> StreamResult:
        async with holder as url, other as other_url, FakeRouter([url, other_url]) as router:
            async with fastaccum.Client(router, abort_drain_s=LONG) as client:
                stream = client.stream(payload("rt-1", 100_000, return_routed_experts=True), expert_shape=(4, 2))
                return await abort_after(stream, 20)

    result = run(main())
    assert result.aborted and result.replay_complete and result.routed_experts is not None
    assert_matches(holder, "rt-1", result, routed=True)
    assert holder.abort_rids == ["rt-1"] and other.abort_rids == ["rt-1"]


# ---- options ---------------------------------------------------------------------------------


def test_a_client_made_rid_is_sent_and_none_is_a_prefix_of_another(twin: ModuleType) -> None:
    emulator = AbortCountingEmulator()

    async def main() -> list[str]:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=LONG) as client:
            body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3}}
            streams = [client.stream(body) for _ in range(12)]
            for stream in streams:
                assert len(await stream.run()) == 3
            return [s.rid for s in streams if s.rid is not None]

    rids = run(main())
    assert len(set(rids)) == 12 and len({len(r) for r in rids}) == 1  # equal length: no prefixes
    assert emulator.rids == rids


@pytest.mark.parametrize("bad", [-1, "2", True])
def test_abort_drain_s_must_be_seconds_or_none(bad: Any) -> None:
    with pytest.raises(ValueError, match="abort_drain_s"):
        fastaccum.Client("http://127.0.0.1:1", abort_drain_s=bad)


def test_no_drain_cuts_at_once(twin: ModuleType) -> None:
    emulator = AbortCountingEmulator(token_rate=2000)

    async def main() -> StreamResult:
        async with emulator as url, fastaccum.Client(url, abort_drain_s=None) as client:
            result = await abort_after(client.stream(payload("c-1", 100_000)), 20)
            await wait_until(lambda: emulator.stats.disconnects == 1)
            return result

    result = run(main())
    assert result.aborted and not result.replay_complete and emulator.abort_rids == []
    assert np.array_equal(result.token_ids[:20], emulator.expected("c-1", 20).token_ids)
