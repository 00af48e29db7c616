"""Modes and lengths (docs/core.md): readings, auto detection, mismatches, the cumulative light path."""

from __future__ import annotations

import dataclasses
import random
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest

from fastaccum.emulator.writer import (
    DONE,
    WireOptions,
    emission_points,
    error_event,
    normal_event,
    split_pieces,
    sse,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import ServerError, StreamFormatError, StreamLengthError

INC = WireOptions(incremental=True)
CUM = WireOptions()


def _mode_of(opts: WireOptions) -> str:
    return "incremental" if opts.incremental else "cumulative"


def _data(event: dict[str, Any] | bytes) -> bytes:
    raw = event if isinstance(event, bytes) else orjson.dumps(event)
    return b"data: " + raw + b"\n\n"


def _feed_all(acc, blobs) -> None:
    for blob in blobs:
        acc.feed(blob)


def _events(gen, opts, **kwargs) -> list[dict[str, Any]]:
    return list(stream_events(gen, opts, **kwargs))


def check_prefix(result, gen, opts: WireOptions, n: int, *, final: bool, expert_shape=None) -> None:
    """``result`` holds exactly the first ``n`` tokens of ``gen`` as ``opts`` put them on the wire."""
    assert result.token_ids.dtype == np.int32
    assert result.token_ids.tolist() == list(gen.token_ids[:n])
    assert result.completion_tokens == n
    if result.events == 0:  # nothing seen yet: no logprobs, no text
        assert result.logprobs is None and result.text is None
        assert result.finish_reason is None
        return
    if opts.return_logprob:
        expected = np.array([np.nan if x is None else x for x in gen.logprobs[:n]], dtype=np.float64)
        assert result.logprobs is not None and result.logprobs.dtype == np.float64
        assert result.logprobs.tobytes() == expected.tobytes()
    else:
        assert result.logprobs is None
    assert result.text == (None if opts.skip_tokenizer_init else gen.text(0, n))
    if final and gen.top_p_rows is not None and opts.return_logprob:
        rows = gen.top_p_rows[:n]
        assert result.top_p_token_ids.tolist() == [t for r in rows for t in r]
        assert result.top_p_token_offsets.tolist() == np.cumsum([0] + [len(r) for r in rows]).tolist()
        assert result.top_p_token_ids.dtype == result.top_p_token_offsets.dtype == np.int32
    elif result.top_p_token_offsets is not None:  # whatever is held covers the same tokens
        assert len(result.top_p_token_offsets) == n + 1
    else:
        assert result.top_p_token_ids is None
    if final and gen.routed_experts is not None:
        assert result.routed_experts is not None and result.routed_experts.dtype == np.int32
        if expert_shape is not None:
            assert result.routed_experts.shape == gen.routed_experts.shape
        assert result.routed_experts.tobytes() == gen.routed_experts.tobytes()
    else:
        assert result.routed_experts is None
    if final:
        assert result.finish_reason == gen.finish_reason and result.finished
    else:
        assert result.finish_reason is None and not result.finished


# ---- the matrix: both modes x intervals x features x random splits ------------------------

FEATURES: dict[str, dict[str, Any]] = {
    "text": {},
    "no-text": {"opts": {"skip_tokenizer_init": True}},
    "logprob-text": {"opts": {"logprob_text": True}},
    "no-logprobs": {"opts": {"return_logprob": False}},
    "null-logprobs": {"gen": {"null_logprob_every": 7}},
    "top-p": {"gen": {"top_p": True}},
    "experts": {"gen": {"expert_shape": (4, 2)}, "acc": {"expert_shape": (4, 2)}},
    "everything-0.5.15": {
        "opts": {"version": "0.5.15", "logprob_text": True},
        "gen": {"top_p": True, "expert_shape": (3, 2), "null_logprob_every": 5},
    },
}
TOKENS = {1: 50, 20: 200, 64: 300}


@pytest.mark.parametrize("feature", list(FEATURES))
@pytest.mark.parametrize("interval", [1, 20, 64])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_stream_reassembles_exactly(impl: ModuleType, incremental: bool, interval: int, feature: str) -> None:
    spec = FEATURES[feature]
    opts = WireOptions(incremental=incremental, **spec.get("opts", {}))
    gen = synthetic_generation(f"m-{feature}", TOKENS[interval], seed=interval, **spec.get("gen", {}))
    acc_kwargs = spec.get("acc", {})
    events = _events(gen, opts, interval=interval)
    body = stream_bytes(events)
    rng = random.Random(f"{feature}/{interval}/{incremental}")
    sizes = [int(2 ** rng.uniform(0, 16)) for _ in range(200)]
    held_after = (
        np.cumsum([len(e["output_ids"]) for e in events]) if incremental else [len(e["output_ids"]) for e in events]
    )
    for mode in ("auto", _mode_of(opts)):
        acc = impl.StreamAccumulator(mode, **acc_kwargs)
        completed = 0
        for piece in split_pieces(body, sizes):
            completed += acc.feed(piece)
            if rng.random() < 0.2:  # snapshot consistency at random points
                data_events = min(completed, len(events))
                n = int(held_after[data_events - 1]) if data_events else 0
                final = data_events == len(events)
                check_prefix(acc.snapshot(), gen, opts, n, final=final, expert_shape=acc_kwargs.get("expert_shape"))
        result = acc.finish()
        check_prefix(result, gen, opts, len(gen.token_ids), final=True, expert_shape=acc_kwargs.get("expert_shape"))
        assert result.mode == acc.mode == _mode_of(opts)


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_one_byte_pieces(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("one", 12, top_p=True, expert_shape=(2, 2))
    body = stream_bytes(_events(gen, opts, interval=3))
    acc = impl.StreamAccumulator(expert_shape=(2, 2))
    _feed_all(acc, split_pieces(body, [1]))
    check_prefix(acc.finish(), gen, opts, 12, final=True, expert_shape=(2, 2))


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_irregular_emission_points(impl: ModuleType, opts: WireOptions) -> None:
    # Dropped frames (cumulative), multi-token steps and 0.5.15's `% N == 1` rule: any jumps work.
    gen = synthetic_generation("irr", 90)
    for points in ([1, 2, 9, 10, 11, 50, 89, 90], [1, 90], [90], emission_points(90, 7, "0.5.15")):
        result = impl.accumulate([stream_bytes(_events(gen, opts, points=points))])
        check_prefix(result, gen, opts, 90, final=True)


# ---- auto detection -------------------------------------------------------------------------


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_auto_stays_auto_until_an_event_decides(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("auto", 5)
    events = _events(gen, opts)
    acc = impl.StreamAccumulator()
    assert acc.mode == "auto"
    acc.feed(_data(events[0]))
    assert acc.mode == "auto" and acc.snapshot().mode == "auto"
    acc.feed(_data(events[1]))
    assert acc.mode == acc.snapshot().mode == _mode_of(opts)
    _feed_all(acc, [_data(e) for e in events[2:]])
    assert acc.finish().mode == _mode_of(opts)


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_auto_stays_auto_through_events_before_any_token(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("zero", 4)
    zero = normal_event(gen, opts, 0, 0, first=True)
    events = [zero, zero] + _events(gen, opts, points=[2, 3, 4])
    acc = impl.StreamAccumulator()
    for event in events[:3]:
        acc.feed(_data(event))
        assert acc.mode == "auto"
    acc.feed(_data(events[3]))
    assert acc.mode == _mode_of(opts)
    acc.feed(_data(events[4]) + DONE)
    check_prefix(acc.finish(), gen, opts, 4, final=True)


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_single_event_stream_is_reported_as_auto(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("single", 7)
    result = impl.accumulate([stream_bytes(_events(gen, opts, points=[7]))])
    assert result.mode == "auto"
    check_prefix(result, gen, opts, 7, final=True)
    # An explicit mode is kept as given.
    result = impl.accumulate([stream_bytes(_events(gen, opts, points=[7]))], mode=_mode_of(opts))
    assert result.mode == _mode_of(opts)


def test_auto_decides_cumulative_on_a_repeated_event(impl: ModuleType) -> None:
    gen = synthetic_generation("rep", 3)
    first = normal_event(gen, CUM, 0, 2, first=True)
    again = normal_event(gen, CUM, 0, 2)  # 2 listed, 2 reported, 2 held: only cumulative fits
    acc = impl.StreamAccumulator()
    acc.feed(_data(first) + _data(again))
    assert acc.mode == "cumulative"
    acc.feed(_data(normal_event(gen, CUM, 0, 3, terminal=True)) + DONE)
    check_prefix(acc.finish(), gen, CUM, 3, final=True)


def test_auto_decides_incremental_on_a_zero_token_event(impl: ModuleType) -> None:
    gen = synthetic_generation("zinc", 3)
    acc = impl.StreamAccumulator()
    acc.feed(_data(normal_event(gen, INC, 0, 2, first=True)))
    acc.feed(_data(normal_event(gen, INC, 2, 2)))  # 0 listed, 2 reported, 2 held: only incremental
    assert acc.mode == "incremental"
    acc.feed(_data(normal_event(gen, INC, 2, 3, terminal=True)) + DONE)
    check_prefix(acc.finish(), gen, INC, 3, final=True)


# ---- mismatches -----------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [1, 20])
def test_cumulative_stream_into_incremental_accumulator(impl: ModuleType, interval: int) -> None:
    gen = synthetic_generation("mm1", 60)
    events = _events(gen, CUM, interval=interval)
    acc = impl.StreamAccumulator("incremental")
    acc.feed(_data(events[0]))
    reported = 1 + interval
    with pytest.raises(StreamLengthError) as info:
        acc.feed(_data(events[1]))
    exc = info.value
    assert (exc.mode, exc.expected, exc.actual, exc.event_index) == ("incremental", reported, 1 + reported, 1)
    message = str(exc)
    assert "cumulative" in message and "incremental" in message
    assert str(reported) in message and "event 1" in message
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:1])


@pytest.mark.parametrize("interval", [1, 20])
def test_incremental_stream_into_cumulative_accumulator(impl: ModuleType, interval: int) -> None:
    gen = synthetic_generation("mm2", 60)
    events = _events(gen, INC, interval=interval)
    acc = impl.StreamAccumulator("cumulative")
    acc.feed(_data(events[0]))
    reported = 1 + interval
    with pytest.raises(StreamLengthError) as info:
        acc.feed(_data(events[1]))
    exc = info.value
    assert (exc.mode, exc.expected, exc.actual, exc.event_index) == ("cumulative", reported, interval, 1)
    message = str(exc)
    assert "cumulative" in message and "incremental" in message
    assert str(reported) in message and str(interval) in message
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:1])


def test_auto_fails_when_neither_reading_holds(impl: ModuleType) -> None:
    gen = synthetic_generation("neither", 8)
    acc = impl.StreamAccumulator()
    acc.feed(_data(normal_event(gen, INC, 0, 1, first=True)))
    bad = normal_event(gen, INC, 1, 6)  # 5 listed, held 1
    bad["meta_info"]["completion_tokens"] = bad["meta_info"]["output_token_logprobs_length"] = 7
    with pytest.raises(StreamLengthError) as info:
        acc.feed(_data(bad))
    exc = info.value
    assert exc.mode == "auto" and exc.expected == 7 and exc.event_index == 1
    assert "cumulative" in str(exc) and "incremental" in str(exc) and "7" in str(exc)
    assert acc.mode == "auto"
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:1])


