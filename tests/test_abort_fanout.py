"""The drain abort's fan-out behind a router that cannot abort, on both twins: every rid goes to
every worker the router lists, several requests per write on one keep-alive connection (HTTP/1.1
pipelining, replies read in order), each worker taking the rids from another start; a rid whose
stream has ended is left out of what is not yet written; past ``MAX_CONNECTIONS`` workers, each
worker gets one connection. benchmarks/abort_fanout.py measures it at fleet scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import aiohttp
import client_helpers
import httptools
import orjson
import pytest
from aiohttp import web
from client_helpers import abort_together, payload, run

import fastaccum
from fastaccum import ServerError, StreamResult, StreamTimeoutError
from fastaccum.emulator import ABORT_REASON, Emulator
from fastaccum.transport import abort_sender

wait_until = functools.partial(client_helpers.wait_until, timeout=30.0)
# A drain deadline no loaded CI machine reaches, where the test is about where the aborts go.
LONG = 60.0
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"


class Recording(Emulator):
    """The emulator, recording the rid of every /abort_request it was sent."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.abort_rids: list[str] = []

    async def _abort_request(self, request: web.Request) -> web.Response:
        self.abort_rids.append((await request.json()).get("rid"))
        return await super()._abort_request(request)


class Stalling(Recording):
    """A worker whose /abort_request answers only once ``release`` is set, and aborts nothing."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.release = asyncio.Event()

    async def _abort_request(self, request: web.Request) -> web.Response:
        self.abort_rids.append((await request.json()).get("rid"))
        await self.release.wait()
        return web.Response(status=200)


class Router:
    """What sglang-router 0.3.2 offers the abort: ``/generate`` streamed from ``holder``, the
    ``listed`` workers at ``/workers`` (the holder's among them unless told otherwise), and no
    ``/abort_request`` (404)."""

    def __init__(self, holder: str, listed: list[str]) -> None:
        self.holder, self.listed = holder, listed
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async with self._session.post(self.holder + "/generate", data=body) as up:
            async for piece in up.content.iter_any():
                await response.write(piece)
        await response.write_eof()
        return response

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": url} for url in self.listed]})

    async def __aenter__(self) -> str:
        self._session = aiohttp.ClientSession()
        app = web.Application()
        app.router.add_post("/generate", self._generate)
        app.router.add_get("/workers", self._workers)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._runner is not None and self._session is not None
        await self._runner.cleanup()
        await self._session.close()


class _Requests:
    """httptools' receiver: the bodies of the requests read so far on one connection."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self._body = bytearray()

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        self.bodies.append(bytes(self._body))
        self._body.clear()


class AbortSink:
    """A worker that holds no request: it records the rid of every /abort_request and how many
    connections they came on. On its first connection it answers once ``batch`` requests wait,
    on later ones as they come; and not before ``release``, when given, is set. ``reply(i)`` is
    the answer to the i-th request received."""

    def __init__(
        self, *, batch: int = 1, release: asyncio.Event | None = None, reply: Callable[[int], bytes] = lambda i: OK
    ) -> None:
        self.batch, self.release, self.reply = batch, release, reply
        self.rids: list[str] = []
        self.answered = 0
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        batch = self.batch if self.connections == 1 else 1
        requests = _Requests()
        parser = httptools.HttpRequestParser(requests)
        waiting: list[int] = []  # indexes of the requests not answered yet
        try:
            while data := await reader.read(65536):
                parser.feed_data(data)
                for body in requests.bodies:
                    waiting.append(len(self.rids))
                    self.rids.append(orjson.loads(body)["rid"])
                requests.bodies.clear()
                if len(waiting) < batch:
                    continue
                if self.release is not None:
                    await self.release.wait()
                for index in waiting:
                    answer = self.reply(index)
                    writer.write(answer)
                    self.answered += 1
                    if b"Connection: close" in answer:
                        return  # the requests after this one stay unanswered
                waiting.clear()
        except ConnectionError:
            pass
        finally:
            writer.close()


def _start(client: fastaccum.Client, n: int, tag: str) -> tuple[list[Any], list[asyncio.Future[StreamResult]]]:
    streams = [client.stream(payload(f"{tag}-{i}", 100_000)) for i in range(n)]
    return streams, [asyncio.ensure_future(s.run()) for s in streams]


async def _abort_all(streams: list[Any]) -> None:
    """Once every stream holds tokens, abort them in one loop iteration, as a rollout abort does."""
    await wait_until(lambda: all(s.tokens >= 2 for s in streams))
    for stream in streams:
        stream.abort()


# ---- pipelining --------------------------------------------------------------------------------


def test_a_window_of_aborts_is_written_before_any_reply_comes(twin: ModuleType) -> None:
    holder = Recording(token_rate=200)
    n = 6
    sink = AbortSink(batch=n)  # answers only once all n wait on one connection

    async def main() -> list[StreamResult]:
        async with holder as url, sink as sink_url, Router(url, [url, sink_url]) as router:
            async with fastaccum.Client(router, abort_drain_s=LONG) as client:
                results = await abort_together([client.stream(payload(f"pw-{i}", 100_000)) for i in range(n)])
                await wait_until(lambda: sink.answered == n)
                return results

    results = run(main())
    assert all(r.aborted and r.replay_complete and r.finish_reason == ABORT_REASON for r in results)
    assert sink.connections == 1 and sorted(sink.rids) == [f"pw-{i}" for i in range(n)]


def test_a_connection_has_the_next_window_before_the_replies_to_the_last_come(
    twin: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(abort_sender, "WINDOW", 4)
    monkeypatch.setattr(abort_sender, "PARALLEL", 1)
    holder = Recording(token_rate=200)
    n = 8
    sink = AbortSink(batch=n)  # answers only once both windows wait on its one connection

    async def main() -> list[StreamResult]:
        async with holder as url, sink as sink_url, Router(url, [url, sink_url]) as router:
            async with fastaccum.Client(router, abort_drain_s=LONG) as client:
                results = await abort_together([client.stream(payload(f"dw-{i}", 100_000)) for i in range(n)])
                await wait_until(lambda: sink.answered == n and not client._aborts_for("sglang").sending)
                return results

    results = run(main())
    assert all(r.aborted and r.replay_complete for r in results)
    assert sink.connections == 1 and sink.rids == [f"dw-{i}" for i in (4, 5, 6, 7, 0, 1, 2, 3)]


def test_a_refusal_inside_a_window_cuts_the_streams_of_its_batch_and_quotes_the_answer(twin: ModuleType) -> None:
    holder = Emulator(token_rate=200)
    n = 4
    refusal = b'HTTP/1.1 503 Service Unavailable\r\nContent-Length: 12\r\n\r\n"overloaded"'
    sink = AbortSink(batch=n, reply=lambda i: refusal if i == 2 else OK)

    async def main() -> tuple[list[StreamResult], list[BaseException | None]]:
        async with holder as url, sink as sink_url, Router(url, [sink_url]) as router:
            async with fastaccum.Client(router, abort_drain_s=LONG) as client:
                streams = [client.stream(payload(f"rf-{i}", 100_000)) for i in range(n)]
                results = await abort_together(streams)
                return results, [s.abort_error for s in streams]

    results, errors = run(main())
    assert all(r.aborted and not r.replay_complete for r in results)
    for error in errors:
        assert isinstance(error, ServerError) and error.status == 503
        assert "/abort_request" in str(error) and "overloaded" in str(error)


def test_aborts_a_server_left_unanswered_when_it_closed_go_again_on_a_new_connection(twin: ModuleType) -> None:
    holder = Emulator(token_rate=50)
    n = 6
    closing = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    sink = AbortSink(batch=n, reply=lambda i: closing if i == 2 else OK)

    async def main() -> None:
        async with holder as url, sink as sink_url, Router(url, [sink_url]) as router:
            async with fastaccum.Client(router, abort_drain_s=LONG) as client:
                streams, tasks = _start(client, n, "cl")
                await _abort_all(streams)
                await wait_until(lambda: sink.answered == n and not client._aborts_for("sglang").sending)
                for task in tasks:  # the sink ends no stream: they would wait for their deadline
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    run(main())
    rids = [f"cl-{i}" for i in range(n)]
    assert sink.connections == 2 and sink.rids == rids + rids[3:]


# ---- what is left out --------------------------------------------------------------------------


def test_a_rid_whose_stream_ended_is_left_out_of_the_windows_not_yet_written(
    twin: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two windows per worker, one connection each, one window awaiting replies: the holder takes
    # rids 0-3 first, the other worker 4-7 (another start), and holds its answers until the holder
    # has ended streams 0-3.
    monkeypatch.setattr(abort_sender, "WINDOW", 4)
    monkeypatch.setattr(abort_sender, "PARALLEL", 1)
    monkeypatch.setattr(abort_sender, "DEPTH", 1)
    holder = Recording(token_rate=200)
    sink = AbortSink(release=asyncio.Event())
    n = 8

    async def main() -> list[StreamResult]:
        async with holder as url, sink as sink_url, Router(url, [url, sink_url]) as router:
            async with fastaccum.Client(router, abort_drain_s=LONG) as client:
                streams, tasks = _start(client, n, "lo")
                await _abort_all(streams)
                await wait_until(lambda: all(task.done() for task in tasks[:4]))
                assert sink.release is not None
                sink.release.set()
                results = list(await asyncio.gather(*tasks))
                await wait_until(lambda: not client._aborts_for("sglang").sending)
                return results

    results = run(main())
    assert all(r.aborted and r.replay_complete for r in results)
    assert holder.abort_rids == [f"lo-{i}" for i in range(n)]  # its streams were live when it got them
    assert sink.rids == [f"lo-{i}" for i in range(4, n)]  # not 0-3: their streams had ended


def test_after_the_drain_deadline_no_more_aborts_are_written_for_the_cut_streams(
    twin: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(abort_sender, "WINDOW", 4)
    monkeypatch.setattr(abort_sender, "PARALLEL", 1)
    monkeypatch.setattr(abort_sender, "DEPTH", 1)
    holder = Stalling(token_rate=200)  # takes the first window, answers none of it before release
    n = 8

    async def main() -> tuple[list[StreamResult], list[BaseException | None]]:
        async with holder as url, Router(url, [url]) as router:
            async with fastaccum.Client(router, abort_drain_s=0.5) as client:
                streams, tasks = _start(client, n, "ct")
                await _abort_all(streams)
                results = list(await asyncio.gather(*tasks))  # every stream cut at its deadline
                holder.release.set()
                await wait_until(lambda: not client._aborts_for("sglang").sending)
                return results, [s.abort_error for s in streams]

    results, errors = run(main())
    assert all(r.aborted and not r.replay_complete for r in results)
    assert all(isinstance(error, StreamTimeoutError) for error in errors)
    assert holder.abort_rids == [f"ct-{i}" for i in range(4)]  # the first window, and no second


# ---- connections -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sinks", "each"),
    [(1, abort_sender.PARALLEL), (abort_sender.MAX_CONNECTIONS, 1)],
    ids=["few-workers", "many-workers"],
)
def test_past_max_connections_workers_each_get_one_abort_connection(
    twin: ModuleType, monkeypatch: pytest.MonkeyPatch, sinks: int, each: int
) -> None:
    monkeypatch.setattr(abort_sender, "WINDOW", 2)  # 8 rids: enough windows for PARALLEL connections
    holder = Recording(token_rate=200)
    n = 8

    async def main() -> list[AbortSink]:
        async with contextlib.AsyncExitStack() as stack:
            url = await stack.enter_async_context(holder)
            workers = [AbortSink() for _ in range(sinks)]
            urls = [await stack.enter_async_context(w) for w in workers]
            router = await stack.enter_async_context(Router(url, [url, *urls]))
            async with fastaccum.Client(router, abort_drain_s=LONG) as client:
                results = await abort_together([client.stream(payload(f"mc-{i}", 100_000)) for i in range(n)])
                await wait_until(lambda: not client._aborts_for("sglang").sending)
            assert all(r.replay_complete for r in results)
            return workers

    workers = run(main())
    assert [w.connections for w in workers] == [each] * sinks
