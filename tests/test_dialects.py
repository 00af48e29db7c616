"""Dialects (docs/dialects.md): vLLM's /inference/v1/generate chunks and Dynamo's /generate read
by the same core, with each server's end rules, on both twins."""

from __future__ import annotations

import base64
import io
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest

from fastaccum.emulator import writer_vllm
from fastaccum.emulator.writer import (
    DONE,
    WireOptions,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import ServerError, StreamFormatError, StreamLengthError, StreamTruncatedError

SHAPES = writer_vllm.SHAPES


def _accumulate(impl: ModuleType, data: bytes, *, pieces: int = 0, **options: Any) -> Any:
    acc = impl.StreamAccumulator(**options)
    for piece in split_pieces(data, [pieces] if pieces else []):
        acc.feed(piece)
    return acc.finish()


def _npy(array: np.ndarray, **save: Any) -> str:
    out = io.BytesIO()
    np.save(out, array, **save)
    return base64.b64encode(out.getvalue()).decode()


# ---- vLLM: a finished request ------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("interval", [1, 3])
@pytest.mark.parametrize("pieces", [0, 1, 7, 4096])
def test_a_vllm_stream_reads_to_the_tokens_logprobs_and_finish_reason(
    impl: ModuleType, shape: str, interval: int, pieces: int
) -> None:
    gen = synthetic_generation("r", 40, finish_reason={"type": "stop", "matched": 7})
    data = writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, shape=shape, interval=interval))
    result = _accumulate(impl, data, pieces=pieces, dialect="vllm")
    assert result.mode == "incremental"
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.logprobs.tolist() == list(gen.logprobs)
    # SGLang's object form (the stop_reason, which 0.31 does not send, is what matched); the raw
    # value stays in meta_info
    assert result.finish_reason == {"type": "stop", "matched": 7 if shape == "0.32" else None}
    assert result.meta_info["finish_reason"] == "stop"
    assert result.meta_info["request_id"] == "r"
    assert result.meta_info["usage"]["completion_tokens"] == 40


def test_text_mode_log_probs_are_refused_on_the_first_chunk_naming_output_mode(impl: ModuleType) -> None:
    """With output_mode "text" vLLM names each log-prob's token by its text (as vLLM 0.32 sends it):
    a rollout needs ids, so the stream fails at once, saying what to send instead."""
    item = {"token": "jol", "logprob": -1.5, "bytes": [106, 111, 108], "top_logprobs": []}
    choice = {"index": 0, "finish_reason": None, "token_ids": [2558], "text": "jol", "logprobs": {"content": [item]}}
    chunk = {"request_id": "generate-tokens-t", "usage": None, "output_mode": "text", "choices": [choice]}
    acc = impl.StreamAccumulator(dialect="vllm")
    with pytest.raises(StreamFormatError, match='event 0: .*token is the decoded token .jol.*output_mode "tokens"'):
        acc.feed(b"data: " + orjson.dumps(chunk) + b"\n\n")
    assert len(acc.snapshot()) == 0


def test_text_mode_without_log_probs_reads_the_text(impl: ModuleType) -> None:
    choices = [
        {"index": 0, "finish_reason": None, "token_ids": [5], "text": "ab", "logprobs": None},
        {"index": 0, "finish_reason": "length", "token_ids": [6], "text": "c", "logprobs": None},
    ]
    chunks = [{"request_id": "t", "output_mode": "text", "choices": [c]} for c in choices]
    chunks.append({"request_id": "t", "output_mode": "text", "choices": [], "usage": {"completion_tokens": 2}})
    data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
    result = _accumulate(impl, data, dialect="vllm")
    assert result.token_ids.tolist() == [5, 6] and result.text == "abc" and result.logprobs is None


@pytest.mark.parametrize("raw", ["length", "abort"])
def test_vllm_finish_reasons_take_sglangs_form(impl: ModuleType, raw: str) -> None:
    gen = synthetic_generation("r", 5, finish_reason={"type": raw})
    result = _accumulate(impl, writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen)), dialect="vllm")
    assert result.finish_reason == {"type": raw}
    assert result.meta_info["finish_reason"] == raw


