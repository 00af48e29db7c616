"""One request on a ``fastaccum.Client``: ``ClientStream``, from writing the request to the outcome.

It reads the response on the connection the client lends it: the head through httptools, the body
straight into the core (``feed()``, or ``feed_chunked()`` which undoes the chunked coding in the
core; a non-streaming answer into fastaccum.transport.body's reader), and decides how the request
ended: the terminal event, a drained abort (fastaccum.transport.abort_sender), a cut, a failure to
retry (fastaccum.transport.retry) or to raise. It knows the client only as the ``Pool`` it borrows
connections, request ids and abort senders from (fastaccum.transport.client).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from fastaccum._core.dialects import VLLM, request_for, route_hint
from fastaccum._core.resume import routed_start_of
from fastaccum._impl import StreamAccumulator
from fastaccum.errors import StreamConnectionError, StreamError, StreamFormatError
from fastaccum.result import StreamResult, StreamTiming
from fastaccum.transport.abort_sender import AbortSender, Drain
from fastaccum.transport.consumer import AccumulatorLike, StreamConsumer
from fastaccum.transport.http1 import Body, BodyFraming, Connection, ResponseHead, framing_of, read_head, request_bytes
from fastaccum.transport.pacing import ReadPacer, Resumer
from fastaccum.transport.timing import ReadTimeout, RequestClock, timeout_error

__all__ = ("ClientStream", "Pool", "check_drain")


class Pool(Protocol):
    """What a request borrows from its client."""

    _prefix: str
    _headers: bytes
    _header_fields: dict[str, str]

    @property
    def base_url(self) -> str: ...

    def _new_rid(self) -> str: ...

    def _aborts_for(self, dialect: str) -> AbortSender: ...

    async def _acquire(self, url: str) -> Connection: ...

    def _release(self, conn: Connection, *, reuse: bool) -> None: ...

    def _resumer(self, window: float) -> Resumer: ...


def check_drain(seconds: object) -> None:
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds < 0):
        raise ValueError(f"abort_drain_s must be seconds >= 0 or None, not {seconds!r}")


class _Stale(Exception):
    """A reused connection closed before the response's first byte (the server's idle timeout
    raced the request): the request is sent again on a new connection."""


class ClientStream(StreamConsumer):
    """One streaming request on a ``Client`` (made by ``Client.stream()``)."""

    def __init__(
        self,
        client: Pool,
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
        super().__init__(
            None, routed_start=routed_start_of(payload, dialect), dialect=dialect, body=not request.streams, **core
        )
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
        if isinstance(result, list):  # a non-streaming batch's answers: one request, one timing
            return [self._stamped(one) for one in result]
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
        if self._drain is not None:
            cause = f"the connection closed before the server ended request {self.rid} after its abort"
            self._drain.interrupted(exc if isinstance(exc, StreamError) else StreamConnectionError(cause))
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