def test_decided_cumulative_rejects_an_incremental_terminal_event(impl: ModuleType) -> None:
    gen = synthetic_generation("strict1", 5)
    acc = impl.StreamAccumulator()
    acc.feed(_data(normal_event(gen, CUM, 0, 1, first=True)) + _data(normal_event(gen, CUM, 0, 3)))
    assert acc.mode == "cumulative"
    with pytest.raises(StreamLengthError) as info:
        acc.feed(_data(normal_event(gen, INC, 3, 5, terminal=True)))
    assert info.value.mode == "cumulative" and info.value.event_index == 2
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:3])


def test_decided_incremental_rejects_a_cumulative_event(impl: ModuleType) -> None:
    gen = synthetic_generation("strict2", 5)
    acc = impl.StreamAccumulator()
    acc.feed(_data(normal_event(gen, INC, 0, 1, first=True)) + _data(normal_event(gen, INC, 1, 2)))
    assert acc.mode == "incremental"
    with pytest.raises(StreamLengthError) as info:
        acc.feed(_data(normal_event(gen, CUM, 0, 3)))
    assert info.value.mode == "incremental" and info.value.event_index == 2
    assert info.value.expected == 3 and info.value.actual == 5


def test_cumulative_changed_prefix_is_a_format_error(impl: ModuleType) -> None:
    gen = synthetic_generation("prefix", 4)
    other = synthetic_generation("prefix-other", 4)
    acc = impl.StreamAccumulator("cumulative")
    acc.feed(_data(normal_event(gen, CUM, 0, 2, first=True)))
    with pytest.raises(StreamFormatError, match="event 1"):
        acc.feed(_data(normal_event(other, CUM, 0, 3)))
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:2])


