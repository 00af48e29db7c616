"""The compiled twin's native event scanner reads exactly what the orjson path reads.

Ordinary events are scanned straight from the bytes (no Python object per token), and so are the
token lists of large events the scanner does not read whole (a non-streaming answer, a cumulative
terminal event: "lifted", the rest parsed by orjson). The numbers must be bit-identical to
orjson's parse, and every event or list the scanner is unsure of must fall back to orjson.
``_debug(fast_scan=False)`` forces the orjson path, which these tests compare against;
``_debug(lift_after_bytes=0)`` lifts the lists of every such event, however small.
"""

from __future__ import annotations

import math
import random
import re
import struct
from collections.abc import Iterator
from decimal import Decimal, getcontext
from types import ModuleType

import numpy as np
import orjson
import pytest

from fastaccum.emulator.writer import (
    WireOptions,
    normal_event,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)

pytestmark = pytest.mark.c_extension


@pytest.fixture
def cy() -> ModuleType:
    import fastaccum._cy as cy

    return cy


def _agree(cy, outcomes, data: bytes, **kwargs) -> None:
    slow = outcomes.run(cy, [data], debug={"fast_scan": False}, **kwargs)
    outcomes.assert_same(outcomes.run(cy, [data], **kwargs), slow)
    outcomes.assert_same(outcomes.run(cy, [data], debug={"lift_after_bytes": 0}, **kwargs), slow)


def _scanned(acc) -> bool:
    """The scanner read the newest event: only it keeps meta_info as bytes for a later parse."""
    return acc._lazy_meta is not None


def _event(numbers: list[bytes], ids: list[int] | None = None, total: int = 0) -> bytes:
    ids = ids or list(range(1, len(numbers) + 1))
    triples = b",".join(b"[" + n + b"," + str(i).encode() + b",null]" for n, i in zip(numbers, ids))
    out_ids = b",".join(str(i).encode() for i in ids)
    total = total or len(ids)
    return (
        b'data: {"text":"x","output_ids":[' + out_ids + b'],"meta_info":{"id":"r","finish_reason":null,'
        b'"prompt_tokens":3,"output_token_logprobs":['
        + triples
        + b'],"output_token_logprobs_length":'
        + str(total).encode()
        + b',"completion_tokens":'
        + str(total).encode()
        + b"}}\n\n"
    )


def _number_spellings(rng: random.Random) -> Iterator[bytes]:
    """Doubles as orjson writes them, plus the other spellings JSON allows."""
    for _ in range(4000):
        kind = rng.random()
        if kind < 0.4:
            x = float(np.float32(-rng.random() * 10.0 ** -rng.randint(0, 12)))
        elif kind < 0.7:
            x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
            if not math.isfinite(x):
                continue
        else:
            x = -rng.random() * 10.0 ** rng.randint(-30, 30)
        text = orjson.dumps(x)
        yield text
        yield repr(x).encode()  # e-notation with a padded exponent sign, as orjson 3.8 wrote
        yield f"{x:.25e}".encode()  # more digits than a double holds
        yield f"{x:.17g}".encode()
    yield from (
        b"0",
        b"-0",
        b"-0.0",
        b"0.0",
        b"1e16",
        b"1e+16",
        b"1E-7",
        b"-1.0000000116860974e-7",
        b"5e-324",
        b"2.2250738585072014e-308",
        b"1.7976931348623157e308",
        b"1e-400",
        b"123456789012345",
        b"9007199254740993",
        b"18446744073709551616",
        b"0.30000000000000004",
        b"1." + b"0" * 40,
        b"-0.000019999999494757503",
        b"4.9406564584124654e-324",
        b"2.4703282292062327e-324",
        b"2.4703282292062328e-324",
        b"9007199254740993.0",
        b"0.1e1",
        b"100e-2",
    )


