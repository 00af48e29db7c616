"""Committing a result onto vime's ``Sample``: once per call, the terminal result or a cut prefix,
through vime's own ``Sample.append_response_tokens`` (which keeps the loss mask, log-probs, top-p
CSR, routed experts and status aligned as vime's non-streaming ``generate`` has them)."""

from __future__ import annotations

from typing import Any

from fastaccum._rollout import call_tokens, record_timing
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


def commit_terminal(args: Any, sample: Any, result: StreamResult, tokenizer: Any, skip_special_tokens: bool) -> None:
    """A stream that ended with its finishing chunk: tokens, terminal bookkeeping, status."""
    finish = finish_of(result)
    tokens, logprobs = call_tokens(result, "logprobs: 1 is sent")
    info = result.meta_info
    meta: dict[str, Any] = {"finish_reason": finish}
    if info.get("weight_version") is not None:
        meta["weight_version"] = str(info["weight_version"])
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
    _top_p(result, meta)
    if result.routed_experts is not None:
        meta["routed_experts"] = result.routed_experts
    sample.append_response_tokens(
        args,
        tokens=tokens,
        log_probs=logprobs,
        trainable=True,
        meta_info=meta,
        text=_text(tokens, tokenizer, skip_special_tokens),
        update_terminal_info=True,
    )
    record_timing(sample, result)


def commit_prefix(args: Any, sample: Any, result: StreamResult, tokenizer: Any, skip_special_tokens: bool) -> None:
    """A cut stream: the tokens received (with the sampling-mask rows that came with them), no
    terminal bookkeeping, ABORTED. Routed experts come only in the finishing chunk: none."""
    tokens, logprobs = call_tokens(result, "logprobs: 1 is sent")
    if tokens:
        meta: dict[str, Any] = {}
        _top_p(result, meta)
        sample.append_response_tokens(
            args,
            tokens=tokens,
            log_probs=logprobs,
            trainable=True,
            meta_info=meta,
            text=_text(tokens, tokenizer, skip_special_tokens),
            update_terminal_info=False,
        )
        version = result.meta_info.get("weight_version")
        if version is not None:  # one entry per committed segment, as a terminal commit makes
            sample.weight_versions.append(str(version))
    record_timing(sample, result)
    sample.status = modules().Sample.Status.ABORTED
