"""SSE framing rules (docs/core.md "Framing"): line ends, data lines, ignored lines, BOM, limits, EOF."""

from __future__ import annotations

import random
from types import ModuleType

import numpy as np
import orjson
import pytest

from fastaccum.emulator.writer import (
    DONE,
    WireOptions,
    normal_event,
    split_pieces,
    sse,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import StreamFormatError, StreamLimitError, StreamTruncatedError

INC = WireOptions(incremental=True)
CUM = WireOptions()


def _gen(n: int = 6, seed: int = 1):
    return synthetic_generation("frame", n, seed=seed)


def _body(n: int = 6, opts: WireOptions = INC, *, done: bool = True) -> bytes:
    return stream_bytes(stream_events(_gen(n), opts), done=done)


def _feed(acc, pieces) -> int:
    return sum(acc.feed(p) for p in pieces)


def _run(impl: ModuleType, pieces, **kwargs):
    acc = impl.StreamAccumulator(**kwargs)
    _feed(acc, pieces)
    return acc.finish()


def _assert_is_generation(result, gen, n: int) -> None:
    assert result.token_ids.tolist() == list(gen.token_ids[:n])
    expected = np.array([np.nan if x is None else x for x in gen.logprobs[:n]], dtype=np.float64)
    assert result.logprobs.tobytes() == expected.tobytes()
    assert result.text == gen.text(0, n)
    assert result.finish_reason == gen.finish_reason
    assert result.finished


# ---- line ends ------------------------------------------------------------------------------


def test_reference_stream_in_one_piece_is_the_generation(impl: ModuleType) -> None:
    gen = _gen()
    _assert_is_generation(_run(impl, [_body()]), gen, 6)


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_lines_end_at_lf_cr_or_crlf(impl: ModuleType, outcomes, eol: bytes, opts: WireOptions) -> None:
    body = _body(opts=opts)
    reference = _run(impl, [body])
    # SGLang's JSON never holds a raw LF, so every LF in the body is a line end.
    converted = body.replace(b"\n", eol)
    outcomes.assert_same_result(_run(impl, [converted]), reference)
    outcomes.assert_same_result(_run(impl, split_pieces(converted, [1])), reference)


def test_mixed_line_ends_in_one_stream(impl: ModuleType, outcomes) -> None:
    body = _body()
    reference = _run(impl, [body])
    # Every (line end, blank line end) pair except CR then LF, which would be one CRLF line end.
    pairs = [
        (b"\r\n", b"\r\n"),
        (b"\r", b"\r"),
        (b"\n", b"\n"),
        (b"\n", b"\r"),
        (b"\r\n", b"\n"),
        (b"\n", b"\r\n"),
        (b"\r", b"\r\n"),
        (b"\r\n", b"\r"),
    ]
    blocks = body.split(b"\n\n")[:-1]
    mixed = b"".join(block + pairs[i % 8][0] + pairs[i % 8][1] for i, block in enumerate(blocks))
    outcomes.assert_same_result(_run(impl, [mixed]), reference)
    outcomes.assert_same_result(_run(impl, split_pieces(mixed, [1, 2, 3])), reference)


def test_crlf_split_across_pieces_is_one_line_end(impl: ModuleType, outcomes) -> None:
    crlf = _body().replace(b"\n", b"\r\n")
    reference = _run(impl, [crlf])
    # Cut right after every CR, so each LF starts the next piece; empty pieces in between too.
    pieces: list[bytes] = []
    start = 0
    for i, byte in enumerate(crlf):
        if byte == 0x0D:
            pieces += [crlf[start : i + 1], b""]
            start = i + 1
    pieces.append(crlf[start:])
    assert b"".join(pieces) == crlf
    assert any(p.endswith(b"\r") for p in pieces)
    outcomes.assert_same_result(_run(impl, pieces), reference)


def test_crlf_split_is_not_a_blank_line(impl: ModuleType) -> None:
    # "data: A\r" + "\ndata: B\r\n\r\n" must be one event with two data lines ("A\nB"), not two events.
    gen = _gen(1)
    event = orjson.dumps(normal_event(gen, INC, 0, 1, terminal=True))
    inside_key = event.index(b"output_ids") + 3
    head, tail = event[:inside_key], event[inside_key:]
    pieces = [b"data: " + head + b"\r", b"\ndata: " + tail + b"\r", b"\n\r", b"\n"]
    with pytest.raises(StreamFormatError, match="event 0"):
        _run(impl, pieces)  # joined with LF inside a key or value: not JSON
    # A split at a JSON whitespace position proves the two lines join into one event.
    cut = event.index(b',"meta_info"') + 1
    pieces = [b"data: " + event[:cut] + b"\r", b"\ndata: " + event[cut:] + b"\r", b"\n\r", b"\n" + DONE]
    acc = impl.StreamAccumulator()
    assert _feed(acc, pieces) >= 1
    _assert_is_generation(acc.finish(), gen, 1)


def test_cr_cr_is_a_blank_line_across_pieces(impl: ModuleType, outcomes) -> None:
    body = _body().replace(b"\n", b"\r")
    reference = _run(impl, [body])
    pieces = [p + b"\r" for p in body.split(b"\r")[:-1]]
    outcomes.assert_same_result(_run(impl, pieces), reference)


@pytest.mark.parametrize(
    "char",
    ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"],
    ids=["U+2028", "U+2029", "U+0085", "VT", "FF", "FS", "GS", "RS"],
)
def test_unicode_and_control_separators_are_data(impl: ModuleType, outcomes, char: str) -> None:
    # Inside a comment: if the character ended the line, the garbage after it would be a data line.
    comment = (": ping" + char + "data: garbage\n\n").encode()
    body = comment + _body()
    reference = _run(impl, [_body()])
    outcomes.assert_same_result(_run(impl, [body]), reference)
    outcomes.assert_same_result(_run(impl, split_pieces(body, [1])), reference)


@pytest.mark.parametrize("char", ["\u2028", "\u2029", "\x85"], ids=["U+2028", "U+2029", "U+0085"])
def test_raw_unicode_separators_inside_text_survive_any_split(impl: ModuleType, char: str) -> None:
    gen = _gen(2)
    event = normal_event(gen, INC, 0, 2, terminal=True)
    event["text"] = f"a{char}b{char}"
    body = stream_bytes([event])
    assert char.encode() in body  # orjson writes them raw
    for sizes in ([1], [2], [3], [len(body)]):
        result = _run(impl, split_pieces(body, sizes))
        assert result.text == f"a{char}b{char}"
        assert result.token_ids.tolist() == list(gen.token_ids)


# ---- data lines -----------------------------------------------------------------------------


def test_data_without_space(impl: ModuleType, outcomes) -> None:
    body = _body()
    reference = _run(impl, [body])
    outcomes.assert_same_result(_run(impl, [body.replace(b"data: ", b"data:")]), reference)


def test_only_one_space_after_the_colon_is_dropped(impl: ModuleType, outcomes) -> None:
    body = _body()
    reference = _run(impl, [body])
    # A second space stays in the value; JSON ignores leading whitespace, so the events still parse.
    events_only = body[: -len(DONE)]
    outcomes.assert_same_result(_run(impl, [events_only.replace(b"data: ", b"data:  ") + DONE]), reference)
    # But "[DONE]" with a leading space is not [DONE]: a data event after the terminal event.
    with pytest.raises(StreamFormatError):
        _run(impl, [events_only + b"data:  [DONE]\n\n"])


def test_multi_line_data_joins_with_lf(impl: ModuleType, outcomes) -> None:
    gen = _gen(3)
    events = list(stream_events(gen, INC))
    out = b""
    for event in events:
        raw = orjson.dumps(event)
        # Break the JSON at whitespace-safe places (after commas between members).
        parts = raw.split(b',"')
        out += b"data: " + parts[0] + b"".join(b",\ndata: " + b'"' + p for p in parts[1:]) + b"\n\n"
    out += DONE
    assert out.count(b"\ndata: ") > len(events) * 2
    reference = _run(impl, [stream_bytes(events)])
    outcomes.assert_same_result(_run(impl, [out]), reference)
    outcomes.assert_same_result(_run(impl, split_pieces(out, [1, 5])), reference)


def test_multi_line_join_is_lf_not_nothing(impl: ModuleType) -> None:
    events_only = _body(done=False)
    # Joined with LF this is "[DO\nNE]", not [DONE]: a data event after the terminal event.
    with pytest.raises(StreamFormatError, match="event 6"):
        _run(impl, [events_only + b"data: [DO\ndata: NE]\n\n"])
    # A number split over two lines becomes "1\n2": not JSON.
    gen = _gen(1)
    raw = orjson.dumps(normal_event(gen, INC, 0, 1, terminal=True))
    at = raw.index(b'"completion_tokens":1') + len(b'"completion_tokens":1')
    broken = b"data: " + raw[:at] + b"\ndata: 2" + raw[at:] + b"\n\n"
    with pytest.raises(StreamFormatError, match="event 0"):
        _run(impl, [broken])


def test_bare_data_line_is_an_empty_value(impl: ModuleType) -> None:
    gen = _gen(1)
    raw = orjson.dumps(normal_event(gen, INC, 0, 1, terminal=True))
    cut = raw.index(b',"meta_info"') + 1
    # "data" alone adds an empty line to the value: {...,\n\n"meta_info":...} is still JSON.
    body = b"data: " + raw[:cut] + b"\ndata\ndata: " + raw[cut:] + b"\n\n" + DONE
    _assert_is_generation(_run(impl, [body]), gen, 1)
    # An event whose only data line is bare has the empty value: not JSON.
    with pytest.raises(StreamFormatError, match="event 0"):
        _run(impl, [b"data\n\n"])


# ---- ignored lines --------------------------------------------------------------------------


IGNORED_LINES = [
    b": ping",
    b":",
    b"event: message",
    b"event:delta",
    b"id: 7",
    b"id",
    b"retry: 15000",
    b"foo: bar",
    b"DATA: {not json}",
    b"Data: {not json}",
    b"dat: {not json}",
    b"datax: {not json}",
    b" data: {not json}",
    b"data_: {not json}",
]


@pytest.mark.parametrize("line", IGNORED_LINES, ids=[x.decode() or "empty" for x in IGNORED_LINES])
def test_comments_and_other_fields_are_ignored(impl: ModuleType, outcomes, line: bytes) -> None:
    body = _body()
    reference = _run(impl, [body])
    # Before every data line and as a block of its own (a blank line after it dispatches nothing).
    sprinkled = body.replace(b"data: ", line + b"\ndata: ")
    outcomes.assert_same_result(_run(impl, [sprinkled]), reference)
    blocks = line + b"\n\n" + body.replace(b"\n\n", b"\n\n" + line + b"\n\n")
    outcomes.assert_same_result(_run(impl, [blocks]), reference)
    outcomes.assert_same_result(_run(impl, split_pieces(blocks, [1, 7])), reference)


def test_blank_lines_without_data_dispatch_nothing(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    assert acc.feed(b"\n\n\r\n\r\r: keepalive\n\nevent: x\nid: 1\n\n") == 0
    # Event indices count data events only: the first data event is still event 0.
    with pytest.raises(StreamFormatError, match="event 0") as info:
        acc.feed(b"\n\ndata: nonsense\n\n")
    assert info.value.event_index == 0


def test_ignored_lines_are_never_buffered(impl: ModuleType) -> None:
    gen = _gen(2)
    raw = orjson.dumps(normal_event(gen, INC, 0, 2, terminal=True))
    huge = b": " + b"x" * 200_000 + b"\n" + b"event: " + b"y" * 100_000 + b"\n"
    body = huge + b"data: " + raw + b"\n" + huge + b"\n" + DONE
    result = _run(impl, split_pieces(body, [4096]), max_event_bytes=len(raw))
    _assert_is_generation(result, gen, 2)


def test_bom_at_start_is_ignored(impl: ModuleType, outcomes) -> None:
    body = _body()
    reference = _run(impl, [body])
    with_bom = b"\xef\xbb\xbf" + body
    outcomes.assert_same_result(_run(impl, [with_bom]), reference)
    outcomes.assert_same_result(_run(impl, split_pieces(with_bom, [1])), reference)
    outcomes.assert_same_result(_run(impl, [with_bom.replace(b"\n", b"\r\n")]), reference)


def test_bom_elsewhere_is_not_ignored(impl: ModuleType) -> None:
    # After the start a BOM is part of the field name, so the line is an unknown field: the
    # terminal event it carried never arrives.
    events = list(stream_events(_gen(3), INC))
    body = stream_bytes(events[:-1], done=False) + b"\xef\xbb\xbf" + sse(events[-1])
    acc = impl.StreamAccumulator()
    acc.feed(body)
    assert not acc.finished
    with pytest.raises(StreamTruncatedError):
        acc.finish()


def test_no_line_length_cap(impl: ModuleType) -> None:
    gen = _gen(3)
    event = normal_event(gen, INC, 0, 3, terminal=True)
    event["meta_info"]["padding"] = "p" * (3 << 20)  # a 3 MiB line, like a routed-experts array
    body = stream_bytes([event])
    result = _run(impl, split_pieces(body, [65536]))
    _assert_is_generation(result, gen, 3)
    assert result.meta_info["padding"] == "p" * (3 << 20)


# ---- splits ---------------------------------------------------------------------------------


def test_every_two_piece_split_gives_the_same_result(impl: ModuleType, outcomes) -> None:
    body = _body(3).replace(b"\n", b"\r\n")
    reference = _run(impl, [body])
    for cut in range(len(body) + 1):
        outcomes.assert_same_result(_run(impl, [body[:cut], body[cut:]]), reference)


@pytest.mark.parametrize("seed", range(4))
def test_random_splits_from_one_byte_to_64k(impl: ModuleType, outcomes, seed: int) -> None:
    rng = random.Random(seed)
    gen = synthetic_generation("split", 400, seed=seed, top_p=True, expert_shape=(8, 4))
    opts = CUM if seed % 2 else INC
    body = stream_bytes(stream_events(gen, opts, interval=20))
    reference = _run(impl, [body], expert_shape=(8, 4))
    sizes = [int(2 ** rng.uniform(0, 16)) for _ in range(64)]
    outcomes.assert_same_result(_run(impl, split_pieces(body, sizes), expert_shape=(8, 4)), reference)


# ---- feed() count and event indices ---------------------------------------------------------


def test_feed_returns_the_events_completed_by_each_call(impl: ModuleType) -> None:
    events = list(stream_events(_gen(4), INC))
    acc = impl.StreamAccumulator()
    counts = [acc.feed(p) for p in split_pieces(stream_bytes(events, done=False), [1])]
    assert sum(counts) == len(events)
    assert set(counts) <= {0, 1}
    # The call that completes an event is the one delivering the final LF of its blank line.
    body = stream_bytes(events, done=False)
    ends = {i for i in range(len(body)) if body[i - 1 : i + 1] == b"\n\n"}
    assert {i for i, c in enumerate(counts) if c} == ends
    acc2 = impl.StreamAccumulator()
    assert acc2.feed(stream_bytes(events[:2], done=False)) == 2
    assert acc2.feed(b"") == 0


def test_done_counts_as_an_event(impl: ModuleType) -> None:
    events = list(stream_events(_gen(2), INC))
    acc = impl.StreamAccumulator()
    assert acc.feed(stream_bytes(events, done=True)) == len(events) + 1


# ---- max_event_bytes ------------------------------------------------------------------------


def test_max_event_bytes_counts_the_data_value(impl: ModuleType) -> None:
    events = list(stream_events(_gen(4), INC))
    sizes = [len(orjson.dumps(e)) for e in events]
    largest = max(sizes)
    body = stream_bytes(events)
    _run(impl, [body], max_event_bytes=largest)  # exactly the limit: fine
    first_too_big = next(i for i, s in enumerate(sizes) if s > largest - 1)
    acc = impl.StreamAccumulator(max_event_bytes=largest - 1)
    with pytest.raises(StreamLimitError, match=f"max_event_bytes={largest - 1}") as info:
        acc.feed(body)
    assert info.value.event_index == first_too_big
    assert len(acc.snapshot().token_ids) == sum(len(e["output_ids"]) for e in events[:first_too_big])


def test_max_event_bytes_counts_the_lf_joining_data_lines(impl: ModuleType) -> None:
    gen = _gen(1)
    raw = orjson.dumps(normal_event(gen, INC, 0, 1, terminal=True))
    cut = raw.index(b',"meta_info"') + 1
    body = b"data: " + raw[:cut] + b"\ndata: " + raw[cut:] + b"\n\n" + DONE
    _run(impl, [body], max_event_bytes=len(raw) + 1)
    with pytest.raises(StreamLimitError):
        _run(impl, [body], max_event_bytes=len(raw))


def test_oversized_event_is_refused_while_it_arrives(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator(max_event_bytes=1000)
    acc.feed(b"data: " + b"{" * 600)
    with pytest.raises(StreamLimitError, match="event 0"):
        acc.feed(b"{" * 401)  # no line end yet: the limit is checked as bytes arrive
    with pytest.raises(StreamLimitError):
        acc.feed(b"\n\n")  # the first error is kept


def test_max_event_bytes_applies_per_event(impl: ModuleType) -> None:
    gen = _gen(40)
    events = list(stream_events(gen, INC))
    largest = max(len(orjson.dumps(e)) for e in events)
    total = sum(len(orjson.dumps(e)) for e in events)
    assert total > largest
    _assert_is_generation(_run(impl, [stream_bytes(events)], max_event_bytes=largest), gen, 40)


# ---- end of input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tail",
    [
        b"",
        b"d",
        b"data",
        b"data:",
        b"data: ",
        b"data: [DO",
        b"data: [DONE",
        b"data: [DONE]",
        b"data:[DONE]",
        b"data: [DONE]\n",
        b"data: [DONE]\r",
        b"data: [DONE]\r\n",
        b": bye",
        DONE,
    ],
    ids=repr,
)
def test_end_of_input_before_or_inside_done_is_fine(impl: ModuleType, tail: bytes) -> None:
    gen = _gen()
    result = _run(impl, [_body(done=False) + tail])
    _assert_is_generation(result, gen, 6)


@pytest.mark.parametrize(
    "tail",
    [b"data: x", b"data: [DONE]x", b"data: [DONE] ", b"data: {", b"data: [DONE]\ndata: x", b"data: [D0"],
    ids=repr,
)
def test_unfinished_data_event_after_terminal_that_cannot_be_done(impl: ModuleType, tail: bytes) -> None:
    acc = impl.StreamAccumulator()
    acc.feed(_body(done=False) + tail)
    with pytest.raises(StreamFormatError, match="event 6"):
        acc.finish()
    assert len(acc.snapshot().token_ids) == 6


@pytest.mark.parametrize("cut", [1, 10, -40, -3, -2, -1], ids=lambda c: f"cut{c}")
def test_end_of_input_inside_an_event_before_terminal_is_truncation(impl: ModuleType, cut: int) -> None:
    events = list(stream_events(_gen(3), INC))
    head = stream_bytes(events[:-1], done=False)
    last = sse(events[-1])
    acc = impl.StreamAccumulator()
    acc.feed(head + last[:cut])
    with pytest.raises(StreamTruncatedError):
        acc.finish()
    assert acc.snapshot().token_ids.tolist() == [t for e in events[:-1] for t in e["output_ids"]]


def test_data_after_done_is_a_format_error(impl: ModuleType) -> None:
    body = _body()
    with pytest.raises(StreamFormatError, match="event 7"):
        _run(impl, [body + DONE])
    with pytest.raises(StreamFormatError, match="event 7"):
        _run(impl, [body + b"data: {}\n\n"])
    # Comments and blank lines after [DONE] are not data events.
    _assert_is_generation(_run(impl, [body + b": bye\n\n\n"]), _gen(), 6)
