"""feed_chunked(): HTTP/1.1 chunked bodies undone in the core, split anywhere, errors typed and kept."""

from __future__ import annotations

from types import ModuleType

import pytest

from fastaccum import StreamFormatError, StreamTruncatedError
from fastaccum.emulator.writer import (
    WireOptions,
    chunk_encode,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)

GEN = synthetic_generation("chunked", 40)
BODY = stream_bytes(stream_events(GEN, WireOptions(incremental=True)))


def feed_all(impl: ModuleType, data: bytes, sizes: list[int]) -> tuple[object, int]:
    acc = impl.StreamAccumulator()
    events = sum(acc.feed_chunked(piece) for piece in split_pieces(data, sizes))
    return acc, events


@pytest.mark.parametrize("sizes", [[1], [2], [3], [7], [64], [1 << 20]], ids=repr)
@pytest.mark.parametrize(
    ("chunks", "extension", "trailers"),
    [([], b"", b""), ([1, 5, 9], b";a=b", b"X-A: 1\r\nX-B: 2\r\n"), ([300] * 40, b' ;q="x y"', b"")],
    ids=["one-chunk", "small-chunks-ext-trailers", "many-chunks"],
)
def test_any_cut_of_a_chunked_body_gives_the_stream(
    impl: ModuleType, sizes: list[int], chunks: list[int], extension: bytes, trailers: bytes
) -> None:
    data = chunk_encode(BODY, chunks, extension=extension, trailers=trailers)
    acc, events = feed_all(impl, data, sizes)
    assert acc.chunked_ended
    result = acc.finish()
    assert len(result) == 40 and result.events == events - 1  # [DONE] is counted by feed, not events
    assert result.token_ids.tolist() == GEN.token_ids


def test_upper_and_lower_case_hex_and_leading_zeros(impl: ModuleType) -> None:
    first = BODY[: BODY.index(b"\n\n") + 2]
    event = b":" + b"p" * (0x2AB - len(first) - 2) + b"\n" + first  # a comment pads it to 0x2ab bytes
    assert len(event) == 0x2AB
    for size in (b"2AB", b"2ab", b"002aB"):
        acc = impl.StreamAccumulator()
        assert acc.feed_chunked(size + b"\r\n" + event + b"\r\n0\r\n\r\n") == 1
        assert acc.chunked_ended and len(acc.snapshot()) == 1


@pytest.mark.parametrize("case", ["lower", "upper"])
def test_every_hex_digit_in_either_case_is_a_chunk_size(impl: ModuleType, case: str) -> None:
    """RFC 9112's chunk-size is 1*HEXDIG, and HEXDIG is case-insensitive: chunks of every size from
    1 to 15 (each one-digit size), and two-digit ones holding every letter, in either case."""
    sizes = [*range(1, 16), 0xAF, 0xBE, 0xCD, 0xDF, 0x9A, 0xFF, 0x10]
    spelled = [format(n, "x" if case == "lower" else "X") for n in sizes]
    assert set("".join(spelled).lower()) == set("0123456789abcdef")
    data, pos = b"", 0
    while pos < len(BODY):
        for size, text in zip(sizes, spelled):
            piece = BODY[pos : pos + size]
            if not piece:
                break
            if len(piece) < size:  # the last chunk: its own size, spelled as Python spells it
                text = format(len(piece), "x" if case == "lower" else "X")
            data += text.encode() + b"\r\n" + piece + b"\r\n"
            pos += len(piece)
    acc, _ = feed_all(impl, data + b"0\r\n\r\n", [5])
    assert acc.chunked_ended and acc.finish().token_ids.tolist() == GEN.token_ids


def test_the_body_is_not_complete_before_the_last_crlf(impl: ModuleType) -> None:
    data = chunk_encode(BODY)
    acc = impl.StreamAccumulator()
    acc.feed_chunked(data[:-1])
    assert not acc.chunked_ended
    acc.feed_chunked(data[-1:])
    assert acc.chunked_ended


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"zz\r\n", r"event 0: malformed chunked body: b'z' where a chunk size was expected"),
        (b"\r\n", r"b'\\r' where a chunk size was expected"),
        (b"5x\r\n", r"b'x' in the chunk size \(expected a hex digit, ';' or CRLF\)"),
        (b"5 x\r\n", r"b'x' after the chunk size \(expected ';' or CRLF\)"),
        (b"5\n", r"b'\\n' in the chunk size"),
        (b"5\rx", r"b'x' after CR \(expected LF\)"),
        (b"5;ext\n", r"b'\\n' in a chunk-extension name \(expected a token character, '=', ';' or CRLF\)"),
        (b"2\r\nabX", r"b'X' after chunk data \(expected CRLF\)"),
        (b"2\r\nab\rX", r"b'X' after CR \(expected LF\)"),
        (b"0\r\n\n", r"b'\\n' at the start of a trailer line"),
        (b"0\r\nA: b\n", r"b'\\n' in a trailer line \(expected CRLF\)"),
        (b"0\r\n\r\nx", r"b'x' after the end of the chunked body"),
        (b"1" * 16 + b"\r\n", r"chunk size of 2\*\*60 bytes or more"),
        (b"5;" + b"x" * 9000, r"chunk-size or trailer line longer than 8192 bytes"),
    ],
    ids=lambda v: v[:12].decode("latin-1") if isinstance(v, bytes) else None,
)
def test_malformed_framing_is_a_format_error_that_keeps_the_prefix(impl: ModuleType, data: bytes, message: str) -> None:
    head = chunk_encode(BODY[: BODY.index(b"\n\n") + 2])[: -len(b"0\r\n\r\n")]  # event 0 in one chunk
    for sizes in ([1 << 20], [1], [3]):
        acc = impl.StreamAccumulator()
        acc.feed_chunked(head)
        with pytest.raises(StreamFormatError, match=message.replace("event 0", "event 1")) as info:
            for piece in split_pieces(data, sizes):
                acc.feed_chunked(piece)
        assert info.value.event_index == 1
        assert len(acc.snapshot()) == 1  # the event before the bad framing stays
        with pytest.raises(StreamFormatError):  # the error is kept
            acc.feed_chunked(b"")
        with pytest.raises(StreamFormatError):
            acc.finish()


