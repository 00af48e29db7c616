"""Hypothesis: the compiled and pure twins agree on any stream, valid or corrupted, cut anywhere."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fastaccum.emulator.writer import (
    DONE,
    WireOptions,
    chunk_encode,
    coalesce,
    echo_event,
    emission_points,
    error_event,
    normal_event,
    split_pieces,
    sse,
    synthetic_generation,
)

pytestmark = pytest.mark.c_extension

# Derandomized so a run is reproducible; about 10 s for both tests on one core.
SETTINGS = settings(
    max_examples=600,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _twins() -> tuple[ModuleType, ModuleType]:
    # Imported here, not at collection, so --no-c-extensions can skip this module's tests.
    return importlib.import_module("fastaccum._cy"), importlib.import_module("fastaccum._py")


# ---- outcome of one run, in comparable form -------------------------------------------------


def _array(a: np.ndarray | None) -> Any:
    return None if a is None else (a.dtype.str, a.shape, a.tobytes())


def _result(r) -> tuple[Any, ...]:
    return (
        type(r).__name__,
        r.mode,
        _array(r.token_ids),
        _array(r.logprobs),
        r.text,
        orjson.dumps(r.finish_reason),
        orjson.dumps(r.meta_info),
        r.completion_tokens,
        _array(r.top_p_token_ids),
        _array(r.top_p_token_offsets),
        _array(r.routed_experts),
        r.events,
        r.aborted,
        r.finished,
    )


def _error(exc: BaseException) -> tuple[Any, ...]:
    attrs = tuple(getattr(exc, a, None) for a in ("event_index", "mode", "expected", "actual", "status", "message"))
    return (type(exc), str(exc), attrs)


def _call(fn, *args) -> tuple[str, Any]:
    try:
        value = fn(*args)
    except Exception as exc:  # both twins must fail the same way, whatever the class
        return ("raise", _error(exc))
    return ("ok", _result(value) if hasattr(value, "token_ids") else value)


def _run(
    impl: ModuleType, pieces: list[bytes], kwargs: dict[str, Any], snap_at: set[int], feed: str = "feed"
) -> list[Any]:
    try:
        acc = impl.StreamAccumulator(**kwargs)
    except Exception as exc:
        return [("init", _error(exc))]
    trace: list[Any] = []
    for i, piece in enumerate(pieces):
        trace.append(_call(getattr(acc, feed), piece))
        if i in snap_at:
            trace.append(_call(acc.snapshot))
            trace.append(("state", acc.mode, acc.finished))
    trace.append(_call(acc.finish))
    trace.append(_call(acc.snapshot))
    trace.append(_call(acc.finish))
    trace.append(("state", acc.mode, acc.finished, acc.chunked_ended))
    return trace


def assert_twins_agree(pieces: list[bytes], kwargs: dict[str, Any], snap_at: set[int], feed: str = "feed") -> None:
    cy, py = _twins()
    assert _run(cy, pieces, kwargs, snap_at, feed) == _run(py, pieces, kwargs, snap_at, feed)


# ---- stream generation ----------------------------------------------------------------------


@st.composite
def valid_events(draw: st.DrawFn) -> tuple[list[bytes], dict[str, Any]]:
    """A stream as SGLang writes it (normal, echo-terminated, coalesced, error), as event blobs."""
    incremental = draw(st.booleans())
    opts = WireOptions(
        incremental=incremental,
        return_logprob=draw(st.booleans()),
        logprob_text=draw(st.booleans()),
        skip_tokenizer_init=draw(st.booleans()),
        version=draw(st.sampled_from(["0.5.23", "0.5.15"])),
    )
    n = draw(st.integers(0, 30))
    shape = draw(st.sampled_from([None, (2, 3)]))
    gen = synthetic_generation(
        "diff",
        n,
        seed=draw(st.integers(0, 1000)),
        prompt_tokens=draw(st.integers(1, 5)),
        top_p=draw(st.booleans()),
        expert_shape=shape,
        null_logprob_every=draw(st.sampled_from([0, 2, 5])),
    )
    points = emission_points(n, draw(st.sampled_from([1, 2, 5, 20])), opts.version)
    ending = draw(st.sampled_from(["normal", "normal", "echo", "coalesced", "zero-terminal", "error", "abort"]))
    events: list[dict[str, Any]] = []
    prev = 0
    for k, end in enumerate(points):
        terminal = k == len(points) - 1 and ending in ("normal", "abort")
        reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
        events.append(
            normal_event(
                gen,
                opts,
                prev,
                end,
                terminal=terminal,
                first=k == 0,
                finish_reason=reason if ending == "abort" else None,
            )
        )
        prev = end
    blobs = [orjson.dumps(e) for e in events]
    if ending == "echo":
        held = points[-2] if len(points) > 1 else 0
        blobs = blobs[:-1] if len(points) > 1 else []
        blobs.append(orjson.dumps(echo_event(gen, opts, max(held, n if draw(st.booleans()) else held))))
    elif ending == "coalesced" and incremental and len(events) >= 2:
        blobs[-1] = orjson.dumps(coalesce([events[-1], echo_event(gen, opts, n)]))
    elif ending == "zero-terminal" or ending == "coalesced":
        blobs.append(orjson.dumps(normal_event(gen, opts, n, n, terminal=True)))
    elif ending == "error":
        at = draw(st.integers(0, len(blobs)))
        blobs.insert(at, orjson.dumps(error_event("boom", draw(st.sampled_from([400, 500])))))
    kwargs: dict[str, Any] = {"mode": draw(st.sampled_from(["auto", "auto", "cumulative", "incremental"]))}
    if shape is not None and draw(st.booleans()):
        kwargs["expert_shape"] = draw(st.sampled_from([shape, (3, 2), (1, 1)]))
    if draw(st.integers(0, 5)) == 0:
        kwargs["max_event_bytes"] = draw(st.integers(0, 3000))
    return blobs, kwargs


CORRUPT_BYTES = b'\r\n"{}[],:0-1e.\\ dax\xff\xef\xbb\xbfA=/nul'


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[bytes], dict[str, Any], set[int]]:
    blobs, kwargs = draw(valid_events())
    eol = draw(st.sampled_from([b"\n", b"\n", b"\r", b"\r\n"]))
    nospace = draw(st.booleans())
    body = b"".join((b"data:" if nospace else b"data: ") + b + eol + eol for b in blobs)
    if draw(st.booleans()):
        body += b"data: [DONE]" + eol + eol
    if draw(st.integers(0, 4)) == 0:
        body = b"\xef\xbb\xbf" + body
    if draw(st.integers(0, 4)) == 0:
        at = draw(st.integers(0, len(body)))
        body = body[:at] + b": ping" + eol + body[at:]
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 4]))):  # corruptions
        if not body:
            break
        at = draw(st.integers(0, len(body) - 1))
        byte = bytes([draw(st.sampled_from(CORRUPT_BYTES))])
        how = draw(st.sampled_from(["replace", "insert", "delete", "truncate"]))
        if how == "replace":
            body = body[:at] + byte + body[at + 1 :]
        elif how == "insert":
            body = body[:at] + byte + body[at:]
        elif how == "delete":
            body = body[:at] + body[at + 1 :]
        else:
            body = body[:at]
    sizes = draw(st.lists(st.one_of(st.integers(1, 16), st.integers(1, 65536)), min_size=1, max_size=12))
    pieces = split_pieces(body, sizes)
    if draw(st.booleans()):  # empty pieces are legal feeds
        pieces.insert(draw(st.integers(0, len(pieces))), b"")
    snap_at = set(draw(st.lists(st.integers(0, max(len(pieces) - 1, 0)), max_size=4)))
    return pieces, kwargs, snap_at


@SETTINGS
@given(streams())
def test_twins_agree_on_generated_streams(case: tuple[list[bytes], dict[str, Any], set[int]]) -> None:
    pieces, kwargs, snap_at = case
    assert_twins_agree(pieces, kwargs, snap_at)


# ---- raw SSE token soup: framing corner cases ------------------------------------------------

SMALL = synthetic_generation("soup", 3)
FRAGMENTS = [
    b"data: ",
    b"data:",
    b"data",
    b"dat",
    b": c",
    b"event: x",
    b"id: 1",
    b"\n",
    b"\r",
    b"\r\n",
    b"\n\n",
    b"[DONE]",
    b" ",
    b"\xef\xbb\xbf",
    b"\xe2\x80\xa8",
    b"\x0b",
]
SOUP = [  # JSON values, sent as whole events or mixed into the fragments
    b"[DONE]",
    orjson.dumps(normal_event(SMALL, WireOptions(incremental=True), 0, 1, first=True)),
    orjson.dumps(normal_event(SMALL, WireOptions(incremental=True), 1, 3, terminal=True)),
    orjson.dumps(normal_event(SMALL, WireOptions(), 0, 2)),
    orjson.dumps(normal_event(SMALL, WireOptions(), 0, 3, terminal=True)),
    orjson.dumps(echo_event(SMALL, WireOptions(incremental=True), 3)),
    orjson.dumps(error_event("soup")),
    b'{"text":"a","output_ids":[1],"meta_info":{"finish_reason":null,"completion_tokens":9}}',
    b'{"index":0}',
    b"{}",
    b"[]",
    b"null",
]
# Numbers beyond every C integer type, in each place a number is read.
for huge in (2**31, 2**63, 2**64 - 1, 2**64, -(2**63) - 1, 10**30):
    for where in ("output_ids", "logprob-id", "logprob", "completion_tokens", "prompt_tokens"):
        event = normal_event(SMALL, WireOptions(incremental=True), 0, 1, first=True)
        meta = event["meta_info"]
        if where == "output_ids":
            event["output_ids"][0] = "HUGE"
        elif where == "logprob-id":
            meta["output_token_logprobs"][0][1] = event["output_ids"][0] = "HUGE"
        elif where == "logprob":
            meta["output_token_logprobs"][0][0] = "HUGE"
        else:
            meta[where] = "HUGE"
        SOUP.append(orjson.dumps(event).replace(b'"HUGE"', str(huge).encode()))


BLOCKS = [b"data: " + value + b"\n\n" for value in SOUP] + [b"data:" + value + b"\r\n\r\n" for value in SOUP]


@SETTINGS
@given(
    st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.sampled_from(SOUP), st.sampled_from(BLOCKS)), max_size=30),
    st.lists(st.integers(1, 40), min_size=1, max_size=5),
    st.sampled_from(["auto", "cumulative", "incremental"]),
)
def test_twins_agree_on_sse_soup(tokens: list[bytes], sizes: list[int], mode: str) -> None:
    body = b"".join(tokens)
    pieces = split_pieces(body, sizes)
    assert_twins_agree(pieces, {"mode": mode, "max_event_bytes": 4000}, set(range(0, len(pieces), 3)))


# ---- chunked transfer encoding (feed_chunked) ------------------------------------------------

CHUNK_CORRUPTIONS = [
    b"\r",
    b"\n",
    b"\r\n",
    b";",
    b" ",
    b"\t",
    b"0",
    b"f",
    b"g",
    b"x",
    b"\x00",
    b"ffffffffffffffff",
    b"0\r\n\r\n",
]


@st.composite
def chunked_streams(draw: st.DrawFn) -> tuple[list[bytes], dict[str, Any], set[int]]:
    """A stream's body as a chunked HTTP body: chunks of any size (one per event, as uvicorn and
    aiohttp write, or cutting events anywhere), extensions, trailers, corrupted framing, any cut."""
    pieces, kwargs, snap_at = draw(streams())
    body = b"".join(pieces)
    if draw(st.booleans()):
        sizes = [len(p) for p in pieces]
    else:
        sizes = draw(st.lists(st.integers(1, 300), max_size=20))
    extension = draw(st.sampled_from([b"", b"", b";a", b';a=b;c="d e"', b" ;x=1", b"\t"]))
    trailers = draw(st.sampled_from([b"", b"", b"X-Trailer: 1\r\n", b"A: b\r\nC: d\r\n"]))
    data = chunk_encode(body, sizes, extension=extension, trailers=trailers)
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2]))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(["insert", "replace", "delete", "truncate", "append"]))
        junk = draw(st.sampled_from(CHUNK_CORRUPTIONS))
        if how == "insert":
            data = data[:at] + junk + data[at:]
        elif how == "replace":
            data = data[:at] + junk + data[at + len(junk) :]
        elif how == "delete":
            data = data[:at] + data[at + 1 :]
        elif how == "truncate":
            data = data[:at]
        else:
            data += junk
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    split = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)])]
    return split, kwargs, set(range(0, len(split), 3)) | snap_at


@SETTINGS
@given(chunked_streams())
def test_twins_agree_on_chunked_bodies(case: tuple[list[bytes], dict[str, Any], set[int]]) -> None:
    pieces, kwargs, snap_at = case
    assert_twins_agree(pieces, kwargs, snap_at, "feed_chunked")


def test_twins_have_the_same_public_names() -> None:
    cy, py = _twins()
    assert cy.__all__ == py.__all__
    for name in ("feed", "feed_chunked", "chunked_ended", "finish", "snapshot", "finished", "mode"):
        assert hasattr(cy.StreamAccumulator, name) and hasattr(py.StreamAccumulator, name)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "bogus"},
        {"mode": 5},
        {"expert_shape": (0, 2)},
        {"expert_shape": (2,)},
        {"expert_shape": "x"},
        {"max_event_bytes": -1},
        {"max_event_bytes": "10"},
        {"expert_shape": (2, -1)},
    ],
    ids=repr,
)
def test_twins_refuse_the_same_arguments_the_same_way(kwargs: dict[str, Any]) -> None:
    cy, py = _twins()
    assert _run(cy, [], kwargs, set())[:1] == _run(py, [], kwargs, set())[:1]


@pytest.mark.parametrize("data", ["text", 5, None, [b"x"], b"", bytearray(b"data: x\n\n")], ids=repr)
def test_twins_treat_feed_arguments_the_same_way(data: object) -> None:
    cy, py = _twins()
    results = []
    for impl in (cy, py):
        acc = impl.StreamAccumulator()
        results.append((_call(acc.feed, data), _call(acc.snapshot)))
    assert results[0] == results[1]


def test_large_stream_agrees() -> None:
    gen = synthetic_generation("big", 3000, top_p=True, expert_shape=(8, 4), null_logprob_every=11)
    for incremental in (False, True):
        opts = WireOptions(incremental=incremental, logprob_text=True)
        events = []
        prev = 0
        points = emission_points(3000, 64)
        for k, end in enumerate(points):
            events.append(sse(normal_event(gen, opts, prev, end, terminal=k == len(points) - 1, first=k == 0)))
            prev = end
        body = b"".join(events) + DONE
        assert_twins_agree(split_pieces(body, [65536, 1, 4093]), {"expert_shape": (8, 4)}, {3, 40})
