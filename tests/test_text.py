"""Text (cumulative: newest; incremental: joined deltas; absent: None) and token values (logprobs)."""

from __future__ import annotations

import struct
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest

from fastaccum.emulator.writer import (
    TEXT_PIECES,
    WireOptions,
    normal_event,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import StreamFormatError

INC = WireOptions(incremental=True)
CUM = WireOptions()

UNICODE_TEXTS = [
    "日本語のテキスト",
    "中文",
    "🙂👍🏽👨‍👩‍👧",
    "a\u2028b",
    "\u2029",
    "\x85",
    "<|im_end|>",
    "<|endoftext|>",
    "",
    '"quoted" \\ back/slash',
    "tab\tnew\nline\r\ncr\r",
    "\x00\x01\x1f\x7f",
    "\ufffd",
    "é",
]


def _stream_with_texts(texts: list[str], opts: WireOptions) -> tuple[list[dict[str, Any]], str]:
    """One token per text piece; in cumulative mode each event carries the text so far."""
    gen = synthetic_generation("text", len(texts))
    events = []
    for i in range(len(texts)):
        event = normal_event(gen, opts, i, i + 1, terminal=i == len(texts) - 1, first=i == 0)
        event["text"] = texts[i] if opts.incremental else "".join(texts[: i + 1])
        events.append(event)
    return events, "".join(texts)


def _run(impl: ModuleType, events, sizes=(1 << 16,), **kwargs):
    return impl.accumulate(split_pieces(stream_bytes(events), list(sizes)), **kwargs)


# ---- text -----------------------------------------------------------------------------------


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_unicode_special_and_empty_text_survive_any_split(impl: ModuleType, opts: WireOptions) -> None:
    events, full = _stream_with_texts(UNICODE_TEXTS, opts)
    for sizes in ([1], [2, 3], [7], [1 << 16]):
        result = _run(impl, events, sizes)
        assert result.text == full


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_text_of_synthetic_generation(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("pieces", 3 * len(TEXT_PIECES))
    result = _run(impl, list(stream_events(gen, opts, interval=2)), [5])
    assert result.text == gen.text(0, len(gen.token_ids))


def test_incremental_empty_deltas_add_nothing(impl: ModuleType) -> None:
    events, full = _stream_with_texts(["", "a", "", "", "b", ""], INC)
    assert _run(impl, events).text == full == "ab"


def test_cumulative_text_is_the_newest_event_text(impl: ModuleType) -> None:
    # Text may lag the ids (an incomplete UTF-8 tail is held back) and the stop string may be
    # trimmed at the end: whatever the newest event says is the text.
    events, _ = _stream_with_texts(["x", "y", "z", "w"], CUM)
    events[1]["text"] = "x"
    events[2]["text"] = "xy\ufffd"
    events[3]["text"] = "xyz"
    assert _run(impl, events).text == "xyz"


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_text_snapshot_covers_the_same_tokens(impl: ModuleType, opts: WireOptions) -> None:
    texts = ["A", "🙂", "\u2028", "", "中"]
    events, _ = _stream_with_texts(texts, opts)
    acc = impl.StreamAccumulator()
    for i, event in enumerate(events):
        acc.feed(stream_bytes([event], done=False))
        snap = acc.snapshot()
        assert snap.text == "".join(texts[: i + 1])
        assert len(snap.token_ids) == i + 1


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_null_text_means_unchanged(impl: ModuleType, opts: WireOptions) -> None:
    events, _ = _stream_with_texts(["a", "b", "c"], opts)
    events[2]["text"] = None
    assert _run(impl, events).text == "ab"


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_no_text_key_gives_none(impl: ModuleType, opts: WireOptions) -> None:
    skip = WireOptions(incremental=opts.incremental, skip_tokenizer_init=True)
    gen = synthetic_generation("skip", 30)
    events = list(stream_events(gen, skip, interval=4))
    assert all("text" not in e for e in events)
    result = _run(impl, events)
    assert result.text is None
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert impl.StreamAccumulator().snapshot().text is None


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_text_only_in_the_terminal_event(impl: ModuleType, opts: WireOptions) -> None:
    events, _ = _stream_with_texts(["a", "b", "c"], opts)
    del events[0]["text"], events[1]["text"]
    assert _run(impl, events).text == ("c" if opts.incremental else "abc")


def test_json_escapes_in_text(impl: ModuleType) -> None:
    gen = synthetic_generation("esc", 1)
    event = normal_event(gen, INC, 0, 1, terminal=True, first=True)
    event["text"] = "PLACEHOLDER"
    escaped = rb"\ud83d\ude42 \u00e9\/\b\f\n\r\t\"\\\u2028\u0041"
    body = b"data: " + orjson.dumps(event).replace(b"PLACEHOLDER", escaped) + b"\n\n"
    result = impl.accumulate([body])
    assert result.text == '\U0001f642 \u00e9/\b\f\n\r\t"\\\u2028A'


def test_text_with_utf8_split_inside_characters(impl: ModuleType) -> None:
    events, full = _stream_with_texts(["🙂🙂", "日本", "\u2028"], INC)
    body = stream_bytes(events)
    emoji = body.index("🙂".encode())
    for cut in range(emoji, emoji + 8):
        assert impl.accumulate([body[:cut], body[cut:]]).text == full


# ---- logprob text (the third triple element) ------------------------------------------------


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_logprob_text_is_accepted(impl: ModuleType, opts: WireOptions) -> None:
    with_text = WireOptions(incremental=opts.incremental, logprob_text=True)
    gen = synthetic_generation("lptext", 3 * len(TEXT_PIECES), null_logprob_every=3)
    events = list(stream_events(gen, with_text, interval=5))
    assert any(t[2] for e in events for t in e["meta_info"]["output_token_logprobs"])
    reference = _run(impl, list(stream_events(gen, opts, interval=5)))
    result = _run(impl, events, [3])
    assert result.token_ids.tobytes() == reference.token_ids.tobytes()
    assert result.logprobs.tobytes() == reference.logprobs.tobytes()
    assert "output_token_logprobs" not in result.meta_info


def test_two_element_logprob_entries(impl: ModuleType) -> None:
    gen = synthetic_generation("pairs", 4)
    event = normal_event(gen, INC, 0, 4, terminal=True, first=True)
    event["meta_info"]["output_token_logprobs"] = [t[:2] for t in event["meta_info"]["output_token_logprobs"]]
    result = _run(impl, [event])
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.logprobs.tolist() == list(gen.logprobs[:4])


# ---- logprob values -------------------------------------------------------------------------

NUMBERS = [
    b"1e-7",
    b"1e+16",
    b"1E16",
    b"1e16",
    b"-0.0",
    b"0.0",
    b"0",
    b"-0",
    b"-5",
    b"3",
    b"-1.0000000116860974e-7",
    b"-0.3310999870300293",
    b"-0.000012299999980314169",
    b"-1.9000000293090125e-6",
    b"-2.5E-3",
    b"5e-324",
    b"-2.2250738585072014e-308",
    b"1.7976931348623157e308",
    b"-123456789012345678901234567890",
    b"0.1",
    b"-1e-400",
    b"-0.30000000000000004",
    b"-9007199254740993",
]


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def test_logprob_numbers_parse_exactly_as_orjson(impl: ModuleType) -> None:
    n = len(NUMBERS)
    gen = synthetic_generation("floats", n)
    triples = b",".join(b"[" + num + b"," + str(t).encode() + b",null]" for num, t in zip(NUMBERS, gen.token_ids))
    meta = (
        b'{"id":"f","finish_reason":{"type":"length","length":%d},"prompt_tokens":3,'
        b'"output_token_logprobs":[%s],"output_token_logprobs_length":%d,"completion_tokens":%d}' % (n, triples, n, n)
    )
    body = b'data: {"text":"","output_ids":%s,"meta_info":%s}\n\n' % (orjson.dumps(list(gen.token_ids)), meta)
    result = impl.accumulate([body])
    expected = [float(orjson.loads(num)) for num in NUMBERS]
    assert [_bits(x) for x in result.logprobs.tolist()] == [_bits(x) for x in expected]
    assert np.signbit(result.logprobs[NUMBERS.index(b"-0.0")])


def test_null_logprob_becomes_nan(impl: ModuleType) -> None:
    gen = synthetic_generation("nulls", 20, null_logprob_every=3)
    for opts in (INC, CUM):
        result = _run(impl, list(stream_events(gen, opts, interval=4)), [11])
        nan = np.isnan(result.logprobs)
        assert nan.tolist() == [x is None for x in gen.logprobs]
        assert result.logprobs[~nan].tolist() == [x for x in gen.logprobs if x is not None]


def test_generation_logprobs_round_trip_bit_exact(impl: ModuleType) -> None:
    gen = synthetic_generation("roundtrip", 500)
    result = _run(impl, list(stream_events(gen, INC, interval=20)), [65536])
    assert [_bits(x) for x in result.logprobs.tolist()] == [_bits(x) for x in gen.logprobs]


@pytest.mark.parametrize(
    "value",
    [b"NaN", b"Infinity", b"-Infinity", b"1e400", b"true", b'"-0.5"', b"[]", b"01", b"-", b".5", b"1."],
    ids=repr,
)
def test_logprob_must_be_a_json_number_or_null(impl: ModuleType, value: bytes) -> None:
    gen = synthetic_generation("badnum", 1)
    raw = orjson.dumps(normal_event(gen, INC, 0, 1, terminal=True, first=True))
    lp = orjson.dumps(gen.logprobs[0])
    assert raw.count(b"[[" + lp + b",") == 1
    body = b"data: " + raw.replace(b"[[" + lp + b",", b"[[" + value + b",") + b"\n\n"
    with pytest.raises(StreamFormatError, match="event 0"):
        impl.accumulate([body])
