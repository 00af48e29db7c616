"""The resume contract, written once: the next request of a sample that was cut short
(``resume_payload``), and one result for every segment of it (``join``), its replay rows checked.

A framework that aborts a request keeps its prefix and asks again with ``prompt + prefix``. Both
engines return routed experts for the whole sequence of each request, ``prompt + completion - 1``
rows, unless asked to skip those already held: SGLang's ``routed_experts_start_len`` (rows from
that position on) and vLLM's ``sampling_params.routed_experts_prompt_start``. Concatenating two
answers' arrays without it repeats the prompt's rows (the bug verl fixed by slicing, and that
AReaL and ROLL still have). ``resume_payload`` asks for exactly the rows not held, and ``join``
refuses any other count. SGLang sends the indexer top-k for the whole sequence whatever the start,
so a join takes the newest segment's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from fastaccum._core.policy import DIALECTS
from fastaccum.errors import StreamFormatError, StreamLengthError
from fastaccum.result import StreamResult

__all__ = ("resume_payload", "join", "prompt_tokens_of", "routed_start_of")

SGLANG, DYNAMO, VLLM = DIALECTS
# Per dialect: the prompt's key, the budget's key in sampling_params, where the routed experts'
# start goes (the payload, or its sampling_params), and the request id's key.
_KEYS = {
    SGLANG: ("input_ids", "max_new_tokens", ("payload", "routed_experts_start_len"), "rid"),
    DYNAMO: ("input_ids", "max_new_tokens", ("payload", "routed_experts_start_len"), "rid"),
    VLLM: ("token_ids", "max_tokens", ("sampling_params", "routed_experts_prompt_start"), "request_id"),
}


def prompt_tokens_of(result: StreamResult) -> int | None:
    """The prompt length the server reported for the request (SGLang's ``meta_info.prompt_tokens``,
    vLLM's ``usage.prompt_tokens``), or None."""
    count = result.meta_info.get("prompt_tokens")
    usage = result.meta_info.get("usage")
    if count is None and isinstance(usage, Mapping):
        count = usage.get("prompt_tokens")
    return count if type(count) is int and count >= 0 else None


def routed_start_of(payload: Mapping[str, Any], dialect: str = SGLANG) -> int:
    """The first routed-experts row a request asks for (SGLang's ``routed_experts_start_len``,
    vLLM's ``sampling_params.routed_experts_prompt_start``). The stream does not say it, so the
    accumulator is told; 0 where it is not a valid count (the server refuses such a request)."""
    where, key = _KEYS[dialect][2] if dialect in _KEYS else _KEYS[SGLANG][2]
    holder = payload if where == "payload" else payload.get("sampling_params") or {}
    start = holder.get(key, 0) if isinstance(holder, Mapping) else 0
    return start if type(start) is int and start >= 0 else 0


def _rows(array: npt.NDArray[Any] | None, width: int | None) -> int:
    """Rows of a routed-experts array: its first axis when shaped, else its size over ``width``."""
    if array is None:
        return 0
    if array.ndim > 1:
        return int(array.shape[0])
    if not width:
        raise StreamFormatError("join needs the routed experts shaped (expert_shape) or a width to count their rows")
    return int(array.size) // width


def resume_payload(payload: Mapping[str, Any], kept: StreamResult, *, dialect: str = "sglang") -> dict[str, Any]:
    """The request that continues ``payload`` after ``kept`` (what the sample holds of it so far:
    one cut result, or ``join`` of several): the prompt followed by the kept tokens, the budget
    reduced by them, and the routed experts asked for from the first row not held. The request id
    is dropped: a resumed request is another request (the transports give it a new one)."""
    if dialect not in _KEYS:
        raise ValueError(f"dialect must be one of {', '.join(map(repr, _KEYS))}, not {dialect!r}")
    prompt_key, budget_key, (where, start_key), id_key = _KEYS[dialect]
    prompt = payload.get(prompt_key)
    if not isinstance(prompt, list) or any(type(t) is not int for t in prompt):
        given = next((k for k in ("text", "input_ids", "token_ids") if k in payload and k != prompt_key), None)
        why = f"not {given}" if given else "and the payload has none"
        raise ValueError(f"resume_payload continues a prompt of token ids ({prompt_key}, a list of ints), {why}")
    held = len(kept)
    params = dict(payload.get("sampling_params") or {})
    budget = params.get(budget_key)
    if budget is not None:
        if type(budget) is not int or budget - held < 1:
            raise ValueError(
                f"sampling_params.{budget_key}={budget!r} leaves no token to resume after {held} kept tokens"
            )
        params[budget_key] = budget - held
    out = {key: value for key, value in payload.items() if key != id_key}
    out[prompt_key] = [*prompt, *kept.token_ids.tolist()]
    start = routed_start_of(payload, dialect) + _rows(kept.routed_experts, _width(kept, len(prompt), payload, dialect))
    if start:
        if where == "payload":
            out[start_key] = start
        else:
            params[start_key] = start
    if params or "sampling_params" in payload:
        out["sampling_params"] = params
    return out


def _width(result: StreamResult, prompt: int, payload: Mapping[str, Any], dialect: str) -> int | None:
    """Values per row of a flat routed-experts array: its size over the rows it must have."""
    array = result.routed_experts
    if array is None or array.ndim > 1:
        return None
    rows = prompt + len(result) - 1 - routed_start_of(payload, dialect)
    return array.size // rows if rows > 0 and array.size % rows == 0 else None


def join(
    *segments: StreamResult,
    prompt_tokens: int | None = None,
    routed_start: int = 0,
    width: int | None = None,
    held_routed: npt.NDArray[Any] | None = None,
) -> StreamResult:
    """One result for a sample asked for in ``segments``, in order (each resumed with
    ``resume_payload`` from everything before it): tokens, log-probs, text and top-p rows
    concatenated, the routed experts too, checked to have ``prompt + total - 1 - routed_start``
    rows (a StreamLengthError naming both counts otherwise: repeated rows are what a resume without
    the start length gives), the newest segment's indexer top-k (sent for the whole sequence), its
    finish and meta_info (with the first segment's prompt length). ``prompt_tokens``: the first
    request's prompt length (default: what its server reported); ``routed_start``: the first
    request's own start; ``width``: values per row, for unshaped (flat) routed experts;
    ``held_routed``: the ``routed_start`` rows before it, held elsewhere (a framework's array of
    the sample), put first so that the routed experts cover the whole sequence."""
    if not segments:
        raise ValueError("join needs at least one result")
    first, last = segments[0], segments[-1]
    prompt = prompt_tokens if prompt_tokens is not None else prompt_tokens_of(first)
    tokens = np.concatenate([s.token_ids for s in segments]).astype(np.int32, copy=False)
    total = int(tokens.shape[0])
    meta = dict(last.meta_info)
    if prompt is not None:
        meta["prompt_tokens"] = prompt
    meta["completion_tokens"] = total
    top_p_ids, top_p_offsets = _top_p(segments)
    return dataclasses.replace(
        last,
        token_ids=tokens,
        logprobs=_logprobs(segments),
        text=_text(segments),
        meta_info=meta,
        completion_tokens=total,
        top_p_token_ids=top_p_ids,
        top_p_token_offsets=top_p_offsets,
        routed_experts=_routed(segments, prompt, total, routed_start, width, held_routed),
        indexer_topk=_indexer(segments, prompt, total),
        events=sum(s.events for s in segments),
        request_sent=any(s.request_sent for s in segments),
        timing=None,  # each segment was its own request: their timings are theirs
        weight_version_spans=_spans(segments),
    )


def _spans(segments: tuple[StreamResult, ...]) -> tuple[tuple[int, int, str], ...] | None:
    """The segments' weight-version runs over the sample's tokens, in order, adjacent equal
    versions merged; None when a segment with tokens said none."""
    out: list[tuple[int, int, str]] = []
    base = 0
    for s in segments:
        if s.weight_version_spans is None:
            if len(s):
                return None
            continue
        for start, end, version in s.weight_version_spans:
            if out and out[-1][2] == version and out[-1][1] == base + start:
                out[-1] = (out[-1][0], base + end, version)
            else:
                out.append((base + start, base + end, version))
        base += len(s)
    return tuple(out)


def _logprobs(segments: tuple[StreamResult, ...]) -> npt.NDArray[np.float64] | None:
    with_tokens = [s for s in segments if len(s)]
    if not with_tokens or all(s.logprobs is None for s in with_tokens):
        return None
    if any(s.logprobs is None for s in with_tokens):
        raise StreamFormatError("join: some segments carry log-probs and others do not")
    return np.concatenate([s.logprobs for s in with_tokens if s.logprobs is not None])


def _text(segments: tuple[StreamResult, ...]) -> str | None:
    if all(s.text is None for s in segments):
        return None
    return "".join(s.text or "" for s in segments)


def _top_p(
    segments: tuple[StreamResult, ...],
) -> tuple[npt.NDArray[np.int32] | None, npt.NDArray[np.int32] | None]:
    """The rows of every token, or none when a segment with tokens has none (a cut one)."""
    with_tokens = [s for s in segments if len(s)]
    if not with_tokens or any(s.top_p_token_offsets is None or s.top_p_token_ids is None for s in with_tokens):
        return None, None
    ids = np.concatenate([s.top_p_token_ids for s in with_tokens if s.top_p_token_ids is not None])
    offsets = [np.zeros(1, dtype=np.int32)]
    base = 0
    for s in with_tokens:
        assert s.top_p_token_offsets is not None
        offsets.append(s.top_p_token_offsets[1:] + base)
        base += int(s.top_p_token_offsets[-1])
    return ids.astype(np.int32, copy=False), np.concatenate(offsets).astype(np.int32, copy=False)


def _routed(
    segments: tuple[StreamResult, ...],
    prompt: int | None,
    total: int,
    start: int,
    width: int | None,
    held: npt.NDArray[Any] | None,
) -> npt.NDArray[Any] | None:
    """The segments' routed experts, in order (after ``held``, the ``start`` rows before them).
    Rows may be missing only while the sample's newest segment lacks its terminal event (a cut:
    the resume asks for them again); rows may never repeat."""
    arrays = [s.routed_experts for s in segments if s.routed_experts is not None]
    held_note = ""
    if held is not None:
        if width is None and held.ndim == 1:  # flat: the width is the shaped segments', or its own
            width = int(np.prod(arrays[0].shape[1:])) if arrays and arrays[0].ndim > 1 else held.size // max(start, 1)
        if _rows(held, width) != start:
            raise StreamLengthError(
                f"join: held_routed has {_rows(held, width)} rows, routed_start says {start}",
                mode=segments[-1].mode,
                expected=start,
                actual=_rows(held, width),
            )
        if arrays and held.ndim != arrays[0].ndim:
            held = held.reshape(-1, *arrays[0].shape[1:])
        if len(held):
            arrays = [held, *arrays]
        held_note = f"{start} held, "
        start = 0
    if not arrays:
        return None
    if prompt is None:
        raise StreamFormatError("join cannot count routed-experts rows: no prompt_tokens given or reported")
    expected = max(prompt + total - 1 - start, 0)
    if width is None and arrays[0].ndim == 1:
        first = segments[0]
        rows_first = prompt + len(first) - 1 - start
        width = arrays[0].size // rows_first if first.routed_experts is not None and rows_first > 0 else None
    actual = sum(_rows(a, width) for a in arrays)
    if actual > expected or (actual < expected and segments[-1].replay_complete):
        each = held_note + ", ".join(str(_rows(s.routed_experts, width)) for s in segments)
        if actual > expected:
            why = "rows repeat: was a segment asked for without routed_experts_start_len?"
        else:
            why = "rows are missing"
        counted = f"prompt {prompt} + {total} tokens - 1" + (f" - start {start}" if start else "")
        raise StreamLengthError(
            f"join: the segments hold {actual} routed-experts rows ({each}), the sample has {expected} "
            f"({counted}): {why}",
            mode=segments[-1].mode,
            expected=expected,
            actual=actual,
        )
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def _indexer(segments: tuple[StreamResult, ...], prompt: int | None, total: int) -> npt.NDArray[np.int32] | None:
    """The newest segment's indexer top-k: SGLang sends it for its request's whole sequence. When
    that is the sample's last segment and it ended, its rows must be the sample's."""
    last = segments[-1]
    newest = next((s.indexer_topk for s in reversed(segments) if s.indexer_topk is not None), None)
    if newest is None or prompt is None or newest.ndim == 1 or last.indexer_topk is None:
        return newest
    expected = max(prompt + total - 1, 0)
    if last.replay_complete and newest.shape[0] != expected:
        raise StreamLengthError(
            f"join: the newest indexer top-k has {newest.shape[0]} rows, the sample has {expected} "
            f"(prompt {prompt} + {total} tokens - 1): SGLang sends it for the whole sequence of its request",
            mode=last.mode,
            expected=expected,
            actual=int(newest.shape[0]),
        )
    return newest
