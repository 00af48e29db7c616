"""``generate``: one streaming ``/generate`` request per slime sample (slime's payload and
commit); how a rollout abort ends it is the skeleton's (fastaccum._rollout.endings)."""

from __future__ import annotations

import uuid
from typing import Any

from fastaccum._rollout import budget, committer, end_call
from fastaccum.slime import _pools
from fastaccum.slime._commit import commit_prefix, commit_terminal
from fastaccum.slime._modules import modules
from fastaccum.slime._probe import check_server_mode
from fastaccum.slime._settings import Settings

__all__ = ("generate", "new_rid")


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime's custom generate function: one streaming request, committed onto ``sample`` once."""
    slime = modules()
    settings = Settings.from_args(args)
    state = slime.rollout.GenerateState(args)
    name = "fastaccum.slime.generate"
    left = budget(name, slime.Sample.Status, sample, sampling_params, sample.response_length)
    prompt_ids = slime.rollout._prepare_prompt_ids(sample, state.tokenizer, state.processor)
    sampling_params["max_new_tokens"] = left  # slime's own generate reduces the caller's dict too
    if left == 0:
        return sample
    if not sample.tokens:
        sample.tokens = list(prompt_ids)

    await check_server_mode(args, settings, _pools.POOLS.session(args))
    routing_replay = bool(getattr(args, "use_rollout_routing_replay", False))
    expert_shape = (int(args.num_layers), int(args.moe_router_topk)) if routing_replay else None
    headers = None
    if sample.session_id and getattr(args, "router_policy", None) == "consistent_hashing":
        headers = {"X-SMG-Routing-Key": sample.session_id}
    payload = _payload(sample, sampling_params, prompt_ids, routed_experts=routing_replay)
    stream = _pools.POOLS.open_stream(args, settings, payload, expert_shape=expert_shape, headers=headers)

    # Top-p rows arrive only in the terminal event, so a cut prefix could never carry them:
    # without the drain (the aiohttp transport, or fastaccum_abort_drain_s: null) such calls are
    # ended by the server-wide abort.
    top_p = getattr(args, "rollout_top_p", 1.0) != 1.0
    server_wide = settings.abort_mode == "server" or (top_p and not settings.drains)
    commit = committer(
        terminal=lambda result: commit_terminal(args, sample, result, state.tokenizer),
        prefix=lambda result: commit_prefix(args, sample, result, state.tokenizer),
    )
    await end_call(_pools.POOLS, state, stream, commit, drain=settings.drains, server_wide=server_wide)
    return sample


generate.abort_mode = "request"  # type: ignore[attr-defined]  # the marker slime and request_abort read


def _payload(
    sample: Any, sampling_params: dict[str, Any], prompt_ids: list[int], *, routed_experts: bool
) -> dict[str, Any]:
    payload: dict[str, Any] = {
        "rid": new_rid(sample),
        "sampling_params": sampling_params,
        "return_logprob": True,
        "stream": True,
    }
    if routed_experts:
        # No routed_experts_start_len: the server recomputes routing for prompt + partial + new on
        # every call and slime overwrites, so a request-cancelled prefix needs no routing.
        payload["return_routed_experts"] = True
    images = sample.multimodal_inputs.get("images") if sample.multimodal_inputs else None
    if images:
        from slime.utils.processing_utils import encode_image_for_rollout_engine

        payload["image_data"] = [encode_image_for_rollout_engine(image) for image in images]
        payload["text"] = sample.prompt
    else:
        payload["input_ids"] = list(prompt_ids)
    return payload


def new_rid(sample: Any) -> str:
    """The request id of one call for ``sample``: its index (so server logs and aborts name the
    sample), then a random part. SGLang aborts rids by prefix, and none of these is a prefix of
    another: the dash after the index falls where a longer index has a digit."""
    return f"fastaccum-{sample.index}-{uuid.uuid4().hex}"
