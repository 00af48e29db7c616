"""Non-streaming answers (fastaccum.parse_response), on both twins: the answer read by the core
that reads streams equals what the stream of the same generation gives, from engine-written
answers and the writer's; a batch gives one result per request; every bad body is its typed
error; the base64 is decoded from the body's bytes."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest

import fastaccum
from fastaccum import ServerError, StreamFormatError, StreamLengthError, StreamLimitError, StreamTruncatedError
from fastaccum.emulator.writer import (
    WireOptions,
    encode_int32,
    normal_event,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.result import StreamResult

GOLDEN = Path(__file__).resolve().parent / "golden"
CUM = WireOptions()


def same(a: StreamResult, b: StreamResult) -> None:
    """Equal in everything a request's answer holds (not events: a stream has many)."""
    assert a.token_ids.tolist() == b.token_ids.tolist()
    assert (a.logprobs is None) == (b.logprobs is None)
    if a.logprobs is not None and b.logprobs is not None:
        assert np.array_equal(a.logprobs, b.logprobs, equal_nan=True)
    assert a.text == b.text and a.finish_reason == b.finish_reason and a.completion_tokens == b.completion_tokens
    for key in ("routed_experts", "indexer_topk", "top_p_token_ids", "top_p_token_offsets"):
        x, y = getattr(a, key), getattr(b, key)
        assert (x is None) == (y is None), key
        if x is not None:
            assert np.array_equal(x, y), key


def answer_of(gen: Any, opts: WireOptions = CUM) -> bytes:
    """SGLang's non-streaming answer: the terminal event of the cumulative stream, whole."""
    n = len(gen.token_ids)
    event = normal_event(gen, opts, 0, n, terminal=True, finish_reason=gen.finish_reason, first=True)
    return orjson.dumps(event)


def _live_answers() -> list[Any]:
    cases = []
    for manifest in sorted(GOLDEN.glob("live-*/manifest.json")):
        engine = json.loads(manifest.read_text())["engine"]
        for name, entry in json.loads(manifest.read_text())["scenarios"].items():
            if isinstance(entry.get("answer"), dict) and "error" not in entry["answer"]:
                cases.append(pytest.param(manifest.parent, engine, name, entry, id=f"{manifest.parent.name}-{name}"))
    return cases


@pytest.mark.parametrize(("folder", "engine", "name", "entry"), _live_answers())
def test_an_engines_own_answer_reads_as_its_stream_does(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch, folder: Path, engine: str, name: str, entry: dict[str, Any]
) -> None:
    """The live goldens hold each engine's non-streaming answer beside its stream of the same
    request: the two read to the same result (the answer's tokens, log-probs, finish, arrays)."""
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    dialect = "vllm" if engine == "vllm" else "sglang"
    shape = (2, 2) if "routed" in name else None  # the tiny model's (layers, top-k)
    streamed = impl.accumulate([(folder / entry["file"]).read_bytes()], dialect=dialect, expert_shape=shape)
    answer = fastaccum.parse_response(orjson.dumps(entry["answer"]), dialect=dialect, expert_shape=shape)
    assert isinstance(answer, StreamResult)
    same(answer, streamed)


@pytest.mark.parametrize("pieces", [1, 7, 4096], ids=lambda n: f"{n}-byte-pieces")
@pytest.mark.parametrize(
    "features",
    [{}, {"top_p": True}, {"expert_shape": (6, 4)}, {"indexer_shape": (2, 8)}, {"null_logprob_every": 5}],
    ids=["plain", "top-p", "routed", "indexer", "null-logprobs"],
)
def test_a_writer_made_answer_reads_as_its_stream_does(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch, pieces: int, features: dict[str, Any]
) -> None:
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    gen = synthetic_generation("body-1", 300, prompt_tokens=40, **features)
    options = {k: features[k] for k in ("expert_shape", "indexer_shape") if k in features}
    streamed = impl.accumulate([stream_bytes(stream_events(gen, CUM, interval=7))], **options)
    body = answer_of(gen)
    chunks = [body[i : i + pieces] for i in range(0, len(body), pieces)]
    answer = fastaccum.parse_response(chunks, **options)
    assert isinstance(answer, StreamResult) and len(answer) == 300
    same(answer, streamed)
    same(fastaccum.parse_response(memoryview(bytearray(body)), **options), streamed)  # any buffer


