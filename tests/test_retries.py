"""Retries before the first event, on both transports and both twins: a request that failed before
the server sent an event (refused, closed before the response, a 429 or 5xx status, a body that
ended before its first event) is sent again, with bounded waits; anything after the first event,
a read timeout, or a status that judges the request itself, is final. No test measures a time:
each waits on what the server saw or what the stream reports."""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import pytest
from aiohttp import web
from client_helpers import SkippingClock, Transport, assert_matches, payload, run, run_with_clock, wait_until

from fastaccum import ServerError, ShardError, StreamConnectionError, StreamTimeoutError, StreamTruncatedError
from fastaccum.emulator import Emulator
from fastaccum.transport import retry

FAST = {"retry_max_delay_s": 0.0}  # no wait between attempts, so the tests run as fast as the server


class FlakyEmulator(Emulator):
    """The emulator, answering its first ``len(failures)`` requests to /generate with a failure:
    an HTTP status, or ``"close"`` (the connection closed before any response byte)."""

    def __init__(self, failures: list[int | str], **options: Any) -> None:
        super().__init__(**options)
        self.failures = list(failures)
        self.requests = 0

    def make_app(self) -> web.Application:
        app = super().make_app()

        @web.middleware
        async def flaky(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path != "/generate":
                return await handler(request)
            self.requests += 1
            await request.read()
            if not self.failures:
                return await handler(request)
            failure = self.failures.pop(0)
            if failure == "close":
                assert request.transport is not None
                request.transport.abort()  # a crash or a stale connection: no status line at all
                raise ConnectionResetError
            return web.json_response({"error": {"message": f"injected {failure}"}}, status=int(failure))

        app.middlewares.append(flaky)
        return app


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("status", sorted(retry.RETRY_STATUSES))
def test_a_429_or_5xx_before_the_first_event_is_sent_again(transport: Transport, status: int) -> None:
    emulator = FlakyEmulator([status, status])

    async def main() -> tuple[Any, Any]:
        async with emulator as url, transport.open(url, **FAST) as make:
            stream = make(payload("r-1", 12), retries=5)
            return stream, await stream.run()

    stream, result = run(main())
    assert emulator.requests == 3 and stream.retries == 2
    assert result.finish_reason == {"type": "length", "length": 12}
    assert_matches(emulator, "r-1", result)
    if transport.kind == "client":
        assert result.timing.retries == 2


@pytest.mark.parametrize("status", [400, 404, 422])
def test_a_status_that_judges_the_request_is_never_sent_again(transport: Transport, status: int) -> None:
    emulator = FlakyEmulator([status])

    async def main() -> None:
        async with emulator as url, transport.open(url, **FAST) as make:
            with pytest.raises(ServerError, match=f"HTTP {status}") as info:
                await make(payload("r-2", 5), retries=5).run()
            assert info.value.status == status and "retries" not in str(info.value)

    run(main())
    assert emulator.requests == 1


def test_a_connection_closed_before_the_response_is_sent_again(transport: Transport) -> None:
    emulator = FlakyEmulator(["close", "close"])

    async def main() -> Any:
        async with emulator as url, transport.open(url, **FAST) as make:
            return await make(payload("r-3", 8), retries=3).run()

    result = run(main())
    assert emulator.requests == 3 and len(result) == 8
    assert_matches(emulator, "r-3", result)


def test_a_refused_connection_is_sent_again_until_the_server_is_up(transport: Transport) -> None:
    port = _free_port()
    emulator = Emulator(port=port)
    retried = asyncio.Event()

    class StartOnRetry(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            retried.set()

    async def main() -> Any:
        handler = StartOnRetry(logging.INFO)
        retry.LOG.addHandler(handler)
        level = retry.LOG.level
        retry.LOG.setLevel(logging.INFO)
        try:
            async with transport.open(f"http://127.0.0.1:{port}") as make:
                # Waits of 0.1 s and up, 60 of them: the emulator, started at the first retry,
                # is up long before they run out.
                stream = make(payload("r-4", 6), retries=60, retry_max_delay_s=1.0)
                task = asyncio.ensure_future(stream.run())
                await asyncio.wait_for(retried.wait(), 30)
                await emulator.start()
                result = await asyncio.wait_for(task, 60)
                return stream, result
        finally:
            retry.LOG.removeHandler(handler)
            retry.LOG.setLevel(level)
            await emulator.stop()

    stream, result = run(main())
    assert stream.retries >= 1 and len(result) == 6
    assert_matches(emulator, "r-4", result)


def test_a_failure_after_the_first_event_is_never_sent_again(transport: Transport) -> None:
    emulator = FlakyEmulator([])

    async def main() -> None:
        async with emulator as url, transport.open(url, **FAST) as make:
            stream = make(payload("r-5", 10, fastaccum_fault={"kind": "cut", "at": 3}), retries=5)
            with pytest.raises(StreamTruncatedError):
                await stream.run()
            assert stream.retries == 0 and len(stream.snapshot()) == 3

    run(main())
    assert emulator.requests == 1


def test_a_read_timeout_is_never_sent_again(transport: Transport) -> None:
    """The server may still hold a silent request: a second one would run beside it."""
    emulator = FlakyEmulator([])
    clock = SkippingClock()

    async def main() -> None:
        stall = {"kind": "stall", "seconds": 3600, "at": 0}
        async with emulator as url, transport.open(url, **FAST) as make:
            stream = make(payload("r-6", 4, fastaccum_fault=stall), retries=5, read_timeout=60)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.status == 200)  # the head came; then the silence
            clock.skip(61)  # the timeout passes without being waited for
            with pytest.raises(StreamTimeoutError):
                await asyncio.wait_for(task, 30)
            assert stream.retries == 0

    run_with_clock(main(), clock)
    assert emulator.requests == 1


def test_retries_that_run_out_raise_the_last_failure_saying_how_many(transport: Transport) -> None:
    emulator = FlakyEmulator([503] * 10)

    async def main() -> None:
        async with emulator as url, transport.open(url, **FAST) as make:
            with pytest.raises(ServerError, match=r"HTTP 503 .* \(after 2 retries over 0\.0 s\)") as info:
                await make(payload("r-7", 5), retries=2).run()
            assert info.value.status == 503

    run(main())
    assert emulator.requests == 3


def test_no_retries_unless_asked(transport: Transport) -> None:
    emulator = FlakyEmulator([503])

    async def main() -> None:
        async with emulator as url, transport.open(url) as make:
            with pytest.raises(ServerError, match="HTTP 503"):
                await make(payload("r-8", 5)).run()

    run(main())
    assert emulator.requests == 1


def test_an_abort_while_waiting_to_retry_returns_at_once_with_nothing_held(transport: Transport) -> None:
    emulator = FlakyEmulator([503] * 100)

    async def main() -> Any:
        async with emulator as url, transport.open(url, retry_max_delay_s=3600.0) as make:
            stream = make(payload("r-9", 5), retries=100)
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.retries >= 2, timeout=30)  # now waiting up to 0.4 s
            stream.abort()
            return await asyncio.wait_for(task, 30)

    result = run(main())
    assert result.aborted and not result.request_sent and result.replay_complete and len(result) == 0