def test_a_vllm_stream_without_logprobs_has_none(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 9)
    result = _accumulate(impl, writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, logprobs=False)), dialect="vllm")
    assert result.logprobs is None
    assert result.token_ids.tolist() == list(gen.token_ids)


def test_the_usage_chunk_checks_the_token_count(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 6)
    chunks = list(writer_vllm.stream_chunks(gen))
    chunks[-1]["usage"]["completion_tokens"] = 5
    with pytest.raises(StreamLengthError):
        _accumulate(impl, writer_vllm.stream_bytes(chunks), dialect="vllm")


def test_only_the_usage_chunk_may_follow_the_finishing_chunk(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 6)
    chunks = list(writer_vllm.stream_chunks(gen))
    chunks.insert(-1, writer_vllm.chunk(gen, 5, 6))
    with pytest.raises(StreamFormatError, match="after the terminal event"):
        _accumulate(impl, writer_vllm.stream_bytes(chunks), dialect="vllm")


# ---- vLLM: how a request ends early ---------------------------------------------------------------


def test_an_abort_chunk_ends_the_stream_aborted_with_the_prefix(impl: ModuleType) -> None:
    # vLLM 0.32 on: a chunk without tokens, finish_reason "abort"
    gen = synthetic_generation("r", 10)
    chunks = [writer_vllm.chunk(gen, i, i + 1) for i in range(4)]
    chunks += [writer_vllm.chunk(gen, 4, 4, finish="abort"), writer_vllm.usage_chunk(gen, 4)]
    result = _accumulate(impl, writer_vllm.stream_bytes(chunks), dialect="vllm")
    assert result.finish_reason == {"type": "abort"}
    assert result.token_ids.tolist() == list(gen.token_ids[:4])
    assert len(result.logprobs) == 4


def test_done_without_a_finish_reason_is_a_truncation_that_keeps_the_prefix(impl: ModuleType) -> None:
    # vLLM before 0.32 ends an aborted request so: the caller that asked for the abort keeps it
    gen = synthetic_generation("r", 10)
    chunks = [writer_vllm.chunk(gen, i, i + 1, shape="0.31") for i in range(3)]
    acc = impl.StreamAccumulator(dialect="vllm")
    with pytest.raises(StreamTruncatedError, match="vLLM before 0.32 ends an aborted request"):
        acc.feed(writer_vllm.stream_bytes(chunks))
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:3])


def test_a_usage_chunk_adds_its_counts_to_the_meta_info_of_the_chunk_before_it(impl: ModuleType) -> None:
    # in one piece, so that the compiled twin reads the chunks before it in place
    gen = synthetic_generation("r", 10)
    chunks = [writer_vllm.chunk(gen, i, i + 1, shape="0.31") for i in range(3)] + [writer_vllm.usage_chunk(gen, 3)]
    acc = impl.StreamAccumulator(dialect="vllm")
    with pytest.raises(StreamTruncatedError):
        acc.feed(writer_vllm.stream_bytes(chunks))
    meta = acc.snapshot().meta_info
    assert (meta["request_id"], meta["index"], meta["usage"]["completion_tokens"]) == ("r", 0, 3)


def test_a_vllm_error_object_is_a_server_error_after_the_prefix(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 10)
    data = writer_vllm.stream_bytes([writer_vllm.chunk(gen, 0, 2)], done=False)
    data += writer_vllm.error_chunk("The engine died", "InternalServerError", 500) + DONE
    acc = impl.StreamAccumulator(dialect="vllm")
    with pytest.raises(ServerError, match="The engine died"):
        acc.feed(data)
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:2])


# ---- vLLM: replay arrays -----------------------------------------------------------------------------


@pytest.mark.parametrize(("experts", "dtype"), [(64, np.uint8), (512, np.uint16), (70_000, np.int32)])
def test_routed_experts_arrive_as_the_npy_array_in_its_wire_dtype(impl: ModuleType, experts: int, dtype: Any) -> None:
    gen = synthetic_generation("r", 12, expert_shape=(3, 2), num_experts=experts)
    data = writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, routed=True))
    result = _accumulate(impl, data, pieces=1000, dialect="vllm", expert_shape=(3, 2))
    assert result.routed_experts.dtype == dtype
    assert result.routed_experts.shape == (16 + 12 - 1, 3, 2)
    np.testing.assert_array_equal(result.routed_experts, gen.routed_experts)


