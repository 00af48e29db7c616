"""The replay arrays SGLang sends only in a request's terminal event (docs/core.md, "Replay
arrays"): the indexer top-k beside routed experts, and routed experts from
``routed_experts_start_len`` on. Both twins."""

from __future__ import annotations

import asyncio
import dataclasses
from types import ModuleType

import aiohttp
import numpy as np
import pytest

from fastaccum.emulator import Emulator
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


def _run(impl: ModuleType, gen, opts=INC, sizes=(1000,), interval=4, **kwargs):
    data = stream_bytes(stream_events(gen, opts, interval=interval))
    return impl.accumulate(split_pieces(data, list(sizes)), **kwargs)


# ---- indexer top-k ---------------------------------------------------------------------------


@pytest.mark.parametrize("opts", [INC, CUM], ids=["incremental", "cumulative"])
def test_the_indexer_top_k_is_decoded_and_shaped_like_sglangs_rows(impl: ModuleType, opts: WireOptions) -> None:
    gen = synthetic_generation("ix", 40, prompt_tokens=9, indexer_shape=(3, 16))
    result = _run(impl, gen, opts, indexer_shape=(3, 16))
    assert result.indexer_topk.dtype == np.int32
    assert result.indexer_topk.shape == (9 + 40 - 1, 3, 16)  # a row per position but the last
    assert np.array_equal(result.indexer_topk, gen.indexer_topk)
    assert "indexer_topk" not in result.meta_info  # an array of the result, not a str in meta_info
    assert result.routed_experts is None


def test_without_indexer_shape_the_flat_int32_array(impl: ModuleType) -> None:
    gen = synthetic_generation("ix-flat", 6, prompt_tokens=2, indexer_shape=(2, 4))
    result = _run(impl, gen)
    assert result.indexer_topk.ndim == 1
    assert result.indexer_topk.tolist() == gen.indexer_topk.reshape(-1).tolist()


def test_routed_experts_and_the_indexer_top_k_in_one_event(impl: ModuleType) -> None:
    gen = synthetic_generation("both", 12, prompt_tokens=5, expert_shape=(4, 2), indexer_shape=(2, 8))
    result = _run(impl, gen, expert_shape=(4, 2), indexer_shape=(2, 8))
    assert np.array_equal(result.routed_experts, gen.routed_experts)
    assert np.array_equal(result.indexer_topk, gen.indexer_topk)


def test_an_indexer_top_k_of_the_wrong_size_is_a_length_error_naming_it(impl: ModuleType) -> None:
    gen = synthetic_generation("ix-bad", 6, prompt_tokens=3, indexer_shape=(2, 4))
    events = list(stream_events(gen, INC))
    events[-1]["meta_info"]["indexer_topk"] = encode_int32(np.zeros(7 * 2 * 4, dtype=np.int32))
    with pytest.raises(StreamLengthError, match=r"indexer_topk has 56 values; expected \(3 \+ 6 - 1\) x 2 x 4 = 64"):
        impl.accumulate([stream_bytes(events)], indexer_shape=(2, 4))


def test_an_indexer_top_k_that_is_not_base64_is_a_format_error(impl: ModuleType) -> None:
    gen = synthetic_generation("ix-b64", 3, prompt_tokens=2, indexer_shape=(1, 2))
    events = list(stream_events(gen, INC))
    events[-1]["meta_info"]["indexer_topk"] = "not base64!"
    with pytest.raises(StreamFormatError, match="indexer_topk"):
        impl.accumulate([stream_bytes(events)])


@pytest.mark.parametrize("shape", [(0, 4), (2,), [2, 4], (2, 4.0)])
def test_indexer_shape_must_be_two_positive_ints(impl: ModuleType, shape: object) -> None:
    with pytest.raises(ValueError, match="indexer_shape must be"):
        impl.StreamAccumulator(indexer_shape=shape)


def test_an_88_mb_indexer_line_in_64_kib_pieces(impl: ModuleType) -> None:
    """The size the issue names: 2k tokens x 4 layers x top-2048 as int32, 88 MB of base64."""
    gen = synthetic_generation("ix-big", 2000, prompt_tokens=48, indexer_shape=(4, 2048))
    result = _run(impl, gen, sizes=(65536,), interval=64, indexer_shape=(4, 2048))
    assert result.indexer_topk.shape == (2047, 4, 2048)
    assert np.array_equal(result.indexer_topk, gen.indexer_topk)


