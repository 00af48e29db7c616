"""Malformed input: the exact error class, a message fragment, and the prefix kept by snapshot()."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any, NamedTuple

import orjson
import pytest

from fastaccum.emulator.writer import DONE, WireOptions, error_event, normal_event, synthetic_generation
from fastaccum.errors import (
    ServerError,
    StreamError,
    StreamFormatError,
    StreamLengthError,
    StreamLimitError,
    StreamTruncatedError,
)

INC = WireOptions(incremental=True, logprob_text=True)
GEN = synthetic_generation("bad", 6)
PREFIX = [normal_event(GEN, INC, 0, 1, first=True), normal_event(GEN, INC, 1, 3)]
HELD = 3  # tokens held after the prefix; the bad event is event 2


def _event() -> dict[str, Any]:
    """A valid incremental event 2 (tokens 3 and 4), to be spoiled."""
    return normal_event(GEN, INC, 3, 5)


def _mutated(change: Callable[[dict[str, Any]], Any]) -> bytes:
    event = _event()
    change(event)
    return orjson.dumps(event)


def _meta(key: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda e: e["meta_info"].__setitem__(key, value)


def _triple(index: int, value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(e: dict[str, Any]) -> None:
        e["meta_info"]["output_token_logprobs"][0][index] = value

    return change


def _both_ids(value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(e: dict[str, Any]) -> None:
        e["output_ids"][0] = value
        e["meta_info"]["output_token_logprobs"][0][1] = value

    return change


def _drop_logprobs(e: dict[str, Any]) -> None:
    del e["meta_info"]["output_token_logprobs"], e["meta_info"]["output_token_logprobs_length"]


class Case(NamedTuple):
    data: bytes
    error: type[StreamError]
    fragment: str


FORMAT, LENGTH = StreamFormatError, StreamLengthError
CASES: dict[str, Case] = {
    # ---- not a JSON object
    "not-json": Case(b"hello", FORMAT, "JSON"),
    "truncated-json": Case(b'{"text":"a","output_ids":[1', FORMAT, "JSON"),
    "invalid-utf8": Case(b'{"text":"\xff\xfe","output_ids":[],"meta_info":{}}', FORMAT, "JSON"),
    "nan-literal": Case(_mutated(_triple(0, 0.0)).replace(b"[[0.0,", b"[[NaN,"), FORMAT, "JSON"),
    "infinite-number": Case(_mutated(_triple(0, 0.0)).replace(b"[[0.0,", b"[[1e400,"), FORMAT, "JSON"),
    "empty-data": Case(b"", FORMAT, "JSON"),
    "trailing-garbage": Case(_mutated(lambda e: None) + b"x", FORMAT, "JSON"),
    "json-array": Case(b"[1,2]", FORMAT, "object"),
    "json-string": Case(b'"text"', FORMAT, "object"),
    "json-number": Case(b"42", FORMAT, "object"),
    "json-null": Case(b"null", FORMAT, "object"),
    # ---- envelope
    "no-meta-info": Case(_mutated(lambda e: e.pop("meta_info")), FORMAT, "meta_info"),
    "meta-info-array": Case(_mutated(lambda e: e.__setitem__("meta_info", [])), FORMAT, "meta_info"),
    "meta-info-null": Case(_mutated(lambda e: e.__setitem__("meta_info", None)), FORMAT, "meta_info"),
    "batch-index": Case(_mutated(lambda e: e.__setitem__("index", 0)), FORMAT, "index"),
    # ---- output_ids
    "output-ids-string": Case(_mutated(lambda e: e.__setitem__("output_ids", "12")), FORMAT, "output_ids"),
    "output-ids-float": Case(_mutated(lambda e: e["output_ids"].__setitem__(0, 1.0)), FORMAT, "output_ids"),
    "output-ids-bool": Case(_mutated(lambda e: e["output_ids"].__setitem__(0, True)), FORMAT, "output_ids"),
    "output-ids-disagree": Case(
        _mutated(lambda e: e["output_ids"].__setitem__(1, e["output_ids"][1] + 1)), FORMAT, "output_ids"
    ),
    "output-ids-shorter": Case(_mutated(lambda e: e["output_ids"].pop()), FORMAT, "output_ids"),
    # ---- token ids and logprob triples
    "id-negative": Case(_mutated(_both_ids(-1)), FORMAT, "-1"),
    "id-2-pow-31": Case(_mutated(_both_ids(2**31)), FORMAT, "2147483648"),
    "id-2-pow-64": Case(_mutated(_both_ids(2**64 - 1)), FORMAT, "18446744073709551615"),
    "id-2-pow-63-logprobs-only": Case(
        _mutated(lambda e: (e.pop("output_ids"), _triple(1, 2**63)(e))), FORMAT, "9223372036854775808"
    ),
    "id-float": Case(_mutated(_triple(1, 5.0)), FORMAT, "output_token_logprobs"),
    "id-null": Case(_mutated(_triple(1, None)), FORMAT, "output_token_logprobs"),
    "logprob-string": Case(_mutated(_triple(0, "-0.5")), FORMAT, "output_token_logprobs"),
    "logprob-bool": Case(_mutated(_triple(0, False)), FORMAT, "output_token_logprobs"),
    "logprob-text-number": Case(_mutated(_triple(2, 7)), FORMAT, "output_token_logprobs"),
    "triple-too-short": Case(
        _mutated(lambda e: e["meta_info"]["output_token_logprobs"][0].pop(1)), FORMAT, "output_token_logprobs"
    ),
    "triple-too-long": Case(
        _mutated(lambda e: e["meta_info"]["output_token_logprobs"][0].append(None)), FORMAT, "output_token_logprobs"
    ),
    "triple-not-a-list": Case(
        _mutated(lambda e: e["meta_info"]["output_token_logprobs"].__setitem__(0, {"a": 1})),
        FORMAT,
        "output_token_logprobs",
    ),
    "logprobs-not-a-list": Case(_mutated(_meta("output_token_logprobs", "[]")), FORMAT, "output_token_logprobs"),
    "logprobs-switched-off": Case(_mutated(_drop_logprobs), FORMAT, "output_token_logprobs"),
    # ---- numbers in meta_info
    "completion-tokens-negative": Case(_mutated(_meta("completion_tokens", -5)), FORMAT, "completion_tokens"),
    "completion-tokens-string": Case(_mutated(_meta("completion_tokens", "5")), FORMAT, "completion_tokens"),
    "completion-tokens-bool": Case(_mutated(_meta("completion_tokens", True)), FORMAT, "completion_tokens"),
    "completion-tokens-float": Case(_mutated(_meta("completion_tokens", 5.0)), FORMAT, "completion_tokens"),
    "logprobs-length-string": Case(
        _mutated(_meta("output_token_logprobs_length", "5")), FORMAT, "output_token_logprobs_length"
    ),
    "prompt-tokens-negative": Case(_mutated(_meta("prompt_tokens", -1)), FORMAT, "prompt_tokens"),
    "prompt-tokens-float": Case(_mutated(_meta("prompt_tokens", 16.5)), FORMAT, "prompt_tokens"),
    "finish-reason-string": Case(_mutated(_meta("finish_reason", "stop")), FORMAT, "finish_reason"),
    "finish-reason-array": Case(_mutated(_meta("finish_reason", ["stop"])), FORMAT, "finish_reason"),
    "finish-reason-false": Case(_mutated(_meta("finish_reason", False)), FORMAT, "finish_reason"),
    "text-number": Case(_mutated(lambda e: e.__setitem__("text", 5)), FORMAT, "text"),
    "text-array": Case(_mutated(lambda e: e.__setitem__("text", ["a"])), FORMAT, "text"),
    # ---- lengths
    "totals-disagree": Case(_mutated(_meta("completion_tokens", 6)), LENGTH, "completion_tokens"),
    # The log-probs' count fits the tokens held; only its disagreement with completion_tokens is wrong.
    "totals-disagree-below": Case(_mutated(_meta("completion_tokens", 4)), LENGTH, "completion_tokens"),
    "cumulative-event": Case(
        orjson.dumps(normal_event(GEN, WireOptions(logprob_text=True), 0, 5)), LENGTH, "incremental"
    ),
    "total-too-small": Case(
        _mutated(lambda e: [_meta(k, 4)(e) for k in ("completion_tokens", "output_token_logprobs_length")]), LENGTH, "4"
    ),
    # ---- base64 arrays
    "top-p-undecodable": Case(
        _mutated(lambda e: e["meta_info"].update(top_p_token_ids="@@@@", top_p_token_offsets="AAAAAA==")),
        FORMAT,
        "top_p_token_ids",
    ),
    "routed-experts-undecodable": Case(_mutated(_meta("routed_experts", "A")), FORMAT, "routed_experts"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_malformed_event(impl: ModuleType, name: str) -> None:
    case = CASES[name]
    acc = impl.StreamAccumulator()
    for event in PREFIX:
        acc.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    with pytest.raises(case.error) as info:
        acc.feed(b"data: " + case.data + b"\n\n")
    exc = info.value
    assert type(exc) is case.error
    assert case.fragment in str(exc), str(exc)
    assert exc.event_index == 2 and str(exc).startswith("event 2")
    _assert_prefix_kept(acc)
    _assert_error_is_kept(acc, exc)


def _assert_prefix_kept(acc) -> None:
    snap = acc.snapshot()
    assert snap.token_ids.tolist() == list(GEN.token_ids[:HELD])
    assert snap.logprobs.tolist() == list(GEN.logprobs[:HELD])
    assert snap.text == GEN.text(0, HELD)
    assert snap.completion_tokens == HELD
    assert snap.finish_reason is None and not acc.finished
    assert snap.top_p_token_ids is None and snap.routed_experts is None


def _assert_error_is_kept(acc, exc: StreamError) -> None:
    for again in (lambda: acc.feed(b""), lambda: acc.feed(b"data: " + orjson.dumps(_event()) + b"\n\n"), acc.finish):
        with pytest.raises(type(exc)) as info:
            again()
        assert str(info.value) == str(exc) and info.value.event_index == exc.event_index


def test_at_least_25_distinct_malformed_inputs() -> None:
    assert len({case.data for case in CASES.values()}) >= 25


# ---- server errors --------------------------------------------------------------------------


@pytest.mark.parametrize("code", [400, 503])
def test_error_event_object(impl: ModuleType, code: int) -> None:
    acc = impl.StreamAccumulator()
    for event in PREFIX:
        acc.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    message = "The input (40000 tokens) is longer than the model's context length (32768 tokens)."
    with pytest.raises(ServerError) as info:
        acc.feed(b"data: " + orjson.dumps(error_event(message, code)) + b"\n\n" + DONE)
    exc = info.value
    assert type(exc) is ServerError
    assert exc.status == code and exc.message == message and exc.event_index == 2
    assert message in str(exc)
    _assert_prefix_kept(acc)
    _assert_error_is_kept(acc, exc)


def test_error_event_string(impl: ModuleType) -> None:
    with pytest.raises(ServerError) as info:
        impl.accumulate([b'data: {"error":"rid already exists"}\n\n', DONE])
    exc = info.value
    assert exc.status is None and exc.message == "rid already exists" and exc.event_index == 0
    assert "rid already exists" in str(exc)


def test_error_event_as_first_and_only_event_before_done(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    with pytest.raises(ServerError):
        acc.feed(b"data: " + orjson.dumps(error_event("bad params")) + b"\n\n")
    snap = acc.snapshot()
    assert snap.token_ids.tolist() == [] and snap.events <= 1


def test_error_key_wins_over_meta_info(impl: ModuleType) -> None:
    event = normal_event(GEN, INC, 0, 6, terminal=True, first=True)
    event["error"] = {"message": "late failure", "code": 500}
    with pytest.raises(ServerError, match="late failure") as info:
        impl.accumulate([b"data: " + orjson.dumps(event) + b"\n\n"])
    assert info.value.status == 500


# ---- stream-level malformations -------------------------------------------------------------


def _terminal_stream() -> bytes:
    events = PREFIX + [normal_event(GEN, INC, 3, 6, terminal=True)]
    return b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)


def test_early_done_is_truncation(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    for event in PREFIX:
        acc.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    with pytest.raises(StreamTruncatedError, match=r"\[DONE\]") as info:
        acc.feed(DONE)
    assert info.value.event_index == 2
    _assert_prefix_kept(acc)
    _assert_error_is_kept(acc, info.value)


def test_missing_terminal_is_truncation(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    for event in PREFIX:
        acc.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    with pytest.raises(StreamTruncatedError) as info:
        acc.finish()
    _assert_prefix_kept(acc)
    with pytest.raises(StreamTruncatedError) as again:
        acc.finish()
    assert str(again.value) == str(info.value)


def test_finish_with_no_input_is_truncation(impl: ModuleType) -> None:
    with pytest.raises(StreamTruncatedError):
        impl.StreamAccumulator().finish()


@pytest.mark.parametrize(
    "extra",
    [orjson.dumps(normal_event(GEN, INC, 6, 6, terminal=True)), b'{"error":"after"}', b"nonsense"],
    ids=["another-terminal", "error", "nonsense"],
)
def test_data_after_the_terminal_event(impl: ModuleType, extra: bytes) -> None:
    acc = impl.StreamAccumulator()
    acc.feed(_terminal_stream())
    assert acc.finished
    with pytest.raises(StreamFormatError, match="event 3") as info:
        acc.feed(b"data: " + extra + b"\n\n")
    assert info.value.event_index == 3
    snap = acc.snapshot()
    assert snap.token_ids.tolist() == list(GEN.token_ids) and snap.finished


def test_oversized_event(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator(max_event_bytes=600)
    for event in PREFIX:
        acc.feed(b"data: " + orjson.dumps(event) + b"\n\n")
    big = _mutated(_meta("padding", "x" * 1000))
    with pytest.raises(StreamLimitError, match="max_event_bytes=600") as info:
        acc.feed(b"data: " + big + b"\n\n")
    assert info.value.event_index == 2
    _assert_prefix_kept(acc)
    _assert_error_is_kept(acc, info.value)


def test_logprobs_switched_on(impl: ModuleType) -> None:
    plain = WireOptions(incremental=True, return_logprob=False)
    acc = impl.StreamAccumulator()
    acc.feed(b"data: " + orjson.dumps(normal_event(GEN, plain, 0, 2, first=True)) + b"\n\n")
    with pytest.raises(StreamFormatError, match="output_token_logprobs"):
        acc.feed(b"data: " + orjson.dumps(normal_event(GEN, INC, 2, 4)) + b"\n\n")
    assert acc.snapshot().token_ids.tolist() == list(GEN.token_ids[:2])
    assert acc.snapshot().logprobs is None


@pytest.mark.parametrize("value", [-1, 2**31, 1.5, True, "3"], ids=repr)
def test_output_ids_out_of_range_without_logprobs(impl: ModuleType, value: Any) -> None:
    plain = WireOptions(incremental=True, return_logprob=False)
    event = normal_event(GEN, plain, 0, 2, first=True)
    event["output_ids"][1] = value
    with pytest.raises(StreamFormatError, match="output_ids"):
        impl.accumulate([b"data: " + orjson.dumps(event) + b"\n\n"])
