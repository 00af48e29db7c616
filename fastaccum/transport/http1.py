"""HTTP/1.1 for ``fastaccum.Client``: the connection, the response head, and how long its body is.

The head is parsed by httptools (llhttp) as its bytes arrive, so a malformed head fails with the
byte that proves it, never at a timeout. The body of a successful response goes to the core whole
(``feed_chunked()`` undoes the chunked coding there); an error response's body is read by the same
httptools parser, to be quoted in the error. Nothing here interprets the event stream.
"""

from __future__ import annotations

import asyncio
import enum
import errno
import os
import socket
from collections.abc import Callable, Mapping
from typing import Any

import httptools
import orjson

from fastaccum.errors import ServerError, StreamConnectionError, StreamFormatError
from fastaccum.transport.consumer import ERROR_BODY_CHARS

__all__ = (
    "Body",
    "BodyFraming",
    "Connection",
    "ResponseHead",
    "connect_error",
    "framing_of",
    "keep_alive",
    "header_lines",
    "read_head",
    "request_bytes",
    "status_error",
)

_HEAD_LIMIT_BYTES = 65536
_ERROR_BODY_LIMIT_BYTES = 65536
# Drain at abort: what the kernel holds is bounded by the receive buffer; the cap only stops a
# server that writes faster than the loop reads from holding abort() up.
_DRAIN_MAX_READS = 256


# TCP keepalive on every stream's connection: a stream may be silent for as long as a server is
# paused for a weight update (minutes), and a NAT, proxy or load balancer forgets a connection it
# saw nothing on (AWS NLB after 350 s, GCP after 10 minutes): probes after 60 s of silence, then
# every 15 s, keep it known; 4 unanswered probes (another minute) say the peer is gone.
KEEPALIVE_IDLE_S = 60
KEEPALIVE_INTERVAL_S = 15
KEEPALIVE_PROBES = 4


