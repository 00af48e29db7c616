"""Committing a result onto Miles' ``Sample`` once per call, as Miles' ``update_sample_from_response``
fills it from a whole answer: tokens written directly, then ``Sample.update_from_meta_info``
(prefix-cache and speculative counts, the weight version, the status); routed experts and the
indexer top-k as numpy arrays, one row per position of the sequence but the last."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fastaccum._rollout import call_text, call_tokens, call_versions, record_timing, sglang_finish
from fastaccum.errors import StreamFormatError, StreamLengthError
from fastaccum.result import StreamResult

__all__ = ("commit_prefix", "commit_terminal", "shape_routed")


def shape_routed(result: StreamResult, layers: int, sent: int, start: int) -> StreamResult:
    """The call's routed experts as Miles shapes them, ``(rows, layers, k)``: ``layers`` is Miles'
    ``--num-layers`` and ``k`` what the size leaves per row and layer (Miles reads no top-k flag
    for the rollout). ``sent``: the prompt's tokens (the sample's, on a resume); ``start``: the
    first row asked for (``routed_experts_start_len``)."""
    flat = result.routed_experts
    if flat is None or flat.ndim != 1:
        return result
    rows = max(sent + len(result) - 1 - start, 0)
    k = flat.size // (rows * layers) if rows else 0
    if flat.size != rows * layers * k or (rows and not k):
        raise StreamLengthError(
            f"routed_experts has {flat.size} values, not a whole number of rows x {layers} layers "
            f"x top-k for {rows} rows",
            mode=result.mode,
            expected=rows * layers,
            actual=flat.size,
        )
    return dataclasses.replace(result, routed_experts=flat.reshape(rows, layers, k))


def _extend(sample: Any, prompt: list[int], result: StreamResult, tokenizer: Any) -> list[str]:
    """The call's tokens, text and log-probs onto the sample, in Miles' order (the prompt first on
    a sample that holds none); the loss mask only where the sample keeps one (Miles' v1 generate
    extends it; its single-turn generate never starts one). Returns the call's versions."""
    tokens, logprobs = call_tokens(result, "return_logprob is set")
    if not sample.tokens:
        sample.tokens = list(prompt)
    sample.tokens = sample.tokens + tokens
    sample.response_length += len(tokens)
    sample.response += call_text(result, tokens, tokenizer)
    sample.rollout_log_probs = [*(sample.rollout_log_probs or []), *logprobs]
    if sample.loss_mask is not None:
        sample.loss_mask = sample.loss_mask + [1] * len(tokens)
    record_timing(sample, result)
    return call_versions(result) if tokens else []


def commit_terminal(
    args: Any, sample: Any, result: StreamResult, tokenizer: Any, prompt: list[int], routed: Any
) -> None:
    """A call that ended with its terminal event (a finish, a drained abort, the server's abort):
    its tokens, ``routed`` (the sample's routed experts for its whole sequence: held rows and the
    call's, joined by fastaccum._rollout.replay), the indexer top-k (sent for the whole sequence),
    then Miles' own ``update_from_meta_info``; the later versions of a call that ran across a
    weight update are appended after the first."""
    reason = sglang_finish(result)  # a cut one is a prefix; a failed one or an unknown end fails the call
    indexer = result.indexer_topk
    if indexer is not None and indexer.ndim != 3:
        raise StreamFormatError(
            "SGLang sent indexer_topk without indexer_topk_num_layers: Miles reads the layer count from "
            "the server (sglang-miles sends it in meta_info)"
        )
    versions = _extend(sample, prompt, result, tokenizer)
    if routed is not None:
        sample.rollout_routed_experts = np.ascontiguousarray(routed, dtype=np.int32)
    if indexer is not None:
        sample.rollout_indexer_topk = indexer
    meta = {**result.meta_info, "finish_reason": reason}
    if versions:  # Miles' Sample takes one version per call, through meta_info
        meta["weight_version"] = versions[0]
    sample.update_from_meta_info(args, meta)
    sample.weight_versions.extend(versions[1:])


def commit_prefix(sample: Any, result: StreamResult, tokenizer: Any, prompt: list[int], aborted: Any) -> None:
    """A request-level abort's cut: the observed prefix, no terminal bookkeeping, ``aborted``
    (Miles' ``Sample.Status.ABORTED``); the versions it ran under recorded as a finish records
    them. Its replay rows come with the resume's answer."""
    sample.weight_versions.extend(_extend(sample, prompt, result, tokenizer))
    sample.status = aborted
