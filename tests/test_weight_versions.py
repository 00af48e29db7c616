"""Each token's weight version (``StreamResult.weight_version_spans``), on both twins: runs of
``(start, end, version)`` over the token indices, end exclusive, every token in exactly one.

SGLang puts the version it holds into every event's ``meta_info.weight_version`` and its own
record of the request into the finishing event's ``weight_versions`` spans; vLLM puts spans on
the finishing chunk only. Until the end the events' versions say (a cut stream keeps them); the
finishing record then replaces them. A stream that never says a version has none (None)."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
import pytest

import fastaccum
from fastaccum.emulator import writer_vllm
from fastaccum.emulator.writer import WireOptions, split_pieces, stream_bytes, stream_events, synthetic_generation

N = 40


def sglang_events(versions: dict[int, str], *, incremental: bool, interval: int, record: Any = "spans") -> list[Any]:
    """A stream of N tokens whose events say the version in force at their last token
    (``versions``: first token -> version); its finishing event carries ``record`` (the spans
    the versions make, unless given)."""
    gen = synthetic_generation("wv", N, prompt_tokens=5)
    events = list(stream_events(gen, WireOptions(incremental=incremental), interval=interval))
    total = 0
    for event in events:
        total = event["meta_info"]["completion_tokens"]
        event["meta_info"]["weight_version"] = version_at(versions, total - 1)
    meta = events[-1]["meta_info"]
    if record == "spans":
        meta["weight_versions"] = [{"version": v, "start": a, "end": b} for a, b, v in spans_of(versions, N)]
    elif record is None:
        meta.pop("weight_versions", None)
    else:
        meta["weight_versions"] = record
    return events


def labels_of(events: list[Any]) -> tuple[tuple[int, int, str], ...]:
    """The runs the events' own versions make: each event's new tokens take its version."""
    runs: list[tuple[int, int, str]] = []
    held = 0
    for event in events:
        total, version = event["meta_info"]["completion_tokens"], event["meta_info"]["weight_version"]
        if total > held:
            if runs and runs[-1][2] == version:
                runs[-1] = (runs[-1][0], total, version)
            else:
                runs.append((held, total, version))
            held = total
    return tuple(runs)


def version_at(versions: dict[int, str], token: int) -> str:
    return versions[max(k for k in versions if k <= max(token, 0))]


def spans_of(versions: dict[int, str], total: int) -> list[tuple[int, int, str]]:
    starts = sorted(versions)
    return [(a, min(b, total), versions[a]) for a, b in zip(starts, [*starts[1:], total]) if a < total]


def read(impl: ModuleType, events: list[Any], **options: Any) -> fastaccum.StreamResult:
    return impl.accumulate(split_pieces(stream_bytes(events), [97]), **options)


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "cumulative"])
@pytest.mark.parametrize("interval", [1, 7])
def test_a_stream_across_a_weight_update_says_which_tokens_ran_under_which_version(
    impl: ModuleType, incremental: bool, interval: int
) -> None:
    versions = {0: "v1", 17: "v2", 30: "v3"}
    result = read(impl, sglang_events(versions, incremental=incremental, interval=interval))
    assert result.weight_version_spans == ((0, 17, "v1"), (17, 30, "v2"), (30, N, "v3"))
    assert result.meta_info["weight_version"] == "v3"


def test_until_the_end_the_events_versions_say_and_a_cut_stream_keeps_them(impl: ModuleType) -> None:
    """Each event's tokens take its version (SGLang labels an event with the version it holds
    when it sends it); the runs are known at every snapshot, for every token seen so far."""
    for incremental in (True, False):
        events = sglang_events({0: "v1", 12: "v2", 21: "v3"}, incremental=incremental, interval=4)
        acc = impl.StreamAccumulator()
        for k, event in enumerate(events[:-1], 1):
            acc.feed(stream_bytes([event], done=False))
            snapshot = acc.snapshot()
            assert snapshot.weight_version_spans == labels_of(events[:k]), k
        assert labels_of(events[:-1])[-1] == (21, 37, "v3")


def test_the_finishing_record_replaces_the_events_labels(impl: ModuleType) -> None:
    """SGLang's events carry the tokenizer's version, which can lag the scheduler's (an update
    whose cache flush failed); the finishing event's spans are the scheduler's own record."""
    record = [{"version": "v1", "start": 0, "end": 20}, {"version": "v2", "start": 20, "end": N}]
    result = read(impl, sglang_events({0: "v1"}, incremental=True, interval=3, record=record))
    assert result.weight_version_spans == ((0, 20, "v1"), (20, N, "v2"))


@pytest.mark.parametrize(
    "record",
    [
        [{"version": "v1", "start": 0, "end": 25}],  # short of the tokens
        [{"version": "v1", "start": 0, "end": 20}, {"version": "v2", "start": 21, "end": N}],  # a gap
        [{"version": 2, "start": 0, "end": N}],
        ["v1"],
        "v1",
        None,
    ],
    ids=["short", "gap", "number", "strings", "string", "absent"],
)
def test_a_finishing_record_that_does_not_cover_the_tokens_leaves_the_events_labels(
    impl: ModuleType, record: Any
) -> None:
    events = sglang_events({0: "v1", 9: "v2"}, incremental=False, interval=1, record=record)
    result = read(impl, events)
    assert result.weight_version_spans == labels_of(events) == ((0, 9, "v1"), (9, N, "v2"))
    if record is not None:
        assert result.meta_info["weight_versions"] == record  # the server's words, as sent


def test_adjacent_equal_versions_merge_and_a_version_without_tokens_leaves_no_run() -> None:
    from fastaccum._core.results import weight_spans

    assert weight_spans([(0, "v1"), (5, "v9"), (5, "v1"), (8, "v2")], 10, None) == ((0, 8, "v1"), (8, 10, "v2"))
    assert weight_spans([(0, "v1")], 0, None) == ()  # no token yet: nothing to say


def test_a_stream_that_says_no_version_has_none(impl: ModuleType) -> None:
    events = sglang_events({0: "v1"}, incremental=True, interval=4, record=None)
    for event in events:
        del event["meta_info"]["weight_version"]
    assert read(impl, events).weight_version_spans is None
    events[3]["meta_info"]["weight_version"] = "v1"  # tokens 0..11 came before any version
    assert read(impl, events).weight_version_spans is None
    events[0]["meta_info"]["weight_version"] = 7  # not a version
    assert read(impl, events).weight_version_spans is None


def test_vllm_says_the_versions_on_its_finishing_chunk_only(impl: ModuleType) -> None:
    gen = synthetic_generation("wv-v", N, prompt_tokens=5)
    spans = [{"version": "default", "start": 0, "end": 23}, {"version": "v2", "start": 23, "end": N}]
    chunks = list(writer_vllm.stream_chunks(gen, shape="0.32", interval=4))
    (finishing,) = [c for c in chunks if c["choices"] and c["choices"][0].get("finish_reason")]
    finishing["choices"][0]["weight_versions"] = spans
    body = writer_vllm.stream_bytes(chunks)
    acc = impl.StreamAccumulator(dialect="vllm")
    acc.feed(body[: body.index(b"data: ", len(body) // 2)])
    assert len(acc.snapshot()) > 0 and acc.snapshot().weight_version_spans is None
    result = impl.accumulate([body], dialect="vllm")
    assert result.weight_version_spans == ((0, 23, "default"), (23, N, "v2"))


def test_a_non_streaming_answer_says_its_versions(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import orjson

    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    last = sglang_events({0: "v1", 30: "v2"}, incremental=False, interval=N)[-1]
    assert fastaccum.parse_response(orjson.dumps(last)).weight_version_spans == ((0, 30, "v1"), (30, N, "v2"))


def test_a_joined_sample_joins_its_versions(impl: ModuleType) -> None:
    first = read(impl, sglang_events({0: "v1", 10: "v2"}, incremental=True, interval=3))
    second = read(impl, sglang_events({0: "v2", 5: "v3"}, incremental=True, interval=3))
    joined = fastaccum.join(first, second, prompt_tokens=5)
    assert joined.weight_version_spans == ((0, 10, "v1"), (10, N + 5, "v2"), (N + 5, 2 * N, "v3"))
    cut = first.__class__(mode="incremental", token_ids=np.arange(3, dtype=np.int32), logprobs=np.zeros(3))
    assert fastaccum.join(first, cut, prompt_tokens=5).weight_version_spans is None  # 3 tokens said none