def test_every_retry_is_logged(transport: Transport, caplog: pytest.LogCaptureFixture) -> None:
    emulator = FlakyEmulator([502, 503])

    async def main() -> None:
        async with emulator as url, transport.open(url, **FAST) as make:
            await make(payload("r-10", 3), retries=4).run()

    with caplog.at_level(logging.INFO, logger="fastaccum.transport"):
        run(main())
    lines = [r.getMessage() for r in caplog.records if r.name == "fastaccum.transport"]
    assert len(lines) == 2
    assert "HTTP 502" in lines[0] and "retry 1 of 4" in lines[0]
    assert "HTTP 503" in lines[1] and "retry 2 of 4" in lines[1]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_a_retry_count_that_is_no_count_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="retries must be an int >= 0"):
        retry.check_retries(bad, 1.0)


def test_the_waits_double_up_to_the_maximum_and_are_spread() -> None:
    policy = retry.Retry(10, 1.0)
    failure = StreamConnectionError("refused")
    waits = [policy.delay(failure, 0) for _ in range(10)]
    assert policy.delay(failure, 0) is None  # none left
    bases = [min(1.0, retry.FIRST_DELAY_S * 2**k) for k in range(10)]
    assert all(w is not None and 0.75 * b <= w <= 1.25 * b for w, b in zip(waits, bases))
    assert policy.waited_s == pytest.approx(sum(w for w in waits if w is not None))


def test_only_transient_failures_before_the_first_event_qualify() -> None:
    policy = retry.Retry(5, 0.0)
    assert policy.delay(StreamConnectionError("refused"), 1) is None  # after an event
    assert policy.delay(ServerError("error event", status=503, event_index=0), 0) is None  # the server's event
    assert policy.delay(StreamTimeoutError("silent"), 0) is None
    assert policy.delay(StreamTruncatedError("cut before the first event"), 0) is not None


def test_a_dead_shard_is_not_retried_by_the_caller() -> None:
    """fastaccum.ray's shard runs a Client, which retried inside it; a dead actor is replaced."""
    assert retry.Retry(5, 0.0).delay(ShardError("actor died", shard=0), 0) is None
