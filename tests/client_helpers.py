"""Helpers for the transport tests (test_client.py, test_transport.py, test_http_responses.py): one
request payload, the emulator's truth for a result, waiting on a condition inside the loop, both
transports behind one interface, and a raw socket server for responses no real server sends."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import numpy as np

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import Emulator
from fastaccum.emulator.writer import WireOptions, chunk_encode, normal_event, sse, synthetic_generation
from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT, GenerateStream

__all__ = (
    "CHUNKED_HEAD",
    "EVENTS",
    "GEN",
    "PROMPT",
    "RawServer",
    "Transport",
    "abort_after",
    "abort_together",
    "assert_matches",
    "chunks",
    "payload",
    "run",
    "run_with_clock",
    "SkippingClock",
    "wait_until",
)

T = TypeVar("T")
PROMPT = [101, 102, 103, 104]


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


class SkippingClock:
    """Monotonic time a test moves forward at will: the event loop's timers (asyncio's, aiohttp's)
    and fastaccum's request clock read it (``run_with_clock``), so a timeout is made to pass by
    ``skip()`` instead of by waiting, whatever the machine's speed."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def skip(self, seconds: float) -> None:
        self.offset += seconds


def run_with_clock(coro: Awaitable[T], clock: SkippingClock) -> T:
    """``run(coro)`` on a loop whose time is ``clock``'s, with fastaccum's request clock on it too."""
    import fastaccum.transport.timing as timing

    class Loop(asyncio.SelectorEventLoop):
        def time(self) -> float:
            return clock()

    previous, timing.now = timing.now, clock
    try:
        with asyncio.Runner(loop_factory=Loop) as runner:
            return runner.run(coro)  # type: ignore[arg-type]
    finally:
        timing.now = previous


def payload(rid: str, n: int, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": n, **extra.pop("sampling_params", {})}
    return {"input_ids": PROMPT, "rid": rid, "return_logprob": True, "sampling_params": params, **extra}


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def assert_matches(
    emulator: Emulator, rid: str, result: StreamResult, *, routed: bool = False, top_p: bool = False
) -> None:
    """Every token, logprob and text byte equals the emulator's truth for this prefix."""
    n = len(result)
    gen = emulator.expected(rid, n, prompt_tokens=len(PROMPT), top_p=top_p, routed_experts=routed)
    assert np.array_equal(result.token_ids, np.asarray(gen.token_ids, dtype=np.int32))
    if n == 0:
        return  # nothing arrived: no event said whether logprobs or text would come
    assert result.logprobs is not None
    assert np.array_equal(result.logprobs, np.asarray(gen.logprobs, dtype=np.float64))
    if not emulator.skip_tokenizer_init:
        assert result.text == gen.text(0, n)
    if routed and result.finished:
        assert result.routed_experts is not None and gen.routed_experts is not None
        assert np.array_equal(result.routed_experts, gen.routed_experts)
    if top_p and result.finished:
        assert result.top_p_token_offsets is not None and result.top_p_token_ids is not None
        rows = [
            list(result.top_p_token_ids[a:b])
            for a, b in zip(result.top_p_token_offsets[:-1], result.top_p_token_offsets[1:])
        ]
        assert rows == [list(r) for r in gen.top_p_rows or ()]


# ---- aborts: one stream, or a rollout's worth at once -------------------------------------------


async def abort_after(stream: Any, tokens: int, timeout: float = 30.0) -> StreamResult:
    """Run the stream, abort it once it holds ``tokens`` tokens (or has ended), return its result."""
    task = asyncio.ensure_future(stream.run())
    await wait_until(lambda: stream.tokens >= tokens or task.done(), timeout)
    stream.abort()
    result: StreamResult = await task
    return result


async def abort_together(streams: list[Any], tokens: int = 2, timeout: float = 30.0) -> list[StreamResult]:
    """Run the streams, and once each holds ``tokens`` tokens abort them all in one loop iteration,
    as a rollout abort does; their results in order."""
    tasks = [asyncio.ensure_future(s.run()) for s in streams]
    await wait_until(lambda: all(s.tokens >= tokens for s in streams), timeout)
    for stream in streams:
        stream.abort()
    return list(await asyncio.gather(*tasks))


# ---- both transports behind one interface ----------------------------------------------------

Make = Callable[..., Any]  # (payload, **stream options) -> a stream with run()/abort()


class Transport:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    @contextlib.asynccontextmanager
    async def open(self, url: str, **client_options: Any) -> AsyncIterator[Make]:
        if self.kind == "aiohttp":
            client_options.pop("abort_drain_s", None)  # GenerateStream's abort always cuts
            headers = client_options.get("headers")
            # Client's options that GenerateStream takes per stream
            defaults = {k: client_options[k] for k in ("retries", "retry_max_delay_s") if k in client_options}
            connector = aiohttp.TCPConnector(limit=client_options.get("max_connections") or 0)
            async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT, connector=connector, headers=headers) as session:

                def make(body: dict[str, Any], **kwargs: Any) -> GenerateStream:
                    kwargs.pop("coalesce_ms", None)
                    path = kwargs.pop("path", "/generate")
                    return GenerateStream(session, f"{url}{path}", body, **{**defaults, **kwargs})

                yield make
        else:
            async with fastaccum.Client(url, **client_options) as client:
                yield client.stream


# ---- a raw socket server for what no real server sends ----------------------------------------


class RawServer:
    """Answers every request with ``parts`` (bytes written in turn, ``pause`` seconds apart), then
    holds the connection ``hold`` seconds; ``closed`` counts connections the client left first."""

    def __init__(self, parts: list[bytes], *, pause: float = 0.05, hold: float = 30.0) -> None:
        self.parts, self.pause, self.hold = parts, pause, hold
        self.requests = 0
        self.client_left = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            self.requests += 1
            for part in self.parts:
                writer.write(part)
                await writer.drain()
                await asyncio.sleep(self.pause)
            if await asyncio.wait_for(reader.read(1), self.hold) == b"":
                self.client_left += 1
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            self.client_left += 1
        except asyncio.CancelledError:
            pass
        finally:
            writer.close()


GEN = synthetic_generation("raw", 10, prompt_tokens=len(PROMPT))
EVENTS = [
    sse(normal_event(GEN, WireOptions(incremental=True), i, i + 1, first=i == 0, terminal=i == 9)) for i in range(10)
]
CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def chunks(events: list[bytes]) -> bytes:
    return b"".join(chunk_encode(e)[:-5] for e in events)
