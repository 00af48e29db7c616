"""Stand-in for miles.rollout.inference_rollout.inference_rollout_common: Miles' rollout class.

``InferenceRolloutFn`` is built once with the constructor input and holds one ``GenerateState``
(not a singleton): tokenizer, processor, the semaphore that gates generate calls, the sampling
parameters, the generate function (Miles' own single-turn one unless a path names another) and
the ``aborted`` flag. There is no per-task cancel: a rollout abort is the train module's
``abort``. Each sample's generate call gets its own copy of the sampling parameters.
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from typing import Any

from miles.rollout.base_types import GenerateFnInput, RolloutFnTrainOutput
from miles.rollout.generate_hub.single_turn import generate
from miles.rollout.generate_utils.generate_endpoint_utils import policy_uses_routing_key
from miles.rollout.inference_rollout.compatibility import load_generate_function
from miles.rollout.rm_hub import async_rm, batched_async_rm
from miles.utils.processing_utils import load_processor, load_tokenizer
from miles.utils.types import Sample

_DONE = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)


def compute_sampling_params(args: Any, *, temperature: Any, top_p: Any, top_k: Any, max_new_tokens: Any) -> dict:
    return {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "max_new_tokens": max_new_tokens,
        "stop": args.rollout_stop,
        "stop_token_ids": args.rollout_stop_token_ids,
        "skip_special_tokens": args.rollout_skip_special_tokens,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


class GenerateState:
    def __init__(self, args: Any) -> None:
        self.args = args
        self.tokenizer = load_tokenizer(args.hf_checkpoint, chat_template_path=args.chat_template_path)
        self.processor = load_processor(args.hf_checkpoint)
        gate = args.sglang_server_concurrency * args.rollout_num_gpus // args.rollout_num_gpus_per_engine
        self.generate_fn_semaphore = asyncio.Semaphore(gate)
        self.sampling_params = compute_sampling_params(
            args,
            temperature=args.rollout_temperature,
            top_p=args.rollout_top_p,
            top_k=args.rollout_top_k,
            max_new_tokens=args.rollout_max_response_len,
        )
        self.generate_function = load_generate_function(args.custom_generate_function_path) or generate
        self.reset()

    def reset(self) -> None:
        self.aborted = False


async def generate_and_rm(state: GenerateState, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
    """One sample: a finished one is returned as it is; once the rollout is aborted, a sample
    that gets the semaphore is returned ABORTED without a call; an ABORTED result gets no reward."""
    args = state.args
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length
    if sample.status in _DONE:
        assert args.group_rm or sample.reward is not None, f"sample {sample.index} finished without a reward"
        return sample
    async with state.generate_fn_semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        fn = load_generate_function(sample.generate_function_path) or state.generate_function
        call = GenerateFnInput(
            state=state, sample=sample, sampling_params=copy.deepcopy(sampling_params), evaluation=evaluation
        )
        sample = (await fn(call)).samples
    if args.group_rm:
        return sample
    if isinstance(sample, list):
        if all(s.status != Sample.Status.ABORTED for s in sample):
            await batched_async_rm(args, [s for s in sample if s.reward is None], inplace_set_reward_field=True)
        return sample
    if sample.status != Sample.Status.ABORTED and sample.reward is None:
        sample.reward = await async_rm(args, sample)
    return sample


async def generate_and_rm_group(
    state: GenerateState, group: list, sampling_params: dict, evaluation: bool = False, sample_done_callback: Any = None
) -> list:
    """One task per sample, gathered; a failure cancels the siblings, waits for them, and is raised."""
    args = state.args
    if state.aborted:
        return group
    if policy_uses_routing_key(args):
        for sample in group:
            sample.routing_key = sample.routing_key or str(uuid.uuid4())
    tasks = []
    for number, sample in enumerate(group):
        params = sampling_params.copy()
        if getattr(args, "sglang_enable_deterministic_inference", False):
            params["sampling_seed"] = args.rollout_seed + number
        tasks.append(asyncio.create_task(generate_and_rm(state, sample, params, evaluation=evaluation)))
    try:
        group = list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    if not state.aborted and args.group_rm:
        await batched_async_rm(args, group, inplace_set_reward_field=True)
    return group


class InferenceRolloutFn:
    """``--rollout-function-path``'s default: called with a train or an eval input."""

    def __init__(self, input: Any) -> None:
        self.data_source = input.data_source
        self.state = GenerateState(input.args)

    async def __call__(self, input: Any) -> Any:
        return await (self._call_eval(input) if input.evaluation else self._call_train(input))

    async def _call_train(self, input: Any) -> RolloutFnTrainOutput:
        from miles.rollout.inference_rollout.inference_rollout_train import generate_rollout_async

        output, aborted = await generate_rollout_async(self.state, input.rollout_id, self.data_source.get_samples)
        self.data_source.add_samples(aborted)  # every time, an empty list included
        return output

    async def _call_eval(self, input: Any) -> Any:
        raise NotImplementedError("evaluation datasets are not part of the Miles double")
