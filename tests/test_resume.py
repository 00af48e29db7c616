"""The resume contract (fastaccum.resume_payload, fastaccum.join), from the engines' facts: a
resumed request asks again with prompt + kept tokens and a budget reduced by them; SGLang returns
routed-expert rows from ``routed_experts_start_len`` on (vLLM from
``sampling_params.routed_experts_prompt_start``), so the rows a sample holds are asked for from the
first one not held; a join's rows are ``prompt + tokens - 1`` (never repeated, missing only while
the newest segment was cut); the indexer top-k comes whole with each request."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

import fastaccum
from fastaccum import StreamFormatError, StreamLengthError, StreamResult

PROMPT = [11, 12, 13, 14, 15]
SHAPE = (3, 2)  # (layers, top-k)


def rows(start: int, stop: int) -> np.ndarray:
    """The routing of positions [start, stop) of one sample: a value per (position, layer, k)."""
    return np.arange(start * 6, stop * 6, dtype=np.int32).reshape(-1, *SHAPE)


def segment(tokens: list[int], *, prompt: int, held_rows: int | None, finish: str | None = "length", **extra: Any):
    """A result as the server sends it for a request of ``prompt`` tokens whose routing starts at
    row ``held_rows`` (None: no routed experts, a cut)."""
    n = len(tokens)
    routed = None if held_rows is None else rows(held_rows, prompt + n - 1)
    return StreamResult(
        mode="incremental",
        token_ids=np.array(tokens, dtype=np.int32),
        logprobs=-np.arange(1, n + 1, dtype=np.float64) / 10,
        text="".join(f"<{t}>" for t in tokens),
        finish_reason=None if finish is None else {"type": finish},
        meta_info={"prompt_tokens": prompt, "weight_version": "v1"},
        completion_tokens=n,
        routed_experts=routed,
        events=n,
        aborted=finish in (None, "abort"),
        **extra,
    )


def payload(**extra: Any) -> dict[str, Any]:
    return {
        "input_ids": PROMPT,
        "rid": "r-1",
        "sampling_params": {"max_new_tokens": 10, "temperature": 0},
        "return_routed_experts": True,
        "stream": True,
        **extra,
    }


# ---- resume_payload ------------------------------------------------------------------------------


def test_a_resume_asks_again_with_the_kept_tokens_a_reduced_budget_and_the_first_row_not_held() -> None:
    kept = segment([1, 2, 3], prompt=5, held_rows=0, finish="abort")  # drained: 5 + 3 - 1 = 7 rows
    nxt = fastaccum.resume_payload(payload(), kept)
    assert nxt["input_ids"] == [*PROMPT, 1, 2, 3]
    assert nxt["sampling_params"] == {"max_new_tokens": 7, "temperature": 0}
    assert nxt["routed_experts_start_len"] == 7 and "rid" not in nxt and nxt["stream"] is True
    assert payload()["sampling_params"]["max_new_tokens"] == 10  # the original is left alone


def test_a_cut_prefix_holds_no_rows_so_the_resume_asks_for_all() -> None:
    kept = segment([1, 2, 3], prompt=5, held_rows=None, finish=None)
    nxt = fastaccum.resume_payload(payload(), kept)
    assert "routed_experts_start_len" not in nxt and nxt["input_ids"] == [*PROMPT, 1, 2, 3]


def test_vllm_resumes_with_its_own_keys() -> None:
    base = {"token_ids": PROMPT, "request_id": "q-1", "sampling_params": {"max_tokens": 10, "logprobs": 1}}
    nxt = fastaccum.resume_payload(base, segment([1, 2], prompt=5, held_rows=0), dialect="vllm")
    assert nxt["token_ids"] == [*PROMPT, 1, 2] and "request_id" not in nxt
    assert nxt["sampling_params"] == {"max_tokens": 8, "logprobs": 1, "routed_experts_prompt_start": 6}


@pytest.mark.parametrize(
    ("base", "message"),
    [
        ({"text": "hello", "sampling_params": {"max_new_tokens": 5}}, "not text"),
        (payload(sampling_params={"max_new_tokens": 3}), "leaves no token to resume after 3 kept tokens"),
    ],
    ids=["text-prompt", "budget-spent"],
)
def test_what_cannot_be_resumed_is_refused(base: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fastaccum.resume_payload(base, segment([1, 2, 3], prompt=5, held_rows=0))


# ---- join ----------------------------------------------------------------------------------------


def test_a_join_holds_every_segment_once() -> None:
    first = segment([1, 2, 3], prompt=5, held_rows=0, finish="abort")  # rows 0..6
    second = segment([4, 5], prompt=8, held_rows=7)  # rows 7..8
    joined = fastaccum.join(first, second)
    assert joined.token_ids.tolist() == [1, 2, 3, 4, 5] and len(joined) == 5
    assert joined.logprobs.tolist() == [-0.1, -0.2, -0.3, -0.1, -0.2]
    assert joined.text == "<1><2><3><4><5>" and joined.finish_reason == {"type": "length"}
    assert np.array_equal(joined.routed_experts, rows(0, 5 + 5 - 1))  # every position once, in order
    assert joined.meta_info["prompt_tokens"] == 5 and joined.completion_tokens == 5
    assert joined.replay_complete and joined.events == 5 and joined.timing is None


def test_three_segments_with_a_cut_one_between_join_to_the_whole_sample() -> None:
    """A drained abort, a cut (no rows: the next request asks for them from the first missing),
    then the end."""
    first = segment([1, 2], prompt=5, held_rows=0, finish="abort")  # rows 0..5
    cut = segment([3, 4], prompt=7, held_rows=None, finish=None)  # none
    partial = fastaccum.join(first, cut)
    assert not partial.replay_complete and partial.routed_experts.shape[0] == 6  # rows only missing
    nxt = fastaccum.resume_payload(payload(), partial)
    assert nxt["input_ids"] == [*PROMPT, 1, 2, 3, 4] and nxt["routed_experts_start_len"] == 6
    last = segment([5], prompt=9, held_rows=6)  # rows 6..8
    joined = fastaccum.join(first, cut, last)
    assert joined.token_ids.tolist() == [1, 2, 3, 4, 5]
    assert np.array_equal(joined.routed_experts, rows(0, 9))


def test_rows_asked_for_twice_are_refused_naming_both_counts() -> None:
    """The duplicated-rows bug: the second request was sent without routed_experts_start_len, so
    its rows start at 0 again."""
    first = segment([1, 2, 3], prompt=5, held_rows=0, finish="abort")
    again = segment([4, 5], prompt=8, held_rows=0)  # 8 + 2 - 1 = 9 rows from position 0
    with pytest.raises(StreamLengthError, match=r"hold 16 routed-experts rows \(7, 9\), the sample has 9") as info:
        fastaccum.join(first, again)
    assert (info.value.expected, info.value.actual) == (9, 16) and "rows repeat" in str(info.value)


def test_a_finished_sample_with_rows_missing_is_refused() -> None:
    first = segment([1, 2, 3], prompt=5, held_rows=None, finish=None)  # cut: no rows
    last = segment([4], prompt=8, held_rows=7)  # asked from row 7, as if the cut had held them
    with pytest.raises(StreamLengthError, match="rows are missing"):
        fastaccum.join(first, last)


def test_flat_routed_experts_are_counted_by_their_width() -> None:
    first = segment([1, 2], prompt=5, held_rows=0, finish="abort")
    second = segment([3], prompt=7, held_rows=6)
    flat = [dataclasses.replace(s, routed_experts=s.routed_experts.reshape(-1)) for s in (first, second)]
    assert np.array_equal(fastaccum.join(*flat).routed_experts, rows(0, 7).reshape(-1))
    again = dataclasses.replace(flat[1], routed_experts=rows(0, 7).reshape(-1))
    with pytest.raises(StreamLengthError, match="rows repeat"):
        fastaccum.join(flat[0], again)


def test_top_p_rows_join_when_every_segment_has_them() -> None:
    ids = np.array([7, 8, 9], dtype=np.int32)
    first = segment(
        [1, 2], prompt=5, held_rows=None, top_p_token_ids=ids[:2], top_p_token_offsets=np.array([0, 1, 2], np.int32)
    )
    second = segment(
        [3], prompt=7, held_rows=None, top_p_token_ids=ids[2:], top_p_token_offsets=np.array([0, 1], np.int32)
    )
    joined = fastaccum.join(first, second)
    assert joined.top_p_token_ids.tolist() == [7, 8, 9] and joined.top_p_token_offsets.tolist() == [0, 1, 2, 3]
    assert fastaccum.join(first, segment([3], prompt=7, held_rows=None)).top_p_token_ids is None  # one has none


def test_the_indexer_top_k_is_the_newest_segments_whole_sequence() -> None:
    first = segment([1, 2], prompt=5, held_rows=None, indexer_topk=np.zeros((6, 1, 2), np.int32))
    second = segment([3, 4], prompt=7, held_rows=None, indexer_topk=np.ones((8, 1, 2), np.int32))
    assert fastaccum.join(first, second).indexer_topk.tolist() == np.ones((8, 1, 2)).tolist()
    wrong = dataclasses.replace(second, indexer_topk=np.ones((5, 1, 2), np.int32))
    with pytest.raises(StreamLengthError, match="indexer top-k has 5 rows, the sample has 8"):
        fastaccum.join(first, wrong)


def test_segments_that_disagree_on_log_probs_are_refused() -> None:
    with pytest.raises(StreamFormatError, match="some segments carry log-probs and others do not"):
        without = dataclasses.replace(segment([2], prompt=6, held_rows=None), logprobs=None)
        fastaccum.join(segment([1], prompt=5, held_rows=None), without)


def test_rows_held_elsewhere_go_first_and_must_be_the_start() -> None:
    """A framework holds the sample's rows in its own array: the resumed request asked from there
    on, and the join covers the whole sequence."""
    rest = segment([4, 5], prompt=8, held_rows=7)  # prompt 5 + 3 kept tokens, rows 0..6 held
    whole = fastaccum.join(rest, prompt_tokens=8, routed_start=7, held_routed=rows(0, 7))
    assert np.array_equal(whole.routed_experts, rows(0, 9))
    flat = fastaccum.join(rest, prompt_tokens=8, routed_start=7, held_routed=rows(0, 7).ravel())
    assert np.array_equal(flat.routed_experts, rows(0, 9))
    with pytest.raises(StreamLengthError, match="held_routed has 6 rows, routed_start says 7"):
        fastaccum.join(rest, prompt_tokens=8, routed_start=7, held_routed=rows(0, 6))
    stale = segment([4, 5], prompt=8, held_rows=0)  # the server sent every row again
    with pytest.raises(StreamLengthError, match=r"\(7 held, 9\).*rows repeat"):
        fastaccum.join(stale, prompt_tokens=8, routed_start=7, held_routed=rows(0, 7))
