"""A call's tokens and log-probs for the ``Sample``, its timing, and the checks and budget every
generate function applies before it sends anything."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from fastaccum.errors import ServerError, StreamFormatError
from fastaccum.result import StreamResult

__all__ = ("call_tokens", "call_text", "call_versions", "sglang_finish", "record_timing", "budget", "append_call")

# The finish_reason types slime and Miles map to a status; anything else would leave a resumed
# sample ABORTED or a new one PENDING, trained on as if it ended, so it is refused.
_SGLANG_FINISH_TYPES = ("stop", "length", "abort")


def call_tokens(result: StreamResult, asked: str) -> tuple[list[int], list[float]]:
    """A call's tokens and their log-probs as lists; every token must have one (``asked``: the
    request key that asks for them, for the message)."""
    tokens = result.token_ids.tolist()
    if not tokens:
        return [], []
    if result.logprobs is None:
        raise StreamFormatError(f"the stream carried {len(tokens)} tokens but no logprobs ({asked})")
    nulls = np.flatnonzero(np.isnan(result.logprobs))
    if nulls.size:
        # A NaN logprob would poison off-policy correction (TIS) for the whole batch.
        raise StreamFormatError(f"null logprob for sampled token at position {int(nulls[0])} of {len(tokens)}")
    return tokens, result.logprobs.tolist()


def call_text(result: StreamResult, tokens: list[int], tokenizer: Any) -> str:
    """A call's text: the stream's, or, from --skip-tokenizer-init servers that send none, the
    tokens decoded once (not per event)."""
    if result.text is not None:
        return result.text
    return tokenizer.decode(tokens) if tokens else ""


def sglang_finish(result: StreamResult) -> dict[str, Any]:
    """The ``finish_reason`` of a call that ended with SGLang's terminal event, checked before
    anything is committed: an abort with a status code (a validation failure, a server timeout:
    not an abort or a pause) fails the call, as does a type the framework has no status for."""
    reason = result.finish_reason
    if reason is None:  # run() returns only finished or aborted results; a cut one is a prefix
        raise StreamFormatError("stream ended without a finish_reason")
    kind = reason.get("type")
    if kind == "abort" and reason.get("status_code") is not None:
        raise ServerError(
            f"SGLang aborted the request with status {reason.get('status_code')}: {reason.get('message')}",
            status=reason.get("status_code"),
            server_message=str(reason.get("message")),
        )
    if kind not in _SGLANG_FINISH_TYPES:
        raise StreamFormatError(f"unknown finish_reason type {kind!r}")
    return dict(reason)


def call_versions(result: StreamResult) -> list[str]:
    """The weight versions a call ran under, in order: one per run of its tokens'
    ``weight_version_spans`` (an update mid-request makes two), else the newest event's
    ``weight_version`` (a stream that did not say one for every token: a cut vLLM one says none)."""
    if result.weight_version_spans is not None:
        return [version for _, _, version in result.weight_version_spans]
    version = result.meta_info.get("weight_version")
    return [] if version is None else [str(version)]


def record_timing(sample: Any, result: StreamResult) -> None:
    """One entry per generate call in ``sample.metadata["fastaccum_timing"]``, so stragglers
    (a late first token, a long gap) show in the rollout's data; the aiohttp transport has none."""
    if result.timing is not None:
        sample.metadata.setdefault("fastaccum_timing", []).append(dataclasses.asdict(result.timing))


def budget(name: str, status: Any, sample: Any, sampling_params: dict[str, Any], kept: int) -> int:
    """``max_new_tokens`` for this call: the flag's, less the ``kept`` tokens the sample holds
    (0: spent, the sample is then TRUNCATED without a request). ``name``: the generate function,
    for the messages; ``status``: the framework's ``Sample.Status``."""
    if sample.status not in (status.PENDING, status.ABORTED):
        raise ValueError(f"{name} got a sample with status {sample.status}")
    if sampling_params.get("max_new_tokens") is None:
        raise ValueError(f"{name} needs --rollout-max-response-len (max_new_tokens is None)")
    left = int(sampling_params["max_new_tokens"]) - kept
    if left < 0:  # a resume that overran its budget: never send a negative one
        raise ValueError(f"max_new_tokens {sampling_params['max_new_tokens']} < response_length {kept}")
    if left == 0:
        sample.status = status.TRUNCATED
    return left


def append_call(
    args: Any, sample: Any, tokens: list[int], logprobs: list[float], text: str, meta: Any, *, terminal: bool
) -> None:
    """A call's tokens through the framework's own ``Sample.append_response_tokens`` (slime's and,
    on the lines that have it, vime's take the same arguments), so loss mask, log-probs, top-p
    CSR, routed experts and status stay aligned as the framework keeps them; ``terminal``: with
    the finish's bookkeeping (weight version, prefix cache, status)."""
    sample.append_response_tokens(
        args,
        tokens=tokens,
        log_probs=logprobs,
        trainable=True,
        meta_info=meta,
        text=text,
        update_terminal_info=terminal,
    )
