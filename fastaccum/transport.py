"""fastaccum.Client: an HTTP/1.1 client for SGLang servers whose socket reads go to the core whole.

``Client`` owns its connections (``asyncio.Protocol``; the stock loop and uvloop). httptools parses
the status line and headers; every body read after them is one call into the accumulator
(``feed_chunked()`` undoes the chunked encoding in the core), with no Python call per HTTP chunk.
Streams keep ``GenerateStream``'s contract (they subclass ``StreamConsumer``): ``run()``,
``abort()``, ``snapshot()``, ``kept()``, progress counters, ``CancelledError`` only for the caller's
own cancel. A completed stream returns its connection to the pool; an aborted or failed one closes
it, so the server sees the disconnect and stops decoding.

Read coalescing (``coalesce_ms``): after a body read the stream stops reading for the window
(``pause_reading()``, resumed by a timer), so the kernel gathers the events that arrive meanwhile
into one read; it does so only while windows pay off (events arrive faster than the window). A
read costs far more than an event (docs/client.md has the figures); no byte waits longer than the
window, and ``abort()`` first reads what the kernel holds without blocking, so the
aborted prefix holds every event that had arrived.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import itertools
import math
import socket
import time
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

import httptools
import orjson

from fastaccum.client import _ERROR_BODY_CHARS, StreamConsumer
from fastaccum.errors import (
    ServerError,
    StreamConnectionError,
    StreamError,
    StreamFormatError,
    StreamTimeoutError,
)
from fastaccum.result import StreamResult, StreamTiming

__all__ = ("Client", "ClientStream", "DEFAULT_COALESCE_MS")

# docs/client.md, "Read coalescing": at 100 events/s per stream a 100 ms window gathers about ten
# events per read, and client CPU per token falls to a third of reading each event (a fifth of
# aiohttp's); the terminal event waits at most this long, a few tokens' decode time.
DEFAULT_COALESCE_MS = 100.0
# A read at least this large means the socket holds more: read on at once (a routed-experts line).
_BIG_READ_BYTES = 65536
_HEAD_LIMIT_BYTES = 65536
_ERROR_BODY_LIMIT_BYTES = 65536
# One read's most: asyncio's own default read size.
_READ_BUFFER_BYTES = 262144
# Drain at abort: what the kernel holds is bounded by the receive buffer; the cap only stops a
# server that writes faster than the loop reads from holding abort() up.
_DRAIN_MAX_READS = 256
# Windows that end within this fraction of a window of the first due are resumed with it.
_RESUME_SLACK = 0.02
# Inter-event gap histogram: 16 log-spaced buckets per doubling from 1 us (about 4.4% wide), up
# to 2**30 us (18 minutes), O(1) memory and one log2 per read that completed events.
_GAP_BUCKETS_PER_DOUBLING = 16
_GAP_BUCKETS = 30 * _GAP_BUCKETS_PER_DOUBLING
_now = time.monotonic


class _Stale(Exception):
    """A reused connection closed before the response's first byte (the server's idle timeout
    raced the request): the request is sent again on a new connection."""


# ---- connection -------------------------------------------------------------------------------


class _Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection; reads go to the attached stream's current receiver.

    A buffered protocol: the loop reads into the client's one receive buffer (``recv_into``).
    A plain protocol gets a fresh 256 KiB ``bytes`` per read, which glibc serves with an mmap,
    an mremap and a munmap around every recv: three system calls per read, more than the read.
    Receivers get a view of the buffer that is valid only during the call (the core copies what
    it keeps).
    """

    def __init__(self, client: Client) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.receiver: Callable[[memoryview], None] | None = None
        self.lost: Callable[[BaseException | None], None] | None = None
        self.requests = 0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.client._buffer

    def buffer_updated(self, nbytes: int) -> None:
        receiver = self.receiver
        if receiver is not None:
            receiver(self.client._buffer[:nbytes])
        else:  # bytes on an idle connection: nothing to answer; it cannot serve another request
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.client._forget(self)
        lost = self.lost
        if lost is not None:
            lost(exc)

    def attach(self, receiver: Callable[[memoryview], None], lost: Callable[[BaseException | None], None]) -> None:
        self.receiver, self.lost = receiver, lost

    def detach(self) -> None:
        self.receiver = self.lost = None
        transport = self.transport
        if transport is not None and not self.closed and not transport.is_reading():
            transport.resume_reading()  # an idle connection must notice the server closing it

    def close(self) -> None:
        self.closed = True
        self.receiver = self.lost = None
        if self.transport is not None:
            self.transport.abort()  # now, not after a flush: the server must see the client leave


