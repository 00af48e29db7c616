"""The replay arrays SGLang sends only in a request's terminal event (docs/core.md, "Replay
arrays"): the indexer top-k beside routed experts, and routed experts from
``routed_experts_start_len`` on. Both twins."""

from __future__ import annotations

from types import ModuleType

import numpy as np
import pytest

from fastaccum.errors import StreamFormatError, StreamLengthError
from fastaccum.wire import WireOptions, encode_int32, split_pieces, stream_bytes, stream_events, synthetic_generation

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


@pytest.mark.parametrize("start", [-1, 1.0, None])
def test_routed_start_must_be_a_non_negative_int(impl: ModuleType, start: object) -> None:
    with pytest.raises(ValueError, match="routed_start must be"):
        impl.StreamAccumulator(routed_start=start)