def test_an_unfinished_body_is_a_truncation_unless_the_terminal_event_arrived(impl: ModuleType) -> None:
    data = chunk_encode(BODY, [50] * 200)
    acc = impl.StreamAccumulator()
    acc.feed_chunked(data[: len(data) // 2])
    with pytest.raises(StreamTruncatedError):
        acc.finish()
    acc = impl.StreamAccumulator()
    acc.feed_chunked(data[: -len(b"0\r\n\r\n")])  # every event, not the last chunk: a cut connection
    assert not acc.chunked_ended and len(acc.finish()) == 40


def test_feed_chunked_refuses_what_feed_refuses(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    with pytest.raises(TypeError, match="feed_chunked\\(\\) takes bytes, bytearray or memoryview, not str"):
        acc.feed_chunked("5\r\n")  # type: ignore[arg-type]
    acc.feed_chunked(memoryview(chunk_encode(BODY))[::1])
    acc.finish()
    with pytest.raises(RuntimeError, match="feed_chunked\\(\\) called after finish\\(\\)"):
        acc.feed_chunked(b"")


# RFC 9112, "Chunk Extensions": chunk-ext = *( BWS ";" BWS name [ BWS "=" BWS ( token / quoted-string ) ]).
VALID_EXTENSIONS = [
    b";a",
    b";a=b",
    b";name=value;flag;other=x",
    b';a="x y"',
    b';a="with \\"escaped\\" quotes; and \\\\"',
    b';a=""',
    b" ;a=b",
    b"; a = b",
    b";a=b ;c",
    b";!#$%&'*+-.^_`|~09AZaz=!#$%&'*+-.^_`|~",
    b';a="\xe9t\xe9"',  # obs-text
]
INVALID_EXTENSIONS = [
    (b";", r"b'\\r' after ';' \(expected a chunk-extension name\)"),
    (b";;a", r"b';' after ';'"),
    (b";=v", r"b'=' after ';'"),
    (b";a=", r"b'\\r' after '=' \(expected a token or a quoted string\)"),
    (b";a=;b", r"b';' after '='"),
    (b';a="x', r"b'\\r' in a quoted chunk-extension value"),
    (b';a="x\x01"', r"b'\\x01' in a quoted chunk-extension value"),
    (b";a b", r"b'b' after a chunk-extension name"),
    (b";a=b c", r"b'c' after a chunk-extension value"),
    (b';a="x"y', r"b'y' after a chunk-extension value"),
    (b";a@b", r"b'@' in a chunk-extension name"),
    (b";a=b@", r"b'@' in a chunk-extension value"),
    (b";a=\x01", r"b'\\x01' after '='"),
    (b";a\n", r"b'\\n' in a chunk-extension name"),
]


@pytest.mark.parametrize("extension", VALID_EXTENSIONS, ids=repr)
def test_chunk_extensions_of_the_rfc_grammar_are_read_and_ignored(impl: ModuleType, extension: bytes) -> None:
    for sizes in ([1 << 20], [1], [7]):
        acc = impl.StreamAccumulator()
        for piece in split_pieces(chunk_encode(BODY, [100] * 10, extension=extension), sizes):
            acc.feed_chunked(piece)
        assert acc.chunked_ended and len(acc.finish()) == 40


@pytest.mark.parametrize(("extension", "message"), INVALID_EXTENSIONS, ids=[repr(e) for e, _ in INVALID_EXTENSIONS])
def test_a_malformed_chunk_extension_fails_at_the_byte_that_proves_it(
    impl: ModuleType, extension: bytes, message: str
) -> None:
    head = chunk_encode(BODY[: BODY.index(b"\n\n") + 2])[: -len(b"0\r\n\r\n")]  # event 0 in one chunk
    acc = impl.StreamAccumulator()
    acc.feed_chunked(head)
    with pytest.raises(StreamFormatError, match=message):
        acc.feed_chunked(b"5" + extension + b"\r\n")  # no more bytes needed to know
    assert len(acc.snapshot()) == 1
