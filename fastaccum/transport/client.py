"""``fastaccum.Client``: an HTTP/1.1 client for SGLang servers whose socket reads go to the core whole.

``Client`` owns its connections (``asyncio.BufferedProtocol``; the stock loop and uvloop): the
response head is parsed by httptools as it arrives, and every body read after it is one call into
the accumulator (``feed_chunked()`` undoes the chunked encoding in the core), with no Python call
per HTTP chunk. Streams keep ``GenerateStream``'s contract (both are ``StreamConsumer``s):
``run()``, ``abort()``, ``snapshot()``, ``kept()``, progress counters, ``CancelledError`` only for
the caller's own cancel. A completed stream returns its connection to the pool; an aborted or
failed one closes it, so the server sees the disconnect and stops decoding.

The parts live beside it: fastaccum.transport.request (one request and its outcome),
fastaccum.transport.http1 (the connection, the response head, the body's length),
fastaccum.transport.pacing (read coalescing) and fastaccum.transport.timing (what ``result.timing``
reports). This module is the pool: connections, request ids, abort senders, windows.
"""

from __future__ import annotations

import asyncio
import itertools
import urllib.parse
import uuid
from collections.abc import Mapping
from types import EllipsisType
from typing import Any

from fastaccum._core.dialects import answers_several, check_dialect
from fastaccum.errors import StreamConnectionError
from fastaccum.result import StreamResult
from fastaccum.transport.abort_sender import AbortSender, VllmAbortSender
from fastaccum.transport.http1 import Connection, connect_error, header_lines
from fastaccum.transport.pacing import DEFAULT_COALESCE_MS, Resumer
from fastaccum.transport.request import ClientStream, check_drain
from fastaccum.transport.retry import DEFAULT_RETRY_MAX_DELAY_S, check_retries

__all__ = ("Client", "ClientStream", "DEFAULT_ABORT_DRAIN_S", "DEFAULT_COALESCE_MS", "DEFAULT_RETRY_MAX_DELAY_S")

# Read size: asyncio's own default; every connection of a client reads into one such buffer.
_READ_BUFFER_BYTES = 262144
# How long abort() reads on for the terminal abort event: SGLang answers an abort at its next
# decode step (milliseconds); a queued or retracted request at once.
DEFAULT_ABORT_DRAIN_S = 2.0


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
        check_drain(abort_drain_s)
        check_dialect(dialect)
        check_retries(retries, retry_max_delay_s)
        self._retries = retries
        self._retry_max_delay_s = retry_max_delay_s
        self._dialect = dialect
        self._several_ok = False  # generate() reads a batch's several answers
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
        closed = StreamConnectionError("the Client was closed")
        for conn in list(self._connections):
            lost = conn.lost
            conn.close()
            if lost is not None:  # its stream ends now, a drain it waited on with it
                lost(closed)
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
        before ``run()``. A payload with ``"stream": false`` is sent so, its answer read whole
        into the same result (docs/client.md, "Non-streaming requests"). ``coalesce_ms`` None
        takes the client's window, ``abort_drain_s`` left out and ``dialect`` None the client's.
        ``routed_dtype="int32"`` widens vLLM's narrower routed experts (uint8, uint16) to int32.
        ``require_routed_experts``: a stream that finishes (stop, length) without routed experts
        raises ``StreamFormatError`` instead of giving None (the server was not started to send
        them). ``retries`` and ``retry_max_delay_s`` None take the client's."""
        if abort_drain_s is ...:
            abort_drain_s = self._abort_drain_s
        else:
            check_drain(abort_drain_s)
        if dialect is None:
            dialect = self._dialect
        else:
            check_dialect(dialect)
        retries = self._retries if retries is None else retries
        retry_max_delay_s = self._retry_max_delay_s if retry_max_delay_s is None else retry_max_delay_s
        check_retries(retries, retry_max_delay_s)
        if payload.get("stream") is False and answers_several(dialect, payload) and not self._several_ok:
            raise ValueError("a non-streaming batch (several answers in one body): use Client.generate()")
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

    async def generate(self, payload: Mapping[str, Any], **options: Any) -> StreamResult | list[StreamResult]:
        """One non-streaming request: ``payload`` with ``"stream": false``, its answer read by the
        core into what a stream of it gives; a batch (SGLang's lists, ``n > 1``) gives one result
        per request, in order. ``options``: ``stream()``'s. To abort it, use ``stream()``."""
        self._several_ok = True  # this call only: nothing awaits before the stream is made
        try:
            stream = self.stream({**payload, "stream": False}, **options)
        finally:
            self._several_ok = False
        return await stream.run()

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
