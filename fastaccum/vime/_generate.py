"""``generate``: one streaming vLLM ``/inference/v1/generate`` request per vime sample, and the ways
a rollout abort can end it: vime's own cancel or fastaccum's ``request_abort`` (both cut the
connection, which is how vLLM aborts a request), or the server-wide abort."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastaccum._rollout import has_in_tree_request_abort, opted_out_of_request_cancel
from fastaccum.errors import StreamTruncatedError
from fastaccum.result import StreamResult
from fastaccum.transport.client import ClientStream
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
    if getattr(args, "use_score_centering", False):
        raise ValueError("fastaccum.vime.generate does not support score centering (use vime's generate)")
    if sample.status not in (vime.Sample.Status.PENDING, vime.Sample.Status.ABORTED):
        raise ValueError(f"fastaccum.vime.generate got a sample with status {sample.status}")
    if any(value is not None for value in (sample.multimodal_inputs or {}).values()):
        raise ValueError("fastaccum.vime.generate streams text samples only (multimodal: use vime's generate)")
    if sampling_params.get("max_new_tokens") is None:
        raise ValueError("fastaccum.vime.generate needs --rollout-max-response-len (max_new_tokens is None)")

    prompt_ids = vime.rollout._prepare_prompt_ids(sample, state.tokenizer, state.processor)
    params = dict(sampling_params)
    params["max_new_tokens"] -= sample.response_length  # as vime does: what the sample kept counts
    if params["max_new_tokens"] < 0:
        raise ValueError(
            f"max_new_tokens {sampling_params['max_new_tokens']} < response_length {sample.response_length}"
        )
    if params["max_new_tokens"] == 0:
        sample.status = vime.Sample.Status.TRUNCATED
        return sample
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
    stream = _pools.open_stream(args, settings, payload, expert_shape=expert_shape, headers=headers)

    def commit(result: StreamResult) -> None:
        if result.aborted and not result.finished:
            commit_prefix(args, sample, result, state.tokenizer, skip_special_tokens)
        else:
            commit_terminal(args, sample, result, state.tokenizer, skip_special_tokens)

    vime_cancels = has_in_tree_request_abort(state)
    server_wide = settings.abort_mode == "server"
    try:
        if vime_cancels and not server_wide:
            result = await _ended_by_vime(state, stream, commit)
            if result is None:  # committed in _ended_by_vime
                return sample
        elif vime_cancels:
            with opted_out_of_request_cancel(state):
                result = await _run_unless_aborted(state, stream)
        elif server_wide:
            result = await _ended_by_server_abort(state, stream)
        else:
            result = await _cut_by_fastaccum(state, stream)
    except StreamTruncatedError:
        # vLLM before 0.32 ends an aborted request with [DONE] and no finish_reason. Only while the
        # rollout is being aborted is that the rollout's abort; otherwise it fails, never complete.
        if not state.aborted:
            raise
        result = stream.kept()
    commit(result)
    return sample


generate.abort_mode = "request"  # type: ignore[attr-defined]  # the marker vime and request_abort read


def new_rid(sample: Any) -> str:
    """vLLM's request_id of one call for ``sample``: its index (server logs and the cancel endpoint
    name the sample), then a random part."""
    return f"fastaccum-{sample.index}-{uuid.uuid4().hex}"


# ---- the ways a call ends at a rollout abort ---------------------------------------------------


async def _run_unless_aborted(state: Any, stream: ClientStream) -> StreamResult:
    if state.aborted:  # the rollout is already being aborted: send nothing
        stream.abort()
    return await stream.run()


async def _cut_by_fastaccum(state: Any, stream: ClientStream) -> StreamResult:
    """vime without request-level abort: fastaccum's request_abort cuts this stream (run() returns
    the observed prefix, aborted=True); any other cancellation propagates unchanged."""
    registry = _pools.registry()
    registry.request_streams.add(stream)
    try:
        # Register, then check: an abort that swept the registry first has set state.aborted.
        result = await _run_unless_aborted(state, stream)
    finally:
        registry.request_streams.discard(stream)
    if result.aborted and stream.rid is not None:
        registry.cut_rids.append(stream.rid)
    return result


async def _ended_by_server_abort(state: Any, stream: ClientStream) -> StreamResult:
    """vime without request-level abort, ``fastaccum_abort_mode: server``: request_abort aborts
    server-wide and the stream ends with the server's own end."""
    registry = _pools.registry()
    registry.server_generations += 1
    try:
        return await _run_unless_aborted(state, stream)
    finally:
        registry.server_generations -= 1


async def _ended_by_vime(state: Any, stream: ClientStream, commit: Any) -> StreamResult | None:
    """vime with request-level abort: its ``abort()`` removes the task running this sample from
    ``state.cancellable_tasks``, then cancels it. Exactly that cancel cuts the stream (vLLM aborts
    on the disconnect) and the prefix is committed here, before the ``CancelledError`` reaches
    vime's wrapper, which marks the sample ABORTED and returns it as left. Any other cancel
    propagates with nothing committed. Returns None when the finishing chunk had already arrived:
    the sample is committed complete and the cancel withdrawn (resuming it would generate past
    its end)."""
    task = asyncio.current_task()
    registered = task is not None and task in state.cancellable_tasks
    try:
        return await _run_unless_aborted(state, stream)
    except asyncio.CancelledError:
        ended_by_abort = (
            task is not None
            and registered
            and state.aborted
            and task not in state.cancellable_tasks
            and task.cancelling() == 1  # a caller's own cancel on top makes it theirs
        )
        if not ended_by_abort:
            raise
        kept = stream.kept()
        if kept.aborted:
            commit(kept)
            if stream.rid is not None:
                _pools.registry().cut_rids.append(stream.rid)
            raise
    assert task is not None
    task.uncancel()
    commit(kept)
    return None