class _Head:
    """httptools callbacks for a response head: the headers, lower-cased, repeats joined."""

    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.complete = False
        self.body = bytearray()  # an error response's body, up to _ERROR_BODY_LIMIT_BYTES
        self.body_complete = False

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        old = self.headers.get(key)
        self.headers[key] = text if old is None else f"{old}, {text}"

    def on_headers_complete(self) -> None:
        self.complete = True

    def on_body(self, body: bytes) -> None:
        room = _ERROR_BODY_LIMIT_BYTES - len(self.body)
        if room > 0:
            self.body += body[:room]

    def on_message_complete(self) -> None:
        self.body_complete = True


# ---- stream -----------------------------------------------------------------------------------


class ClientStream(StreamConsumer):
    """One streaming request on a ``Client`` (made by ``Client.stream()``)."""

    def __init__(
        self,
        client: Client,
        payload: Mapping[str, Any],
        *,
        path: str,
        mode: str,
        expert_shape: tuple[int, int] | None,
        max_event_bytes: int | None,
        headers: Mapping[str, str] | None,
        read_timeout: float | None,
        coalesce_ms: float,
    ) -> None:
        super().__init__(None, mode=mode, expert_shape=expert_shape, max_event_bytes=max_event_bytes)
        self._client = client
        self._url = client._base + path
        self._request = client._request_bytes(client._prefix + path, {**payload, "stream": True}, headers)
        self._read_timeout = read_timeout
        window = max(0.0, coalesce_ms) / 1000.0
        if read_timeout is not None:
            window = min(window, read_timeout / 2)  # a window never looks like a silent server
        self._window = window
        self.status: int | None = None
        self._conn: _Connection | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._head_buf = bytearray()
        self._head: _Head | None = None
        self._parser: Any = None
        self._feed_body: Callable[[memoryview], int] = self._accumulator.feed_chunked
        self._length: int | None = None  # Content-Length bytes still due; None: chunked or until close
        self._chunked = False
        self._keep_alive = False
        self._reusable = False
        self._paused = False  # reading paused for a window, waiting in the client's _Resumer
        self._paused_last = False  # the read before this one was followed by a window
        self._timer: asyncio.TimerHandle | None = None
        # timing (monotonic seconds)
        self._sent = 0.0
        self._ended = 0.0
        self._first_byte = 0.0
        self._first_token = 0.0
        self._last_read = 0.0
        self._last_event = 0.0
        self._reads = 0
        self._gaps = [0] * _GAP_BUCKETS
        self._gap_count = 0
        self._gap_max = 0.0

    # ---- timing --------------------------------------------------------------------------------
    @property
    def timing(self) -> StreamTiming | None:
        """What the transport measured so far (None before the request was written)."""
        if not self._sent:
            return None
        end = self._ended or _now()
        tokens = self._accumulator.tokens
        first_token = self._first_token - self._sent if self._first_token else None
        rate = None
        if self._first_token and self._last_event > self._sent:
            rate = tokens / (self._last_event - self._sent)
        gap_p50, gap_p99 = self._gap_quantiles()
        return StreamTiming(
            first_byte_s=self._first_byte - self._sent if self._first_byte else None,
            first_token_s=first_token,
            duration_s=end - self._sent,
            gap_p50_s=gap_p50,
            gap_p99_s=gap_p99,
            gap_max_s=self._gap_max if self._gap_count else None,
            tokens_per_s=rate,
            tokens=tokens,
            bytes=self._bytes_received,
            events=self._events,
            reads=self._reads,
        )

    def _record_gap(self, gap: float) -> None:
        if gap > self._gap_max:
            self._gap_max = gap
        bucket = int(math.log2(gap * 1e6) * _GAP_BUCKETS_PER_DOUBLING) if gap > 1e-6 else 0
        self._gaps[min(bucket, _GAP_BUCKETS - 1)] += 1
        self._gap_count += 1

    def _gap_quantiles(self) -> tuple[float | None, float | None]:
        """p50 and p99 of the gaps: the middle of the bucket holding each rank (one pass in C)."""
        count = self._gap_count
        if not count:
            return None, None
        running = list(itertools.accumulate(self._gaps))
        p50, p99 = (
            # The bucket's geometric middle, but never beyond the largest gap seen.
            min(2.0 ** ((bisect.bisect_left(running, rank) + 0.5) / _GAP_BUCKETS_PER_DOUBLING) * 1e-6, self._gap_max)
            for rank in (max(1, math.ceil(0.5 * count)), max(1, math.ceil(0.99 * count)))
        )
        return p50, p99

    def snapshot(self) -> StreamResult:
        return dataclasses.replace(super().snapshot(), timing=self.timing)

    def kept(self) -> StreamResult:
        return dataclasses.replace(super().kept(), timing=self.timing)

    # ---- request -------------------------------------------------------------------------------
    async def _read(self) -> StreamResult:
        loop = self._loop = asyncio.get_running_loop()
        for attempt in range(2):
            conn = await self._client._acquire()
            reused = conn.requests > 0
            self._conn = conn
            conn.requests += 1
            self._waiter = loop.create_future()
            conn.attach(self._on_head, self._on_lost)
            transport = conn.transport
            if conn.closed or transport is None:
                self._on_lost(None)
            else:
                self._sent = self._last_read = _now()
                transport.write(self._request)
                self._arm_timeout()
            try:
                await self._waiter
            except _Stale:
                if attempt or not reused:
                    raise StreamConnectionError(
                        f"POST {self._url} failed: the connection closed before a response"
                    ) from None
                self._release()
                continue
            break
        self._ended = _now()
        result = self._accumulator.finish()
        return dataclasses.replace(result, timing=self.timing)

    # ---- receivers (loop callbacks) ------------------------------------------------------------
    def _on_head(self, data: memoryview) -> None:
        now = self._last_read = _now()
        self._reads += 1
        if not self._first_byte:
            self._first_byte = now
        buf = self._head_buf
        buf += data
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _HEAD_LIMIT_BYTES:
                    self._fail(StreamFormatError(f"response head from {self._url} exceeds {_HEAD_LIMIT_BYTES} bytes"))
                return
            head = _Head()
            parser = httptools.HttpResponseParser(head)
            try:
                parser.feed_data(bytes(buf[: end + 4]))
            except httptools.HttpParserUpgrade:
                self._fail(StreamFormatError(f"{self._url} answered with a protocol upgrade; Client speaks HTTP/1.1"))
                return
            except httptools.HttpParserError as exc:
                self._fail(StreamFormatError(f"malformed response head from {self._url}: {exc}"))
                return
            status = parser.get_status_code()
            rest = bytes(buf[end + 4 :])
            buf.clear()
            if 100 <= status < 200 and status != 101:
                buf += rest  # an interim response (100 Continue, 103 Early Hints): the real one follows
                continue
            self.status = status
            self._head, self._parser = head, parser
            self._keep_alive = parser.should_keep_alive()
            break
        if not self._start_body(status, head.headers):
            return
        conn = self._conn
        if rest and conn is not None and conn.receiver is not None:
            self._reads -= 1  # the same read, counted once
            conn.receiver(memoryview(rest))

    def _start_body(self, status: int, headers: dict[str, str]) -> bool:
        conn = self._conn
        assert conn is not None
        if status >= 300 or status == 101:
            if status == 101:
                self._fail(StreamFormatError(f"{self._url} switched protocols (HTTP 101); Client speaks HTTP/1.1"))
                return False
            conn.receiver = self._on_error_body
            if self._head is not None and self._head.body_complete:  # Content-Length: 0
                self._fail(self._status_error())
                return False
            return True
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            self._fail(
                StreamFormatError(
                    f"{self._url} sent Content-Encoding: {encoding}; Client asks for identity and does not decompress"
                )
            )
            return False
        transfer = headers.get("transfer-encoding")
        if transfer is not None:
            if transfer.strip().lower() != "chunked":
                self._fail(StreamFormatError(f"{self._url} sent Transfer-Encoding: {transfer}; only chunked is read"))
                return False
            self._chunked = True
        else:
            self._feed_body = self._accumulator.feed
            length = headers.get("content-length")
            if length is not None:
                try:
                    self._length = int(length)
                except ValueError:
                    self._fail(StreamFormatError(f"malformed Content-Length from {self._url}: {length!r}"))
                    return False
            else:
                self._keep_alive = False  # the body ends when the server closes
        conn.receiver = self._on_body
        if self._length == 0:
            self._complete()
        return True

    def _on_body(self, data: memoryview) -> None:
        previous = self._last_read
        now = self._last_read = _now()
        self._reads += 1
        self._bytes_received += len(data)
        length = self._length
        if length is not None and len(data) >= length:
            extra = len(data) - length
            data = data[:length]
            self._length = 0
        elif length is not None:
            self._length = length - len(data)
            extra = 0
        else:
            extra = 0
        try:
            count = self._feed_body(data)
        except StreamError as exc:
            self._fail(exc)
            return
        if count:
            self._events += count
            if self._last_event:
                self._record_gap(now - self._last_event)
            self._last_event = now
            if not self._first_token and self._accumulator.tokens:
                self._first_token = now
        if extra:
            self._fail(StreamFormatError(f"{self._url} sent {extra} bytes after its Content-Length body"))
        elif self._accumulator.chunked_ended if self._chunked else self._length == 0:
            self._complete()
        elif self._window and len(data) < _BIG_READ_BYTES and self._worth_pausing(count, now - previous):
            conn = self._conn
            assert conn is not None and conn.transport is not None and self._loop is not None
            conn.transport.pause_reading()
            self._paused = True
            self._client._resumer(self._window).add(self)

    def _worth_pausing(self, count: int, gap: float) -> bool:
        # A pause costs two epoll_ctl calls, and pays only if several events arrive
        # within the window: keep pausing while a window gathers more than one event; after a
        # window that gathered one at most, pause again only once reads come faster than the window.
        if self._paused_last:
            pause = count > 1
        else:
            pause = gap < self._window
        self._paused_last = pause
        return pause

    def _resume_reading(self) -> None:
        if not self._paused:
            return  # ended while paused
        self._paused = False
        conn = self._conn
        if conn is not None and conn.transport is not None and not conn.closed:
            conn.transport.resume_reading()

    def _on_error_body(self, data: memoryview) -> None:
        self._last_read = _now()
        self._reads += 1
        head = self._head
        assert head is not None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            head.body_complete = True  # a broken error body: quote what arrived
        if head.body_complete:
            self._fail(self._status_error())

    def _status_error(self) -> ServerError:
        head, status = self._head, self.status
        assert head is not None and status is not None
        body = head.body.decode("utf-8", errors="replace")
        if 300 <= status < 400:
            location = head.headers.get("location", "")
            body = body or f"redirect to {location!r} not followed"
        return ServerError(
            f"HTTP {status} from {self._url}: {body[:_ERROR_BODY_CHARS]}", status=status, server_message=body
        )

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
        elif not self._first_byte:
            self._fail(_Stale())
        else:
            reason = f": {exc!r}" if exc is not None else ""
            message = f"POST {self._url} failed: the connection closed inside the response head{reason}"
            head = _Head()
            try:
                httptools.HttpResponseParser(head).feed_data(bytes(self._head_buf))
            except httptools.HttpParserError as parse_error:
                self._fail(StreamFormatError(f"malformed response head from {self._url}: {parse_error}"))
                return
            self._fail(StreamConnectionError(message))

    # ---- outcome -------------------------------------------------------------------------------
    def _complete(self, *, eof: bool = False) -> None:
        self._reusable = self._keep_alive and not eof
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

    def _arm_timeout(self) -> None:
        if self._read_timeout is not None and self._loop is not None:
            self._timer = self._loop.call_later(self._read_timeout, self._check_timeout)

    def _check_timeout(self) -> None:
        timeout = self._read_timeout
        assert timeout is not None and self._loop is not None
        idle = _now() - self._last_read
        if idle < timeout * 0.999:  # timer granularity: a timer may fire a hair early
            self._timer = self._loop.call_later(timeout - idle, self._check_timeout)
            return
        self._timer = None
        if self.status is None:
            self._fail(StreamTimeoutError(f"no response from {self._url} within {timeout} s"))
        else:
            self._fail(
                StreamTimeoutError(
                    f"no bytes from {self._url} for {timeout} s after {self._events} events", event_index=self._events
                )
            )

    def _stop_timers(self) -> None:
        self._paused = False
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None

    def _feed_buffered(self) -> None:
        """Read what the kernel holds for this stream without blocking (reading may be paused by
        the window) and feed it, so the prefix holds every byte that arrived before the cancel."""
        conn = self._conn
        if conn is None or conn.closed or conn.transport is None or conn.receiver in (None, self._after_end):
            return
        sock = conn.transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd < 0:
            return
        raw = socket.socket(fileno=fd)
        buffer = self._client._buffer
        try:
            for _ in range(_DRAIN_MAX_READS):
                receiver = conn.receiver
                if receiver is None or receiver == self._after_end:
                    break
                try:
                    n = raw.recv_into(buffer, 0, socket.MSG_DONTWAIT)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break  # reset: what arrived before it is already fed
                if not n:
                    break
                receiver(buffer[:n])
        finally:
            raw.detach()  # the fd stays the transport's

    def _close(self) -> None:
        self._stop_timers()
        if self._ended == 0.0 and self._sent:
            self._ended = _now()
        self._release()

    def _release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        reuse = self._reusable and not conn.closed
        self._reusable = False
        self._client._release(conn, reuse=reuse)