def test_numbers_parse_bit_identically_to_orjson(cy, outcomes) -> None:
    rng = random.Random(11)
    spellings = list(_number_spellings(rng))
    chunks = [spellings[i : i + 50] for i in range(0, len(spellings) - 30, 50)] + [[n] for n in spellings[-30:]]
    scanned = 0
    for chunk in chunks:
        _agree(cy, outcomes, _event(chunk) + b"data: [DONE]\n\n", mode="incremental")
        # The values also equal orjson's own reading, bit for bit.
        acc = cy.StreamAccumulator("incremental")
        acc.feed(_event(chunk))
        scanned += _scanned(acc)
        got = acc.snapshot().logprobs
        want = np.array([float(orjson.loads(n)) if orjson.loads(n) is not None else np.nan for n in chunk])
        assert got.tobytes() == want.tobytes(), [
            (n, g, w) for n, g, w in zip(chunk, got, want) if struct.pack("<d", g) != struct.pack("<d", w)
        ]
    # Most chunks took the scanner; the others hold an integer spelling above 2**53 (as '%.17g'
    # writes large doubles), whose float() rounding is left to the orjson path.
    assert scanned >= 0.9 * len(chunks)


def _near_halfway(rng: random.Random) -> Iterator[bytes]:
    """Decimals within a few units of the last digit of the midpoint between two doubles: the
    spellings where a parser that rounds an approximation goes wrong unless it checks."""
    getcontext().prec = 60
    for _ in range(1500):
        x = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(63)))[0]
        if not math.isfinite(x) or x == 0.0:
            continue
        mid = (Decimal(x) + Decimal(math.nextafter(x, math.inf))) / 2
        digits = rng.randint(15, 19)
        mantissa, exponent = f"{mid:.{digits - 1}e}".split("e")
        for step in (-1, 0, 1):
            near = Decimal(mantissa) + step * Decimal(10) ** -(digits - 1)
            yield f"{near}e{exponent}".encode()


def test_near_halfway_numbers_round_as_orjson_does(cy) -> None:
    spellings = list(_near_halfway(random.Random(5)))
    acc = cy.StreamAccumulator("incremental")
    acc.feed(_event(spellings))
    got = acc.snapshot().logprobs
    want = np.array([orjson.loads(n) for n in spellings], dtype=np.float64)
    assert got.tobytes() == want.tobytes(), [
        (n, g, w) for n, g, w in zip(spellings, got, want) if struct.pack("<d", g) != struct.pack("<d", w)
    ]


@pytest.mark.parametrize("special", [b'\\"', b"\\n", b"\\u00e9", "\u00e9".encode(), b"\x01", b"\xff"])
def test_a_special_byte_anywhere_in_a_string_is_seen(cy, outcomes, special: bytes) -> None:
    # Plain runs are skipped eight bytes at a time: the special byte is put at every offset.
    for offset in range(20):
        text = b"a" * offset + special + b"b" * (19 - offset)
        event = (
            _event([b"-0.5"])
            .replace(b'"text":"x"', b'"text":"' + text + b'"')
            .replace(b'"id":"r"', b'"id":"' + text + b'"')
        )
        _agree(cy, outcomes, event + b"data: [DONE]\n\n", mode="incremental")


@pytest.mark.parametrize(
    "bad",
    [
        b"01",
        b"1.",
        b".5",
        b"-",
        b"+1",
        b"1e",
        b"1e+",
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e400",
        b"0x10",
        b"1_000",
        b"--1",
        b"1.5.5",
        b"true",
        b'"1"',
        b"[1]",
        b"1 ",
        b" 1",
    ],
)
def test_numbers_the_scanner_refuses_go_to_orjson(cy, outcomes, bad: bytes) -> None:
    _agree(cy, outcomes, _event([b"-0.5", bad, b"-0.25"]) + b"data: [DONE]\n\n", mode="incremental")


