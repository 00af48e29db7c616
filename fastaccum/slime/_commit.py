"""Committing a result onto slime's ``Sample``: once per call, the terminal result or a cut prefix."""

from __future__ import annotations

from typing import Any

from fastaccum._rollout import append_call, call_text, call_tokens, call_versions, record_timing, sglang_finish
from fastaccum.result import StreamResult
from fastaccum.slime._modules import modules

__all__ = ("commit_prefix", "commit_terminal")


def commit_terminal(args: Any, sample: Any, result: StreamResult, tokenizer: Any, routed: Any) -> None:
    """A call that ended with its terminal event: tokens, terminal bookkeeping, status, and
    ``routed``, the sample's routed experts for its whole sequence (held rows and the call's,
    joined: fastaccum._rollout.replay), which slime's ``Sample`` takes whole."""
    reason = sglang_finish(result)  # never commit a cut one, a failed one or an unknown end
    tokens, logprobs = call_tokens(result, "return_logprob is set")
    meta = dict(result.meta_info)
    meta["finish_reason"] = reason
    # slime's Sample takes one version per call (meta's, for a call with tokens); a call that ran
    # across weight updates adds the later ones, in order.
    versions = call_versions(result)
    if versions:
        meta["weight_version"] = versions[0]
    # Decoded arrays go straight into meta_info: slime's decode_int32_meta_array takes arrays as is.
    if result.top_p_token_ids is not None:
        meta["top_p_token_ids"] = result.top_p_token_ids
        meta["top_p_token_offsets"] = result.top_p_token_offsets
    if routed is not None:
        meta["routed_experts"] = routed
    append_call(args, sample, tokens, logprobs, call_text(result, tokens, tokenizer), meta, terminal=True)
    if tokens:
        sample.weight_versions.extend(versions[1:])
    record_timing(sample, result)


def commit_prefix(args: Any, sample: Any, result: StreamResult, tokenizer: Any) -> None:
    """A deliberate request-level cancel: the observed prefix, no terminal bookkeeping, ABORTED."""
    tokens, logprobs = call_tokens(result, "return_logprob is set")
    if tokens:
        append_call(args, sample, tokens, logprobs, call_text(result, tokens, tokenizer), None, terminal=False)
        # the versions the prefix ran under, as terminal commits record them
        sample.weight_versions.extend(call_versions(result))
    record_timing(sample, result)
    sample.status = modules().Sample.Status.ABORTED