def test_routed_dtype_int32_widens_the_npy_when_the_caller_asks(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 12, expert_shape=(3, 2), num_experts=64)
    data = writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, routed=True))
    result = _accumulate(impl, data, pieces=1000, dialect="vllm", routed_dtype="int32")
    assert result.routed_experts.dtype == np.int32
    np.testing.assert_array_equal(result.routed_experts, gen.routed_experts)
    with pytest.raises(ValueError, match="routed_dtype must be None"):
        impl.StreamAccumulator(dialect="vllm", routed_dtype="int64")


def test_an_npy_of_another_shape_than_expert_shape_is_a_length_error(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 4, expert_shape=(3, 2))
    data = writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, routed=True))
    with pytest.raises(StreamLengthError, match=r"expert_shape says \(rows, 3, 4\)"):
        _accumulate(impl, data, dialect="vllm", expert_shape=(3, 4))


@pytest.mark.parametrize(
    ("npy", "why"),
    [
        (_npy(np.zeros((2, 2, 2), dtype=np.float32)), "dtype <f4 is not uint8, uint16 or int32"),
        (_npy(np.zeros((2, 2, 2), dtype=">u2")), "dtype >u2"),
        (_npy(np.asfortranarray(np.zeros((2, 3, 4), dtype=np.uint8))), "Fortran order"),
        (_npy(np.zeros((2, 4), dtype=np.uint8)), r"shape \(2, 4\) is not \(rows, layers, topk\)"),
        (_npy(np.array([{"a": 1}], dtype=object), allow_pickle=True), "dtype"),
        (base64.b64encode(b"\x93NUMPY\x01\x00\xff\xff{}").decode(), "header is longer than the value"),
        (base64.b64encode(b"PK\x03\x04 not an npy at all").decode(), "magic"),
        (base64.b64encode(base64.b64decode(_npy(np.zeros((2, 2, 2), dtype=np.uint8)))[:-1]).decode(), "needs 8 bytes"),
    ],
)
def test_a_bad_npy_is_refused_and_never_unpickled(impl: ModuleType, npy: str, why: str) -> None:
    gen = synthetic_generation("r", 3)
    chunks = list(writer_vllm.stream_chunks(gen))
    chunks[-2]["choices"][0]["routed_experts"] = npy
    with pytest.raises(StreamFormatError, match=why):
        _accumulate(impl, writer_vllm.stream_bytes(chunks), dialect="vllm")


def test_a_chunk_of_another_choice_than_0_is_refused(impl: ModuleType) -> None:
    # n > 1: each chunk holds one of the request's choices; their tokens must not be mixed
    gen = synthetic_generation("r", 4)
    chunks = list(writer_vllm.stream_chunks(gen))
    chunks[2]["choices"][0]["index"] = 1
    with pytest.raises(StreamFormatError, match="n > 1"):
        _accumulate(impl, writer_vllm.stream_bytes(chunks), dialect="vllm")


def test_arrays_outside_the_choice_are_not_vllms_and_are_ignored(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 3)
    chunks = list(writer_vllm.stream_chunks(gen))
    chunks[0]["routed_experts"] = ""
    chunks[1]["sampling_mask"] = [[1]]
    result = _accumulate(impl, writer_vllm.stream_bytes(chunks), dialect="vllm")
    assert result.routed_experts is None and result.top_p_token_ids is None
    assert "routed_experts" not in result.meta_info


def test_the_sampling_mask_becomes_the_top_p_rows(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 20, top_p=True)
    data = writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, sampling_mask=True, interval=3))
    result = _accumulate(impl, data, dialect="vllm")
    offsets = result.top_p_token_offsets.tolist()
    rows = [result.top_p_token_ids[offsets[i] : offsets[i + 1]].tolist() for i in range(20)]
    assert rows == [list(r) for r in gen.top_p_rows]


def test_a_sampling_mask_that_stops_while_tokens_go_on_is_refused(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 6, top_p=True)
    chunks = list(writer_vllm.stream_chunks(gen, sampling_mask=True))
    chunks[3]["choices"][0]["sampling_mask"] = None
    with pytest.raises(StreamFormatError, match="top-p rows missing"):
        _accumulate(impl, writer_vllm.stream_bytes(chunks), dialect="vllm")