def test_cumulative_changed_prefix_in_the_terminal_event(impl: ModuleType) -> None:
    gen = synthetic_generation("prefix2", 6)
    events = _events(gen, CUM)
    terminal = events[-1]
    terminal["output_ids"][0] = (terminal["output_ids"][0] + 1) % 1000
    terminal["meta_info"]["output_token_logprobs"][0][1] = terminal["output_ids"][0]
    acc = impl.StreamAccumulator()
    _feed_all(acc, [_data(e) for e in events[:-1]])
    with pytest.raises(StreamFormatError, match="event 5"):
        acc.feed(_data(terminal))


def test_cumulative_total_may_not_decrease(impl: ModuleType) -> None:
    gen = synthetic_generation("dec", 6)
    acc = impl.StreamAccumulator("cumulative")
    acc.feed(_data(normal_event(gen, CUM, 0, 3, first=True)))
    with pytest.raises(StreamLengthError, match="event 1"):
        acc.feed(_data(normal_event(gen, CUM, 0, 2)))
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:3])


# ---- the cumulative light path --------------------------------------------------------------


def _cumulative_with(gen, replace: dict[int, bytes], opts: WireOptions = CUM) -> list[bytes]:
    """The stream's event blobs with some events' data replaced by raw bytes."""
    return [
        (b"data: " + replace[i] + b"\n\n") if i in replace else _data(e) for i, e in enumerate(_events(gen, opts))
    ] + [DONE]