# The third element of a logprob triple: null, or the token's text.
_TEXT_ELEMENT = re.compile(rb',(?:null|"(?:[^"\\]|\\.)*")\]')
EDITS = [
    lambda d: d,
    lambda d: d.replace(b'"text":"', b'"text":"\\u00e9\\n\\"', 1),  # escapes in text
    lambda d: d.replace(b'"text":"', b'"text":"\\ud83d\\ude00', 1),  # a surrogate pair: orjson's
    lambda d: d.replace(b'"text":"', b'"text":"\\ud800', 1),  # a lone surrogate
    lambda d: d.replace(b'"text":"', b'"text":"\xff', 1),  # invalid UTF-8
    lambda d: d.replace(b'"text":"', b'"text":"\xed\xa0\x80', 1),  # an encoded surrogate
    lambda d: d.replace(b'"text":"', b'"text":"\xc0\xaf', 1),  # overlong
    lambda d: d.replace(b'"text":"', b'"text":"\x01', 1),  # a raw control character
    lambda d: d.replace(b'"text":"', b'"text":null,"x":"', 1),
    lambda d: d.replace(b',"meta_info"', b', "meta_info"', 1),  # whitespace
    lambda d: d.replace(b'"finish_reason":null', b'"finish_reason":null,"finish_reason":null', 1),
    lambda d: d.replace(b'"completion_tokens":', b'"completion_tokens":-', 1),
    lambda d: d.replace(b'"completion_tokens":', b'"completion_tokens":0', 1),
    lambda d: d.replace(b'"prompt_tokens":', b'"prompt_tokens":1.0,"was":', 1),
    lambda d: d.replace(b'"output_ids":[', b'"output_ids":[2147483648,', 1),
    lambda d: d.replace(b'"output_ids":[', b'"output_ids":[1.0,', 1),
    lambda d: re.sub(_TEXT_ELEMENT, b"]", d, count=1),  # a two-element entry
    lambda d: re.sub(_TEXT_ELEMENT, b',"t\\\\u0041"]', d, count=1),  # logprob text with an escape
    lambda d: re.sub(_TEXT_ELEMENT, b",null,null]", d, count=1),  # four elements
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","nested":{"a":[1,{"b":[true,false,null]}],"c":-1.5e3}', 1),
    lambda d: d.replace(b'"id":"scan"', b'"id":' + b"[" * 70 + b"]" * 70, 1),  # deeper than the scanner goes
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","error":1', 1),
    lambda d: d.replace(b'{"text"', b'{"error":{"message":"m","code":500},"text"', 1),
    lambda d: d.replace(b'{"text"', b'{"index":0,"text"', 1),
    lambda d: d.replace(b"}}\n\n", b"}}x\n\n", 1),  # trailing bytes
    lambda d: d.replace(b"}}\n\n", b"}\n\n", 1),  # unterminated
    lambda d: d.replace(b'"meta_info":{', b'"meta_info":{"top_p_token_ids":"AAAAAA==",', 1),
    # numbers that are skipped, not read, must still be ones orjson accepts (found by fuzzing)
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","x":1e400', 1),
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","x":[-1.5e309]', 1),
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","x":1' + b"0" * 400, 1),
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","x":1e-400', 1),
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","x":0.' + b"0" * 400 + b"1e700", 1),
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","x":1e308', 1),
    # a lifted list's key twice, or nested where it does not belong: the lists stay for orjson
    lambda d: d.replace(b'"id":"scan"', b'"id":"scan","x":{"output_token_logprobs":[[-1.0,5,null]]}', 1),
    lambda d: d.replace(b'"output_token_logprobs":', b'"output_token_logprobz":', 1).replace(
        b'"id":"scan"', b'"id":"scan","x":{"output_token_logprobs":[[-1.0,5,null]]}', 1
    ),
    lambda d: d.replace(b'"output_ids":[', b'"output_idz":[', 1).replace(
        b'"meta_info":{', b'"meta_info":{"output_ids":[7],', 1
    ),
    lambda d: d.replace(b'"text":"', b'"text":"\\"output_ids\\":[1]', 1),  # the key's bytes inside a string
    lambda d: d.replace(b',"output_ids":[', b',\n"output_ids":[', 1),  # not right after a comma
]