# ---- which server: the first event is checked ---------------------------------------------------


def test_a_vllm_chunk_read_as_sglang_fails_naming_both(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 3)
    with pytest.raises(StreamFormatError, match=r"vLLM /inference/v1/generate.*dialect='sglang'.*pass dialect='vllm'"):
        _accumulate(impl, writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen)))


@pytest.mark.parametrize("dialect", ["sglang", "dynamo"])
def test_an_sglang_event_read_as_vllm_fails_naming_both(impl: ModuleType, dialect: str) -> None:
    gen = synthetic_generation("r", 3)
    data = stream_bytes(stream_events(gen, WireOptions(incremental=True)))
    with pytest.raises(StreamFormatError, match=r"SGLang /generate.*dialect='vllm'.*pass dialect='sglang'"):
        _accumulate(impl, data, dialect="vllm")


def _indexed(meta: dict[str, Any]) -> bytes:
    event = {"text": "Hi", "output_ids": [5], "index": 0, "meta_info": {"id": "x", "finish_reason": None, **meta}}
    return b"data: " + orjson.dumps(event) + b"\n\n" + DONE


GATEWAY_FIX = r"sgl-model-gateway /generate stream in gRPC mode.*run the gateway in HTTP mode"
BATCH_FIX = r"SGLang batch stream.*send one prompt per request"


def test_the_gateways_grpc_rendering_is_refused_on_its_first_event_naming_the_fix(impl: ModuleType) -> None:
    # The gateway's gRPC rendering: a top-level index, a running completion_tokens, log-probs
    # without SGLang's output_token_logprobs_length.
    grpc = {"completion_tokens": 1, "output_token_logprobs": [[-0.5, 5, None]]}
    with pytest.raises(StreamFormatError, match=r'event 0: a top-level "index": an ' + GATEWAY_FIX):
        _accumulate(impl, _indexed(grpc))
    # Older gateways sent no completion_tokens at all.
    with pytest.raises(StreamFormatError, match=r'a top-level "index": an ' + GATEWAY_FIX):
        _accumulate(impl, _indexed({}))


def test_an_sglang_batch_stream_is_refused_naming_the_fix(impl: ModuleType) -> None:
    batch = {"completion_tokens": 1, "output_token_logprobs": [[-0.5, 5, None]], "output_token_logprobs_length": 1}
    with pytest.raises(StreamFormatError, match=r'event 0: a top-level "index": an ' + BATCH_FIX):
        _accumulate(impl, _indexed(batch))


def test_an_indexed_stream_without_logprobs_names_both_possibilities(impl: ModuleType) -> None:
    with pytest.raises(StreamFormatError, match=r"either an " + BATCH_FIX + r"\) or an " + GATEWAY_FIX):
        _accumulate(impl, _indexed({"completion_tokens": 1}))


def test_a_dialect_fixes_the_mode_and_refuses_cumulative(impl: ModuleType) -> None:
    assert impl.StreamAccumulator(dialect="dynamo").mode == "incremental"
    with pytest.raises(ValueError, match="mode='cumulative' cannot be read as dialect='vllm'"):
        impl.StreamAccumulator("cumulative", dialect="vllm")
    with pytest.raises(ValueError, match="dialect must be 'sglang', 'dynamo' or 'vllm'"):
        impl.StreamAccumulator(dialect="openai")


# ---- Dynamo: SGLang's incremental events, Dynamo's end rules ----------------------------------------


def test_dynamo_passes_sglangs_incremental_events_through(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 30)
    data = stream_bytes(stream_events(gen, WireOptions(incremental=True), interval=4))
    result = _accumulate(impl, data, pieces=5, dialect="dynamo")
    assert result.token_ids.tolist() == list(gen.token_ids)


def test_dynamo_reads_a_cumulative_stream_as_a_length_error(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 8)
    with pytest.raises(StreamLengthError):
        _accumulate(impl, stream_bytes(stream_events(gen, WireOptions())), dialect="dynamo")