def test_a_large_indexer_value_in_small_pieces_equals_the_whole_feed(impl: ModuleType) -> None:
    """9 MB of base64, past the 4 MiB at which the compiled twin decodes a value while it arrives."""
    gen = synthetic_generation("ix-pieces", 200, prompt_tokens=30, indexer_shape=(4, 2048))
    data = stream_bytes(stream_events(gen, INC, interval=64))
    whole = impl.accumulate([data], indexer_shape=(4, 2048))
    pieces = impl.accumulate(split_pieces(data, [4093, 65536, 7]), indexer_shape=(4, 2048))
    assert pieces.indexer_topk.shape == whole.indexer_topk.shape == (229, 4, 2048)
    assert pieces.indexer_topk.tobytes() == whole.indexer_topk.tobytes() == gen.indexer_topk.tobytes()


def test_a_snapshot_after_the_terminal_event_holds_the_indexer_top_k(impl: ModuleType) -> None:
    gen = synthetic_generation("ix-snap", 7, prompt_tokens=3, indexer_shape=(2, 4))
    acc = impl.StreamAccumulator(indexer_shape=(2, 4))
    acc.feed(stream_bytes(stream_events(gen, INC)))
    assert np.array_equal(acc.snapshot().indexer_topk, gen.indexer_topk)
    assert np.array_equal(acc.finish().indexer_topk, gen.indexer_topk)


# ---- indexer_topk_num_layers, which SGLang forks send (SGLang 0.5.23 does not) ---------------

FORK = WireOptions(incremental=True, indexer_topk_num_layers=True)


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "cumulative"])
def test_indexer_topk_num_layers_gives_the_layers_and_the_length_the_width(impl: ModuleType, incremental: bool) -> None:
    gen = synthetic_generation("ix-fork", 11, prompt_tokens=4, indexer_shape=(3, 8))
    result = _run(impl, gen, dataclasses.replace(FORK, incremental=incremental))
    assert result.indexer_topk.shape == (4 + 11 - 1, 3, 8)
    assert np.array_equal(result.indexer_topk, gen.indexer_topk)
    assert result.meta_info["indexer_topk_num_layers"] == 3  # a count, not an array: it stays


def test_indexer_topk_num_layers_must_agree_with_indexer_shape(impl: ModuleType) -> None:
    gen = synthetic_generation("ix-fork-shape", 5, prompt_tokens=2, indexer_shape=(3, 8))
    assert _run(impl, gen, FORK, indexer_shape=(3, 8)).indexer_topk.shape == (6, 3, 8)
    with pytest.raises(StreamLengthError, match=r"indexer_topk_num_layers = 3, but indexer_shape has 2 layers"):
        _run(impl, gen, FORK, indexer_shape=(2, 12))


@pytest.mark.parametrize(
    ("layers", "error", "message"),
    [
        ("3", StreamFormatError, "indexer_topk_num_layers must be a positive integer, not str"),
        (True, StreamFormatError, "indexer_topk_num_layers must be a positive integer, not bool"),
        (0, StreamFormatError, "indexer_topk_num_layers = 0 is not a layer count"),
        (5, StreamLengthError, r"indexer_topk has 144 values; expected a positive multiple of \(2 \+ 5 - 1\) x 5"),
    ],
)
def test_an_indexer_layer_count_that_does_not_fit_names_the_field(
    impl: ModuleType, layers: object, error: type[Exception], message: str
) -> None:
    gen = synthetic_generation("ix-fork-bad", 5, prompt_tokens=2, indexer_shape=(3, 8))
    events = list(stream_events(gen, FORK))
    events[-1]["meta_info"]["indexer_topk_num_layers"] = layers
    with pytest.raises(error, match=message):
        impl.accumulate([stream_bytes(events)])


# ---- routed experts from routed_experts_start_len on -----------------------------------------


@pytest.mark.parametrize("start", [0, 1, 6])
def test_routed_experts_start_at_routed_start(impl: ModuleType, start: int) -> None:
    gen = synthetic_generation("rs", 10, prompt_tokens=6, expert_shape=(2, 2), routed_start=start)
    result = _run(impl, gen, expert_shape=(2, 2), routed_start=start)
    assert result.routed_experts.shape == (6 + 10 - 1 - start, 2, 2)
    assert np.array_equal(result.routed_experts, gen.routed_experts)