# ---- client -----------------------------------------------------------------------------------


class _Resumer:
    """Resumes paused streams when their window ends, with one loop timer for all of them.

    A timer per pause would cost a handle and a push and pop on the loop's heap (ten Python-level
    comparisons each with a thousand streams) per read; windows of one length end in the order
    they began, so a queue and a single timer do. Streams due within ``_RESUME_SLACK`` of the
    first are resumed together, a hair early rather than with a timer each.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, window: float) -> None:
        self._loop = loop
        self._window = window
        self._queue: collections.deque[tuple[float, ClientStream]] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    def add(self, stream: ClientStream) -> None:
        due = self._loop.time() + self._window
        self._queue.append((due, stream))
        if self._timer is None:
            self._timer = self._loop.call_at(due, self._fire)

    def _fire(self) -> None:
        queue = self._queue
        until = self._loop.time() + self._window * _RESUME_SLACK
        while queue and queue[0][0] <= until:
            queue.popleft()[1]._resume_reading()
        self._timer = self._loop.call_at(queue[0][0], self._fire) if queue else None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._queue.clear()


class Client:
    """A pool of HTTP/1.1 connections to one SGLang server or router, for streaming ``/generate``.

    ``async with Client("http://host:port") as client: result = await client.stream(payload).run()``

    ``max_connections`` bounds the open connections (None: no bound; a stream waits for a free
    one). ``connect_timeout`` seconds to connect, else ``StreamConnectionError``. ``headers`` go
    with every request (``stream(headers=...)`` adds to them per request, such as a router's
    ``X-SMG-Routing-Key``). ``coalesce_ms``: the read-coalescing window (0: off); docs/client.md.
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
    ) -> None:
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"Client needs an http://host[:port] URL, not {base_url!r} (TLS: use GenerateStream)")
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections must be a positive int or None, not {max_connections!r}")
        self._host = parts.hostname
        self._port = parts.port or 80
        self._prefix = parts.path.rstrip("/")
        self._base = f"http://{parts.netloc}{self._prefix}"
        host_header = parts.netloc.rsplit("@", 1)[-1]
        self._headers = _header_lines({"Host": host_header, **(headers or {})})
        self._connect_timeout = connect_timeout
        self._coalesce_ms = coalesce_ms
        self._slots = asyncio.Semaphore(max_connections) if max_connections is not None else None
        self._idle: list[_Connection] = []
        self._connections: set[_Connection] = set()
        self._closed = False
        # Every connection reads into this one buffer: reads are loop callbacks, one at a time.
        self._buffer = memoryview(bytearray(_READ_BUFFER_BYTES))
        self._resumers: dict[float, _Resumer] = {}  # one per window length

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
        await asyncio.sleep(0)  # let the transports' connection_lost callbacks run

    def stream(
        self,
        payload: Mapping[str, Any],
        *,
        path: str = "/generate",
        mode: str = "auto",
        expert_shape: tuple[int, int] | None = None,
        max_event_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
        coalesce_ms: float | None = None,
    ) -> ClientStream:
        """One streaming POST of ``payload`` (sent as JSON with ``"stream": true``); nothing is sent
        before ``run()``. ``coalesce_ms`` None takes the client's window."""
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

    # ---- pool ----------------------------------------------------------------------------------
    def _request_bytes(self, target: str, body: Mapping[str, Any], headers: Mapping[str, str] | None) -> bytes:
        data = orjson.dumps(body)
        extra = _header_lines(headers) if headers else b""
        return (
            b"POST %s HTTP/1.1\r\n%s%sContent-Type: application/json\r\nAccept: text/event-stream\r\n"
            b"Accept-Encoding: identity\r\nContent-Length: %d\r\n\r\n%s"
            % (target.encode("ascii"), self._headers, extra, len(data), data)
        )

    async def _acquire(self) -> _Connection:
        if self._closed:
            raise RuntimeError("Client is closed")
        if self._slots is not None:
            await self._slots.acquire()
        try:
            while self._idle:
                conn = self._idle.pop()
                if not conn.closed:
                    return conn
            return await self._connect()
        except BaseException:
            if self._slots is not None:
                self._slots.release()
            raise

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        where = f"{self._host}:{self._port}"
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, conn = await loop.create_connection(lambda: _Connection(self), self._host, self._port)
        except TimeoutError as exc:
            raise StreamConnectionError(f"connecting to {where} timed out after {self._connect_timeout} s") from exc
        except OSError as exc:
            raise StreamConnectionError(f"POST {self._base} failed: connecting to {where}: {exc!r}") from exc
        if self._closed:
            conn.close()
            raise RuntimeError("Client is closed")
        self._connections.add(conn)
        return conn

    def _release(self, conn: _Connection, *, reuse: bool) -> None:
        if reuse and not self._closed and not conn.closed:
            conn.detach()
            self._idle.append(conn)
        else:
            conn.close()
            self._forget(conn)
        if self._slots is not None:
            self._slots.release()

    def _resumer(self, window: float) -> _Resumer:
        resumer = self._resumers.get(window)
        if resumer is None:
            resumer = self._resumers[window] = _Resumer(asyncio.get_running_loop(), window)
        return resumer

    def _forget(self, conn: _Connection) -> None:
        self._connections.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)


def _header_lines(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if any(c in name for c in ":\r\n ") or any(c in str(value) for c in "\r\n"):
            raise ValueError(f"invalid HTTP header {name!r}: {value!r}")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(lines)