LIGHT_GARBAGE = b'{"text":"zz","output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":4}}'


def test_superseded_light_checked_event_is_never_parsed(impl: ModuleType) -> None:
    gen = synthetic_generation("light", 6)
    reference = impl.accumulate([stream_bytes(_events(gen, CUM))])
    for garbage in (
        LIGHT_GARBAGE,
        b'{"output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":4}}',
        b'{"text":1,"meta_info":[],"finish_reason":null,"completion_tokens":0,"completion_tokens":4,]',
    ):
        for mode in ("auto", "cumulative"):
            acc = impl.StreamAccumulator(mode)
            _feed_all(acc, _cumulative_with(gen, {3: garbage}))
            result = acc.finish()
            check_prefix(result, gen, CUM, 6, final=True)
            assert result.meta_info == reference.meta_info


def test_light_checked_total_may_not_decrease(impl: ModuleType) -> None:
    gen = synthetic_generation("light-dec", 6)
    acc = impl.StreamAccumulator()
    blobs = _cumulative_with(gen, {3: LIGHT_GARBAGE.replace(b'tokens":4', b'tokens":2')})
    _feed_all(acc, blobs[:3])
    with pytest.raises(StreamLengthError) as info:
        acc.feed(blobs[3])
    assert info.value.event_index == 3
    assert "3" in str(info.value) and "2" in str(info.value)
    check_prefix(acc.snapshot(), gen, CUM, 3, final=False)


