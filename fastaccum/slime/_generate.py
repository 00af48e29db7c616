"""``generate``: one streaming ``/generate`` request per slime sample, and the ways a rollout abort
can end it: slime's own cancel or fastaccum's ``request_abort``, each ending the request by rid (a
drain: the stream reads on to the server's terminal abort event), by closing the connection (a
cut), or by the server-wide abort."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from fastaccum._rollout import has_in_tree_request_abort, opted_out_of_request_cancel
from fastaccum.result import StreamResult
from fastaccum.slime import _pools
from fastaccum.slime._commit import commit_prefix, commit_terminal
from fastaccum.slime._modules import modules
from fastaccum.slime._probe import check_server_mode
from fastaccum.slime._settings import Settings
from fastaccum.transport.consumer import StreamConsumer

__all__ = ("generate", "new_rid")


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime's custom generate function: one streaming request, committed onto ``sample`` once."""
    slime = modules()
    settings = Settings.from_args(args)
    state = slime.rollout.GenerateState(args)
    if sample.status not in (slime.Sample.Status.PENDING, slime.Sample.Status.ABORTED):
        raise ValueError(f"fastaccum.slime.generate got a sample with status {sample.status}")
    if sampling_params.get("max_new_tokens") is None:
        raise ValueError("fastaccum.slime.generate needs --rollout-max-response-len (max_new_tokens is None)")

    prompt_ids = slime.rollout._prepare_prompt_ids(sample, state.tokenizer, state.processor)
    budget = sampling_params["max_new_tokens"] - sample.response_length
    if budget < 0:  # a resume that overran its budget (older slime): never send a negative one
        raise ValueError(
            f"max_new_tokens {sampling_params['max_new_tokens']} < response_length {sample.response_length}"
        )
    sampling_params["max_new_tokens"] = budget
    if budget == 0:
        sample.status = slime.Sample.Status.TRUNCATED
        return sample
    if not sample.tokens:
        sample.tokens = list(prompt_ids)

    await check_server_mode(args, settings, _pools.session(args))
    routing_replay = bool(getattr(args, "use_rollout_routing_replay", False))
    expert_shape = (int(args.num_layers), int(args.moe_router_topk)) if routing_replay else None
    headers = None
    if sample.session_id and getattr(args, "router_policy", None) == "consistent_hashing":
        headers = {"X-SMG-Routing-Key": sample.session_id}
    payload = _payload(sample, sampling_params, prompt_ids, routed_experts=routing_replay)
    stream = _pools.open_stream(args, settings, payload, expert_shape=expert_shape, headers=headers)

    # Who ends the call when the rollout is aborted: slime itself, on the line that cancels
    # request-abortable calls, or fastaccum's request_abort on stock slime; by ending this request
    # (drained by rid, or cut) or by the server-wide abort. Top-p rows arrive only in the terminal
    # event, so a cut prefix could never carry them: without the drain (the aiohttp transport, or
    # fastaccum_abort_drain_s: null) such calls are ended by the server-wide abort.
    slime_cancels = has_in_tree_request_abort(state)
    top_p = getattr(args, "rollout_top_p", 1.0) != 1.0
    server_wide = settings.abort_mode == "server" or (top_p and not settings.drains)
    if slime_cancels and not server_wide:
        outcome = await _ended_by_slime(args, sample, state, stream, drain=settings.drains)
        if outcome is None:  # committed whole: the terminal event beat slime's abort
            return sample
        result = outcome
    elif slime_cancels:
        with opted_out_of_request_cancel(state):
            result = await _run_unless_aborted(state, stream)
    elif server_wide:
        result = await _ended_by_server_abort(state, stream)
    else:
        result = await _cut_by_fastaccum(state, stream)

    _commit(args, sample, state, result)
    return sample


generate.abort_mode = "request"  # type: ignore[attr-defined]  # the marker slime and request_abort read


