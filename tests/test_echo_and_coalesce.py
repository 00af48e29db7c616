"""Abort echo chunks (docs/core.md, "Abort echo chunks"), coalesced incremental events, zero-token terminals."""

from __future__ import annotations

import dataclasses
import random
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest

from fastaccum.emulator.writer import (
    WireOptions,
    coalesce,
    echo_event,
    emission_points,
    normal_event,
    split_pieces,
    stream_bytes,
    stream_events,
    synthetic_generation,
)
from fastaccum.errors import ServerError, StreamFormatError, StreamLengthError

ECHO_REASON = {"type": "abort", "message": "Abort in waiting queue"}


def _mode_of(opts: WireOptions) -> str:
    return "incremental" if opts.incremental else "cumulative"


def _data(event: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(event) + b"\n\n"


def prefix_events(gen, opts: WireOptions, held: int, interval: int = 1) -> list[dict[str, Any]]:
    """The non-terminal events a client saw before the request holding ``held`` ids was aborted."""
    if held == 0:
        return []
    points = emission_points(held, interval, opts.version)
    out, prev = [], 0
    for k, end in enumerate(points):
        out.append(normal_event(gen, opts, prev, end, first=k == 0))
        prev = end
    return out


def _logprobs(gen, n: int) -> np.ndarray:
    return np.array([np.nan if x is None else x for x in gen.logprobs[:n]], dtype=np.float64)


def _run(impl: ModuleType, events, *, pieces=(4096,), **kwargs):
    return impl.accumulate(split_pieces(stream_bytes(events), list(pieces)), **kwargs)


# ---- echo chunks ----------------------------------------------------------------------------

# (12, ...) has light-checked events before the echo in cumulative mode: the echo must be reconciled
# against everything held (the newest event), not only the events parsed fully.
HELD = [(0, 0), (0, 4), (3, 3), (3, 8), (1, 6), (12, 12), (12, 20), (12, 30)]


@pytest.mark.parametrize("return_logprob", [True, False], ids=["logprobs", "no-logprobs"])
@pytest.mark.parametrize("held,total", HELD, ids=[f"held{h}-echo{c}" for h, c in HELD])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
@pytest.mark.parametrize("version", ["0.5.23", "0.5.15"])
def test_echo_reconciles_through_completion_tokens(
    impl: ModuleType, version: str, incremental: bool, held: int, total: int, return_logprob: bool
) -> None:
    opts = WireOptions(incremental=incremental, version=version, return_logprob=return_logprob)
    gen = synthetic_generation("echo", total, seed=held)
    events = prefix_events(gen, opts, held, interval=5) + [echo_event(gen, opts, total)]
    recoverable = total == held or return_logprob or (not incremental and version == "0.5.23")
    if not recoverable:
        with pytest.raises(StreamLengthError) as info:
            _run(impl, events, mode=_mode_of(opts))
        assert info.value.event_index == len(events) - 1
        assert str(total) in str(info.value) and str(held) in str(info.value)
        return
    result = _run(impl, events, mode=_mode_of(opts))
    assert result.token_ids.tolist() == list(gen.token_ids[:total])
    assert result.completion_tokens == total
    if return_logprob:
        assert result.logprobs.tobytes() == _logprobs(gen, total).tobytes()
    else:
        assert result.logprobs is None
    assert result.finish_reason == ECHO_REASON and result.finished
    if held == 0:
        assert result.text is None  # the stream carried no text before the echo
    else:
        assert result.text == gen.text(0, total)  # the echo's whole text replaces, never appended
    assert result.routed_experts is None


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
@pytest.mark.parametrize("version", ["0.5.23", "0.5.15"])
def test_echo_under_skip_tokenizer_init_leaves_text_none(impl: ModuleType, version: str, incremental: bool) -> None:
    opts = WireOptions(incremental=incremental, version=version, skip_tokenizer_init=True)
    gen = synthetic_generation("echo-skip", 9)
    events = prefix_events(gen, opts, 4) + [echo_event(gen, opts, 9)]
    assert events[-1]["text"] == "" and "text" not in events[0]
    result = _run(impl, events)
    assert result.text is None
    assert result.token_ids.tolist() == list(gen.token_ids)


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_echo_holding_fewer_tokens_is_a_length_error(impl: ModuleType, incremental: bool) -> None:
    opts = WireOptions(incremental=incremental)
    gen = synthetic_generation("echo-less", 6)
    events = prefix_events(gen, opts, 6) + [echo_event(gen, opts, 4)]
    acc = impl.StreamAccumulator()
    for event in events[:-1]:
        acc.feed(_data(event))
    with pytest.raises(StreamLengthError) as info:
        acc.feed(_data(events[-1]))
    assert info.value.event_index == 6
    assert "4" in str(info.value) and "6" in str(info.value)
    assert acc.snapshot().token_ids.tolist() == list(gen.token_ids[:6])
    assert not acc.finished


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_echo_recovered_prefix_must_match_held_ids(impl: ModuleType, incremental: bool) -> None:
    opts = WireOptions(incremental=incremental)
    gen = synthetic_generation("echo-prefix", 8)
    echo = echo_event(gen, opts, 8)
    echo["meta_info"]["output_token_logprobs"][1][1] += 1
    events = prefix_events(gen, opts, 3) + [echo]
    with pytest.raises(StreamFormatError, match="event 3"):
        _run(impl, events)


def test_echo_recovered_from_cumulative_output_ids_must_match(impl: ModuleType) -> None:
    opts = WireOptions(return_logprob=False)
    gen = synthetic_generation("echo-ids", 8)
    echo = echo_event(gen, opts, 8)
    echo["output_ids"][0] += 1
    with pytest.raises(StreamFormatError, match="event 3"):
        _run(impl, prefix_events(gen, opts, 3) + [echo], mode="cumulative")


def test_echo_cumulative_output_ids_must_list_exactly_completion_tokens(impl: ModuleType) -> None:
    opts = WireOptions(return_logprob=False)
    gen = synthetic_generation("echo-ids2", 8)
    echo = echo_event(gen, opts, 8)
    echo["output_ids"] = echo["output_ids"][:7]
    with pytest.raises(StreamLengthError, match="event 3"):
        _run(impl, prefix_events(gen, opts, 3) + [echo], mode="cumulative")


def test_echo_output_ids_do_not_recover_in_incremental_mode(impl: ModuleType) -> None:
    # Even a full-length output_ids is untrusted in incremental mode: only logprobs recover.
    opts = WireOptions(incremental=True, return_logprob=False)
    gen = synthetic_generation("echo-inc-ids", 8)
    echo = echo_event(gen, opts, 8)
    echo["output_ids"] = list(gen.token_ids)
    with pytest.raises(StreamLengthError, match="event 3"):
        _run(impl, prefix_events(gen, opts, 3) + [echo], mode="incremental")


@pytest.mark.parametrize("version", ["0.5.23", "0.5.15"])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_echo_never_decides_the_mode(impl: ModuleType, incremental: bool, version: str) -> None:
    opts = WireOptions(incremental=incremental, version=version)
    gen = synthetic_generation("echo-auto", 5)
    events = prefix_events(gen, opts, 1) + [echo_event(gen, opts, 5)]
    acc = impl.StreamAccumulator()
    for event in events:
        acc.feed(_data(event))
        assert acc.mode == "auto"
    result = acc.finish()
    assert result.mode == "auto"
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.logprobs.tobytes() == _logprobs(gen, 5).tobytes()
    assert result.text == gen.text(0, 1)  # the echo's text replaces in cumulative mode only


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_echo_after_auto_decided(impl: ModuleType, incremental: bool) -> None:
    opts = WireOptions(incremental=incremental, version="0.5.15")
    gen = synthetic_generation("echo-decided", 10)
    events = prefix_events(gen, opts, 4) + [echo_event(gen, opts, 10)]
    result = _run(impl, events)
    assert result.mode == _mode_of(opts)
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.text == gen.text(0, 10)  # the echo's whole text, in both modes


def test_scheduler_echo_with_status_code_keeps_its_finish_reason(impl: ModuleType) -> None:
    opts = WireOptions(incremental=True)
    gen = synthetic_generation("echo-503", 4)
    echo = echo_event(gen, opts, 4, message="Request waiting timeout reached.")
    echo["meta_info"]["finish_reason"] = {
        "type": "abort",
        "status_code": 503,
        "message": "Request waiting timeout reached.",
    }
    result = _run(impl, prefix_events(gen, opts, 2) + [echo])
    assert result.finish_reason == echo["meta_info"]["finish_reason"]
    assert result.token_ids.tolist() == list(gen.token_ids)


# SGLang 0.5.23 refusing a streamed request (routed_experts_start_len past the prompt), as the live
# server sent it: the prompt swapped for one dummy token, logprobs switched off for it.
REFUSAL = (
    b'data: {"text":" zan","output_ids":[1345],"meta_info":{"id":"r","finish_reason":{"type":"abort",'
    b'"message":"recv_req.routed_experts_start_len=9 is higher than the number of input tokens '
    b'len(req.origin_input_ids)=2. Please use a smaller routed_experts_start_len.","status_code":400,'
    b'"err_type":"BadRequestError"},"prompt_tokens":1,"input_token_logprobs":[],"output_token_logprobs":[],'
    b'"output_token_logprobs_length":0,"completion_tokens":1,"routed_experts":"AwAAAAcAAAAHAAAAAgAAAA=="}}\n\n'
    b"data: [DONE]\n\n"
)


def test_an_abort_with_a_4xx_status_is_the_servers_refusal(impl: ModuleType) -> None:
    acc = impl.StreamAccumulator()
    with pytest.raises(ServerError, match=r"^event 0: server error 400: recv_req\.routed_experts_start_len=9 ") as info:
        acc.feed(REFUSAL)
    assert info.value.status == 400 and info.value.message.startswith("recv_req.routed_experts_start_len=9")
    assert len(acc.snapshot()) == 0  # the dummy token is no prefix


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_running_abort_is_a_normal_terminal_event(impl: ModuleType, incremental: bool) -> None:
    # It has prompt_tokens: not an echo. Its one extra in-flight token is appended normally.
    opts = WireOptions(incremental=incremental)
    gen = synthetic_generation("running-abort", 7, expert_shape=(2, 2))
    reason = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
    events = prefix_events(gen, opts, 6) + [normal_event(gen, opts, 6, 7, terminal=True, finish_reason=reason)]
    result = _run(impl, events, expert_shape=(2, 2))
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.finish_reason == reason
    assert result.text == gen.text(0, 7)
    assert result.routed_experts.tobytes() == gen.routed_experts.tobytes()


def test_echo_with_top_p_snapshot_replaces(impl: ModuleType) -> None:
    opts = WireOptions(incremental=True)
    gen = synthetic_generation("echo-topp", 9, top_p=True)
    result = _run(impl, prefix_events(gen, opts, 4) + [echo_event(gen, opts, 9)])
    rows = gen.top_p_rows
    assert result.top_p_token_ids.tolist() == [t for r in rows for t in r]
    assert result.top_p_token_offsets.tolist() == np.cumsum([0] + [len(r) for r in rows]).tolist()


# ---- coalesced echo -------------------------------------------------------------------------


@pytest.mark.parametrize("deltas", [1, 3])
@pytest.mark.parametrize("version", ["0.5.23", "0.5.15"])
def test_coalesced_echo_recovers_the_delta_and_its_text(impl: ModuleType, version: str, deltas: int) -> None:
    opts = WireOptions(incremental=True, version=version, logprob_text=True)
    held, total = 5, 5 + 2 * deltas
    gen = synthetic_generation("coalesced-echo", total)
    queued = [normal_event(gen, opts, held + 2 * i, held + 2 * i + 2) for i in range(deltas)]
    merged = coalesce(queued + [echo_event(gen, opts, total)])
    # SGLang 0.5.23 observed: the list holds delta + full entries, the length field only the full.
    assert len(merged["meta_info"]["output_token_logprobs"]) == 2 * deltas + total
    assert merged["meta_info"]["output_token_logprobs_length"] == total
    for mode in ("incremental", "auto"):
        result = _run(impl, prefix_events(gen, opts, held) + [merged], mode=mode)
        assert result.token_ids.tolist() == list(gen.token_ids)
        assert result.logprobs.tobytes() == _logprobs(gen, total).tobytes()
        assert result.completion_tokens == total
        # SGLang's text is delta + whole text; the delta in front is taken off (docs/wire-format.md,
        # "The abort echo").
        assert result.text == gen.text(0, total)
        assert result.finish_reason == ECHO_REASON
        assert result.mode == "incremental"


def test_coalesced_echo_as_the_first_event(impl: ModuleType) -> None:
    opts = WireOptions(incremental=True)
    gen = synthetic_generation("coalesced-first", 3)
    merged = coalesce([normal_event(gen, opts, 0, 3, first=True), echo_event(gen, opts, 3)])
    result = _run(impl, [merged])
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.logprobs.tobytes() == _logprobs(gen, 3).tobytes()


# ---- coalesced incremental events -----------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_coalesced_incremental_events(impl: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    opts = WireOptions(incremental=True, logprob_text=bool(seed % 2), skip_tokenizer_init=seed == 4)
    gen = synthetic_generation("coalesce", 80, seed=seed, top_p=True, expert_shape=(2, 3))
    events = list(stream_events(gen, opts, interval=rng.choice([1, 3])))
    groups: list[dict[str, Any]] = []
    i = 0
    while i < len(events):
        size = rng.randint(1, 6)
        groups.append(coalesce(events[i : i + size]) if size > 1 else events[i])
        i += size
    # Zero-token deltas between them are valid too.
    with_empty: list[dict[str, Any]] = []
    held = 0
    for event in groups[:-1]:
        with_empty.append(event)
        held = event["meta_info"]["completion_tokens"]
        if rng.random() < 0.3:
            with_empty.append(normal_event(gen, opts, held, held))
    with_empty.append(groups[-1])
    sizes = [rng.randint(1, 3000) for _ in range(50)]
    result = _run(impl, with_empty, pieces=sizes, expert_shape=(2, 3))
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.logprobs.tobytes() == _logprobs(gen, 80).tobytes()
    assert result.text == (None if opts.skip_tokenizer_init else gen.text(0, 80))
    assert result.top_p_token_ids.tolist() == [t for r in gen.top_p_rows for t in r]
    assert result.routed_experts.tobytes() == gen.routed_experts.tobytes()
    assert result.mode == "incremental"


# ---- zero-token terminal events -------------------------------------------------------------


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_zero_token_terminal_event(impl: ModuleType, incremental: bool) -> None:
    opts = WireOptions(incremental=incremental)
    gen = synthetic_generation("zero-term", 6, top_p=True, expert_shape=(2, 2))
    events = prefix_events(gen, opts, 6, interval=2)
    events.append(normal_event(gen, opts, 6, 6, terminal=True))
    assert len(events[-1]["output_ids"]) == (0 if incremental else 6)
    for mode in ("auto", _mode_of(opts)):
        result = _run(impl, events, mode=mode, expert_shape=(2, 2))
        assert result.token_ids.tolist() == list(gen.token_ids)
        assert result.text == gen.text(0, 6)
        assert result.finish_reason == gen.finish_reason
        assert result.top_p_token_offsets.tolist() == np.cumsum([0] + [len(r) for r in gen.top_p_rows]).tolist()
        assert result.routed_experts.shape == (16 + 6 - 1, 2, 2)
        assert result.mode == _mode_of(opts)


@pytest.mark.parametrize(
    "opts",
    [WireOptions(), WireOptions(skip_tokenizer_init=True), WireOptions(return_logprob=False)],
    ids=["text", "no-text", "no-logprobs"],
)
def test_stream_of_one_zero_token_terminal_event(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("empty", 0, expert_shape=(2, 2))
    acc = impl.StreamAccumulator(expert_shape=(2, 2))
    acc.feed(stream_bytes(stream_events(gen, opts)))
    assert acc.finished
    result = acc.finish()
    assert result.token_ids.tolist() == [] and result.token_ids.dtype == np.int32
    assert result.completion_tokens == 0
    assert result.mode == "auto"
    assert result.finish_reason == {"type": "length", "length": 0}
    assert result.text == (None if opts.skip_tokenizer_init else "")
    if opts.return_logprob:
        assert result.logprobs is not None and result.logprobs.shape == (0,)
    else:
        assert result.logprobs is None
    assert result.routed_experts.shape == (15, 2, 2)


def test_zero_token_incremental_terminal_after_coalesced_delta(impl: ModuleType) -> None:
    opts = dataclasses.replace(WireOptions(incremental=True), logprob_text=True)
    gen = synthetic_generation("zero-coal", 5)
    events = prefix_events(gen, opts, 2) + [
        coalesce([normal_event(gen, opts, 2, 4), normal_event(gen, opts, 4, 5)]),
        normal_event(gen, opts, 5, 5, terminal=True),
    ]
    result = _run(impl, events)
    assert result.token_ids.tolist() == list(gen.token_ids)
    assert result.text == gen.text(0, 5)
    assert result.events >= 4
