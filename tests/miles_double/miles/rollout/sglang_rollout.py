"""Stand-in for miles.rollout.sglang_rollout: Miles' v1 rollout (``MILES_USE_LEGACY_ROLLOUT_V1=1``),
slime's shape.

``GenerateState`` is a process singleton holding the pending group tasks and the ``aborted``
flag; ``generate_and_rm`` calls a custom generate function through Miles' loader (its own
signature with this state, or slime's wrapped) and the stock non-streaming one otherwise, which
the double does not model; ``abort(args, rollout_id)`` sends ``abort_all`` to every worker once,
runs the agent abort hook, awaits the pending groups and with ``--partial-rollout`` returns every
one, stamped; ``generate_rollout_async`` calls it as a module global, at call time.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from miles.rollout.base_types import GenerateFnInput, RolloutFnTrainOutput
from miles.rollout.generate_utils.generate_endpoint_utils import policy_uses_routing_key
from miles.rollout.inference_rollout.compatibility import load_generate_function
from miles.rollout.inference_rollout.inference_rollout_train import get_worker_urls
from miles.rollout.rm_hub import async_rm
from miles.utils.async_utils import run
from miles.utils.http_utils import post
from miles.utils.misc import SingletonMeta, call_agent_abort_hook
from miles.utils.processing_utils import load_processor, load_tokenizer
from miles.utils.types import Sample


class GenerateState(metaclass=SingletonMeta):
    def __init__(self, args: Any) -> None:
        self.args = args
        self.tokenizer = load_tokenizer(args.hf_checkpoint, chat_template_path=args.chat_template_path)
        self.processor = load_processor(args.hf_checkpoint)
        gate = args.sglang_server_concurrency * args.rollout_num_gpus // args.rollout_num_gpus_per_engine
        self.semaphore = asyncio.Semaphore(gate)
        self.sampling_params = {
            "temperature": args.rollout_temperature,
            "top_p": args.rollout_top_p,
            "top_k": args.rollout_top_k,
            "max_new_tokens": args.rollout_max_response_len,
            "stop": args.rollout_stop,
            "stop_token_ids": args.rollout_stop_token_ids,
            "skip_special_tokens": args.rollout_skip_special_tokens,
            "no_stop_trim": True,
            "spaces_between_special_tokens": False,
        }
        self.reset()

    def reset(self) -> None:
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task] = set()
        self.aborted = False

    def submit_generate_tasks(self, groups: list) -> None:
        for group in groups:
            self.pendings.add(asyncio.create_task(generate_and_rm_group(self.args, group, self.sampling_params.copy())))
        self.remaining_batch_size += len(groups)


async def generate(args: Any, sample: Any, sampling_params: dict) -> Any:
    raise NotImplementedError("Miles' v1 non-streaming generate is not part of the Miles double")


async def generate_and_rm(args: Any, sample: Any, sampling_params: dict, evaluation: bool = False) -> Any:
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
        assert args.group_rm or sample.reward is not None
        return sample
    state = GenerateState(args)
    async with state.semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        fn = load_generate_function(sample.generate_function_path or args.custom_generate_function_path)
        if fn is None:
            sample = await generate(args, sample, sampling_params)
        else:
            call = GenerateFnInput(state=state, sample=sample, sampling_params=sampling_params, evaluation=evaluation)
            sample = (await fn(call)).samples
    if not args.group_rm and sample.status != Sample.Status.ABORTED and sample.reward is None:
        sample.reward = await async_rm(args, sample)
    return sample


async def generate_and_rm_group(args: Any, group: list, sampling_params: dict, evaluation: bool = False) -> list:
    if GenerateState(args).aborted:
        return group
    if policy_uses_routing_key(args):
        for sample in group:
            sample.routing_key = sample.routing_key or str(uuid.uuid4())
    tasks = [asyncio.create_task(generate_and_rm(args, s, sampling_params.copy(), evaluation)) for s in group]
    return list(await asyncio.gather(*tasks))


async def abort(args: Any, rollout_id: int) -> list[list[Any]]:
    state = GenerateState(args)
    assert not state.aborted
    state.aborted = True
    urls = await get_worker_urls(args)
    await asyncio.gather(*(post(f"{url}/abort_request", {"abort_all": True}) for url in urls), return_exceptions=True)
    await call_agent_abort_hook(args)
    buffered = []
    while state.pendings:
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        if not args.partial_rollout:
            continue
        for task in done:
            group = task.result()
            for sample in group:
                if sample.response and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            buffered.append(group)
    return buffered


async def generate_rollout_async(args: Any, rollout_id: int, data_source: Any) -> tuple[RolloutFnTrainOutput, list]:
    assert args.rollout_global_dataset
    state = GenerateState(args)
    wanted = args.rollout_batch_size
    data: list[list[Any]] = []
    while len(data) < wanted:
        while state.remaining_batch_size < wanted:
            state.submit_generate_tasks(data_source(args.over_sampling_batch_size))
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            group = task.result()  # a failed group fails the rollout here (the class path skips it)
            assert len(group) == args.n_samples_per_prompt
            if len(data) < wanted:
                data.append(group)
    aborted = await abort(args, rollout_id)  # the module global, looked up now
    data.sort(key=lambda group: group[0].index)
    state.reset()
    return RolloutFnTrainOutput(samples=data, metrics={}), aborted


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    assert args.rollout_global_dataset
    if evaluation:
        raise NotImplementedError("evaluation rollouts are not part of the Miles double")
    output, aborted = run(generate_rollout_async(args, rollout_id, data_source.get_samples))
    data_source.add_samples(aborted)
    return output
