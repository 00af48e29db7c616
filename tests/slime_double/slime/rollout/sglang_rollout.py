"""Double of slime.rollout.sglang_rollout: GenerateState, the per-sample/group tasks, abort, the rollout.

Order of events follows the integration doc §2.2 and §6.1. ``IN_TREE_REQUEST_ABORT`` switches on a
model of slime's in-tree request-level abort (THUDM/slime#2272; inferred, see ../../README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import uuid
from typing import Any

from slime.backends.sglang_utils.server_control import abort_servers_until_idle
from slime.rollout.base_types import RolloutFnTrainOutput
from slime.utils.async_utils import run
from slime.utils.http_utils import get, get_rollout_num_engines
from slime.utils.misc import SingletonMeta, load_function
from slime.utils.processing_utils import load_processor, load_tokenizer
from slime.utils.types import Sample

logger = logging.getLogger(__name__)

IN_TREE_REQUEST_ABORT = False


def _prepare_prompt_ids(sample: Sample, tokenizer: Any, processor: Any) -> list[int]:
    """Held tokens (prompt + partial on resume) when there are any, else the encoded prompt."""
    if sample.tokens:
        return sample.tokens
    return tokenizer.encode(sample.prompt, add_special_tokens=False)


class GenerateState(metaclass=SingletonMeta):
    def __init__(self, args: Any) -> None:
        self.args = args
        self.tokenizer = load_tokenizer(args.hf_checkpoint, trust_remote_code=True)
        self.processor = load_processor(args.hf_checkpoint, trust_remote_code=True)
        self.semaphore = asyncio.Semaphore(args.sglang_server_concurrency * get_rollout_num_engines(args))
        self.sampling_params: dict[str, Any] = {
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
        if args.rollout_top_p != 1.0:
            self.sampling_params["custom_params"] = {"return_top_p_token_ids": True}
        self.dp_counts = [0] * (getattr(args, "sglang_dp_size", None) or 1)
        self.dp_rank = 0
        self.reset()

    def reset(self) -> None:
        self.remaining_batch_size = 0
        self.pendings: set[asyncio.Task] = set()
        self.aborted = False
        if IN_TREE_REQUEST_ABORT:
            self.cancellable_tasks: set[asyncio.Task] = set()
            self.active_server_generations = 0

    @contextlib.contextmanager
    def dp_rank_context(self):
        least = min(self.dp_counts)
        rank = random.choice([i for i, c in enumerate(self.dp_counts) if c == least])
        self.dp_counts[rank] += 1
        self.dp_rank = rank
        try:
            yield rank
        finally:
            self.dp_counts[rank] -= 1

    def submit_generate_tasks(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            coro = generate_and_rm_group(self.args, group, sampling_params=self.sampling_params.copy(), evaluation=False)
            self.pendings.add(asyncio.create_task(coro))
        self.remaining_batch_size += len(groups)


async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    raise NotImplementedError("the slime double has no stock (non-streaming) generate")


async def async_rm(args: Any, sample: Sample) -> Any:
    path = sample.custom_rm_path or args.custom_rm_path
    if path is None:
        raise NotImplementedError("the slime double only runs custom reward functions")
    return await load_function(path)(args, sample)


async def generate_and_rm(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
    # The off-policy mask runs before the early return, so it hits completed samples too (§11.1).
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
        assert sample.response is not None
        if not args.group_rm:
            assert sample.reward is not None
        return sample

    state = GenerateState(args)
    async with state.semaphore:
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        with state.dp_rank_context():
            path = getattr(sample, "generate_function_path", None) or args.custom_generate_function_path
            if path is None:
                sample = await generate(args, sample, sampling_params)
            else:
                fn = load_function(path)
                if "evaluation" in inspect.signature(fn).parameters:
                    sample = await fn(args, sample, sampling_params, evaluation=evaluation)
                else:
                    sample = await fn(args, sample, sampling_params)

    if args.group_rm:
        return sample
    samples = sample if isinstance(sample, list) else [sample]
    if any(s.status == Sample.Status.ABORTED for s in samples):
        return sample
    for s in samples:
        if s.reward is None:
            s.reward = await async_rm(args, s)
    return sample


async def generate_and_rm_group(
    args: Any, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list:
    state = GenerateState(args)
    if state.aborted:
        return group
    for sample in group:
        if sample.session_id is None:
            sample.session_id = str(uuid.uuid4())
    tasks = [
        asyncio.create_task(generate_and_rm(args, sample, sampling_params.copy(), evaluation=evaluation))
        for sample in group
    ]
    # A CancelledError in one sample's task kills the whole group here.
    return list(await asyncio.gather(*tasks))


async def abort(args: Any, rollout_id: int) -> list[list[Sample]]:
    """Stock: server-wide abort until idle, then drain; with partial rollout every group is kept."""
    state = GenerateState(args)
    assert not state.aborted
    state.aborted = True
    server_wide = True
    if IN_TREE_REQUEST_ABORT:
        for task in list(state.cancellable_tasks):
            task.cancel()
        server_wide = state.active_server_generations > 0
    if server_wide:
        workers = await get(f"http://{args.sglang_router_ip}:{args.sglang_router_port}/workers")
        await abort_servers_until_idle([w["url"] for w in workers["workers"]])
    kept: list[list[Sample]] = []
    while state.pendings:
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        if not args.partial_rollout:
            continue
        for task in done:
            group = task.result()
            for sample in group:
                if sample.response and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            kept.append(group)
    return kept


async def generate_rollout_async(args: Any, rollout_id: int, data_source: Any) -> tuple[RolloutFnTrainOutput, list]:
    assert args.rollout_global_dataset
    state = GenerateState(args)
    target = args.rollout_batch_size
    data: list[list[Sample]] = []
    while len(data) < target:
        while state.remaining_batch_size < target:
            state.submit_generate_tasks(data_source(args.over_sampling_batch_size))
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            group = task.result()
            assert len(group) == args.n_samples_per_prompt
            if len(data) < target:
                data.append(group)
    # Looked up through the module global at call time: rollout plugins may swap it.
    aborted = await abort(args, rollout_id)
    data.sort(key=lambda g: g[0][0].index if isinstance(g[0], list) else g[0].index)
    state.reset()
    return RolloutFnTrainOutput(samples=data), aborted


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    assert args.rollout_global_dataset
    if evaluation:
        raise NotImplementedError("the slime double has no eval rollout")
    output, aborted = run(generate_rollout_async(args, rollout_id, data_source.get_samples))
    if aborted:
        data_source.add_samples(aborted)
    return output
