"""Stand-in for miles.rollout.generate_utils.generate_endpoint_utils: the single-turn request
(prompt ids, payload, routing header) and how a whole ``/generate`` answer is written onto a
``Sample`` (``update_sample_from_response``), with Miles' base64 decode of the replay arrays."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pybase64

from miles.utils.lora import LORA_ADAPTER_NAME, lora_rollout_enabled
from miles.utils.processing_utils import encode_image_for_rollout_engine
from miles.utils.types import Sample


def compute_prompt_ids_from_sample(state: Any, sample: Any, tools: Any = None) -> list[int]:
    """The prompt's ids: a chat prompt is rendered first; multimodal prompts are not modelled."""
    if state.processor and sample.multimodal_inputs and any(v is not None for v in sample.multimodal_inputs.values()):
        raise NotImplementedError("multimodal prompts are not part of the Miles double")
    prompt = sample.prompt
    if not isinstance(prompt, str):
        prompt = state.tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, tools=tools)
    return state.tokenizer.encode(prompt, add_special_tokens=False)


def policy_uses_routing_key(args: Any) -> bool:
    return args.sglang_router_policy in ("consistent_hashing", "manual")


def compute_routing_headers(args: Any, sample: Any) -> dict[str, str] | None:
    """``X-SMG-Routing-Key`` from the sample's key; a routing-key policy without one is an error."""
    if not sample.routing_key:
        if policy_uses_routing_key(args):
            raise ValueError(f"router policy {args.sglang_router_policy} needs sample {sample.index}'s routing_key")
        return None
    return {"X-SMG-Routing-Key": sample.routing_key}


def compute_request_payload(
    args: Any, input_ids: list[int], sampling_params: dict, multimodal_inputs: dict | None = None
) -> tuple[dict[str, Any] | None, Any]:
    """The ``/generate`` body, or (None, TRUNCATED) when the context cap leaves no new token:
    ``max_new_tokens`` (the params', else the flag's) is capped at ``--rollout-max-context-len``
    less the prompt."""
    params = copy.deepcopy(sampling_params)
    budget = params.pop("max_new_tokens", args.rollout_max_response_len)
    if args.rollout_max_context_len:
        budget = min(budget, args.rollout_max_context_len - len(input_ids))
    if budget <= 0:
        return None, Sample.Status.TRUNCATED
    payload: dict[str, Any] = {
        "input_ids": input_ids,
        "sampling_params": {**params, "max_new_tokens": budget},
        "return_logprob": True,
        "return_routed_experts": args.use_rollout_routing_replay,
        "return_indexer_topk": args.use_rollout_indexer_replay,
    }
    if lora_rollout_enabled(args):
        payload["lora_path"] = LORA_ADAPTER_NAME
    images = (multimodal_inputs or {}).get("images")
    if images:
        payload["image_data"] = [encode_image_for_rollout_engine(image) for image in images]
    return payload, None


def _rows_of(encoded: str, rows: int, layers: int) -> np.ndarray:
    """base64 of little-endian int32 as (rows, layers, width): the width is what the size leaves."""
    flat = np.frombuffer(pybase64.b64decode(encoded.encode("ascii")), dtype=np.int32)
    if rows <= 0:
        return np.empty((0, layers, 0), dtype=np.int32)
    return flat.reshape(rows, layers, len(flat) // (rows * layers))


def get_routed_experts_from_response(args: Any, output: dict, num_tokens: int) -> Any:
    encoded = output["meta_info"].get("routed_experts")
    return None if encoded is None else _rows_of(encoded, num_tokens, args.num_layers)


def get_indexer_topk_from_response(args: Any, output: dict, sample: Any) -> Any:
    """The layer count comes from the server (sglang-miles' ``indexer_topk_num_layers``)."""
    meta = output["meta_info"]
    if meta.get("indexer_topk") is None:
        return None
    layers = meta.get("indexer_topk_num_layers")
    assert layers is not None, "the server sent indexer_topk without indexer_topk_num_layers"
    return _rows_of(meta["indexer_topk"], len(sample.tokens) - 1, layers)


async def update_sample_from_response(
    args: Any, sample: Any, payload: dict, output: dict, update_loss_mask: bool = False
) -> None:
    """A whole answer onto the sample: the prompt first on a first turn; the answer's tokens and
    log-probs (from ``output_token_logprobs``), its text; the loss mask only when asked; the replay
    arrays replaced by the answer's (None when it has none); then ``update_from_meta_info``."""
    if not sample.response and not sample.tokens:
        sample.tokens = payload["input_ids"]
    entries = output["meta_info"].get("output_token_logprobs") or []
    tokens = [entry[1] for entry in entries]
    sample.tokens = sample.tokens + tokens
    sample.response_length += len(tokens)
    sample.response += output["text"]
    sample.rollout_log_probs = (sample.rollout_log_probs or []) + [entry[0] for entry in entries]
    if update_loss_mask:
        sample.loss_mask = (sample.loss_mask or []) + [1] * len(tokens)
    sample.rollout_routed_experts = get_routed_experts_from_response(args, output, len(sample.tokens) - 1)
    sample.rollout_indexer_topk = get_indexer_topk_from_response(args, output, sample)
    sample.update_from_meta_info(args, output["meta_info"])
