"""The public surface (design.md "Core API"): names, StreamResult, misuse, idempotence, kept errors."""

from __future__ import annotations

import dataclasses
import gc
import pickle
from types import ModuleType

import numpy as np
import orjson
import pytest

import fastaccum
from fastaccum.emulator.writer import (
    WireOptions,
    normal_event,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import (
    ServerError,
    StreamError,
    StreamFormatError,
    StreamLengthError,
    StreamLimitError,
    StreamTruncatedError,
)
from fastaccum.result import StreamResult

INC = WireOptions(incremental=True)
GEN = synthetic_generation("api", 8, top_p=True, expert_shape=(2, 2))
BODY = stream_bytes(stream_events(GEN, INC, interval=3))  # 3 events + [DONE]


def _data(event) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


# ---- names ----------------------------------------------------------------------------------


def test_twin_exports(impl: ModuleType) -> None:
    assert isinstance(impl.__all__, tuple)
    assert {"StreamAccumulator", "accumulate"} <= set(impl.__all__)
    for name in impl.__all__:
        assert getattr(impl, name) is not None


def test_package_exports() -> None:
    assert isinstance(fastaccum.__all__, tuple)
    for name in (
        "StreamAccumulator",
        "StreamResult",
        "accumulate",
        "StreamError",
        "StreamFormatError",
        "StreamLengthError",
        "StreamTruncatedError",
        "StreamLimitError",
        "ServerError",
        "IMPLEMENTATION",
        "__version__",
    ):
        assert name in fastaccum.__all__
    assert fastaccum.IMPLEMENTATION in ("cython", "python")


def test_error_hierarchy() -> None:
    for cls in (StreamFormatError, StreamLengthError, StreamTruncatedError, StreamLimitError, ServerError):
        assert issubclass(cls, StreamError)
    assert issubclass(StreamError, ValueError)


def test_stream_result_fields() -> None:
    names = [f.name for f in dataclasses.fields(StreamResult)]
    assert names == [
        "mode",
        "token_ids",
        "logprobs",
        "text",
        "finish_reason",
        "meta_info",
        "completion_tokens",
        "top_p_token_ids",
        "top_p_token_offsets",
        "routed_experts",
        "events",
        "aborted",
        "timing",
        "indexer_topk",
        "request_sent",
        "weight_version_spans",
    ]


def test_result_types_and_frozen(impl: ModuleType) -> None:
    result = impl.accumulate([BODY], expert_shape=(2, 2))
    assert isinstance(result, StreamResult)
    assert result.token_ids.dtype == np.int32 and result.token_ids.ndim == 1
    assert result.logprobs.dtype == np.float64
    assert result.top_p_token_ids.dtype == result.top_p_token_offsets.dtype == np.int32
    assert result.routed_experts.dtype == np.int32
    assert isinstance(result.text, str) and isinstance(result.meta_info, dict)
    assert isinstance(result.finish_reason, dict) and result.finished
    assert result.completion_tokens == 8 == len(result)
    assert result.aborted is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.mode = "x"  # type: ignore[misc]


def test_meta_info_without_token_lists_and_arrays(impl: ModuleType) -> None:
    result = impl.accumulate([BODY], expert_shape=(2, 2))
    for key in ("output_token_logprobs", "top_p_token_ids", "top_p_token_offsets", "routed_experts"):
        assert key not in result.meta_info
    last = list(stream_events(GEN, INC, interval=3))[-1]["meta_info"]
    for key in (
        "id",
        "prompt_tokens",
        "weight_version",
        "completion_tokens",
        "weight_versions",
        "e2e_latency",
        "finish_reason",
        "cached_tokens_details",
        "dp_rank",
    ):
        assert result.meta_info[key] == last[key]


def test_events_counts_data_events(impl: ModuleType) -> None:
    events = list(stream_events(GEN, INC, interval=3))
    acc = impl.StreamAccumulator()
    acc.feed(stream_bytes(events[:2], done=False))
    assert acc.snapshot().events == 2
    acc.feed(stream_bytes(events[2:], done=False))
    assert acc.snapshot().events == len(events) == 4
    assert acc.finish().events == 4


# ---- construction and misuse ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "cumulative", "incremental"])
def test_modes_accepted(impl: ModuleType, mode: str) -> None:
    assert impl.StreamAccumulator(mode).mode == mode
    assert impl.StreamAccumulator(mode=mode).mode == mode


def test_unknown_mode_is_a_value_error(impl: ModuleType) -> None:
    with pytest.raises(ValueError, match="mode"):
        impl.StreamAccumulator("streaming")
    with pytest.raises(ValueError):
        impl.StreamAccumulator("Auto")


def test_options_are_keyword_only(impl: ModuleType) -> None:
    with pytest.raises(TypeError):
        impl.StreamAccumulator("auto", (2, 2))
    impl.StreamAccumulator("auto", expert_shape=(2, 2), max_event_bytes=100)


@pytest.mark.parametrize("data", ["data: [DONE]\n\n", 5, None, [b"x"]], ids=["str", "int", "None", "list"])
def test_feed_rejects_non_bytes(impl: ModuleType, data: object) -> None:
    acc = impl.StreamAccumulator()
    with pytest.raises(TypeError):
        acc.feed(data)  # type: ignore[arg-type]
    acc.feed(BODY)  # the misuse left nothing behind
    assert acc.finish().token_ids.tolist() == list(GEN.token_ids)


def test_feed_data_is_positional_only(impl: ModuleType) -> None:
    with pytest.raises(TypeError):
        impl.StreamAccumulator().feed(data=BODY)


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_feed_accepts_bytes_like(impl: ModuleType, kind: type) -> None:
    acc = impl.StreamAccumulator(expert_shape=(2, 2))
    for piece in split_pieces(BODY, [100]):
        acc.feed(kind(piece))
    assert acc.finish().token_ids.tolist() == list(GEN.token_ids)


def test_fed_buffers_may_be_reused(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    buf = bytearray(64)
    for piece in split_pieces(BODY, [64]):
        buf[: len(piece)] = piece
        acc.feed(memoryview(buf)[: len(piece)])
        buf[:] = b"\xff" * len(buf)  # the accumulator must not keep a view of the caller's memory
    assert acc.finish().token_ids.tolist() == list(GEN.token_ids)


# ---- lifecycle ------------------------------------------------------------------------------


def test_finished_flag(impl: ModuleType) -> None:
    events = list(stream_events(GEN, INC, interval=3))
    acc = impl.StreamAccumulator()
    assert acc.finished is False
    acc.feed(stream_bytes(events[:-1], done=False))
    assert acc.finished is False
    acc.feed(_data(events[-1]))
    assert acc.finished is True


def test_finish_is_idempotent(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator(expert_shape=(2, 2))
    acc.feed(BODY)
    first = acc.finish()
    second = acc.finish()
    for name in ("token_ids", "logprobs", "top_p_token_ids", "top_p_token_offsets", "routed_experts"):
        assert getattr(first, name).tobytes() == getattr(second, name).tobytes()
    assert (first.text, first.finish_reason, first.meta_info, first.events, first.mode) == (
        second.text,
        second.finish_reason,
        second.meta_info,
        second.events,
        second.mode,
    )


def test_snapshot_returns_copies(impl: ModuleType) -> None:
    events = list(stream_events(GEN, INC, interval=3))
    acc = impl.StreamAccumulator()
    acc.feed(_data(events[0]))
    snap = acc.snapshot()
    snap.token_ids[:] = -7
    snap.logprobs[:] = 1.0
    snap.meta_info["id"] = "changed"
    acc.feed(stream_bytes(events[1:]))
    result = acc.finish()
    assert result.token_ids.tolist() == list(GEN.token_ids)
    assert result.logprobs.tolist() == list(GEN.logprobs)
    assert result.meta_info["id"] == "api"


def test_the_final_result_owns_its_arrays(impl: ModuleType) -> None:
    # finish() hands the buffers' storage to the result instead of copying it: the arrays must
    # outlive the accumulator, be writable, and not be shared with a later snapshot.
    acc = impl.StreamAccumulator(expert_shape=(2, 2))
    acc.feed(BODY)
    result = acc.finish()
    snap = acc.snapshot()
    del acc
    gc.collect()
    assert result.token_ids.tolist() == list(GEN.token_ids)
    assert result.logprobs.tolist() == list(GEN.logprobs)
    for name in ("token_ids", "logprobs", "top_p_token_ids", "top_p_token_offsets"):
        final, later = getattr(result, name), getattr(snap, name)
        assert final.flags.writeable and final.flags.c_contiguous
        assert final.tobytes() == later.tobytes() and not np.shares_memory(final, later)
    assert (snap.text, snap.finish_reason, snap.meta_info, snap.events, snap.mode, snap.completion_tokens) == (
        result.text,
        result.finish_reason,
        result.meta_info,
        result.events,
        result.mode,
        result.completion_tokens,
    )
    result.token_ids[:] = -1
    result.meta_info["id"] = "changed"
    assert snap.token_ids.tolist() == list(GEN.token_ids) and snap.meta_info["id"] == "api"


def test_snapshot_before_any_input(impl: ModuleType) -> None:
    snap = impl.StreamAccumulator("incremental").snapshot()
    assert snap.token_ids.tolist() == [] and snap.token_ids.dtype == np.int32
    assert snap.finish_reason is None and not snap.finished
    assert snap.completion_tokens == 0 and snap.events == 0
    assert snap.text is None and snap.top_p_token_ids is None and snap.routed_experts is None
    assert snap.mode == "incremental"


def test_accumulate_equals_feed_and_finish(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator("incremental", expert_shape=(2, 2), max_event_bytes=1 << 20)
    for piece in split_pieces(BODY, [33]):
        acc.feed(piece)
    expected = acc.finish()
    result = impl.accumulate(
        iter(split_pieces(BODY, [33])), mode="incremental", expert_shape=(2, 2), max_event_bytes=1 << 20
    )
    assert result.token_ids.tobytes() == expected.token_ids.tobytes()
    assert result.routed_experts.shape == expected.routed_experts.shape == (16 + 8 - 1, 2, 2)
    assert result.mode == expected.mode == "incremental"
    with pytest.raises(StreamLimitError):
        impl.accumulate([BODY], max_event_bytes=10)
    with pytest.raises(TypeError):
        impl.accumulate(pieces=[BODY])


def test_accumulate_raises_truncation(impl: ModuleType) -> None:
    with pytest.raises(StreamTruncatedError):
        impl.accumulate([BODY[:200]])
    with pytest.raises(StreamTruncatedError):
        impl.accumulate([])


# ---- kept errors ----------------------------------------------------------------------------


def test_feed_after_error_reraises_the_same_error(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    with pytest.raises(StreamFormatError) as first:
        acc.feed(b"data: {nope}\n\n")
    for call in (lambda: acc.feed(BODY), lambda: acc.feed(b""), acc.finish):
        with pytest.raises(StreamFormatError) as again:
            call()
        assert type(again.value) is type(first.value) and str(again.value) == str(first.value)
        assert again.value.event_index == first.value.event_index == 0
    assert acc.snapshot().token_ids.tolist() == []


def test_length_error_attributes_survive_pickling(impl: ModuleType) -> None:
    gen = synthetic_generation("pickle", 4)
    acc = impl.StreamAccumulator("cumulative")
    acc.feed(_data(normal_event(gen, INC, 0, 1, first=True)))
    with pytest.raises(StreamLengthError) as info:
        acc.feed(_data(normal_event(gen, INC, 1, 3)))
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is StreamLengthError and str(copy) == str(info.value)
    assert (copy.mode, copy.expected, copy.actual, copy.event_index) == (
        info.value.mode,
        info.value.expected,
        info.value.actual,
        info.value.event_index,
    )