def test_routed_start_not_told_is_a_length_error_that_says_the_rule(impl: ModuleType) -> None:
    gen = synthetic_generation("rs-miss", 10, prompt_tokens=6, expert_shape=(2, 2), routed_start=4)
    with pytest.raises(StreamLengthError, match=r"routed_experts has 44 values; expected \(6 \+ 10 - 1\) x 2 x 2"):
        _run(impl, gen, expert_shape=(2, 2))


def test_routed_start_at_the_prompts_end_with_no_completion_is_no_rows(impl: ModuleType) -> None:
    """SGLang's rows: max(prompt + completion - 1 - start, 0)."""
    gen = synthetic_generation("rs-empty", 0, prompt_tokens=5, expert_shape=(2, 2), routed_start=5)
    result = _run(impl, gen, expert_shape=(2, 2), routed_start=5)
    assert result.routed_experts.shape == (0, 2, 2)


@pytest.mark.parametrize("start", [-1, 1.0, None])
def test_routed_start_must_be_a_non_negative_int(impl: ModuleType, start: object) -> None:
    with pytest.raises(ValueError, match="routed_start must be"):
        impl.StreamAccumulator(routed_start=start)


# ---- end to end, from the emulator -----------------------------------------------------------


async def _body(emulator: Emulator, request: dict[str, object]) -> bytes:
    async with emulator as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/generate", json=request) as response:
            assert response.status == 200
            return await response.read()


@pytest.mark.parametrize("fork", [False, True], ids=["sglang", "fork-layers"])
@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "cumulative"])
def test_the_emulators_replay_arrays_end_to_end(impl: ModuleType, incremental: bool, fork: bool) -> None:
    emulator = Emulator(
        incremental_streaming_output=incremental,
        stream_interval=4,
        enable_return_routed_experts=True,
        enable_return_indexer_topk=True,
        index_topk=16,
        indexer_topk_num_layers=fork,
    )
    prompt = [5, 6, 7, 8, 9, 10]
    request = {
        "input_ids": prompt,
        "rid": "e2e",
        "stream": True,
        "return_logprob": True,
        "return_routed_experts": True,
        "routed_experts_start_len": 4,
        "return_indexer_topk": True,
        "sampling_params": {"max_new_tokens": 25},
    }
    body = asyncio.run(_body(emulator, request))
    shapes = {} if fork else {"indexer_shape": emulator.indexer_shape}
    result = impl.accumulate(split_pieces(body, [97, 1000]), expert_shape=(4, 2), routed_start=4, **shapes)
    truth = emulator.expected("e2e", 25, prompt_tokens=6, routed_experts=True, routed_start=4, indexer_topk=True)
    assert result.routed_experts.shape == (6 + 25 - 1 - 4, 4, 2)
    assert np.array_equal(result.routed_experts, truth.routed_experts)
    assert result.indexer_topk.shape == (6 + 25 - 1, 2, 16)
    assert np.array_equal(result.indexer_topk, truth.indexer_topk)


def test_the_emulator_refuses_a_routed_start_past_the_prompt_even_without_the_flag() -> None:
    """SGLang's scheduler checks routed_experts_start_len whenever routed experts are asked for."""
    request = {"input_ids": [1, 2], "return_routed_experts": True, "routed_experts_start_len": 3, "stream": True}

    async def main() -> int:
        async with Emulator() as url, aiohttp.ClientSession() as session:
            async with session.post(f"{url}/generate", json=request) as response:
                return response.status

    assert asyncio.run(main()) == 400


@pytest.mark.c_extension
@pytest.mark.parametrize("shape", [None, (2, 4), (3, 4)], ids=["flat", "fits", "misfits"])
def test_an_indexer_top_k_before_the_terminal_event_is_read_alike_by_both_twins(outcomes, shape) -> None:
    """SGLang sends it only in the terminal event; an earlier one must still take the ordinary path
    in the compiled twin (its scanner refuses the key), so both twins decode and check it."""
    import fastaccum._cy as cy
    import fastaccum._py as py

    gen = synthetic_generation("ix-early", 9, prompt_tokens=3, indexer_shape=(2, 4))
    events = list(stream_events(gen, INC, interval=2))
    events[1]["meta_info"]["indexer_topk"] = encode_int32(gen.indexer_topk[: 3 + 3 - 1])
    pieces = [stream_bytes(events)]
    options = {} if shape is None else {"indexer_shape": shape}
    outcomes.assert_same(outcomes.run(cy, pieces, **options), outcomes.run(py, pieces, **options))
