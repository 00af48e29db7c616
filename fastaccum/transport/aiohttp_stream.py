"""``GenerateStream``: one streaming ``POST /generate`` on an aiohttp session, fed to the core.

The raw body pieces (``iter_any()``, never a line reader: aiohttp's line limits break on
multi-megabyte events) go into a ``StreamAccumulator``; abort, snapshots and the rest of the
contract come from ``StreamConsumer`` (fastaccum.transport.consumer). For many streams to one server,
``fastaccum.Client`` (fastaccum.transport.client) is the faster transport: it owns its connections.

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
from collections.abc import Mapping
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from fastaccum._core.dialects import request_for, route_hint
from fastaccum._core.resume import routed_start_of
from fastaccum._impl import StreamAccumulator
from fastaccum.errors import (
    ServerError,
    StreamConnectionError,
    StreamError,
    StreamFormatError,
    StreamTimeoutError,
)
from fastaccum.result import StreamResult
from fastaccum.transport.consumer import AccumulatorLike, StreamConsumer
from fastaccum.transport.http1 import connect_error, keep_alive, status_error
from fastaccum.transport.retry import DEFAULT_RETRY_MAX_DELAY_S

__all__ = ("GenerateStream", "STREAM_TIMEOUT")

# SGLang sends no heartbeats: queueing or a long prefill can mean minutes of silence
# (docs/wire-format.md, "SSE framing").
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None)


class GenerateStream(StreamConsumer):
    """One streaming ``POST /generate`` on an aiohttp session.

    ``payload`` is sent as JSON with ``"stream": true`` (and vLLM's usage chunk asked for) to
    ``url``, the server's generate endpoint of ``dialect`` (docs/dialects.md). ``read_timeout`` (seconds without a byte,
    default None: SGLang has no heartbeats) raises ``StreamTimeoutError``. ``headers`` are added to
    the request. The connection is closed (not returned to the pool) whenever the stream ends
    early: abort, cancellation or error, so the server observes the disconnect and stops decoding.
    ``retries``, ``retry_max_delay_s``: as ``fastaccum.Client``'s (docs/client.md, "Retries").
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
        indexer_shape: tuple[int, int] | None = None,
        dialect: str = "sglang",
        routed_dtype: str | None = None,
        require_routed_experts: bool = False,
        retries: int = 0,
        retry_max_delay_s: float = DEFAULT_RETRY_MAX_DELAY_S,
    ) -> None:
        request = request_for(dialect, payload, None)
        super().__init__(
            None,
            mode=mode,
            expert_shape=expert_shape,
            max_event_bytes=max_event_bytes,
            indexer_shape=indexer_shape,
            routed_start=routed_start_of(payload, dialect),
            dialect=dialect,
            routed_dtype=routed_dtype,
            require_routed_experts=require_routed_experts,
            retries=retries,
            retry_max_delay_s=retry_max_delay_s,
            body=not request.streams,
        )
        self._session = session
        self._dialect = dialect
        self._url = url
        self._payload = request.body
        self._headers = dict(headers) if headers else None
        self._read_timeout = read_timeout
        self._response: aiohttp.ClientResponse | None = None
        self.status: int | None = None

    @staticmethod
    def _new_accumulator(**options: Any) -> AccumulatorLike:
        return StreamAccumulator(**options)

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
            # Redirects are not followed: a POST of a generation belongs to the server it was sent to.
            response = await self._session.post(
                self._url, json=self._payload, headers=self._headers, timeout=timeout, allow_redirects=False
            )
        except aiohttp.ClientResponseError as exc:
            if isinstance(exc.__cause__, HttpProcessingError):
                # aiohttp reports a response it could not parse as status 400: the server sent none.
                raise StreamFormatError(f"malformed response from {self._url}: {exc.message}") from exc
            # a session created with raise_for_status=True
            raise ServerError(f"HTTP {exc.status} from {self._url}: {exc.message}", status=exc.status) from exc
        except aiohttp.ClientConnectorError as exc:
            raise connect_error(self._url, exc.host, exc.os_error) from exc
        except aiohttp.ClientError as exc:
            if isinstance(exc, asyncio.TimeoutError):  # ServerTimeoutError before the headers
                raise StreamTimeoutError(f"no response from {self._url} within {self._read_timeout} s") from exc
            raise StreamConnectionError(f"POST {self._url} failed: {exc!r}") from exc
        except TimeoutError as exc:  # the session's total/connect timeout
            raise StreamTimeoutError(f"POST {self._url} timed out: {exc!r}") from exc
        self._response = response
        if response.connection is not None and response.connection.transport is not None:
            keep_alive(response.connection.transport.get_extra_info("socket"))  # through a pause
        self.status = response.status
        self._content_type = response.headers.get("Content-Type")
        if response.status == 101:
            raise StreamFormatError(f"{self._url} switched protocols (HTTP 101); a stream is HTTP/1.1")
        if not 200 <= response.status < 300:  # every other final status is the server's answer
            body = await response.text(errors="replace")
            location = response.headers.get("Location")
            error = status_error(self._url, response.status, response.reason or "", body, location)
            hint = route_hint(self._dialect, response.status)
            error.args = (error.args[0] + hint, *error.args[1:])
            raise error
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
        return self._finish()

    @staticmethod
    def _watch_parser(response: aiohttp.ClientResponse) -> None:
        """Make a parse error in the body (a malformed chunk size) reach the body reader.

        aiohttp records it on the connection's protocol and drops later bytes, but the body
        reader is never told, so it would wait forever; here the protocol's error also ends it.

        This wraps ``set_exception`` of aiohttp's connection protocol (``ResponseHandler``), an
        aiohttp internal (present from 3.9 through 3.14, which the tests run). Where a future
        aiohttp lacks it, nothing is wrapped: a malformed body then ends at ``read_timeout`` (or
        when the server closes) instead of at once, and ``fastaccum.Client`` is unaffected.
        """
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is None or not callable(getattr(protocol, "set_exception", None)):
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

    def _restart(self) -> None:
        super()._restart()
        self.status = None

    def _close(self) -> None:
        response, self._response = self._response, None
        if response is None:
            return
        if response.content.is_eof() and not response.closed:
            response.release()  # fully read: the connection may serve the next request
        else:
            response.close()  # closes the socket now, so the server sees the client leave