def test_light_checked_total_is_compared_with_the_previous_light_event(impl: ModuleType) -> None:
    gen = synthetic_generation("light-dec2", 6)
    acc = impl.StreamAccumulator()
    blobs = _cumulative_with(gen, {3: LIGHT_GARBAGE.replace(b'tokens":4', b'tokens":10')})
    _feed_all(acc, blobs[:4])  # claims 10: only light-checked, so accepted for now
    with pytest.raises(StreamLengthError) as info:
        acc.feed(blobs[4])  # 5 < 10
    assert info.value.event_index == 4


def test_terminal_total_is_compared_with_the_light_checked_total(impl: ModuleType) -> None:
    long = synthetic_generation("light-dec3", 10)
    blobs = [_data(normal_event(long, CUM, 0, k, first=k == 1)) for k in (1, 2, 3, 10)]
    # The terminal of a 6-token prefix follows a (valid) kept event that held 10 tokens.
    short = synthetic_generation("light-dec3", 6)
    terminal = _data(list(_events(short, CUM, points=[6]))[-1])
    acc = impl.StreamAccumulator()
    _feed_all(acc, blobs)
    with pytest.raises(StreamLengthError) as info:
        acc.feed(terminal)
    assert info.value.event_index == 4
    assert "10" in str(info.value) and "6" in str(info.value)
    assert not acc.finished
    assert len(acc.snapshot().token_ids) == 10


def test_kept_event_error_surfaces_when_the_stream_moves_past_it(impl: ModuleType) -> None:
    gen = synthetic_generation("light-kept", 6)
    blobs = _cumulative_with(gen, {3: LIGHT_GARBAGE})
    del blobs[4]  # the kept garbage (event 3) is followed directly by the terminal
    acc = impl.StreamAccumulator()
    _feed_all(acc, blobs[:4])
    # The garbage does not validate; event 2 was superseded unparsed: event 1 is the verified state.
    assert len(acc.snapshot().token_ids) == 2
    with pytest.raises(StreamFormatError, match="output_ids must be an array") as info:
        acc.feed(blobs[4])
    assert info.value.event_index == 3
    assert not acc.finished


def test_error_event_in_the_middle_is_always_raised(impl: ModuleType) -> None:
    gen = synthetic_generation("light-err", 8)
    acc = impl.StreamAccumulator()
    blobs = _cumulative_with(gen, {5: orjson.dumps(error_event("KV cache pool is full", 503))})
    _feed_all(acc, blobs[:5])
    with pytest.raises(ServerError, match="KV cache pool is full") as info:
        acc.feed(blobs[5])
    assert info.value.status == 503 and info.value.event_index == 5
    check_prefix(acc.snapshot(), gen, CUM, 5, final=False)


@pytest.mark.parametrize(
    "garbage",
    [
        b'{"meta_info":{"finish_reason":null,"completion_tokens":4},"text":"zz","output_ids":"nope"}',
        b' {"text":"zz","output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":4}}',
        b'{ "text":"zz","output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":4}}',
        b'{"text":"zz","output_ids":"nope","meta_info":{"finish_reason":0,"completion_tokens":4}}',
        b'{"text":"zz","output_ids":"nope","meta_info":{"completion_tokens":4}}',
        b'{"text":"zz","output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":"4"}}',
        b'{"text":"zz","output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":4.0}}',
        b'{"text":"zz","output_ids":"nope","meta_info":{"finish_reason":null}}',
        b'{"text":"zz","output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":null}}',
    ],
    ids=[
        "other-first-key",
        "leading-space",
        "space-after-brace",
        "finish-not-null",
        "no-finish-reason",
        "string-total",
        "float-total",
        "no-total",
        "null-total",
    ],
)
def test_events_failing_the_light_check_are_parsed_fully(impl: ModuleType, garbage: bytes) -> None:
    gen = synthetic_generation("full", 6)
    acc = impl.StreamAccumulator()
    blobs = _cumulative_with(gen, {3: garbage})
    _feed_all(acc, blobs[:3])
    with pytest.raises(StreamFormatError, match="event 3"):
        acc.feed(blobs[3])
    check_prefix(acc.snapshot(), gen, CUM, 3, final=False)


