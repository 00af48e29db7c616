"""vLLM ``/inference/v1/generate`` SSE writer: chunks as vLLM serializes them, for the emulator
and tests (the facts are in docs/dialects.md).

A chunk is pydantic's compact ``model_dump_json()`` with every field written, nulls included, in
the model's field order (prompt ids, placeholders and metrics left out while None); the last,
usage-only chunk is written with ``exclude_none``; ``data: <json>\\n\\n``; ``data: [DONE]`` at
the end. The facts are read from vLLM 0.27, 0.31, 0.32 and 0.34
(``vllm/entrypoints/scale_out/token_in_token_out/{protocol,serving}.py``). Two shapes: vLLM
0.32 on (``"0.32"``: ``output_mode``, ``stop_reason``, logprob items with an integer
``token_id``) and before (``"0.31"``: ``"token": "token_id:<id>"`` items with ``bytes``).
Token ids and logprobs come from fastaccum.emulator.writer's ``Generation``, so a test can check a whole
stream end to end; routed experts are a base64 ``.npy``, in the dtype vLLM's capturer picks for
the model's expert count where that is given, else the narrowest that holds them.

tests/test_golden_vllm.py holds these bytes to the goldens vLLM's own serving code wrote
(tests/golden/vllm-*). Written the same: every chunk of the 0.31 shape for vLLM 0.31, and of the
0.32 shape for vLLM 0.32. Not written: vLLM 0.27's choices, which have no ``sampling_mask`` key,
and vLLM 0.34's per-chunk usage (``continuous_usage_stats``), which has no
``prompt_tokens_details`` key (0.27's has no ``completion_tokens_details``).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pybase64

from fastaccum.emulator.writer import DONE, Generation, emission_points

__all__ = (
    "SHAPES",
    "Candidates",
    "chunk",
    "usage_chunk",
    "error_chunk",
    "stream_chunks",
    "sse",
    "stream_bytes",
    "encode_npy",
)

SHAPES = ("0.32", "0.31")
# vLLM's finish reasons as SGLang writes them (fastaccum.emulator.writer's Generation keeps SGLang's form).
_FINISH = {"stop": "stop", "length": "length", "abort": "abort"}
# The top log-probs of one output position as the stream lists them: (token id, logprob, rank),
# the sampled token first (the engine's Logprob dict puts it there).
Candidates = Sequence[tuple[int, float | None, int | None]]


def encode_npy(array: npt.NDArray[Any], num_experts: int | None = None) -> str:
    """A routed-experts array as vLLM sends it: ``np.save`` bytes, base64. The dtype is the one
    vLLM's routed-experts capturer allocates, uint8 for a model of up to 256 experts, else uint16,
    whatever values a request happened to route to; without ``num_experts``, the narrowest of
    uint8, uint16 and int32 that holds the values."""
    if num_experts is not None:
        dtype: type[np.integer[Any]] = np.uint8 if num_experts <= 256 else np.uint16
    else:
        top = int(array.max()) if array.size else 0
        dtype = np.uint8 if top < 1 << 8 else np.uint16 if top < 1 << 16 else np.int32
    out = io.BytesIO()
    np.save(out, np.ascontiguousarray(array, dtype=dtype), allow_pickle=False)
    return pybase64.b64encode(out.getvalue()).decode("ascii")


def _clamped(logprob: float | None) -> float:
    return -9999.0 if logprob is None else logprob  # vLLM clamps -inf; it never writes null


def _logprobs(
    gen: Generation, start: int, end: int, shape: str, candidates: Callable[[int], Candidates] | None
) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(start, end):
        token, value = gen.token_ids[i], _clamped(gen.logprobs[i])
        # With logprobs=0 vLLM still lists the sampled token among the candidates (rank 1 for a
        # greedy sampler; the engine's rank of it where the candidates are given).
        listed = candidates(i) if candidates is not None else [(token, gen.logprobs[i], 1)]
        rank = listed[0][2] if listed else 1
        top: list[dict[str, Any]]
        if shape == "0.32":
            top = [{"token_id": t, "logprob": _clamped(lp), "rank": r} for t, lp, r in listed]
            items.append({"token_id": token, "logprob": value, "rank": rank, "top_logprobs": top})
        else:
            name = f"token_id:{token}"
            top = [{"token": f"token_id:{t}", "logprob": _clamped(lp), "bytes": None} for t, lp, _ in listed]
            items.append({"token": name, "logprob": value, "bytes": None, "top_logprobs": top})
    return {"content": items}


def _running_usage(gen: Generation, completion: int) -> dict[str, Any]:
    """A token chunk's usage under ``stream_options.continuous_usage_stats``: the tokens so far,
    written with the model's nulls (vLLM 0.31 and 0.32)."""
    return {
        "prompt_tokens": gen.prompt_tokens,
        "total_tokens": gen.prompt_tokens + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def chunk(
    gen: Generation,
    start: int,
    end: int,
    *,
    shape: str = "0.32",
    logprobs: bool = True,
    finish: str | None = None,
    stop_reason: int | str | None = None,
    routed: bool = False,
    sampling_mask: bool = False,
    weight_versions: list[dict[str, Any]] | None = None,
    candidates: Callable[[int], Candidates] | None = None,
    num_experts: int | None = None,
    continuous_usage: bool = False,
    prompt_token_ids: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The chunk that carries tokens [start, end) (none for an abort chunk: start == end).

    ``candidates(i)``: the top log-probs listed for output position ``i`` (``logprobs=k``), in the
    engine's order; by default the sampled token alone, at rank 1. ``num_experts``: the model's
    expert count, which sets the routed experts' dtype. ``continuous_usage``: the usage so far on
    the chunk. ``prompt_token_ids``: the prompt, which ``return_token_ids`` puts on the first chunk.
    """
    choice: dict[str, Any] = {"index": 0}
    lps = _logprobs(gen, start, end, shape, candidates) if logprobs else None
    if shape != "0.32":
        choice["logprobs"] = lps
    choice["finish_reason"] = finish
    if shape == "0.32":
        choice["stop_reason"] = stop_reason
    choice["token_ids"] = list(gen.token_ids[start:end])
    experts = gen.routed_experts if routed else None
    choice["routed_experts"] = encode_npy(experts, num_experts) if experts is not None else None
    rows = gen.top_p_rows[start:end] if sampling_mask and gen.top_p_rows is not None else None
    choice["sampling_mask"] = [list(r) for r in rows] if rows is not None else None
    usage = _running_usage(gen, end) if continuous_usage else None
    out: dict[str, Any] = {"request_id": gen.rid}
    if shape == "0.32":
        choice["weight_versions"] = weight_versions
        choice["logprobs"] = lps
        out["usage"] = usage
        if prompt_token_ids is not None:
            out["prompt_token_ids"] = list(prompt_token_ids)
        out["output_mode"] = "tokens"
        out["choices"] = [choice]
        return out
    out["choices"] = [choice]
    out["usage"] = usage
    if prompt_token_ids is not None:
        out["prompt_token_ids"] = list(prompt_token_ids)
    return out


def usage_chunk(gen: Generation, completion: int, *, shape: str = "0.32") -> dict[str, Any]:
    """The last chunk that ``stream_options.include_usage`` asks for: no choice, the counts."""
    # UsageInfo's field order; vLLM writes this chunk with exclude_none: no null details
    usage: dict[str, Any] = {
        "prompt_tokens": gen.prompt_tokens,
        "total_tokens": gen.prompt_tokens + completion,
        "completion_tokens": completion,
    }
    if shape == "0.32":
        return {"request_id": gen.rid, "usage": usage, "output_mode": "tokens", "choices": []}
    return {"request_id": gen.rid, "choices": [], "usage": usage}


def error_chunk(message: str, kind: str = "BadRequestError", code: int = 400) -> bytes:
    """An error as vLLM writes it mid-stream: ``json.dumps`` (with spaces), then ``[DONE]``."""
    error = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return b"data: " + json.dumps(error).encode() + b"\n\n"


def finish_of(gen: Generation) -> tuple[str, int | str | None]:
    reason = gen.finish_reason or {"type": "length"}
    raw = _FINISH.get(reason["type"], reason["type"])
    return raw, reason.get("matched") if raw == "stop" else None


def stream_chunks(
    gen: Generation,
    *,
    shape: str = "0.32",
    interval: int = 1,
    logprobs: bool = True,
    routed: bool = False,
    sampling_mask: bool = False,
    usage: bool = True,
    points: Sequence[int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Every chunk of a finished request: one per emission point, the last with finish_reason
    and the arrays, then the usage chunk."""
    n = len(gen.token_ids)
    pts = list(points) if points is not None else emission_points(n, interval)
    raw, matched = finish_of(gen)
    prev = 0
    for k, end in enumerate(pts):
        last = k == len(pts) - 1
        yield chunk(
            gen,
            prev,
            end,
            shape=shape,
            logprobs=logprobs,
            finish=raw if last else None,
            stop_reason=matched if last else None,
            routed=routed and last,
            sampling_mask=sampling_mask,
        )
        prev = end
    if usage:
        yield usage_chunk(gen, n, shape=shape)


def sse(obj: dict[str, Any]) -> bytes:
    """One chunk as vLLM writes it (pydantic's compact JSON)."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream_bytes(chunks: Iterator[dict[str, Any]] | Sequence[dict[str, Any]], *, done: bool = True) -> bytes:
    body = b"".join(sse(c) for c in chunks)
    return body + DONE if done else body
