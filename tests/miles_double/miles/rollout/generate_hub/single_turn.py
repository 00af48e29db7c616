"""Stand-in for miles.rollout.generate_hub.single_turn: Miles' own generate function, one
non-streaming ``/generate`` POST per call (the harness holds fastaccum.miles.generate to it)."""

from __future__ import annotations

from miles.rollout.base_types import GenerateFnInput, GenerateFnOutput
from miles.rollout.generate_utils.generate_endpoint_utils import (
    compute_prompt_ids_from_sample,
    compute_request_payload,
    compute_routing_headers,
    update_sample_from_response,
)
from miles.utils.http_utils import post
from miles.utils.types import Sample


async def generate(input: GenerateFnInput) -> GenerateFnOutput:
    args, sample, params = input.args, input.sample, input.sampling_params
    assert sample.status in (Sample.Status.PENDING, Sample.Status.ABORTED), sample.status
    prompt_ids = compute_prompt_ids_from_sample(input.state, sample)
    input_ids = prompt_ids
    if sample.response:  # a partial rollout's resume: everything held, the budget less what it kept
        input_ids = sample.tokens
        params["max_new_tokens"] -= len(sample.tokens) - len(prompt_ids)
        assert params["max_new_tokens"] >= 0
        if params["max_new_tokens"] == 0:
            sample.status = Sample.Status.TRUNCATED
            return GenerateFnOutput(samples=sample)
    payload, halt = compute_request_payload(args, input_ids, params, multimodal_inputs=sample.multimodal_inputs)
    if payload is None:
        sample.status = halt
        return GenerateFnOutput(samples=sample)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    output = await post(url, payload, headers=compute_routing_headers(args, sample))
    await update_sample_from_response(args, sample, payload=payload, output=output)
    return GenerateFnOutput(samples=sample)