def keep_alive(sock: socket.socket | None) -> None:
    """Turn TCP keepalive on for ``sock`` with the timings above, where the system has them."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = getattr(socket, "TCP_KEEPIDLE", getattr(socket, "TCP_KEEPALIVE", None))  # macOS names it so
    for option, value in (
        (idle, KEEPALIVE_IDLE_S),
        (getattr(socket, "TCP_KEEPINTVL", None), KEEPALIVE_INTERVAL_S),
        (getattr(socket, "TCP_KEEPCNT", None), KEEPALIVE_PROBES),
    ):
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


# ---- connection -------------------------------------------------------------------------------


class Connection(asyncio.BufferedProtocol):
    """One HTTP/1.1 connection; reads go to the attached stream's current receiver.

    A buffered protocol: the loop reads into ``buffer``, the receive buffer every connection of
    one client shares (``recv_into``); ``on_close`` tells the owner the connection is gone. It
    knows nothing else of its owner.
    A plain protocol gets a fresh 256 KiB ``bytes`` per read, which glibc serves with an mmap,
    an mremap and a munmap around every recv: three system calls per read, more than the read.
    Receivers get a view of the buffer that is valid only during the call (the core copies what
    it keeps).
    """

    def __init__(self, buffer: memoryview, on_close: Callable[[Connection], None]) -> None:
        self.buffer = buffer
        self.on_close = on_close
        self.transport: asyncio.Transport | None = None
        self.receiver: Callable[[memoryview], None] | None = None
        self.lost: Callable[[BaseException | None], None] | None = None
        self.requests = 0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        keep_alive(transport.get_extra_info("socket"))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.buffer

    def buffer_updated(self, nbytes: int) -> None:
        receiver = self.receiver
        if receiver is not None:
            receiver(self.buffer[:nbytes])
        else:  # bytes on an idle connection: nothing to answer; it cannot serve another request
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.on_close(self)
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

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        self.closed = True
        self.receiver = self.lost = None
        if self.transport is not None:
            self.transport.abort()  # now, not after a flush: the server must see the client leave

    def drain(self, receiving: Callable[[Callable[[memoryview], None] | None], bool]) -> None:
        """Read what the kernel already holds, without blocking and even while reading is paused,
        handing each read to the current receiver while ``receiving(receiver)`` says it wants
        more: an abort keeps every byte that arrived before it."""
        transport = self.transport
        if self.closed or transport is None:
            return
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd < 0:
            return
        raw = socket.socket(fileno=fd)
        buffer = self.buffer
        try:
            for _ in range(_DRAIN_MAX_READS):
                receiver = self.receiver
                if receiver is None or not receiving(receiver):
                    break
                try:
                    n = raw.recv_into(buffer, 0, socket.MSG_DONTWAIT)
                except OSError:  # nothing more now (EAGAIN), or a reset: what came before is fed
                    break
                if not n:
                    break
                receiver(buffer[:n])
        finally:
            raw.detach()  # the fd stays the transport's


# ---- the response head ------------------------------------------------------------------------


class ResponseHead:
    """One response's status line and fields, fed as they arrive (``feed()``).

    Every byte goes through httptools at once, so a malformed head (a bare LF, a bad status line
    or field, two Content-Lengths) raises ``StreamFormatError`` with the read that holds it. The
    head ends at the first CRLF CRLF: httptools takes no other line end, so that is where it
    finished too. An error response's body is read by the same parser (``feed_error_body()``).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.headers: dict[str, str] = {}  # lower-cased names; repeated fields joined with ", "
        self.status = 0
        self.reason = ""
        self.keep_alive = False
        self.complete = False
        self.body = bytearray()  # an error response's body, up to _ERROR_BODY_LIMIT_BYTES
        self.body_complete = False
        self._seen = bytearray()  # the head's bytes so far: where it ends, and its size cap
        self._parser = httptools.HttpResponseParser(self)

    @property
    def interim(self) -> bool:
        """A 1xx other than 101 (100 Continue, 103 Early Hints): the final response follows."""
        return 100 <= self.status < 200 and self.status != 101

    def feed(self, data: memoryview) -> int:
        """Take the head's bytes from ``data``; return how many were the head's once it is
        complete (the body starts there), or -1 while it is not."""
        seen = self._seen
        start = len(seen)
        seen += data
        # The end may straddle two reads.
        end = seen.find(b"\r\n\r\n", max(0, start - 3))
        used = end + 4 - start if end >= 0 else len(data)
        if end < 0 and len(seen) > _HEAD_LIMIT_BYTES:
            raise StreamFormatError(f"response head from {self.url} exceeds {_HEAD_LIMIT_BYTES} bytes")
        try:
            self._parser.feed_data(bytes(data[:used]))
        except (httptools.HttpParserUpgrade, httptools.HttpParserError) as exc:  # unrelated classes
            # llhttp stops at a 101 (with an Upgrade field or without): another protocol follows.
            if isinstance(exc, httptools.HttpParserUpgrade) or self._parser.get_status_code() == 101:
                raise StreamFormatError(f"{self.url} switched protocols (HTTP 101); Client speaks HTTP/1.1") from None
            raise StreamFormatError(f"malformed response head from {self.url}: {exc}") from None
        if end < 0:
            return -1
        if not self.complete:  # httptools ends every head it accepts at its first CRLF CRLF
            raise StreamFormatError(f"malformed response head from {self.url}: no end of head at CRLF CRLF")
        self.status = self._parser.get_status_code()
        self.keep_alive = bool(self._parser.should_keep_alive())
        return used

    def status_error(self, hint: str = "") -> ServerError:
        """The error for this response's status, quoting its body (what arrived of it), then
        ``hint``."""
        error = status_error(
            self.url,
            self.status,
            self.reason,
            self.body.decode("utf-8", errors="replace"),
            self.headers.get("location"),
        )
        error.args = (error.args[0] + hint, *error.args[1:])
        return error

    def feed_error_body(self, data: memoryview) -> None:
        """An error response's body, read for the message; a broken one ends it."""
        try:
            self._parser.feed_data(bytes(data))
        except (httptools.HttpParserUpgrade, httptools.HttpParserError):
            self.body_complete = True  # quote what arrived

    # httptools callbacks
    def on_status(self, reason: bytes) -> None:
        self.reason += reason.decode("latin-1")

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


def read_head(head: ResponseHead, data: memoryview) -> tuple[ResponseHead, memoryview, int]:
    """Feed a read to the head; past 1xx interim heads (100 Continue, 103 Early Hints), which the
    final one follows. Returns the head, the read from its start, and ``feed()``'s answer."""
    used = head.feed(data)
    while used >= 0 and head.interim:
        data = data[used:]
        head = ResponseHead(head.url)
        used = head.feed(data) if data else -1
    return head, data, used


