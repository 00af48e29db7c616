"""Committing a result onto vime's ``Sample``: once per call, the terminal result or a cut prefix,
the way this vime line's own ``generate`` commits: through ``Sample.append_response_tokens``
(which keeps the loss mask, log-probs, top-p CSR, routed experts and status aligned), or, on a
line whose ``Sample`` has only ``update_from_meta_info``, tokens written directly and then that."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastaccum._rollout import append_call, call_tokens, call_versions, record_timing
from fastaccum.errors import ServerError, StreamFormatError
from fastaccum.result import StreamResult
from fastaccum.vime._modules import modules

__all__ = ("commit_prefix", "commit_terminal", "finish_of")

# vLLM's finish_reason strings as vime maps them (vllm_rollout._inference_generate_meta_info);
# vime maps any other string to "stop" (complete), which would train on an errored or unknown end:
# fastaccum refuses those instead.
_FINISH = {"stop": "stop", "length": "length", "abort": "abort", "cancelled": "abort"}


def finish_of(result: StreamResult) -> dict[str, Any]:
    """The finish_reason in vime's form, from the raw vLLM string the stream carried."""
    if result.finish_reason is None:  # run() returns only finished or aborted results
        raise StreamFormatError("stream ended without a finish_reason")
    raw = result.meta_info.get("finish_reason", result.finish_reason.get("type"))
    if raw == "error":
        raise ServerError("vLLM ended the request with finish_reason 'error'", status=None, server_message="error")
    kind = _FINISH.get(raw) if isinstance(raw, str) else None
    if kind is None:
        raise StreamFormatError(f"unknown vLLM finish_reason {raw!r}")
    return {"type": kind}


def _text(tokens: list[int], tokenizer: Any, skip_special_tokens: bool) -> str:
    # vLLM's token-in/token-out endpoint sends no text: decode once per call, not per chunk.
    return tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens) if tokens else ""


def _top_p(result: StreamResult, meta: dict[str, Any]) -> None:
    # Decoded arrays go straight into meta_info: vime's decode_int32_meta_array takes arrays as is.
    if result.top_p_token_ids is not None and len(result):
        meta["top_p_token_ids"] = result.top_p_token_ids
        meta["top_p_token_offsets"] = result.top_p_token_offsets


def _write(
    args: Any, sample: Any, tokens: list[int], logprobs: list[float], text: str, meta: dict[str, Any] | None
) -> None:
    """Tokens onto a ``Sample`` without ``append_response_tokens``, as that line's ``generate``
    writes them; ``meta`` (terminal only) then goes through ``update_from_meta_info``."""
    sample.tokens = list(sample.tokens) + tokens
    sample.response_length += len(tokens)
    sample.response += text
    if sample.loss_mask is not None:  # that line keeps a mask only once partial rollout masked one
        sample.loss_mask += [1] * len(tokens)
    if sample.rollout_log_probs is None:
        sample.rollout_log_probs = []
    sample.rollout_log_probs += logprobs
    if meta is not None:
        sample.update_from_meta_info(args, meta)


def commit_terminal(
    args: Any, sample: Any, result: StreamResult, tokenizer: Any, skip_special_tokens: bool, routed: Any
) -> None:
    """A stream that ended with its finishing chunk (a finish, or an abort chunk): tokens,
    terminal bookkeeping, status, and ``routed``, the sample's routed experts for its whole
    sequence (held rows and the call's, joined: fastaccum._rollout.replay)."""
    finish = finish_of(result)
    tokens, logprobs = call_tokens(result, "logprobs: 1 is sent")
    info = result.meta_info
    meta: dict[str, Any] = {"finish_reason": finish}
    versions = call_versions(result)
    usage = info.get("usage")
    if isinstance(usage, dict):
        meta["prompt_tokens"] = usage.get("prompt_tokens", 0)
        meta["completion_tokens"] = usage.get("completion_tokens", 0)
        meta["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    metrics = info.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if spec:
        meta["spec_accept_token_num"] = spec.get("num_accepted_draft_tokens", spec.get("num_accepted_tokens", 0))
        meta["spec_draft_token_num"] = spec.get("num_draft_tokens", 0)
        meta["spec_verify_ct"] = spec.get("num_spec_steps", spec.get("num_verify_steps", 0))
    text = _text(tokens, tokenizer, skip_special_tokens)
    if modules().commit == "update":
        _write(args, sample, tokens, logprobs, text, meta)
        sample.weight_versions.extend(versions)
        if routed is not None:
            sample.rollout_routed_experts = np.ascontiguousarray(routed, dtype=np.int32)
        record_timing(sample, result)
        return
    if versions:  # vime's Sample takes one version per call; more spans are appended below
        meta["weight_version"] = versions[0]
    _top_p(result, meta)
    if routed is not None:
        meta["routed_experts"] = routed
    append_call(args, sample, tokens, logprobs, text, meta, terminal=True)
    sample.weight_versions.extend(versions[1:])
    record_timing(sample, result)


def commit_prefix(args: Any, sample: Any, result: StreamResult, tokenizer: Any, skip_special_tokens: bool) -> None:
    """A stream cut before its finishing chunk (a cut, or [DONE] without a finish_reason): the
    tokens received (with the sampling-mask rows that came with them), no terminal bookkeeping,
    ABORTED. Routed experts come only in a finishing chunk: none."""
    tokens, logprobs = call_tokens(result, "logprobs: 1 is sent")
    if tokens:
        text = _text(tokens, tokenizer, skip_special_tokens)
        if modules().commit == "update":
            _write(args, sample, tokens, logprobs, text, None)
        else:
            meta: dict[str, Any] = {}
            _top_p(result, meta)
            append_call(args, sample, tokens, logprobs, text, meta, terminal=False)
        # one entry per committed segment, as a terminal commit makes
        sample.weight_versions.extend(call_versions(result))
    record_timing(sample, result)
    sample.status = modules().Sample.Status.ABORTED
