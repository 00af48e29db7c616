"""``generate``: one streaming vLLM ``/inference/v1/generate`` request per vime sample (vime's
request body and commit); how a rollout abort ends it is the skeleton's
(fastaccum._rollout.endings): drained by id on vLLM 0.32 and later, cut on older servers, or by
this vime line's server-wide abort."""

from __future__ import annotations

import uuid
from typing import Any

from fastaccum._rollout import budget, committer, end_call
from fastaccum._rollout.replay import routed_after, routed_start
from fastaccum.result import StreamResult
from fastaccum.vime import _pools
from fastaccum.vime._commit import commit_prefix, commit_terminal
from fastaccum.vime._modules import modules
from fastaccum.vime._settings import Settings

__all__ = ("generate", "new_rid")


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """vime's custom generate function: one streaming request, committed onto ``sample`` once."""
    vime = modules()
    settings = Settings.from_args(args)
    state = vime.rollout.GenerateState(args)
    name = "fastaccum.vime.generate"
    if getattr(args, "use_score_centering", False):
        raise ValueError(f"{name} does not support score centering (use vime's generate)")
    if any(value is not None for value in (sample.multimodal_inputs or {}).values()):
        raise ValueError(f"{name} streams text samples only (multimodal: use vime's generate)")
    params = dict(sampling_params)
    params["max_new_tokens"] = budget(name, vime.Sample.Status, sample, sampling_params, sample.response_length)
    if params["max_new_tokens"] == 0:
        return sample
    prompt_ids = vime.rollout._prepare_prompt_ids(sample, state.tokenizer, state.processor)
    if not sample.tokens:
        sample.tokens = list(prompt_ids)
    # A resumed sample continues from everything it holds (prompt + kept response), once.
    token_ids = vime.rollout._coerce_flat_int_token_ids(sample.tokens) if sample.response else list(prompt_ids)
    skip = params.get("skip_special_tokens")
    skip_special_tokens = True if skip is None else bool(skip)

    headers = None
    if sample.session_id and getattr(args, "router_policy", None) == "consistent_hash":
        headers = {"x-session-id": sample.session_id}
    payload = {
        "model": args.hf_checkpoint,
        "token_ids": token_ids,
        "sampling_params": vime.rollout._build_inference_sampling_params(params),
        "request_id": new_rid(sample),
    }
    routing_replay = bool(getattr(args, "use_rollout_routing_replay", False))
    expert_shape = (int(args.num_layers), int(args.moe_router_topk)) if routing_replay else None
    # Where the line resumes from the rows it holds (its vLLM takes the start), so does the adapter.
    start = routed_start(sample, token_ids) if routing_replay and vime.routed_start else 0
    if start:
        payload["sampling_params"]["routed_experts_prompt_start"] = start
    stream = _pools.POOLS.open_stream(args, settings, payload, expert_shape=expert_shape, headers=headers)

    def terminal(result: StreamResult) -> None:
        routed = routed_after(sample, result, start, len(token_ids))
        commit_terminal(args, sample, result, state.tokenizer, skip_special_tokens, routed)

    commit = committer(
        terminal=terminal,
        prefix=lambda result: commit_prefix(args, sample, result, state.tokenizer, skip_special_tokens),
    )
    server_wide = settings.abort_mode == "server"
    await end_call(_pools.POOLS, state, stream, commit, drain=settings.drains, server_wide=server_wide)
    return sample


generate.abort_mode = "request"  # type: ignore[attr-defined]  # the marker vime and request_abort read


def new_rid(sample: Any) -> str:
    """vLLM's request_id of one call for ``sample``: its index (server logs and the cancel endpoint
    name the sample), then a random part."""
    return f"fastaccum-{sample.index}-{uuid.uuid4().hex}"
