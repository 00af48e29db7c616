"""Top-p replay arrays (docs/core.md "Top-p replay"): snapshot replaces, delta rows append, errors."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pybase64
import pytest

from fastaccum.emulator.writer import (
    WireOptions,
    echo_event,
    encode_int32,
    normal_event,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import StreamFormatError, StreamLengthError

INC = WireOptions(incremental=True)
CUM = WireOptions()
IDS, OFFSETS = "top_p_token_ids", "top_p_token_offsets"


def _fields(rows: Sequence[Sequence[int]], prefix: str = "top_p_token") -> dict[str, str]:
    offsets = np.cumsum([0] + [len(r) for r in rows])
    return {f"{prefix}_ids": encode_int32([t for r in rows for t in r]), f"{prefix}_offsets": encode_int32(offsets)}


def _plain_events(gen, opts: WireOptions, points: Sequence[int]) -> list[dict[str, Any]]:
    """Events without any top-p keys (the terminal one's are removed too)."""
    events = list(stream_events(gen, opts, points=points))
    for event in events:
        for key in list(event["meta_info"]):
            if key.startswith("top_p_"):
                del event["meta_info"][key]
    return events


def _with_rows(gen, opts: WireOptions, points: Sequence[int], shape: str) -> list[dict[str, Any]]:
    """Events carrying top-p as ``snapshot`` (full CSR every event) or ``delta`` (this event's rows)."""
    events = _plain_events(gen, opts, points)
    prev = 0
    for event, end in zip(events, points):
        rows = gen.top_p_rows[:end] if shape == "snapshot" else gen.top_p_rows[prev:end]
        event["meta_info"].update(_fields(rows))
        prev = end
    return events


def _expected(gen, n: int) -> tuple[list[int], list[int]]:
    rows = gen.top_p_rows[:n]
    return [t for r in rows for t in r], np.cumsum([0] + [len(r) for r in rows]).tolist()


def _check(result, gen, n: int) -> None:
    ids, offsets = _expected(gen, n)
    assert result.top_p_token_ids.dtype == np.int32 and result.top_p_token_offsets.dtype == np.int32
    assert result.top_p_token_ids.tolist() == ids
    assert result.top_p_token_offsets.tolist() == offsets
    assert len(result.top_p_token_offsets) == len(result.token_ids) + 1


def _run(impl: ModuleType, events, **kwargs):
    return impl.accumulate(split_pieces(stream_bytes(events), [777]), **kwargs)


def _data(event) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


# ---- valid shapes ---------------------------------------------------------------------------


@pytest.mark.parametrize("interval", [1, 20])
@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_terminal_only_full_csr(impl: ModuleType, opts: WireOptions, interval: int) -> None:
    gen = synthetic_generation("topp", 90, top_p=True)
    events = list(stream_events(gen, opts, interval=interval))
    assert IDS in events[-1]["meta_info"] and IDS not in events[0]["meta_info"]
    result = _run(impl, events)
    _check(result, gen, 90)
    assert IDS not in result.meta_info and OFFSETS not in result.meta_info


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_historical_full_arrays_on_every_event_replace(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("topp-hist", 40, top_p=True)
    points = [1, 2, 5, 13, 14, 30, 40]
    events = _with_rows(gen, opts, points, "snapshot")
    acc = impl.StreamAccumulator()
    for event, end in zip(events, points):
        acc.feed(_data(event))
        _check(acc.snapshot(), gen, end)
    _check(acc.finish(), gen, 40)


def test_delta_rows_append_incremental(impl: ModuleType) -> None:
    gen = synthetic_generation("topp-delta", 40, top_p=True)
    points = [1, 2, 5, 13, 14, 30, 40]
    events = _with_rows(gen, INC, points, "delta")
    acc = impl.StreamAccumulator()
    for event, end in zip(events, points):
        acc.feed(_data(event))
        _check(acc.snapshot(), gen, end)  # offsets rebased onto the rows already held
    _check(acc.finish(), gen, 40)


def test_delta_rows_append_cumulative(impl: ModuleType) -> None:
    # Only the first two events and the terminal one are parsed fully in cumulative mode, so the
    # delta shape is checked on a three-event stream (no superseded events to skip).
    gen = synthetic_generation("topp-delta-cum", 12, top_p=True)
    points = [3, 7, 12]
    _check(_run(impl, _with_rows(gen, CUM, points, "delta")), gen, 12)


def test_deltas_then_terminal_snapshot(impl: ModuleType) -> None:
    gen = synthetic_generation("topp-mix", 20, top_p=True)
    points = [1, 5, 9, 20]
    events = _with_rows(gen, INC, points, "delta")
    events[-1]["meta_info"].update(_fields(gen.top_p_rows[:20]))
    _check(_run(impl, events), gen, 20)


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_kept_aliases(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("topp-alias", 25, top_p=True)
    events = _plain_events(gen, opts, [1, 10, 25])
    events[-1]["meta_info"].update(_fields(gen.top_p_rows, prefix="top_p_kept_token"))
    result = _run(impl, events)
    _check(result, gen, 25)
    assert not any(key.startswith("top_p_") for key in result.meta_info)


def test_zero_token_events_need_no_rows(impl: ModuleType) -> None:
    gen = synthetic_generation("topp-zero", 6, top_p=True)
    events = _with_rows(gen, INC, [2, 4], "delta")
    events[-1]["meta_info"]["finish_reason"] = None
    empty = normal_event(gen, INC, 4, 4)  # adds nothing, carries no top-p: fine
    terminal = normal_event(gen, INC, 4, 6, terminal=True)
    terminal["meta_info"].update(_fields(gen.top_p_rows[4:6]))
    _check(_run(impl, events + [empty, terminal]), gen, 6)


def test_zero_rows_for_zero_tokens(impl: ModuleType) -> None:
    gen = synthetic_generation("topp-zero-rows", 3, top_p=True)
    events = _with_rows(gen, INC, [3], "delta")
    events[0]["meta_info"]["finish_reason"] = None
    terminal = normal_event(gen, INC, 3, 3, terminal=True)
    terminal["meta_info"].update(_fields([]))  # ids "", offsets [0]
    _check(_run(impl, events + [terminal]), gen, 3)


def test_echo_snapshot_rows_replace(impl: ModuleType) -> None:
    gen = synthetic_generation("topp-echo", 9, top_p=True)
    events = _with_rows(gen, INC, [1, 4], "delta")
    events[-1]["meta_info"]["finish_reason"] = None
    events.append(echo_event(gen, INC, 9))
    _check(_run(impl, events), gen, 9)


def test_snapshot_without_top_p_reports_none(impl: ModuleType) -> None:
    gen = synthetic_generation("topp-none", 5, top_p=True)
    acc = impl.StreamAccumulator()
    acc.feed(_data(list(stream_events(gen, INC))[0]))
    snap = acc.snapshot()
    assert snap.top_p_token_ids is None and snap.top_p_token_offsets is None


# ---- errors ---------------------------------------------------------------------------------


def _terminal_with(gen, opts: WireOptions, n: int, **meta: Any) -> list[dict[str, Any]]:
    events = _plain_events(gen, opts, [1, n])
    events[-1]["meta_info"].update(meta)
    return events


GOOD_IDS = encode_int32([5, 6, 7])
BAD_FORMAT_CASES = {
    "ids-without-offsets": {IDS: GOOD_IDS},
    "offsets-without-ids": {OFFSETS: encode_int32([0, 1, 2, 3])},
    "kept-ids-without-offsets": {"top_p_kept_token_ids": GOOD_IDS},
    "undecodable-ids": {IDS: "!!!!", OFFSETS: encode_int32([0, 1, 2, 3])},
    "undecodable-offsets": {IDS: GOOD_IDS, OFFSETS: "AAAA@"},
    "bad-padding": {IDS: GOOD_IDS[:-1], OFFSETS: encode_int32([0, 1, 2, 3])},
    "not-a-multiple-of-4": {
        IDS: pybase64.b64encode(b"\x01\x00\x00\x00\x02\x00").decode(),
        OFFSETS: encode_int32([0, 1, 1, 1]),
    },
    "offsets-not-from-0": {IDS: GOOD_IDS, OFFSETS: encode_int32([1, 2, 3, 3])},
    "offsets-decrease": {IDS: GOOD_IDS, OFFSETS: encode_int32([0, 2, 1, 3])},
    "offsets-end-short": {IDS: GOOD_IDS, OFFSETS: encode_int32([0, 1, 2, 2])},
    "offsets-end-long": {IDS: GOOD_IDS, OFFSETS: encode_int32([0, 1, 2, 4])},
    "offsets-empty": {IDS: "", OFFSETS: ""},
    "ids-not-a-string": {IDS: [5, 6, 7], OFFSETS: encode_int32([0, 1, 2, 3])},
    "offsets-null": {IDS: GOOD_IDS, OFFSETS: None},
}


@pytest.mark.parametrize("case", list(BAD_FORMAT_CASES))
def test_malformed_top_p_is_a_format_error(impl: ModuleType, case: str) -> None:
    gen = synthetic_generation("topp-bad", 3)
    events = _terminal_with(gen, INC, 3, **BAD_FORMAT_CASES[case])
    acc = impl.StreamAccumulator()
    acc.feed(_data(events[0]))
    with pytest.raises(StreamFormatError, match="event 1.*top_p") as info:
        acc.feed(_data(events[1]))
    assert info.value.event_index == 1
    snap = acc.snapshot()
    assert snap.token_ids.tolist() == list(gen.token_ids[:1]) and snap.top_p_token_ids is None


@pytest.mark.parametrize("rows", [1, 4], ids=lambda r: f"{r}rows")
def test_row_count_neither_new_nor_all_tokens(impl: ModuleType, rows: int) -> None:
    # 3 tokens held after the event, 2 of them new: 1 or 4 rows fit neither shape.
    gen = synthetic_generation("topp-rows", 3)
    events = _terminal_with(gen, INC, 3, **_fields([[1]] * rows))
    with pytest.raises(StreamLengthError, match="event 1") as info:
        _run(impl, events)
    assert info.value.event_index == 1


def test_delta_rows_when_earlier_tokens_have_none(impl: ModuleType) -> None:
    # 2 new rows for 2 new tokens, but the token held before has no row: neither shape fits.
    gen = synthetic_generation("topp-gap", 3, top_p=True)
    events = _terminal_with(gen, INC, 3, **_fields(gen.top_p_rows[1:3]))
    with pytest.raises(StreamLengthError, match="event 1"):
        _run(impl, events)


def test_tokens_without_top_p_after_top_p_was_seen(impl: ModuleType) -> None:
    gen = synthetic_generation("topp-missing", 6, top_p=True)
    events = _with_rows(gen, INC, [2, 4], "delta")
    events[-1]["meta_info"]["finish_reason"] = None
    terminal = normal_event(gen, INC, 4, 6, terminal=True)
    for key in (IDS, OFFSETS):
        del terminal["meta_info"][key]
    acc = impl.StreamAccumulator()
    acc.feed(_data(events[0]) + _data(events[1]))
    with pytest.raises(StreamFormatError, match="event 2"):
        acc.feed(_data(terminal))
    _check(acc.snapshot(), gen, 4)
