"""The shared consumer: feeds byte pieces of one /generate stream into a StreamAccumulator, with
request-level abort, for any transport.

``StreamConsumer`` is the base of both HTTP transports (``fastaccum.Client``'s streams in
fastaccum.transport.client, ``GenerateStream`` on aiohttp in fastaccum.transport.aiohttp_stream) and, given an async
iterator of byte pieces, a transport of its own (``consume()``: httpx's ``aiter_raw()``, a file).
It owns the contract they share: ``run()``, ``abort()``, ``snapshot()``, ``kept()``, progress
counters, and ``CancelledError`` only for the caller's own cancel. It does I/O only: every byte
is interpreted by the accumulator.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import AsyncIterable
from typing import TYPE_CHECKING, Any

from fastaccum._impl import StreamAccumulator
from fastaccum.errors import StreamError, StreamFormatError, StreamTruncatedError
from fastaccum.result import StreamResult
from fastaccum.transport.retry import LOG, Retry

if TYPE_CHECKING:
    from fastaccum._py import StreamAccumulator as AccumulatorLike
else:
    AccumulatorLike = Any

__all__ = ("StreamConsumer", "consume", "not_an_event_stream", "ERROR_BODY_CHARS", "AccumulatorLike")

# An HTTP error body is quoted in the exception message up to this many characters.
ERROR_BODY_CHARS = 2000
# A body that never held an event is described by its first bytes: this many are kept.
FIRST_BYTES = 120
_SSE_FIELDS = (b"data", b"event", b"id", b"retry")
# The first key of an error body: SGLang's {"error": ...}, FastAPI's {"detail": ...}, vLLM's
# {"object": "error", ...}.
_ERROR_ANSWER = re.compile(rb'\{\s*"(error|detail)"\s*:|\{\s*"object"\s*:\s*"error"')


def not_an_event_stream(first_bytes: bytes, content_type: str | None = None) -> StreamFormatError | None:
    """Why a body that ended before its first event is no event stream at all (a JSON answer, an
    HTML error page, plain text), or None when it reads as the start of one (then it was cut).

    ``content_type``: the response's, when there was one; it names the kind, else the first bytes
    do. SGLang answers a request without ``"stream": true`` with one JSON object, and proxies and
    gateways answer with HTML or plain text."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media == "text/event-stream":
        return None  # the server says it streams: the body was cut before its first event
    text = first_bytes.removeprefix(b"\xef\xbb\xbf").lstrip(b" \t\r\n")
    if not text:
        return None
    field = text.split(b"\n", 1)[0].split(b"\r", 1)[0].split(b":", 1)[0]
    if text.startswith(b":") or field in _SSE_FIELDS:
        return None  # SSE lines (a comment, a field): an event stream cut short
    if media == "application/json" or media.endswith("+json") or (not media and text[:1] in (b"{", b"[")):
        if _ERROR_ANSWER.match(text):  # SGLang's, vLLM's or FastAPI's error body: a failed request
            kind = "a JSON error answer (check the response's HTTP status before reading its body)"
        elif text[:1] == b"{":
            kind = 'a JSON object (is "stream": true in the payload?)'
        else:
            kind = "JSON"
    elif media in ("text/html", "application/xhtml+xml") or (not media and text[:1] == b"<"):
        kind = "an HTML page"
    else:
        kind = "plain text"
    if media:
        kind += f", Content-Type {media}"
    return StreamFormatError(f"the response is not an event stream: {kind}; it starts {text[:80]!r}", event_index=0)


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
        indexer_shape: tuple[int, int] | None = None,
        routed_start: int = 0,
        dialect: str = "sglang",
        routed_dtype: str | None = None,
        require_routed_experts: bool = False,
        retries: int = 0,
        retry_max_delay_s: float = 0.0,
        body: bool = False,
    ) -> None:
        self._pieces = pieces
        self._answer = body  # a non-streaming answer: read whole by fastaccum.transport.body
        self._core_options: dict[str, Any] = {
            "mode": mode,
            "expert_shape": expert_shape,
            "max_event_bytes": max_event_bytes,
            "indexer_shape": indexer_shape,
            "routed_start": routed_start,
            "dialect": dialect,
            "routed_dtype": routed_dtype,
            "require_routed_experts": require_routed_experts,
        }
        self._accumulator = self._new_reader()
        self._retry = Retry(retries, retry_max_delay_s)
        self._waiting_to_retry = False  # an attempt failed before its first event; the next is due
        self._url = ""  # what the transport requests, for messages
        self._task: asyncio.Task[Any] | None = None
        self._started = False
        self._abort_requested = False
        self._abort_cancel_pending = False  # abort() cancelled the task; run() must uncancel once
        self._events = 0
        self._bytes_received = 0
        self._first_bytes = b""  # of the body, kept until an event completes
        self._first_bytes_chunked = False  # ... still in the chunked coding (fastaccum.Client)
        self._content_type: str | None = None  # the response's, where a transport knows it

    @staticmethod
    def _new_accumulator(**options: Any) -> AccumulatorLike:
        # Each transport module names the twin it feeds (tests point that name at either twin).
        return StreamAccumulator(**options)

    def _new_reader(self) -> AccumulatorLike:
        """What reads the response: the twin's accumulator, or for a non-streaming answer a
        ``BodyReader`` (which hands the answer to that accumulator as one event)."""
        if not self._answer:
            return self._new_accumulator(**self._core_options)
        from fastaccum.transport.body import BodyReader  # loaded with the first non-streaming request

        options = dict(self._core_options)
        new = self._new_accumulator
        return BodyReader(options.pop("mode"), accumulator=lambda **o: new(**o), **options)  # type: ignore[return-value]

    # ---- progress (readable while running) -----------------------------------------------------
    @property
    def events(self) -> int:
        """JSON events read so far: what ``result.events`` counts (``[DONE]`` is not one)."""
        return int(self._accumulator.events)

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

    @property
    def retries(self) -> int:
        """Attempts that failed before their first event and were made again (transports that
        retry: ``retries=`` of ``Client`` and ``GenerateStream``)."""
        return self._retry.done

    def snapshot(self) -> StreamResult:
        """The observed prefix (also after an error), ``aborted`` set if ``abort()`` was called."""
        result = self._accumulator.snapshot()
        return self._stamped(dataclasses.replace(result, aborted=True) if self._abort_requested else result)

    # ---- control -------------------------------------------------------------------------------
    def abort(self) -> None:
        """Request-level abort: stop reading this stream (and close its connection) at once.

        Idempotent. If the terminal event has already been fed, ``run()`` still stops reading
        but returns the complete result with ``aborted=False``.
        """
        if self._abort_requested:
            return
        self._abort_requested = True
        self._cut()

    def _cut(self) -> None:
        """Stop reading now: run() returns what was kept (its connection is closed)."""
        task = self._task
        if task is not None and not task.done() and not self._abort_cancel_pending:
            self._abort_cancel_pending = True
            task.cancel()

    async def run(self) -> StreamResult:
        if self._started:
            raise RuntimeError("run() can be awaited only once per stream")
        self._started = True
        if self._abort_requested:  # aborted before it started: nothing was sent or read
            return dataclasses.replace(self.snapshot(), request_sent=False)
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("run() must be awaited inside an asyncio task")
        self._task = task
        try:
            return await self._attempts()
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

    async def _attempts(self) -> StreamResult:
        """``_read()``, made again while it fails before its first event and retries are left
        (fastaccum.transport.retry says which failures)."""
        while True:
            try:
                return await self._read()
            except StreamError as exc:
                delay = None if self._abort_requested else self._retry.delay(exc, self._events)
                if delay is None:
                    self._retry.gave_up(exc)
                    raise
                LOG.info(
                    "fastaccum: %s failed before its first event (%s); retry %d of %d in %.2f s",
                    self._url or "the request",
                    exc,
                    self._retry.done,
                    self._retry.retries,
                    delay,
                )
            self._close()  # the failed attempt's connection
            self._restart()
            self._waiting_to_retry = True  # stays so when abort() or a cancel ends the wait
            await asyncio.sleep(delay)
            self._waiting_to_retry = False

    def _restart(self) -> None:
        """Forget a failed attempt (it held no event): the next one starts afresh."""
        self._accumulator = self._new_reader()
        self._events = 0
        self._bytes_received = 0
        self._first_bytes = b""
        self._first_bytes_chunked = False
        self._content_type = None

    def kept(self) -> StreamResult:
        """What a cut keeps: the complete result if the terminal event already arrived, else the
        observed prefix (``aborted=True``). Never raises. ``aborted`` means what ``run()``'s does:
        True for the prefix and for the terminal abort event ``abort()`` asked for, False for a
        terminal event that won the race with it."""
        if self._accumulator.finished:
            try:
                return self._stamped(self._as_asked(self._accumulator.finish()))
            except StreamError:
                pass  # bytes after the terminal event: keep what was verified, as for any cut
        result = dataclasses.replace(self._accumulator.snapshot(), aborted=True)
        if self._waiting_to_retry:  # every attempt so far failed: no server holds the request
            result = dataclasses.replace(result, request_sent=False)
        return self._stamped(result)

    def _stamped(self, result: StreamResult) -> StreamResult:
        """A result as this transport hands it out (``Client`` adds its timing)."""
        return result

    def _finish_or_kept(self) -> StreamResult:
        """``_finish()`` at the end of the body; after ``abort()`` (a transport that read on to the
        terminal abort event), that event, the normal end if it won the race (``aborted=False``),
        or what was kept if the body ended without one."""
        if not self._abort_requested:
            return self._finish()
        try:
            result = self._as_asked(self._finish())
        except StreamError:
            return self._aborted_result()
        if not result.aborted:
            self._abort_requested = False
        return result

    def _as_asked(self, result: StreamResult) -> StreamResult:
        """A finished result, ``aborted`` when it ends with the abort that ``abort()`` asked for
        (a drain brought it); any other terminal event won the race with ``abort()``."""
        if self._abort_requested and (result.finish_reason or {}).get("type") == "abort":
            return dataclasses.replace(result, aborted=True)
        return result

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
        return self._finish()

    async def _feed_all(self, pieces: AsyncIterable[bytes]) -> None:
        feed = self._accumulator.feed
        async for piece in pieces:
            self._bytes_received += len(piece)
            self._keep_first_bytes(piece)
            self._events += feed(piece)

    def _finish(self) -> StreamResult:
        """``finish()``, except that a body which never held an event and does not read as an event
        stream is a ``StreamFormatError`` naming what it is, not a truncation. A non-streaming
        batch's answer gives its list (``Client.generate``)."""
        try:
            if self._answer:
                return self._accumulator.results()  # type: ignore[attr-defined, no-any-return]
            return self._accumulator.finish()
        except StreamTruncatedError:
            if not self._events and not self._answer:  # a body reader names what it read itself
                first = self._first_bytes
                if self._first_bytes_chunked:  # past the first chunk's size line
                    first = first.partition(b"\r\n")[2]
                error = not_an_event_stream(first, self._content_type)
                if error is not None:
                    raise error from None
            raise

    def _keep_first_bytes(self, piece: bytes | memoryview) -> None:
        if not self._events and len(self._first_bytes) < FIRST_BYTES:
            self._first_bytes += bytes(piece[: FIRST_BYTES - len(self._first_bytes)])

    def _feed_buffered(self) -> None:
        """Feed what the transport has already received but not yet handed over (no await)."""

    def _close(self) -> None:
        """Release transport resources once run() ends; the iterator's owner closes its transport."""


async def consume(
    pieces: AsyncIterable[bytes],
    *,
    mode: str = "auto",
    expert_shape: tuple[int, int] | None = None,
    max_event_bytes: int | None = None,
    indexer_shape: tuple[int, int] | None = None,
    routed_start: int = 0,
    dialect: str = "sglang",
    routed_dtype: str | None = None,
    require_routed_experts: bool = False,
) -> StreamResult:
    """Feed every piece of an async byte iterator (any transport), then ``finish()``.

    Cancellation propagates. For request-level abort, use ``StreamConsumer(pieces, …)`` and its
    ``abort()``.
    """
    return await StreamConsumer(
        pieces,
        mode=mode,
        expert_shape=expert_shape,
        max_event_bytes=max_event_bytes,
        indexer_shape=indexer_shape,
        routed_start=routed_start,
        dialect=dialect,
        routed_dtype=routed_dtype,
        require_routed_experts=require_routed_experts,
    ).run()
