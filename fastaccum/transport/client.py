"""``fastaccum.Client``: an HTTP/1.1 client for SGLang servers whose socket reads go to the core whole.

``Client`` owns its connections (``asyncio.BufferedProtocol``; the stock loop and uvloop): the
response head is parsed by httptools as it arrives, and every body read after it is one call into
the accumulator (``feed_chunked()`` undoes the chunked encoding in the core), with no Python call
per HTTP chunk. Streams keep ``GenerateStream``'s contract (both are ``StreamConsumer``s):
``run()``, ``abort()``, ``snapshot()``, ``kept()``, progress counters, ``CancelledError`` only for
the caller's own cancel. A completed stream returns its connection to the pool; an aborted or
failed one closes it, so the server sees the disconnect and stops decoding.

The parts live beside it: fastaccum.transport.http1 (the connection, the response head, the body's length),
fastaccum.transport.pacing (read coalescing) and fastaccum.transport.timing (what ``result.timing`` reports). This
module ties them to one request and its outcome.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import urllib.parse
import uuid
from collections.abc import Callable, Mapping
from types import EllipsisType
from typing import Any

from fastaccum._core.dialects import VLLM, check_dialect, request_for, route_hint
from fastaccum._impl import StreamAccumulator
from fastaccum.errors import (
    StreamConnectionError,
    StreamError,
    StreamFormatError,
)
from fastaccum.result import StreamResult, StreamTiming
from fastaccum.transport.abort_sender import AbortSender, Drain, VllmAbortSender
from fastaccum.transport.consumer import AccumulatorLike, StreamConsumer, routed_start_of
from fastaccum.transport.http1 import (
    Body,
    BodyFraming,
    Connection,
    ResponseHead,
    connect_error,
    framing_of,
    header_lines,
    read_head,
    request_bytes,
)
from fastaccum.transport.pacing import DEFAULT_COALESCE_MS, ReadPacer, Resumer
from fastaccum.transport.retry import DEFAULT_RETRY_MAX_DELAY_S, check_retries
from fastaccum.transport.timing import ReadTimeout, RequestClock, timeout_error

__all__ = ("Client", "ClientStream", "DEFAULT_ABORT_DRAIN_S", "DEFAULT_COALESCE_MS", "DEFAULT_RETRY_MAX_DELAY_S")

# Read size: asyncio's own default; every connection of a client reads into one such buffer.
_READ_BUFFER_BYTES = 262144
# How long abort() reads on for the terminal abort event: SGLang answers an abort at its next
# decode step (milliseconds); a queued or retracted request at once.
DEFAULT_ABORT_DRAIN_S = 2.0


def _check_drain(seconds: object) -> None:
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0):
        raise ValueError(f"abort_drain_s must be seconds >= 0 or None, not {seconds!r}")


class _Stale(Exception):
    """A reused connection closed before the response's first byte (the server's idle timeout
    raced the request): the request is sent again on a new connection."""


# ---- stream -----------------------------------------------------------------------------------


class ClientStream(StreamConsumer):
    """One streaming request on a ``Client`` (made by ``Client.stream()``)."""

    def __init__(
        self,
        client: Client,
        payload: Mapping[str, Any],
        *,
        path: str | None,
        headers: Mapping[str, str] | None,
        read_timeout: float | None,
        coalesce_ms: float,
        abort_drain_s: float | None,
        dialect: str,
        **core: Any,  # StreamConsumer's options: the accumulator's (mode, expert_shape, ...), retries
    ) -> None:
        request = request_for(dialect, payload, client._new_rid, {**client._header_fields, **(headers or {})})
        super().__init__(None, routed_start=routed_start_of(payload), dialect=dialect, **core)
        self._client = client
        self._dialect = dialect
        self._default_path = path is None  # the dialect's own route (a 404 there names the dialect)
        path = request.path if path is None else path
        self._url = client.base_url + path
        self.rid = request.rid
        self._abort_ids = request.abort_ids
        self._vllm = dialect == VLLM
        self._request = request_bytes(client._prefix + path, client._headers, request.body, headers)
        # Dynamo has no per-request abort to drain after: its abort is the disconnect.
        self._drain = (
            Drain(client._aborts_for(dialect), abort_drain_s, self._cut)
            if abort_drain_s is not None and request.drains
            else None
        )
        self._coalesce_ms = coalesce_ms
        self._read_timeout = read_timeout
        self._conn: Connection | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._new_attempt()

    def _new_attempt(self) -> None:
        """The state of one attempt at the request (a retry starts afresh)."""
        self._pacer = ReadPacer(self._coalesce_ms, self._read_timeout)
        self._clock = RequestClock()
        self._timeout = ReadTimeout(self._clock, self._read_timeout, self._timed_out)
        self.status: int | None = None
        self._head = ResponseHead(self._url)
        self._body = BodyFraming(Body.UNTIL_CLOSE)  # where the body ends, once the head says
        self._feed_body: Callable[[memoryview], int] = self._accumulator.feed
        self._chunked = False  # the core undoes the chunked coding and says where the body ends
        self._reusable = False
        self._paused = False  # reading paused for a window, waiting in the client's Resumer

    @staticmethod
    def _new_accumulator(**options: Any) -> AccumulatorLike:
        return StreamAccumulator(**options)

    @property
    def timing(self) -> StreamTiming | None:
        """What the transport measured so far (None before the request was written)."""
        return self._clock.timing(
            tokens=self._accumulator.tokens,
            bytes_received=self._bytes_received,
            events=int(self._accumulator.events),
            retries=self._retry.done,
        )

    def _stamped(self, result: StreamResult) -> StreamResult:
        return dataclasses.replace(result, timing=self.timing, request_sent=bool(self._clock.sent))

    # ---- request -------------------------------------------------------------------------------
    async def _read(self) -> StreamResult:
        loop = asyncio.get_running_loop()
        for attempt in range(2):
            conn = await self._client._acquire(self._url)
            reused = conn.requests > 0
            self._conn = conn
            conn.requests += 1
            self._waiter = loop.create_future()
            conn.attach(self._on_head, self._on_lost)
            transport = conn.transport
            if conn.closed or transport is None:
                self._on_lost(None)
            else:
                self._clock.request_sent()
                transport.write(self._request)
                self._timeout.arm(loop)
            try:
                await self._waiter
            except StreamError:
                if not self._abort_requested:
                    raise
                return self._aborted_result()  # the drain failed (an error event, a cut): the prefix
            except _Stale:
                if attempt or not reused:
                    message = f"POST {self._url} failed: the connection closed before a response"
                    raise StreamConnectionError(message) from None
                self._release()
                continue
            break
        self._clock.end()
        return self._stamped(self._finish_or_kept())

    def abort(self) -> None:
        """Request-level abort: with ``abort_drain_s`` (the default) a drain: the server is asked to
        abort this rid and the stream reads on to its terminal abort event; else, at the deadline,
        or when the abort cannot be sent, a cut (docs/client.md, "Abort: drain or cut")."""
        if self._abort_requested:
            return
        self._abort_requested = True
        # Not yet written (waiting for a connection): the server never sees it, nothing to drain.
        if self._drain is None or not self._clock.sent or self._waiter is None or self._waiter.done():
            self._cut()
            return
        self._drain.start(self._server_ids())
        self._pacer.window = 0.0  # the terminal event is read as it arrives, not a window later
        self._resume_reading()

    @property
    def abort_error(self) -> BaseException | None:
        """Why a drain abort fell back to a cut (None: it did not)."""
        return self._drain.error if self._drain is not None else None

    def _server_ids(self) -> tuple[str, ...]:
        """The ids the server's abort knows this request by; for vLLM, also the id its chunks carry
        (what it runs the request under, whatever rewrote it on the way)."""
        ids = self._abort_ids
        if self._vllm and self._events:
            carried = self._accumulator.snapshot().meta_info.get("request_id")
            if isinstance(carried, str) and carried not in ids:
                ids = (carried, *ids)
        return ids

    # ---- receivers (loop callbacks) ------------------------------------------------------------
    def _on_head(self, data: memoryview) -> None:
        self._clock.read()
        try:
            self._head, data, used = read_head(self._head, data)
        except StreamFormatError as exc:
            self._fail(exc)
            return
        if used < 0:
            return
        self.status = self._head.status
        if not self._start_body():
            return
        rest = data[used:]
        conn = self._conn
        if rest and conn is not None and conn.receiver is not None:
            self._clock.reads -= 1  # the same read, counted once
            conn.receiver(rest)

    def _start_body(self) -> bool:
        """Pick the receiver for what follows the head; False when the head already failed."""
        conn, head = self._conn, self._head
        assert conn is not None
        if head.status >= 300:
            conn.receiver = self._on_error_body
            if head.body_complete:  # no body to wait for (Content-Length: 0, 304)
                self._fail(self._status_error())
                return False
            return True
        try:
            self._body = framing_of(head)
        except StreamFormatError as exc:
            self._fail(exc)
            return False
        if self._body.kind is Body.CHUNKED:
            self._chunked = True
            self._feed_body = self._accumulator.feed_chunked
            self._first_bytes_chunked = True
        self._content_type = head.headers.get("content-type")
        conn.receiver = self._on_body
        if self._body.ended(False):  # 204, 304, Content-Length: 0
            self._complete()
        return True

    def _on_body(self, data: memoryview) -> None:
        previous = self._clock.last_read
        stamp = self._clock.read()
        self._bytes_received += len(data)
        extra = 0
        if not self._chunked:  # a Content-Length body may end inside this read
            data, extra = self._body.cut(data)
        if not self._events:
            self._keep_first_bytes(data)
        try:
            count = self._feed_body(data)
        except StreamError as exc:
            self._fail(exc)
            return
        if count:
            self._events += count
            if self._events == count and self._abort_requested and self._drain is not None:
                if not self._accumulator.finished:  # the first events: the server holds the request now
                    self._drain.resend(self._server_ids())
            self._clock.events_read(stamp, self._accumulator)
        if self._accumulator.chunked_ended if self._chunked else self._body.ended(False):
            self._complete()
            if extra:  # bytes after the response are not its body (RFC 9112 lets a client drop them)
                self._after_end(data)
        elif self._pacer.should_pause(len(data), count, stamp - previous) and self._conn is not None:
            self._conn.pause_reading()
            self._paused = True
            self._client._resumer(self._pacer.window).add(self._resume_reading)

    def _resume_reading(self) -> None:
        if self._paused and self._conn is not None:  # else it ended while paused
            self._paused = False
            self._conn.resume_reading()

    def _on_error_body(self, data: memoryview) -> None:
        self._clock.read()
        self._head.feed_error_body(data)
        if self._head.body_complete:
            self._fail(self._status_error())

    def _status_error(self) -> StreamError:
        """The response's error status; on the dialect's own route a 404 says it may be the wrong one."""
        return self._head.status_error(route_hint(self._dialect, self._head.status) if self._default_path else "")

    def _on_lost(self, exc: BaseException | None) -> None:
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        conn = self._conn
        receiver = conn.receiver if conn is not None else None
        if receiver == self._on_body:
            self._complete(eof=True)  # end of input: the accumulator tells truncation from the end
        elif receiver == self._on_error_body:
            self._fail(self._status_error())
        elif not self._clock.first_byte:
            self._fail(_Stale())
        else:  # the bytes of the head so far were valid (httptools saw each read), but it stopped
            reason = f": {exc!r}" if exc is not None else ""
            message = f"POST {self._url} failed: the connection closed inside the response head{reason}"
            self._fail(StreamConnectionError(message))

    # ---- outcome -------------------------------------------------------------------------------
    def _complete(self, *, eof: bool = False) -> None:
        self._reusable = self._head.keep_alive and self._body.kind is not Body.UNTIL_CLOSE and not eof
        self._stop_timers()
        conn = self._conn
        if conn is not None and not eof:
            conn.receiver = self._after_end  # bytes after the response: it cannot be reused
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _after_end(self, data: memoryview) -> None:
        self._reusable = False

    def _fail(self, exc: BaseException) -> None:
        self._reusable = False
        self._stop_timers()
        conn = self._conn
        if conn is not None:
            conn.receiver = self._after_end
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _timed_out(self) -> None:
        self._fail(timeout_error(self._url, self._timeout.seconds, self.status, self._events))

    def _stop_timers(self) -> None:
        self._paused = False
        self._timeout.cancel()
        if self._drain is not None:
            self._drain.cancel()

    def _feed_buffered(self) -> None:
        # At a cancel, every byte the kernel holds (reading may be paused by the window) is fed.
        if self._conn is not None:
            self._conn.drain(lambda receiver: receiver != self._after_end)

    def _close(self) -> None:
        self._stop_timers()
        self._clock.end()
        self._release()

    def _restart(self) -> None:
        super()._restart()
        self._new_attempt()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reuse = self._reusable and not conn.closed
        self._reusable = False
        self._client._release(conn, reuse=reuse)


# ---- client -----------------------------------------------------------------------------------


class Client:
    """A pool of HTTP/1.1 connections to one server or router, for streaming generations:
    SGLang's ``/generate`` (``dialect="sglang"``, the default), Dynamo's (``"dynamo"``) or vLLM's
    ``/inference/v1/generate`` (``"vllm"``); docs/dialects.md.

    ``async with Client("http://host:port") as client: result = await client.stream(payload).run()``

    ``max_connections`` bounds the open connections (None: no bound; a stream waits for a free
    one). ``connect_timeout`` seconds to connect, else ``StreamConnectionError``. ``headers`` go
    with every request (``stream(headers=...)`` adds to them per request, such as a router's
    ``X-SMG-Routing-Key``). ``coalesce_ms``: the read-coalescing window (0: off); docs/client.md.
    ``abort_drain_s``: how long ``abort()`` reads on for the terminal abort event after asking the
    server to abort the rid (None: close the connection at once); docs/client.md, "Abort". Dynamo
    has no such request: its abort closes the connection. ``retries``: how many times a request
    that failed before its first event (refused, a 429 or 5xx status, closed before the response)
    is sent again, the waits doubling from 0.1 s to ``retry_max_delay_s``; docs/client.md,
    "Retries".
    Plain ``http://`` only: for TLS, use ``GenerateStream`` on an aiohttp session.
    """

    def __init__(
        self,
        base_url: str,
        *,
        max_connections: int | None = None,
        connect_timeout: float = 30.0,
        headers: Mapping[str, str] | None = None,
        coalesce_ms: float = DEFAULT_COALESCE_MS,
        abort_drain_s: float | None = DEFAULT_ABORT_DRAIN_S,
        dialect: str = "sglang",
        retries: int = 0,
        retry_max_delay_s: float = DEFAULT_RETRY_MAX_DELAY_S,
    ) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Client needs an http://host[:port] URL, not {base_url!r} (TLS: use GenerateStream)")
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections must be a positive int or None, not {max_connections!r}")
        _check_drain(abort_drain_s)
        check_dialect(dialect)
        check_retries(retries, retry_max_delay_s)
        self._retries = retries
        self._retry_max_delay_s = retry_max_delay_s
        self._dialect = dialect
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._base = f"http://{parts.netloc}{self._prefix}"
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self._headers = header_lines({"Host": host_header, **(headers or {})})
        self._connect_timeout = connect_timeout
        self._coalesce_ms = coalesce_ms
        self._abort_drain_s = abort_drain_s
        self._header_fields = dict(headers or {})
        self._abort_headers = header_lines(self._header_fields)
        self._aborts: dict[str, AbortSender] = {}  # by dialect, made on first use
        self._rid_prefix = f"fa-{uuid.uuid4().hex[:12]}-"
        self._rids = itertools.count()
        self._slots = asyncio.Semaphore(max_connections) if max_connections is not None else None
        self._idle: list[Connection] = []
        self._connections: set[Connection] = set()
        self._closed = False
        # Every connection reads into this one buffer: reads are loop callbacks, one at a time.
        self._buffer = memoryview(bytearray(_READ_BUFFER_BYTES))
        self._resumers: dict[float, Resumer] = {}  # one per window length

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every connection; streams still running end as if the server had closed."""
        self._closed = True
        for conn in list(self._connections):
            conn.close()
        self._idle.clear()
        for resumer in self._resumers.values():
            resumer.close()
        for sender in self._aborts.values():
            sender.close()
        await asyncio.sleep(0)  # let the transports' connection_lost callbacks run

    def stream(
        self,
        payload: Mapping[str, Any],
        *,
        path: str | None = None,
        mode: str = "auto",
        expert_shape: tuple[int, int] | None = None,
        max_event_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        coalesce_ms: float | None = None,
        abort_drain_s: float | None | EllipsisType = ...,
        indexer_shape: tuple[int, int] | None = None,
        dialect: str | None = None,
        routed_dtype: str | None = None,
        require_routed_experts: bool = False,
        retries: int | None = None,
        retry_max_delay_s: float | None = None,
    ) -> ClientStream:
        """One streaming POST of ``payload`` (sent as JSON with ``"stream": true`` and a request
        id: ``rid``, or vLLM's ``request_id``; the payload's, else a new one) to ``path`` (None:
        the dialect's, ``/generate`` or vLLM's ``/inference/v1/generate``); nothing is sent
        before ``run()``. ``coalesce_ms`` None takes the client's window, ``abort_drain_s`` left
        out and ``dialect`` None the client's. ``routed_dtype="int32"`` widens vLLM's narrower
        routed experts (uint8, uint16) to int32. ``require_routed_experts``: a stream that
        finishes (stop, length) without routed experts raises ``StreamFormatError`` instead of
        giving None (the server was not started to send them). ``retries`` and
        ``retry_max_delay_s`` None take the client's."""
        if abort_drain_s is ...:
            abort_drain_s = self._abort_drain_s
        else:
            _check_drain(abort_drain_s)
        if dialect is None:
            dialect = self._dialect
        else:
            check_dialect(dialect)
        retries = self._retries if retries is None else retries
        retry_max_delay_s = self._retry_max_delay_s if retry_max_delay_s is None else retry_max_delay_s
        check_retries(retries, retry_max_delay_s)
        return ClientStream(
            self,
            payload,
            path=path,
            mode=mode,
            expert_shape=expert_shape,
            max_event_bytes=max_event_bytes,
            headers=headers,
            read_timeout=read_timeout,
            coalesce_ms=self._coalesce_ms if coalesce_ms is None else coalesce_ms,
            abort_drain_s=abort_drain_s,
            indexer_shape=indexer_shape,
            dialect=dialect,
            routed_dtype=routed_dtype,
            require_routed_experts=require_routed_experts,
            retries=retries,
            retry_max_delay_s=retry_max_delay_s,
        )

    @property
    def base_url(self) -> str:
        return self._base

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def connections(self) -> int:
        """Connections open now (idle or serving a stream)."""
        return len(self._connections)

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def _aborts_for(self, dialect: str) -> AbortSender:
        """The client's sender of drain aborts to a server of ``dialect``."""
        sender = self._aborts.get(dialect)
        if sender is None:
            kind = VllmAbortSender if dialect == "vllm" else AbortSender
            sender = self._aborts[dialect] = kind(self._base, self._abort_headers)
        return sender

    def _new_rid(self) -> str:
        # One prefix per client and a fixed-width counter: no rid is a prefix of another, which
        # matters because SGLang's scheduler aborts every rid that starts with the one asked for.
        return f"{self._rid_prefix}{next(self._rids):012d}"

    # ---- pool ----------------------------------------------------------------------------------
    async def _acquire(self, url: str) -> Connection:
        if self._closed:
            raise RuntimeError("Client is closed")
        if self._slots is not None:
            await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
            return await self._connect(url)
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    async def _connect(self, url: str) -> Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: Connection(self._buffer, self._forget), self._host, self._port
                )
        except TimeoutError as exc:
            raise StreamConnectionError(f"POST {url} failed: no connection within {self._connect_timeout} s") from exc
        except OSError as exc:
            raise connect_error(url, self._host, exc) from exc
        if self._closed:
            conn.close()
            raise RuntimeError("Client is closed")
        self._connections.add(conn)
        return conn

    def _release(self, conn: Connection, *, reuse: bool) -> None:
        if reuse and not self._closed and not conn.closed:
            conn.detach()
            self._idle.append(conn)
        else:
            conn.close()
            self._forget(conn)
        if self._slots is not None:
            self._slots.release()

    def _resumer(self, window: float) -> Resumer:
        resumer = self._resumers.get(window)
        if resumer is None:
            resumer = self._resumers[window] = Resumer(asyncio.get_running_loop(), window)
        return resumer

    def _forget(self, conn: Connection) -> None:
        self._connections.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)
