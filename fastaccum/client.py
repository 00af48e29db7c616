"""Async transport for SGLang ``/generate`` streams: reads bytes, feeds the accumulator, handles abort.

``GenerateStream`` POSTs with aiohttp and feeds the raw body pieces (``iter_any()``, never a line
reader: aiohttp's line limits break on multi-megabyte events) into a ``StreamAccumulator``.
``StreamConsumer``/``consume()`` do the same for any async byte iterator (httpx's ``aiter_raw()``).
This module does I/O only: every byte is interpreted by the accumulator.

Errors: HTTP status >= 400 is ``ServerError`` (status and body); failing to connect or to get the
response headers is ``StreamConnectionError``; ``read_timeout`` seconds without a byte is
``StreamTimeoutError``. A connection that breaks mid-body counts as end of input: the accumulator
then decides (``StreamTruncatedError`` unless the terminal event had arrived: docs/wire-format.md,
"What a consumer must do", item 7).

Session timeouts: aiohttp's default ``ClientTimeout`` has ``total=300``, which would kill a long
rollout. ``GenerateStream`` keeps the session's ``total``/``connect`` settings and replaces only
``sock_read`` with ``read_timeout``, so create the session with
``aiohttp.ClientTimeout(total=None, sock_read=None)`` (``STREAM_TIMEOUT`` below).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterable, Mapping
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from fastaccum._impl import StreamAccumulator
from fastaccum.errors import (
    ServerError,
    StreamConnectionError,
    StreamError,
    StreamFormatError,
    StreamTimeoutError,
)
from fastaccum.result import StreamResult

__all__ = ("GenerateStream", "StreamConsumer", "consume", "STREAM_TIMEOUT")

# SGLang sends no heartbeats: queueing or a long prefill can mean minutes of silence
# (docs/wire-format.md, "SSE framing").
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)
# An HTTP error body is quoted in the exception message up to this many characters.
_ERROR_BODY_CHARS = 2000


class StreamConsumer:
    """Feed an async iterator of byte pieces into a ``StreamAccumulator``, with request-level abort.

    ``await run()`` returns the ``StreamResult``. ``abort()`` (from any task or callback of the same
    loop) stops the read and makes ``run()`` return the observed prefix with ``aborted=True``; any
    other cancellation of the task running ``run()`` propagates as ``CancelledError``. Exceptions
    raised by the iterator itself propagate unchanged.
    """

    def __init__(
        self,
        pieces: AsyncIterable[bytes] | None = None,
        *,
        mode: str = "auto",
        expert_shape: tuple[int, int] | None = None,
        max_event_bytes: int | None = None,
    ) -> None:
        self._pieces = pieces
        self._accumulator = StreamAccumulator(mode=mode, expert_shape=expert_shape, max_event_bytes=max_event_bytes)
        self._task: asyncio.Task[Any] | None = None
        self._started = False
        self._abort_requested = False
        self._abort_cancel_pending = False  # abort() cancelled the task; run() must uncancel once
        self._events = 0
        self._bytes_received = 0

    # ---- progress (readable while running) -----------------------------------------------------
    @property
    def events(self) -> int:
        """Data events completed so far (``[DONE]`` included)."""
        return self._events

    @property
    def bytes_received(self) -> int:
        return self._bytes_received

    @property
    def tokens(self) -> int:
        """The newest token total the stream reported (no parsing: the accumulator's counter)."""
        return self._accumulator.tokens

    @property
    def aborted(self) -> bool:
        return self._abort_requested

    def snapshot(self) -> StreamResult:
        """The observed prefix (also after an error), ``aborted`` set if ``abort()`` was called."""
        result = self._accumulator.snapshot()
        return dataclasses.replace(result, aborted=True) if self._abort_requested else result

    # ---- control -------------------------------------------------------------------------------
    def abort(self) -> None:
        """Request-level abort: stop reading this stream (and close its connection) at once.

        Idempotent. If the terminal event has already been fed, ``run()`` still stops reading
        but returns the complete result with ``aborted=False``.
        """
        if self._abort_requested:
            return
        self._abort_requested = True
        task = self._task
        if task is not None and not task.done() and not self._abort_cancel_pending:
            self._abort_cancel_pending = True
            task.cancel()

    async def run(self) -> StreamResult:
        if self._started:
            raise RuntimeError("run() can be awaited only once per stream")
        self._started = True
        if self._abort_requested:  # aborted before it started: nothing was sent or read
            return self.snapshot()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("run() must be awaited inside an asyncio task")
        self._task = task
        try:
            return await self._read()
        except asyncio.CancelledError:
            # Bytes the transport already holds arrived before the cancel: they belong to the
            # prefix, whoever cancelled (a rollout abort reads the prefix after the cancel).
            self._feed_buffered()
            if not self._abort_cancel_pending:
                raise  # the caller's cancellation: not ours to swallow
            self._abort_cancel_pending = False
            # Python 3.11: undo only the cancel() that abort() issued; if the caller cancelled too,
            # their request is still counted and must propagate.
            if task.uncancel() > 0:
                raise
            return self._aborted_result()
        finally:
            self._task = None
            self._close()

    def kept(self) -> StreamResult:
        """What a cut keeps: the complete result if the terminal event already arrived
        (``aborted=False``), else the observed prefix (``aborted=True``). Never raises."""
        if self._accumulator.finished:
            try:
                return self._accumulator.finish()
            except StreamError:
                pass  # bytes after the terminal event: keep what was verified, as for any cut
        return dataclasses.replace(self._accumulator.snapshot(), aborted=True)

    def _aborted_result(self) -> StreamResult:
        result = self.kept()
        if not result.aborted:  # the terminal event won the race with abort()
            self._abort_requested = False
        return result

    # ---- I/O -----------------------------------------------------------------------------------
    async def _read(self) -> StreamResult:
        if self._pieces is None:
            raise TypeError("StreamConsumer needs an async iterable of bytes")
        await self._feed_all(self._pieces)
        return self._accumulator.finish()

    async def _feed_all(self, pieces: AsyncIterable[bytes]) -> None:
        feed = self._accumulator.feed
        async for piece in pieces:
            self._bytes_received += len(piece)
            self._events += feed(piece)

    def _feed_buffered(self) -> None:
        """Feed what the transport has already received but not yet handed over (no await)."""

    def _close(self) -> None:
        """Release transport resources once run() ends; the iterator's owner closes its transport."""


class GenerateStream(StreamConsumer):
    """One streaming ``POST /generate`` on an aiohttp session.

    ``payload`` is sent as JSON with ``"stream": true``. ``read_timeout`` (seconds without a byte,
    default None: SGLang has no heartbeats) raises ``StreamTimeoutError``. ``headers`` are added to
    the request. The connection is closed (not returned to the pool) whenever the stream ends
    early: abort, cancellation or error, so the server observes the disconnect and stops decoding.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        payload: Mapping[str, Any],
        *,
        mode: str = "auto",
        expert_shape: tuple[int, int] | None = None,
        max_event_bytes: int | None = None,
        headers: Mapping[str, str] | None = None,
        read_timeout: float | None = None,
    ) -> None:
        super().__init__(None, mode=mode, expert_shape=expert_shape, max_event_bytes=max_event_bytes)
        self._session = session
        self._url = url
        self._payload = {**payload, "stream": True}
        self._headers = dict(headers) if headers else None
        self._read_timeout = read_timeout
        self._response: aiohttp.ClientResponse | None = None
        self.status: int | None = None

    async def _read(self) -> StreamResult:
        base = self._session.timeout
        timeout = aiohttp.ClientTimeout(
            total=base.total,
            connect=base.connect,
            sock_read=self._read_timeout,
            sock_connect=base.sock_connect,
            ceil_threshold=base.ceil_threshold,
        )
        try:
            response = await self._session.post(self._url, json=self._payload, headers=self._headers, timeout=timeout)
        except aiohttp.ClientResponseError as exc:
            if isinstance(exc.__cause__, HttpProcessingError):
                # aiohttp reports a response it could not parse as status 400: the server sent none.
                raise StreamFormatError(f"malformed response from {self._url}: {exc.message}") from exc
            # a session created with raise_for_status=True
            raise ServerError(f"HTTP {exc.status} from {self._url}: {exc.message}", status=exc.status) from exc
        except aiohttp.ClientError as exc:
            if isinstance(exc, asyncio.TimeoutError):  # ServerTimeoutError before the headers
                raise StreamTimeoutError(f"no response from {self._url} within {self._read_timeout} s") from exc
            raise StreamConnectionError(f"POST {self._url} failed: {exc!r}") from exc
        except TimeoutError as exc:  # the session's total/connect timeout
            raise StreamTimeoutError(f"POST {self._url} timed out: {exc!r}") from exc
        self._response = response
        self.status = response.status
        if response.status >= 400:
            body = await response.text(errors="replace")
            raise ServerError(
                f"HTTP {response.status} from {self._url}: {body[:_ERROR_BODY_CHARS]}",
                status=response.status,
                server_message=body,
            )
        self._watch_parser(response)
        try:
            await self._feed_all(response.content.iter_any())
        except HttpProcessingError as exc:
            raise StreamFormatError(
                f"malformed response body from {self._url}: {exc.message}", event_index=self._events
            ) from exc
        except aiohttp.ClientPayloadError:
            # The body broke off (no end of the chunked encoding): that is end of input, and
            # finish() tells a truncation from a stream whose terminal event had arrived.
            pass
        except aiohttp.ServerTimeoutError as exc:
            raise StreamTimeoutError(
                f"no bytes from {self._url} for {self._read_timeout} s after {self._events} events",
                event_index=self._events,
            ) from exc
        except aiohttp.ClientConnectionError:
            pass  # the connection dropped between chunks: again end of input
        return self._accumulator.finish()

    @staticmethod
    def _watch_parser(response: aiohttp.ClientResponse) -> None:
        """Make a parse error in the body (a malformed chunk size) reach the body reader.

        aiohttp records it on the connection's protocol and drops later bytes, but the body
        reader is never told, so it would wait forever; here the protocol's error also ends it.
        """
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is None:
            return
        content = response.content
        record = protocol.set_exception

        def set_exception(exc: BaseException, *args: Any) -> None:
            record(exc, *args)
            if isinstance(exc, HttpProcessingError) and content.exception() is None and not content.is_eof():
                content.set_exception(exc)

        protocol.set_exception = set_exception  # type: ignore[method-assign, assignment]

    def _feed_buffered(self) -> None:
        response = self._response
        if response is None:
            return
        try:
            while piece := response.content.read_nowait():
                self._bytes_received += len(piece)
                self._events += self._accumulator.feed(piece)
        except (StreamError, aiohttp.ClientError, RuntimeError):
            pass  # a broken body or a bad event ends the drain; the snapshot keeps what verified

    def _close(self) -> None:
        response, self._response = self._response, None
        if response is None:
            return
        if response.content.is_eof() and not response.closed:
            response.release()  # fully read: the connection may serve the next request
        else:
            response.close()  # closes the socket now, so the server sees the client leave


async def consume(
    pieces: AsyncIterable[bytes],
    *,
    mode: str = "auto",
    expert_shape: tuple[int, int] | None = None,
    max_event_bytes: int | None = None,
) -> StreamResult:
    """Feed every piece of an async byte iterator (any transport), then ``finish()``.

    Cancellation propagates. For request-level abort, use ``StreamConsumer(pieces, …)`` and its
    ``abort()``.
    """
    return await StreamConsumer(pieces, mode=mode, expert_shape=expert_shape, max_event_bytes=max_event_bytes).run()