@pytest.mark.parametrize("edit", range(len(EDITS)))
def test_unusual_events_match_the_orjson_path(cy, outcomes, edit: int) -> None:
    rng = random.Random(edit)
    gen = synthetic_generation("scan", 9, null_logprob_every=4)
    for incremental in (True, False):
        opts = WireOptions(incremental=incremental, logprob_text=rng.random() < 0.5)
        events = stream_bytes(stream_events(gen, opts, interval=2)).split(b"\n\n")
        events = [e + b"\n\n" for e in events if e]
        k = rng.randrange(len(events) - 1)  # edit a non-terminal event
        edited = EDITS[edit](events[k])
        assert edit == 0 or edited != events[k], "the edit must apply"
        events[k] = edited
        data = b"".join(events)
        for mode in ("auto", "incremental" if incremental else "cumulative"):
            _agree(cy, outcomes, data, mode=mode)


@pytest.mark.parametrize("incremental", [True, False])
@pytest.mark.parametrize("interval", [1, 20, 64])
def test_streams_match_the_orjson_path(cy, outcomes, incremental: bool, interval: int) -> None:
    rng = random.Random(interval)
    for trial in range(5):
        gen = synthetic_generation(
            f"eq{trial}",
            rng.choice([1, 50, 300]),
            top_p=rng.random() < 0.3,
            expert_shape=(2, 2) if rng.random() < 0.3 else None,
            null_logprob_every=7,
        )
        opts = WireOptions(
            incremental=incremental, logprob_text=rng.random() < 0.5, skip_tokenizer_init=rng.random() < 0.3
        )
        data = stream_bytes(stream_events(gen, opts, interval=interval))
        # The terminal event always takes the orjson path: look for the scanner's work before it.
        terminal = data.rindex(b"data: {")
        for piece in (1, 97, 65536):
            acc = cy.StreamAccumulator()
            for part in split_pieces(data[:terminal], [piece]):
                acc.feed(part)
            assert _scanned(acc) or len(gen.token_ids) == 1
            acc.feed(data[terminal:])
            fast = acc.finish()
            slow = cy.StreamAccumulator()._debug(fast_scan=False)
            lifted = cy.StreamAccumulator()._debug(lift_after_bytes=0)  # the terminal event's lists
            for part in split_pieces(data, [piece]):
                slow.feed(part)
                lifted.feed(part)
            expected = slow.finish()
            outcomes.assert_same_result(fast, expected)
            outcomes.assert_same_result(lifted.finish(), expected)
            assert lifted._lifted_events == 1


@pytest.mark.parametrize("logprob_text", [False, True])
def test_a_large_answers_lists_are_lifted_and_read_as_orjson_reads_them(cy, outcomes, logprob_text: bool) -> None:
    """A non-streaming answer of 5,000 tokens (JSON well past the lifting size), with routed
    experts streamed into their array: the lists are read by the scanner, the rest by orjson."""
    gen = synthetic_generation("lift", 5000, prompt_tokens=30, expert_shape=(2, 2), top_p=True, null_logprob_every=9)
    opts = WireOptions(logprob_text=logprob_text)
    event = normal_event(gen, opts, 0, 5000, terminal=True, finish_reason=gen.finish_reason, first=True)
    data = stream_bytes([event])
    assert len(data) > 64 << 10
    for debug in ({}, {"stream_after_bytes": 0}):
        fast = outcomes.run(cy, [data], expert_shape=(2, 2), debug=debug)
        outcomes.assert_same(fast, outcomes.run(cy, [data], expert_shape=(2, 2), debug={"fast_scan": False}))
        acc = cy.StreamAccumulator(expert_shape=(2, 2))._debug(**debug)
        acc.feed(data)
        assert acc.finish().routed_experts is not None and acc._lifted_events == 1