def test_a_batch_answer_gives_one_result_per_request_in_order(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    gens = [synthetic_generation(f"batch-{i}", 20 + i, expert_shape=(2, 2)) for i in range(3)]
    body = b"[" + b",".join(answer_of(g) for g in gens) + b"]"
    for size in (1, 3, 64, len(body)):
        results = fastaccum.parse_response([body[i : i + size] for i in range(0, len(body), size)], expert_shape=(2, 2))
        assert isinstance(results, list) and [len(r) for r in results] == [20, 21, 22]
        for gen, result in zip(gens, results):
            assert result.token_ids.tolist() == list(gen.token_ids)
            assert np.array_equal(result.routed_experts, gen.routed_experts)


def test_vllms_n_choices_give_one_result_per_choice_in_index_order(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    entry = json.loads((GOLDEN / "live-vllm-0.32.0-avx512bf16" / "manifest.json").read_text())["scenarios"]
    one = entry["greedy"]["answer"]["choices"][0]
    other = entry["stop_id"]["answer"]["choices"][0]
    body = {**entry["greedy"]["answer"], "choices": [{**other, "index": 1}, {**one, "index": 0}]}
    results = fastaccum.parse_response(orjson.dumps(body), dialect="vllm")
    assert isinstance(results, list)
    assert [r.token_ids.tolist() for r in results] == [one["token_ids"], other["token_ids"]]


def test_a_pretty_printed_answer_reads_the_same(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Line breaks between a JSON answer's tokens (a proxy that re-indents it) are no event's end."""
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    gen = synthetic_generation("pretty", 30, expert_shape=(2, 2))
    pretty = json.dumps(json.loads(answer_of(gen)), indent=2).replace("\n", "\r\n").encode()
    assert b"\r\n" in pretty
    same(
        fastaccum.parse_response(pretty, expert_shape=(2, 2)),
        fastaccum.parse_response(answer_of(gen), expert_shape=(2, 2)),
    )


# ---- bad bodies ----------------------------------------------------------------------------------


def test_a_body_cut_anywhere_is_a_truncation_never_a_result(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    body = answer_of(synthetic_generation("cut", 12, expert_shape=(2, 2), top_p=True))
    for end in range(1, len(body)):
        with pytest.raises((StreamTruncatedError, StreamFormatError)):
            fastaccum.parse_response(body[:end], expert_shape=(2, 2))
    batch = b"[" + body + b"," + body + b"]"
    with pytest.raises(StreamTruncatedError, match="inside its list of answers, after 1"):
        fastaccum.parse_response(batch[: len(body) + 5], expert_shape=(2, 2))
    reader = fastaccum.transport.body.BodyReader(expert_shape=(2, 2))  # what the cut batch still holds
    reader.feed(batch[: len(body) + 5])
    with pytest.raises(StreamTruncatedError) as cut:
        reader.results()
    assert cut.value.event_index == 1 and len(reader.completed) == 1
    same(reader.completed[0], fastaccum.parse_response(body, expert_shape=(2, 2)))


@pytest.mark.parametrize(
    ("body", "error", "message"),
    [
        (b'{"error": {"message": "prompt too long", "code": 400}}', ServerError, "prompt too long"),
        (b'{"error": "The server is busy"}', ServerError, "server is busy"),
        (b"<html><body>502 Bad Gateway</body></html>", StreamFormatError, "an HTML page"),
        (b"data: {}\n\n", StreamFormatError, "an event stream"),
        (b"", StreamTruncatedError, "the body is empty"),
        (b"   \r\n ", StreamTruncatedError, "the body is empty"),
        (b'{"text": "x"} junk', StreamFormatError, "not valid JSON"),
        (b"[1, 2]", StreamFormatError, "element 0 of the answer's list is not an object"),
    ],
    ids=["error-object", "error-string", "html", "sse", "empty", "blank", "junk-after", "list-of-numbers"],
)
def test_a_bad_body_is_its_typed_error(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch, body: bytes, error: type[Exception], message: str
) -> None:
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    with pytest.raises(error, match=message):
        fastaccum.parse_response(body)


def test_counts_that_disagree_and_a_wrong_size_array_are_the_streams_errors(
    impl: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    gen = synthetic_generation("bad", 10, prompt_tokens=4, expert_shape=(2, 2))
    event = json.loads(answer_of(gen))
    lying = {**event, "meta_info": {**event["meta_info"], "completion_tokens": 11}}
    with pytest.raises(StreamLengthError):
        fastaccum.parse_response(orjson.dumps(lying))
    short = {**event, "meta_info": {**event["meta_info"], "routed_experts": encode_int32(np.arange(8))}}
    with pytest.raises(StreamLengthError, match="routed_experts has 8 values"):
        fastaccum.parse_response(orjson.dumps(short), expert_shape=(2, 2))
    broken = {**event, "meta_info": {**event["meta_info"], "routed_experts": "!!!!"}}
    with pytest.raises(StreamFormatError, match="not valid base64"):
        fastaccum.parse_response(orjson.dumps(broken), expert_shape=(2, 2))


def test_max_event_bytes_applies_to_the_body(impl: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fastaccum.transport.body, "StreamAccumulator", impl.StreamAccumulator)
    body = answer_of(synthetic_generation("big", 50))
    with pytest.raises(StreamLimitError, match=f"max_event_bytes={len(body) - 1}"):
        fastaccum.parse_response([body[:10], body[10:]], max_event_bytes=len(body) - 1)
    assert len(fastaccum.parse_response(body, max_event_bytes=len(body))) == 50


def test_dynamo_has_no_body_to_read() -> None:
    with pytest.raises(ValueError, match="Dynamo's /generate streams only"):
        fastaccum.parse_response(b"{}", dialect="dynamo")
