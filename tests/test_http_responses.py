"""HTTP/1.1 responses as RFC 9112 reads them, on both transports and both twins.

Raw responses from a socket server: interim responses, how long a body is (204 and 304 have none,
Content-Length, chunked, until close), chunk extensions, malformed heads, every class of status,
bodies that are no event stream, and the event-stream lines inside a body. Each case says what the
transport reports and which prefix it keeps. The server holds the connection open after its last
byte, so a reader that waits for bytes which cannot make the response valid fails at the case's
bound instead of hanging the suite. Where aiohttp (``GenerateStream``) reads a case otherwise, the
case says so; docs/client.md lists those differences.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import ModuleType
from typing import Any

import pytest
from client_helpers import CHUNKED_HEAD, EVENTS, RawServer, Transport, chunks, payload, run

import fastaccum
from fastaccum import ServerError, StreamError, StreamFormatError, StreamTruncatedError
from fastaccum.emulator.writer import chunk_encode

BOUND_S = 8.0  # a case that has not ended by then waits for bytes that would not help: a failure
DONE = b"data: [DONE]\n\n"
BODY = b"".join(EVENTS) + DONE  # 10 tokens, the last event terminal
FULL = 10


def chunked(body: bytes = BODY, *, extension: bytes = b"") -> bytes:
    """``body`` in one chunk per event, each size line followed by ``extension``."""
    pieces = [body[i : i + len(EVENTS[0])] for i in range(0, len(body), len(EVENTS[0]))]
    return b"".join(b"%x%s\r\n%s\r\n" % (len(p), extension, p) for p in pieces) + b"0\r\n\r\n"


async def outcome(transport: Transport, parts: list[bytes], *, hold: float = 30.0) -> tuple[Any, int]:
    """(the result, or the StreamError raised) and the tokens the stream kept."""
    async with RawServer(parts, pause=0.01, hold=hold) as url, transport.open(url) as make:
        stream = make(payload("h-1", FULL))
        try:
            result: Any = await asyncio.wait_for(stream.run(), BOUND_S)
        except StreamError as exc:
            result = exc
        except TimeoutError:
            pytest.fail(f"{transport.kind}: still waiting after {BOUND_S} s for bytes that cannot help")
        return result, len(stream.snapshot())


def complete(result: Any, kept: int) -> None:
    assert not isinstance(result, Exception), result
    assert result.finished and len(result) == FULL and kept == FULL


# ---- interim responses ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "interim",
    [
        b"HTTP/1.1 100 Continue\r\n\r\n",
        b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\n",
    ],
    ids=["100", "103-with-fields", "two-in-one-write"],
)
def test_interim_responses_before_the_final_one_are_skipped(transport: Transport, interim: bytes) -> None:
    for parts in ([interim, CHUNKED_HEAD + chunked()], [interim + CHUNKED_HEAD + chunked()]):
        complete(*run(outcome(transport, parts)))


# ---- how long the body is ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields", [b"", b"Content-Length: 5\r\n", b"Transfer-Encoding: chunked\r\n"], ids=["bare", "length", "chunked"]
)
def test_204_ends_at_the_blank_line_whatever_its_fields_say(transport: Transport, fields: bytes) -> None:
    # A 204 has no body: it is no event stream, and waiting for one would wait forever.
    result, kept = run(outcome(transport, [b"HTTP/1.1 204 No Content\r\n" + fields + b"\r\n"]))
    assert isinstance(result, StreamTruncatedError) and kept == 0


def test_what_follows_a_204_is_not_its_body(transport: Transport) -> None:
    # The events after the head belong to no response of ours: none of them may be read.
    result, kept = run(outcome(transport, [b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n" + BODY]))
    assert kept == 0
    if transport.kind == "client":
        assert isinstance(result, StreamTruncatedError)
    else:  # aiohttp reads the events as a second, malformed response
        assert isinstance(result, StreamFormatError)


@pytest.mark.parametrize("fields", [b"", b"Content-Length: 5\r\n"], ids=["bare", "length"])
def test_304_is_a_server_error_without_a_body(transport: Transport, fields: bytes) -> None:
    result, kept = run(outcome(transport, [b"HTTP/1.1 304 Not Modified\r\n" + fields + b"\r\n"]))
    assert isinstance(result, ServerError) and result.status == 304 and kept == 0
    assert "Not Modified" in str(result)


def test_a_content_length_body_ends_at_its_length(transport: Transport) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    complete(*run(outcome(transport, [head + BODY])))


def test_bytes_after_a_content_length_body_are_not_its_body(transport: Transport) -> None:
    # RFC 9112 lets a client drop them; the connection is then not reused.
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY)
    complete(*run(outcome(transport, [head + BODY + b"HTTP/1.1 200 OK\r\n"])))


def test_a_content_length_body_cut_short_keeps_its_prefix(transport: Transport) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (len(BODY) + 100)
    result, kept = run(outcome(transport, [head + b"".join(EVENTS[:4])], hold=0.3))
    assert isinstance(result, StreamTruncatedError) and kept == 4


def test_a_body_without_length_ends_when_the_server_closes(transport: Transport) -> None:
    complete(*run(outcome(transport, [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY], hold=0.3)))


def test_an_http_1_0_response_ends_when_the_server_closes(transport: Transport) -> None:
    complete(*run(outcome(transport, [b"HTTP/1.0 200 OK\r\n\r\n" + BODY], hold=0.3)))


def test_transfer_encoding_and_content_length_together_are_refused(transport: Transport) -> None:
    # RFC 9112 lets a recipient read the chunked body; a message with both is a smuggling
    # attempt to llhttp, and both parsers refuse it.
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
    result, kept = run(outcome(transport, [head + chunked()]))
    assert isinstance(result, StreamFormatError) and kept == 0


def test_the_client_reads_no_transfer_coding_but_chunked(transport: Transport) -> None:
    result, kept = run(outcome(transport, [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n" + chunked()]))
    if transport.kind == "client":  # it asked for identity and does not decompress
        assert isinstance(result, StreamFormatError) and "gzip" in str(result)
    else:
        assert kept == FULL or isinstance(result, StreamError)  # aiohttp's own choice


# ---- chunk extensions -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extension",
    [b";a", b";a=b", b";a=b;c;d=e", b';a="x y"', b';a="with \\"quotes\\""', b" ;a=b", b"; a = b"],
    ids=repr,
)
def test_chunk_extensions_are_read_and_ignored(transport: Transport, extension: bytes) -> None:
    result, kept = run(outcome(transport, [CHUNKED_HEAD + chunked(extension=extension)]))
    if transport.kind == "aiohttp" and extension == b"; a = b":
        # aiohttp refuses the whitespace the RFC allows after ';' (llhttp's strict mode does too).
        assert isinstance(result, StreamFormatError)
        return
    complete(result, kept)


@pytest.mark.parametrize(
    "extension",
    [b";", b";=v", b";a=", b';a="x', b";a b", b";a=b c", b";a@b", b";;a"],
    ids=repr,
)
def test_a_malformed_chunk_extension_fails_at_once_and_keeps_the_prefix(transport: Transport, extension: bytes) -> None:
    # The bad chunk follows three good ones; the server then holds the connection: the bytes in
    # hand prove the body malformed.
    if transport.kind == "aiohttp" and extension in (b";=v", b";a=", b";;a"):
        pytest.skip("aiohttp takes an empty extension name or value, and reads on")
    bad = b"5" + extension + b"\r\nhello\r\n"
    result, kept = run(outcome(transport, [CHUNKED_HEAD + chunks(EVENTS[:3]), bad]))
    assert isinstance(result, StreamFormatError) and kept == 3


# ---- malformed heads fail with the bytes that prove it ----------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 2OO OK\r\n",
        b"HTTP/1.1 200 OK\r\nBad Name: x\r\n",
        b"HTTP/1.1 200 OK\r\nX-A : b\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: a\x00b\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: +4\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nContent-Length: 5\r\n",
        b"ICY 200 OK\r\n",
        b"HTTP/1.1 200 OK\r\nX-A: " + b"a" * 70000,
    ],
    ids=[
        "status-code",
        "field-name",
        "space-before-colon",
        "nul",
        "length-sign",
        "two-lengths",
        "not-http",
        "too-long",
    ],
)
def test_a_malformed_head_fails_at_once(transport: Transport, head: bytes) -> None:
    # No end of head follows: a reader that waited for one would wait until the server closed.
    if transport.kind == "aiohttp" and b"\x00" in head:
        pytest.skip("aiohttp takes a NUL in a field value, and waits for the end of the head")
    result, kept = run(outcome(transport, [head], hold=60))
    assert isinstance(result, StreamFormatError) and kept == 0


def test_a_head_with_bare_lf_line_ends_fails_at_once(transport: Transport) -> None:
    head = b"HTTP/1.1 200 OK\nContent-Type: text/event-stream\nTransfer-Encoding: chunked\n\n"
    if transport.kind == "aiohttp":
        pytest.skip("aiohttp takes a bare LF as a line end (RFC 9112 allows it); Client refuses it")
    result, kept = run(outcome(transport, [head], hold=60))
    assert isinstance(result, StreamFormatError) and "CR" in str(result) and kept == 0


def test_a_status_line_without_a_reason_phrase_is_valid(transport: Transport) -> None:
    complete(*run(outcome(transport, [b"HTTP/1.1 200\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked()])))


# ---- statuses ---------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_a_server_error_not_followed(transport: Transport, status: int) -> None:
    head = b"HTTP/1.1 %d Moved\r\nLocation: http://127.0.0.1:9/elsewhere\r\nContent-Length: 0\r\n\r\n" % status
    result, kept = run(outcome(transport, [head]))
    assert isinstance(result, ServerError) and result.status == status and kept == 0
    assert "not followed" in str(result)


@pytest.mark.parametrize("status", [400, 404, 429, 500, 502, 503])
@pytest.mark.parametrize("framing", ["length", "chunked", "close"])
def test_an_error_status_is_a_server_error_with_its_body(transport: Transport, status: int, framing: str) -> None:
    body = b'{"error": "no room"}'
    if framing == "length":
        response = b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n\r\n%s" % (status, len(body), body)
    elif framing == "chunked":
        response = b"HTTP/1.1 %d X\r\nTransfer-Encoding: chunked\r\n\r\n%s" % (status, chunk_encode(body, [7]))
    else:
        response = b"HTTP/1.1 %d X\r\nConnection: close\r\n\r\n%s" % (status, body)
    result, kept = run(outcome(transport, [response], hold=0.3 if framing == "close" else 30.0))
    assert isinstance(result, ServerError) and result.status == status and "no room" in str(result) and kept == 0


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    ],
    ids=["upgrade", "bare"],
)
def test_switching_protocols_is_a_format_error(transport: Transport, head: bytes) -> None:
    result, kept = run(outcome(transport, [head]))
    assert isinstance(result, StreamFormatError) and "101" in str(result) and kept == 0


# ---- bodies that are no event stream ----------------------------------------------------------

JSON_BODY = b'{"text":"hello","output_ids":[1,2],"meta_info":{"finish_reason":{"type":"length"}}}'
HTML_BODY = b"<!DOCTYPE html>\n<html><body><h1>502 Bad Gateway</h1></body></html>\n"


@pytest.mark.parametrize(
    ("response", "kind"),
    [
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(JSON_BODY), JSON_BODY),
            "JSON object",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunk_encode(JSON_BODY, [9]),
            "JSON object",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(JSON_BODY), JSON_BODY), "JSON object"),
        (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: %d\r\n\r\n%s" % (len(HTML_BODY), HTML_BODY),
            "HTML page",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(HTML_BODY), HTML_BODY), "HTML page"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 21\r\n\r\nInternal Server Error", "plain text"),
    ],
    ids=["json", "json-chunked", "json-no-type", "html", "html-no-type", "text"],
)
def test_a_body_that_is_no_event_stream_says_what_it_is(transport: Transport, response: bytes, kind: str) -> None:
    result, kept = run(outcome(transport, [response]))
    assert isinstance(result, StreamFormatError) and kept == 0
    assert "not an event stream" in str(result) and kind in str(result)


@pytest.mark.parametrize(
    "body",
    [b'{"error": {"message": "boom"}}', b'{"object": "error", "message": "boom", "code": 500}', b'{"detail": "boom"}'],
    ids=["sglang", "vllm", "fastapi"],
)
def test_an_error_answer_given_to_consume_says_it_is_one(twin: ModuleType, body: bytes) -> None:
    """consume() sees only the body: an HTTP 500's JSON is a failed request, not a payload that
    forgot ``"stream": true``."""

    async def pieces() -> AsyncIterator[bytes]:
        yield body

    with pytest.raises(StreamFormatError, match="a JSON error answer .check the response's HTTP status") as info:
        run(fastaccum.consume(pieces()))
    assert '"stream": true' not in str(info.value)


def test_an_event_stream_cut_before_its_first_event_stays_a_truncation(transport: Transport) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    result, kept = run(outcome(transport, [head + b': ping\n\ndata: {"te'], hold=0.3))
    assert isinstance(result, StreamTruncatedError) and kept == 0


# ---- the event stream inside the body ---------------------------------------------------------


@pytest.mark.parametrize(
    "edit",
    [
        lambda b: b.replace(b"\n", b"\r\n"),
        lambda b: b.replace(b"\n", b"\r"),
        lambda b: b"\xef\xbb\xbf" + b,
        lambda b: b": keep-alive\n\n" + b.replace(b"\n\n", b"\n: ping\n\n"),
        lambda b: b.replace(b"data: ", b"event: message\nid: 7\nretry: 100\ndata: "),
    ],
    ids=["crlf", "cr", "bom", "comments", "other-fields"],
)
def test_event_stream_lines_as_the_whatwg_rules_read_them(transport: Transport, edit: Any) -> None:
    complete(*run(outcome(transport, [CHUNKED_HEAD + chunked(edit(BODY))])))


def test_an_event_split_across_one_byte_chunks(transport: Transport) -> None:
    complete(*run(outcome(transport, [CHUNKED_HEAD + chunk_encode(BODY, [1] * len(BODY))])))


def test_junk_after_done_keeps_the_events_before_it(transport: Transport) -> None:
    # Every event and [DONE] arrived; then the chunked body breaks.
    result, kept = run(outcome(transport, [CHUNKED_HEAD + chunked()[:-5] + b"zz\r\n"]))
    assert isinstance(result, StreamFormatError)
    if transport.kind == "aiohttp":
        # aiohttp drops the bytes it buffered before its parse error (docs/client.md): pinned, so
        # that an aiohttp which keeps them shows here.
        assert kept < FULL
    else:
        assert kept == FULL
