"""``generate``: one streaming ``/generate`` request per slime sample (slime's payload and
commit), and ``generate_turn``, the same call as one turn of a generate function of your own; how
a rollout abort ends it is the skeleton's (fastaccum._rollout.endings)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastaccum._rollout import budget, committer, end_call
from fastaccum._rollout.replay import routed_after, routed_start
from fastaccum.result import StreamResult
from fastaccum.slime import _pools
from fastaccum.slime._commit import commit_prefix, commit_terminal
from fastaccum.slime._modules import modules
from fastaccum.slime._probe import check_server_mode
from fastaccum.slime._settings import Settings

__all__ = ("generate", "generate_turn", "request_abortable", "new_rid")

GenerateFunction = TypeVar("GenerateFunction", bound=Callable[..., Awaitable[Any]])


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime's custom generate function: one streaming request, committed onto ``sample`` once."""
    left = budget("fastaccum.slime.generate", modules().Sample.Status, sample, sampling_params, sample.response_length)
    sampling_params["max_new_tokens"] = left  # slime's own generate reduces the caller's dict too
    if left:
        await generate_turn(args, sample, sampling_params)
    return sample


generate.abort_mode = "request"  # type: ignore[attr-defined]  # the marker slime and request_abort read


async def generate_turn(
    args: Any, sample: Any, sampling_params: dict[str, Any], *, payload: dict[str, Any] | None = None
) -> StreamResult:
    """One model turn for a generate function of your own (multi-turn, agentic): one streaming
    ``/generate`` request for everything ``sample`` holds (its prompt, then every turn and tool
    output appended so far), committed onto ``sample`` as ``generate`` commits its one call, with
    the same request-level abort, drain and retries; returns the turn's result.

    ``sampling_params`` are this turn's (``max_new_tokens`` is the turn's budget, not reduced
    here); ``payload`` adds keys to the request. Append tool output yourself with slime's
    ``sample.append_response_tokens(args, tokens=..., trainable=False, text=...)``. When a
    rollout abort ends the turn, ``sample`` holds its prefix and is ABORTED: stop there (on stock
    slime the turn returns with ``result.aborted``; where slime cancels request-abortable calls
    itself, ``CancelledError`` leaves this call, which slime's wrapper handles). Mark your
    function ``@request_abortable`` so slime and ``request_abort`` treat it as fastaccum's
    (docs/slime.md, "Your own generate function").
    """
    slime = modules()
    settings = Settings.from_args(args)
    state = slime.rollout.GenerateState(args)
    if not sampling_params.get("max_new_tokens"):
        raise ValueError(f"generate_turn needs max_new_tokens > 0, not {sampling_params.get('max_new_tokens')!r}")
    prompt_ids = slime.rollout._prepare_prompt_ids(sample, state.tokenizer, state.processor)
    if not sample.tokens:
        sample.tokens = list(prompt_ids)

    await check_server_mode(args, settings, _pools.POOLS.session(args))
    routing_replay = bool(getattr(args, "use_rollout_routing_replay", False))
    expert_shape = (int(args.num_layers), int(args.moe_router_topk)) if routing_replay else None
    headers = None
    if sample.session_id and getattr(args, "router_policy", None) == "consistent_hashing":
        headers = {"X-SMG-Routing-Key": sample.session_id}
    body = {**_payload(sample, sampling_params, prompt_ids, routed_experts=routing_replay), **(payload or {})}
    ids = body.get("input_ids") if "text" not in body else None
    start = routed_start(sample, ids) if routing_replay else 0
    if start:  # the rows the sample holds are not sent again; commit joins them to the new ones
        body["routed_experts_start_len"] = start
    stream = _pools.POOLS.open_stream(args, settings, body, expert_shape=expert_shape, headers=headers)

    # Top-p rows arrive only in the terminal event, so a cut prefix could never carry them:
    # without the drain (the aiohttp transport, or fastaccum_abort_drain_s: null) such calls are
    # ended by the server-wide abort.
    top_p = getattr(args, "rollout_top_p", 1.0) != 1.0
    server_wide = settings.abort_mode == "server" or (top_p and not settings.drains)
    committed: list[StreamResult] = []

    def terminal(result: StreamResult) -> None:
        routed = routed_after(sample, result, start, len(ids) if ids is not None else None)
        commit_terminal(args, sample, result, state.tokenizer, routed)
        committed.append(result)

    def prefix(result: StreamResult) -> None:
        commit_prefix(args, sample, result, state.tokenizer)
        committed.append(result)

    commit = committer(terminal=terminal, prefix=prefix)
    await end_call(_pools.POOLS, state, stream, commit, drain=settings.drains, server_wide=server_wide)
    return committed[0]


def request_abortable(function: GenerateFunction) -> GenerateFunction:
    """Mark your generate function as one whose requests fastaccum ends (it streams through
    ``generate_turn``): slime then cancels it request by request where slime can, and
    ``request_abort`` aborts its streams by rid instead of the whole server."""
    function.abort_mode = "request"  # type: ignore[attr-defined]
    return function


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
