"""``generate``: Miles' own generate-function signature, one streaming ``/generate`` request per
call with what Miles' single-turn generate sends, committed onto the ``Sample`` once; how a
rollout abort ends it is the skeleton's (fastaccum._rollout.endings)."""

from __future__ import annotations

import uuid
from typing import Any

from fastaccum._rollout import budget, committer, end_call
from fastaccum._rollout.replay import routed_after, routed_start
from fastaccum.miles._commit import commit_prefix, commit_terminal, shape_routed
from fastaccum.miles._modules import modules
from fastaccum.miles._pools import POOLS
from fastaccum.miles._settings import Settings
from fastaccum.result import StreamResult

__all__ = ("generate", "new_rid")

NAME = "fastaccum.miles.generate"


async def generate(input: Any) -> Any:  # noqa: A002  # Miles tells its own signature by this name
    """Miles' ``--custom-generate-function-path``, ``async generate(input: GenerateFnInput) ->
    GenerateFnOutput``: one streaming request for ``input.sample``, committed onto it once.

    The request is Miles' single-turn one, built by Miles' own ``compute_request_payload``
    (sampling parameters, ``return_routed_experts``, ``return_indexer_topk``, ``lora_path``,
    ``image_data``, the context-length cap) and ``compute_routing_headers``
    (``X-SMG-Routing-Key``), plus a request id, ``stream`` and, on a resumed sample with routing
    replay, ``routed_experts_start_len``: the rows it holds are not sent again.
    """
    miles = modules()
    args, sample, state = input.args, input.sample, input.state
    output = miles.base_types.GenerateFnOutput(samples=sample)
    settings = Settings.from_args(args)
    params = input.sampling_params  # Miles hands each call a copy of its own
    kept = sample.response_length
    left = budget(NAME, miles.Sample.Status, sample, params, kept)
    if not left:  # spent: TRUNCATED without a request, as Miles' own
        return output
    prompt_ids = list(miles.endpoint.compute_prompt_ids_from_sample(state, sample))
    sent = list(sample.tokens) if kept else prompt_ids  # a resumed sample continues from everything it holds
    payload, halt = miles.endpoint.compute_request_payload(
        args,
        input_ids=sent,
        sampling_params={**params, "max_new_tokens": left},
        multimodal_inputs=sample.multimodal_inputs,
    )
    if payload is None:  # no room left in --rollout-max-context-len
        sample.status = halt
        return output
    headers = miles.endpoint.compute_routing_headers(args, sample)
    payload.update(rid=new_rid(sample), stream=True)
    replay = bool(payload.get("return_routed_experts"))
    start = routed_start(sample, sent) if replay else 0
    if start:  # the rows the sample holds are not sent again; the commit joins them to the new ones
        payload["routed_experts_start_len"] = start
    stream = POOLS.open_stream(args, settings, payload, expert_shape=None, headers=headers)

    def terminal(result: StreamResult) -> None:
        routed = None
        if replay and result.routed_experts is not None:
            routed = routed_after(
                sample, shape_routed(result, int(args.num_layers), len(sent), start), start, len(sent)
            )
        commit_terminal(args, sample, result, state.tokenizer, prompt_ids, routed)

    commit = committer(
        terminal=terminal,
        prefix=lambda result: commit_prefix(sample, result, state.tokenizer, prompt_ids, miles.Sample.Status.ABORTED),
    )
    server_wide = settings.abort_mode == "server"
    await end_call(POOLS, state, stream, commit, drain=settings.drains, server_wide=server_wide)
    return output


generate.abort_mode = "request"  # type: ignore[attr-defined]  # the marker fastaccum's abort reads


def new_rid(sample: Any) -> str:
    """A call's ``rid``: ``fastaccum-<sample index>-<32 hex>``, so an abort and the server's log
    name the sample. SGLang's scheduler aborts every rid that starts with the one named; a dash
    follows the index, where a longer index has a digit, so no rid starts another."""
    return f"fastaccum-{sample.index}-{uuid.uuid4().hex}"