def connect_error(url: str, host: str, exc: OSError) -> StreamConnectionError:
    """The error of a connection that could not be made, said once and plainly (the URL names
    the host and port; asyncio's own text repeats them)."""
    if isinstance(exc, socket.gaierror):
        why = f"cannot resolve {host!r} ({exc.strerror or exc})"
    elif exc.errno == errno.ECONNREFUSED or isinstance(exc, ConnectionRefusedError):
        why = "connection refused (is the server up and listening on that port?)"
    elif exc.errno is not None:
        why = f"cannot connect ({os.strerror(exc.errno)})"
    else:  # several addresses, each failed: asyncio lists them
        why = f"cannot connect ({exc})"
    return StreamConnectionError(f"POST {url} failed: {why}")


def status_error(url: str, status: int, reason: str, body: str, location: str | None) -> ServerError:
    """A final status outside 2xx as the error both transports raise: the body quoted, else the
    redirect not followed, else the reason phrase."""
    if not body:
        body = f"redirect to {location!r} not followed" if location and 300 <= status < 400 else reason.strip()
    return ServerError(f"HTTP {status} from {url}: {body[:ERROR_BODY_CHARS]}", status=status, server_message=body)


# ---- the body's length ------------------------------------------------------------------------


class Body(enum.Enum):
    """How a successful response's body is delimited (RFC 9112, "Message Body Length")."""

    NONE = "none"  # 204 and 304 end at the blank line, whatever their fields say
    CHUNKED = "chunked"
    LENGTH = "length"  # Content-Length bytes
    UNTIL_CLOSE = "until close"


class BodyFraming:
    """Where the body of a final, non-error response ends (``framing_of()`` reads it from the
    head); the chunked coding itself is undone by the core."""

    def __init__(self, kind: Body, length: int = 0) -> None:
        self.kind = kind
        self.remaining = length if kind is Body.LENGTH else 0  # Content-Length bytes still due

    def cut(self, data: memoryview) -> tuple[memoryview, int]:
        """The part of a read that is body, and how many bytes follow a Content-Length body."""
        if self.kind is not Body.LENGTH:
            return data, 0
        if len(data) <= self.remaining:
            self.remaining -= len(data)
            return data, 0
        extra = len(data) - self.remaining
        data, self.remaining = data[: self.remaining], 0
        return data, extra

    def ended(self, chunked_ended: bool) -> bool:
        """The body is complete (``chunked_ended``: the core read the last chunk)."""
        if self.kind is Body.CHUNKED:
            return chunked_ended
        return self.kind is Body.NONE or (self.kind is Body.LENGTH and self.remaining == 0)


def framing_of(head: ResponseHead) -> BodyFraming:
    """How the body of a final, non-error response is delimited. httptools has already refused
    malformed or conflicting length fields; what it accepts but Client cannot read raises."""
    if head.status in (204, 304):
        return BodyFraming(Body.NONE)
    headers = head.headers
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise StreamFormatError(
            f"{head.url} sent Content-Encoding: {encoding}; Client asks for identity and does not decompress"
        )
    transfer = headers.get("transfer-encoding")
    if transfer is not None:
        if transfer.strip().lower() != "chunked":
            raise StreamFormatError(f"{head.url} sent Transfer-Encoding: {transfer}; only chunked is read")
        return BodyFraming(Body.CHUNKED)
    length = headers.get("content-length")
    if length is not None:
        return BodyFraming(Body.LENGTH, int(length))
    return BodyFraming(Body.UNTIL_CLOSE)


# ---- the request ------------------------------------------------------------------------------


def request_bytes(
    target: str, host_headers: bytes, body: Mapping[str, Any], headers: Mapping[str, str] | None
) -> bytes:
    """One POST of ``body`` as JSON, asking for an event stream without compression."""
    data = orjson.dumps(body)
    extra = header_lines(headers) if headers else b""
    return (
        b"POST %s HTTP/1.1\r\n%s%sContent-Type: application/json\r\nAccept: text/event-stream\r\n"
        b"Accept-Encoding: identity\r\nContent-Length: %d\r\n\r\n%s"
        % (target.encode("ascii"), host_headers, extra, len(data), data)
    )


def header_lines(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        if any(c in name for c in ":\r\n ") or any(c in str(value) for c in "\r\n"):
            raise ValueError(f"invalid HTTP header {name!r}: {value!r}")
        lines.append(f"{name}: {value}\r\n".encode("latin-1"))
    return b"".join(lines)
