"""Routed experts (docs/core.md "Routed experts"): base64 int32 straight from the bytes, shape checks."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pybase64
import pytest

from fastaccum.emulator.writer import (
    WireOptions,
    encode_int32,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import StreamFormatError, StreamLengthError

INC = WireOptions(incremental=True)
CUM = WireOptions()
KEY = "routed_experts"


def _run(impl: ModuleType, events, sizes=(65536,), **kwargs):
    return impl.accumulate(split_pieces(stream_bytes(events), list(sizes)), **kwargs)


def _data(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


@pytest.mark.parametrize("interval", [1, 20, 64])
@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_terminal_routed_experts_reshaped(impl: ModuleType, opts: WireOptions, interval: int) -> None:
    gen = synthetic_generation("re", 70, prompt_tokens=30, expert_shape=(6, 4), num_experts=64)
    events = list(stream_events(gen, opts, interval=interval))
    assert KEY in events[-1]["meta_info"] and all(KEY not in e["meta_info"] for e in events[:-1])
    result = _run(impl, events, sizes=(1000,), expert_shape=(6, 4))
    assert result.routed_experts.dtype == np.int32
    assert result.routed_experts.shape == (30 + 70 - 1, 6, 4)
    assert np.array_equal(result.routed_experts, gen.routed_experts)
    assert KEY not in result.meta_info
    assert result.meta_info["prompt_tokens"] == 30


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_without_expert_shape_the_flat_int32_array(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("re-flat", 10, expert_shape=(3, 2))
    result = _run(impl, list(stream_events(gen, opts, interval=3)))
    assert result.routed_experts.dtype == np.int32
    assert result.routed_experts.ndim == 1
    assert result.routed_experts.tolist() == gen.routed_experts.reshape(-1).tolist()


def test_without_expert_shape_the_size_is_not_checked(impl: ModuleType) -> None:
    gen = synthetic_generation("re-free", 4, expert_shape=(2, 2))
    events = list(stream_events(gen, INC))
    events[-1]["meta_info"][KEY] = encode_int32([1, 2, 3])
    assert _run(impl, events).routed_experts.tolist() == [1, 2, 3]


def test_no_routed_experts_gives_none(impl: ModuleType) -> None:
    gen = synthetic_generation("re-none", 4)
    assert _run(impl, list(stream_events(gen, INC)), expert_shape=(2, 2)).routed_experts is None


def test_negative_and_extreme_values_are_little_endian_int32(impl: ModuleType) -> None:
    values = np.array([0, 1, -1, 2**31 - 1, -(2**31), 0x01020304, 127, 128, 255, 256, -256, 65536], dtype=np.int32)
    gen = synthetic_generation("re-le", 3, prompt_tokens=1)
    events = list(stream_events(gen, INC))
    events[-1]["meta_info"][KEY] = encode_int32(values)  # (1 + 3 - 1) rows x 2 layers x top-2
    assert _run(impl, events).routed_experts.tolist() == values.tolist()
    assert _run(impl, events, expert_shape=(2, 2)).routed_experts.tolist() == values.reshape(3, 2, 2).tolist()


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_large_array_in_64k_pieces(impl: ModuleType, opts: WireOptions) -> None:
    # 500 rows x 48 layers x top-8: a 1 MB int32 array, a 1.3 MB base64 string on one line.
    gen = synthetic_generation("re-big", 300, prompt_tokens=201, expert_shape=(48, 8))
    result = _run(impl, list(stream_events(gen, opts, interval=64)), sizes=(65536,), expert_shape=(48, 8))
    assert result.routed_experts.shape == (500, 48, 8)
    assert result.routed_experts.tobytes() == gen.routed_experts.tobytes()


def test_zero_token_terminal_rows_count_the_prompt(impl: ModuleType) -> None:
    gen = synthetic_generation("re-zero", 0, prompt_tokens=5, expert_shape=(2, 2))
    result = _run(impl, list(stream_events(gen, INC)), expert_shape=(2, 2))
    assert result.routed_experts.shape == (4, 2, 2)


def test_key_position_and_look_alike_text(impl: ModuleType) -> None:
    # The key may come anywhere in meta_info; text and logprob text may spell the key (escaped).
    gen = synthetic_generation("re-pos", 3, prompt_tokens=2, expert_shape=(2, 2))
    event = list(stream_events(gen, WireOptions(incremental=True, logprob_text=True), points=[3]))[0]
    meta = event["meta_info"]
    meta = {KEY: meta.pop(KEY), **meta}
    event["meta_info"] = meta
    fake = '"routed_experts":"AAAA" routed_experts":"!!"'
    event["text"] = fake
    meta["output_token_logprobs"][0][2] = fake
    result = _run(impl, [event], expert_shape=(2, 2))
    assert result.text == fake
    assert np.array_equal(result.routed_experts, gen.routed_experts)
    # ... and as the very last key of the event.
    event["meta_info"] = {**{k: v for k, v in meta.items() if k != KEY}, KEY: meta[KEY]}
    assert np.array_equal(_run(impl, [event], sizes=(7,), expert_shape=(2, 2)).routed_experts, gen.routed_experts)


# ---- errors ---------------------------------------------------------------------------------


def _terminal_replaced(value: Any, *, drop_prompt: bool = False):
    gen = synthetic_generation("re-bad", 3, prompt_tokens=2, expert_shape=(2, 2))
    events = list(stream_events(gen, INC, points=[1, 3]))
    events[-1]["meta_info"][KEY] = value
    if drop_prompt:
        del events[-1]["meta_info"]["prompt_tokens"]
    return gen, events


@pytest.mark.parametrize(
    "value",
    ["!!!!", "AAAA=", "AAA", "AAAAA===", "AA AA", "AAAA\n", "AQIDBA" + "=", "ÄÄÄÄ", 5, ["AAAA"]],
    ids=["bad-char", "bad-pad", "short", "over-pad", "space", "newline", "bad-pad2", "non-ascii", "number", "list"],
)
def test_undecodable_routed_experts(impl: ModuleType, value: Any) -> None:
    _, events = _terminal_replaced(value)
    acc = impl.StreamAccumulator()
    acc.feed(_data(events[0]))
    with pytest.raises(StreamFormatError, match="event 1.*routed_experts") as info:
        acc.feed(_data(events[1]))
    assert info.value.event_index == 1
    assert acc.snapshot().routed_experts is None
    assert not acc.finished


def test_length_not_a_multiple_of_4(impl: ModuleType) -> None:
    _, events = _terminal_replaced(pybase64.b64encode(b"\x01\x00\x00\x00\x02\x00").decode())
    with pytest.raises(StreamFormatError, match="routed_experts"):
        _run(impl, events)
    _run(impl, events[:1] + [events[1] | {"meta_info": events[1]["meta_info"] | {KEY: encode_int32([1, 2])}}])


@pytest.mark.parametrize("values", [8, 17, 0, 15], ids=lambda v: f"{v}values")
def test_size_must_match_expert_shape(impl: ModuleType, values: int) -> None:
    # prompt 2 + completion 3 - 1 = 4 rows of 2 layers x top-2: 16 values.
    _, events = _terminal_replaced(encode_int32(np.arange(values)))
    acc = impl.StreamAccumulator(expert_shape=(2, 2))
    acc.feed(_data(events[0]))
    with pytest.raises(StreamLengthError, match="event 1") as info:
        acc.feed(_data(events[1]))
    assert info.value.event_index == 1
    assert "routed_experts" in str(info.value)
    assert acc.snapshot().routed_experts is None
    # The same array is fine without a shape to check.
    assert len(_run(impl, events).routed_experts) == values


def test_missing_prompt_tokens_with_expert_shape(impl: ModuleType) -> None:
    gen, events = _terminal_replaced(None, drop_prompt=True)
    events[-1]["meta_info"][KEY] = encode_int32(gen.routed_experts)
    with pytest.raises(StreamFormatError, match="prompt_tokens"):
        _run(impl, events, expert_shape=(2, 2))
    # Without expert_shape nothing needs prompt_tokens.
    assert _run(impl, events).routed_experts.tolist() == gen.routed_experts.reshape(-1).tolist()


def test_json_escaped_solidus_in_base64(impl: ModuleType) -> None:
    # orjson never writes "\/", but it is a valid JSON escape for "/", a base64 character.
    gen = synthetic_generation("re-solidus", 3, prompt_tokens=2)
    values = np.array([-1, 0x3FFFFFFF, 0x7F7F7F7F, 4], dtype=np.int32)  # 4 rows x 1 layer x top-1
    encoded = encode_int32(values)
    assert "/" in encoded
    events = list(stream_events(gen, INC, points=[3]))
    events[0]["meta_info"][KEY] = encoded
    body = stream_bytes(events)
    escaped = body.replace(encoded.encode(), encoded.replace("/", "\\/").encode())
    assert escaped.count(b"\\/") == encoded.count("/")
    result = impl.accumulate([escaped], expert_shape=(1, 1))
    assert result.routed_experts.reshape(-1).tolist() == values.tolist()


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_required_routed_experts_that_never_came_are_an_error(impl: ModuleType, opts: WireOptions) -> None:
    """Asked for (``require_routed_experts``), a stream that finished by itself without them says
    how the server is asked for them, instead of giving None."""
    events = list(stream_events(synthetic_generation("re-required", 6), opts))
    with pytest.raises(StreamFormatError, match="finished without routed experts.*--enable-return-routed-experts"):
        _run(impl, events, expert_shape=(2, 2), require_routed_experts=True)
    assert _run(impl, events, expert_shape=(2, 2)).routed_experts is None  # not required: None, as before


def test_required_routed_experts_that_came_pass(impl: ModuleType) -> None:
    gen = synthetic_generation("re-given", 6, expert_shape=(2, 2))
    result = _run(impl, list(stream_events(gen, INC)), expert_shape=(2, 2), require_routed_experts=True)
    assert np.array_equal(result.routed_experts, gen.routed_experts)


def test_an_abort_without_routed_experts_is_no_error_when_they_are_required(impl: ModuleType) -> None:
    """A request aborted before it ran ends with SGLang's echo, which lawfully has none."""
    events = list(stream_events(synthetic_generation("re-abort", 3), INC))
    events[-1]["meta_info"]["finish_reason"] = {"type": "abort", "message": "Abort in waiting queue"}
    assert _run(impl, events, require_routed_experts=True).routed_experts is None


@pytest.mark.parametrize(
    ("values", "fits"),
    [
        (32, "expert_shape=(4, 2) or (2, 4) would fit"),
        (24, "expert_shape=(3, 2) or (2, 3) would fit"),
        (17, "do not divide"),
    ],
)
def test_a_wrong_expert_shape_names_the_shapes_that_would_fit(impl: ModuleType, values: int, fits: str) -> None:
    # prompt 2 + completion 3 - 1 = 4 rows; expert_shape (2, 2) expects 16 values.
    _, events = _terminal_replaced(encode_int32(np.arange(values)))
    with pytest.raises(StreamLengthError, match=re.escape(fits)):
        _run(impl, events, expert_shape=(2, 2))