def _commit(args: Any, sample: Any, state: Any, result: StreamResult) -> None:
    """A cut prefix as such; anything that ends with the request's terminal event (a drained abort
    included) with its terminal bookkeeping, as a server-wide abort's chunk is."""
    if result.aborted and not result.finished:
        commit_prefix(args, sample, result, state.tokenizer)
    else:
        commit_terminal(args, sample, result, state.tokenizer)


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


# ---- the four ways a call ends at a rollout abort ----------------------------------------------


async def _cut_by_fastaccum(state: Any, stream: StreamConsumer) -> StreamResult:
    """Stock slime: fastaccum's request_abort aborts this stream (``abort()``: run() returns the
    drained terminal abort event, or the observed prefix, aborted=True); any other cancellation of
    this task propagates unchanged."""
    registry = _pools.registry()
    registry.request_streams.add(stream)
    try:
        # Register, then check: an abort that swept the registry before we registered has set
        # state.aborted, so this call is stopped before it sends anything.
        return await _run_unless_aborted(state, stream)
    finally:
        registry.request_streams.discard(stream)


async def _ended_by_server_abort(state: Any, stream: StreamConsumer) -> StreamResult:
    """Stock slime, a call that needs its terminal chunk: request_abort aborts server-wide."""
    registry = _pools.registry()
    registry.server_generations += 1
    try:
        return await _run_unless_aborted(state, stream)
    finally:
        registry.server_generations -= 1


async def _run_unless_aborted(state: Any, stream: StreamConsumer) -> StreamResult:
    if state.aborted:  # the rollout is already being aborted: send nothing
        stream.abort()
    return await stream.run()


async def _ended_by_slime(
    args: Any, sample: Any, state: Any, stream: StreamConsumer, *, drain: bool
) -> StreamResult | None:
    """The request-abort slime line: slime's own abort cancels the task running this call.

    slime registers that task in ``state.cancellable_tasks`` before this call starts, and its
    ``abort()`` removes it from the set, then cancels it. Exactly that cancellation ends the
    request: with ``drain`` the stream runs in a task of its own, so the cancel leaves it reading,
    and ``abort()`` asks the server to end the request, whose terminal abort event (routed experts,
    top-p rows) is read; without, the stream is cut. Either way the result is committed here,
    before the ``CancelledError`` reaches slime's wrapper (which marks the sample ABORTED). Returns
    None when the abort came after the terminal event: the result is then committed here and the
    cancel withdrawn.
    """
    task = asyncio.current_task()
    registered = task is not None and task in state.cancellable_tasks
    reading = asyncio.ensure_future(_run_unless_aborted(state, stream)) if drain else None
    try:
        if reading is None:
            return await _run_unless_aborted(state, stream)
        return await asyncio.shield(reading)
    except asyncio.CancelledError:
        ended_by_abort = (
            task is not None
            and registered
            and state.aborted
            and task not in state.cancellable_tasks
            and task.cancelling() == 1  # a caller's own cancel on top makes it theirs
        )
        if reading is not None and not ended_by_abort:
            reading.cancel()  # the caller's cancel: the stream's too
        if not ended_by_abort:
            raise
        kept = await _drained(stream, reading) if reading is not None else stream.kept()
        if kept.aborted:
            _commit(args, sample, state, kept)
            raise
    # The terminal event won the race with the abort: the sample is complete, and re-raising would
    # make slime's wrapper mark a finished sample ABORTED and resume it past its end.
    assert task is not None
    task.uncancel()
    commit_terminal(args, sample, kept, state.tokenizer)
    return None


async def _drained(stream: StreamConsumer, reading: asyncio.Future[StreamResult]) -> StreamResult:
    """The stream's result after ``abort()``: its terminal abort event, or at the drain deadline the
    prefix; a second cancel of this task cuts it at once."""
    stream.abort()
    try:
        return await reading
    except asyncio.CancelledError:
        reading.cancel()
        raise