def test_snapshot_parses_the_newest_light_checked_event(impl: ModuleType) -> None:
    gen = synthetic_generation("snap", 8, top_p=True)
    events = _events(gen, CUM)
    acc = impl.StreamAccumulator()
    for i, event in enumerate(events[:-1]):
        acc.feed(_data(event))
        check_prefix(acc.snapshot(), gen, CUM, i + 1, final=False)
    acc.feed(_data(events[-1]) + DONE)
    check_prefix(acc.finish(), gen, CUM, 8, final=True)


def test_light_checked_text_and_logprobs_come_from_the_newest_event(impl: ModuleType) -> None:
    # Frames are dropped and superseded: only the newest event's content counts.
    gen = synthetic_generation("newest", 30, null_logprob_every=4)
    opts = dataclasses.replace(CUM, logprob_text=True)
    result = impl.accumulate(split_pieces(stream_bytes(_events(gen, opts, interval=3)), [97]))
    check_prefix(result, gen, opts, 30, final=True)


def test_incremental_validates_every_event(impl: ModuleType) -> None:
    gen = synthetic_generation("inc-all", 6)
    events = _events(gen, INC)
    acc = impl.StreamAccumulator()
    _feed_all(acc, [_data(e) for e in events[:3]])
    garbage = b'{"text":"zz","output_ids":"nope","meta_info":{"finish_reason":null,"completion_tokens":4}}'
    with pytest.raises(StreamFormatError, match="event 3"):
        acc.feed(b"data: " + garbage + b"\n\n")
    check_prefix(acc.snapshot(), gen, INC, 3, final=False)


def test_totals_must_agree_when_both_present(impl: ModuleType) -> None:
    gen = synthetic_generation("agree", 3)
    event = normal_event(gen, INC, 0, 3, terminal=True, first=True)
    event["meta_info"]["output_token_logprobs_length"] = 2
    with pytest.raises(StreamLengthError, match="event 0"):
        impl.accumulate([sse(event)])


def test_snapshot_timing_does_not_change_the_outcome(impl: ModuleType) -> None:
    # A snapshot parses the newest light-checked event; if that event is malformed but later
    # superseded, the stream is still valid, exactly as when no snapshot was taken.
    gen = synthetic_generation("snap-garbage", 6)
    blobs = _cumulative_with(gen, {3: LIGHT_GARBAGE})
    acc = impl.StreamAccumulator()
    for blob in blobs:
        acc.feed(blob)
        snap = acc.snapshot()
        assert len(snap.token_ids) == snap.completion_tokens
        assert snap.token_ids.tolist() == list(gen.token_ids[: len(snap.token_ids)])
    check_prefix(acc.finish(), gen, CUM, 6, final=True)


# ---- where tokens and totals come from ------------------------------------------------------


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_tokens_from_logprobs_when_output_ids_absent(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("no-ids", 20)
    events = _events(gen, opts, interval=3)
    for event in events:
        del event["output_ids"]
    check_prefix(impl.accumulate([stream_bytes(events)]), gen, opts, 20, final=True)


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_total_from_logprobs_length_when_completion_tokens_absent(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("no-total", 20)
    events = _events(gen, opts, interval=3)
    for event in events:
        del event["meta_info"]["completion_tokens"]
    check_prefix(impl.accumulate([stream_bytes(events)]), gen, opts, 20, final=True)
    # ... and the reported total is checked against the listed tokens as usual.
    events[1]["meta_info"]["output_token_logprobs_length"] += 1
    with pytest.raises(StreamLengthError, match="event 1"):
        impl.accumulate([stream_bytes(events)], mode=_mode_of(opts))