def test_dynamos_killed_request_ends_without_done(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 8)
    events = list(stream_events(gen, WireOptions(incremental=True)))[:3]
    acc = impl.StreamAccumulator(dialect="dynamo")
    acc.feed(stream_bytes(events, done=False))
    with pytest.raises(StreamTruncatedError, match="Dynamo ends a request it killed"):
        acc.finish()
    assert len(acc.snapshot()) == 3


def test_dynamos_graceful_stop_ends_with_done_and_no_finish_reason(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 8)
    events = list(stream_events(gen, WireOptions(incremental=True)))[:3]
    acc = impl.StreamAccumulator(dialect="dynamo")
    with pytest.raises(StreamTruncatedError, match="Dynamo stopped the request"):
        acc.feed(stream_bytes(events))
    assert len(acc.snapshot()) == 3


def test_dynamos_error_event_is_a_server_error(impl: ModuleType) -> None:
    gen = synthetic_generation("r", 8)
    events = list(stream_events(gen, WireOptions(incremental=True)))[:2]
    data = stream_bytes(events, done=False) + b'data: {"error":{"message":"Internal server error"}}\n\n' + DONE
    acc = impl.StreamAccumulator(dialect="dynamo")
    with pytest.raises(ServerError, match="Internal server error"):
        acc.feed(data)
    assert len(acc.snapshot()) == 2


# ---- the compiled twin's scanner ---------------------------------------------------------------------


@pytest.mark.c_extension
@pytest.mark.parametrize("shape", SHAPES)
def test_the_compiled_scanner_reads_vllm_chunks_as_orjson_does(shape: str, outcomes: Any) -> None:
    import fastaccum._cy as cy

    gen = synthetic_generation("r", 64, null_logprob_every=9)
    data = writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, shape=shape, interval=2))
    fast = cy.StreamAccumulator(dialect="vllm")
    slow = cy.StreamAccumulator(dialect="vllm")._debug(fast_scan=False)
    scanned = 0
    for piece in split_pieces(data, [333]):
        fast.feed(piece)
        slow.feed(piece)
        scanned += fast._lazy_meta is not None  # only the scanner keeps a chunk's meta_info as bytes
        outcomes.assert_same_result(fast.snapshot(), slow.snapshot())
    outcomes.assert_same_result(fast.finish(), slow.finish())
    assert scanned > 10


@pytest.mark.c_extension
@pytest.mark.parametrize(
    "odd",
    [
        b'"usage":{"prompt_tokens":1}',  # a usage to check
        b'"choices":[{"index":0,"finish_reason":null,"token_ids":[1],"text":"a"}]',  # output_mode text
        b'"choices":[{"index":0,"token_ids":[1],"logprobs":{"content":[{"token_id":1}]}}]',  # no logprob
        b'"choices":[{"index":0,"token_ids":[1],"logprobs":{"content":[{"token_id":2,"logprob":-1.0}]}}]',
        b'"choices":[{"index":0,"token_ids":[1],"logprobs":{"content":[{"token":"token_id:01","logprob":-1}]}}]',
        b'"choices":[{"index":0,"token_ids":[1],"logprobs":{"content":[{"token":"token_id:\\u0031","logprob":-1}]}}]',
        b'"choices":[{"index":0,"token_ids":[1]},{"index":1,"token_ids":[1]}]',  # n > 1
        b'"choices":[{"index":1,"token_ids":[1]}]',  # another choice
        b'"choices":[{"index":0.0,"token_ids":[1]}]',
        b'"choices":[{"index":0,"token_ids":[]}]',  # no tokens
        b'"choices":[{"index":0,"token_ids":[1],"sampling_mask":[[1]]}]',
    ],
)
def test_what_the_scanner_leaves_to_orjson_reads_the_same(odd: bytes, outcomes: Any) -> None:
    import fastaccum._cy as cy

    first = b'data: {"request_id":"r","choices":[{"index":0,"finish_reason":null,"token_ids":[9],"logprobs":null}]}\n\n'
    data = first + b'data: {"request_id":"r",' + odd + b"}\n\n" + DONE
    fast = outcomes.run(cy, [data], dialect="vllm")
    outcomes.assert_same(fast, outcomes.run(cy, [data], debug={"fast_scan": False}, dialect="vllm"))
