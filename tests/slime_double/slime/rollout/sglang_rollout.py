"""Stand-in for slime.rollout.sglang_rollout (docs/slime.md, "How slime runs a rollout").

Models: ``GenerateState`` (the process singleton), ``_prepare_prompt_ids``, the per-sample and
per-group tasks (``generate_and_rm``, ``generate_and_rm_group``), ``abort`` and a
``generate_rollout`` that reaches ``abort`` through this module's globals at call time (so a
rollout plugin can swap it) and then resets the state.

Two slime lines, switched by ``REQUEST_ABORT`` (docs/slime.md, "Two slime lines"):

- ``False``, stock slime: ``abort`` always aborts server-wide and buffers every pending group;
- ``True``, slime with request-level abort: ``GenerateState`` carries ``cancellable_tasks`` and
  ``active_server_generations``; ``generate_and_rm`` runs a generate function marked
  ``abort_mode == "request"`` with the task that runs it registered for cancellation, and turns
  the cancel that ``abort`` issues into an ABORTED sample, returned as the function left it;
  other generate functions are counted; ``abort`` cancels the registered tasks, aborts
  server-wide only while counted generations run, and buffers only groups that kept a prefix.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import uuid
from collections.abc import Iterator
from typing import Any

from slime.backends.sglang_utils.server_control import abort_servers_until_idle
from slime.rollout.base_types import RolloutFnTrainOutput
from slime.utils.async_utils import run
from slime.utils.http_utils import get, get_rollout_num_engines
from slime.utils.misc import SingletonMeta, load_function
from slime.utils.processing_utils import load_processor, load_tokenizer
from slime.utils.types import Sample

log = logging.getLogger(__name__)

_ABORTED = Sample.Status.ABORTED
_FINISHED = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)  # returned as they are on resume

REQUEST_ABORT = False

# SGLang sampling parameter <- slime argument.
_SAMPLING_FROM_ARGS = (
    ("temperature", "rollout_temperature"),
    ("top_p", "rollout_top_p"),
    ("top_k", "rollout_top_k"),
    ("max_new_tokens", "rollout_max_response_len"),
    ("stop", "rollout_stop"),
    ("stop_token_ids", "rollout_stop_token_ids"),
    ("skip_special_tokens", "rollout_skip_special_tokens"),
)
# Fixed for every request: keep stop strings in the text, no spaces around special tokens.
_SAMPLING_FIXED = {"no_stop_trim": True, "spaces_between_special_tokens": False}


def _prepare_prompt_ids(sample: Sample, tokenizer: Any, processor: Any) -> list[int]:
    """The ids to send: what the sample already holds (prompt + partial response on resume),
    else the text prompt encoded without special tokens. Multimodal prompts are not modelled."""
    held = sample.tokens
    if held:
        return held
    prompt = sample.prompt
    return tokenizer.encode(prompt, add_special_tokens=False)


def _initial_sampling_params(args: Any) -> dict[str, Any]:
    params = {name: getattr(args, source) for name, source in _SAMPLING_FROM_ARGS}
    params.update(_SAMPLING_FIXED)
    if args.rollout_top_p != 1.0:  # top-p replay: ask the patched server for the kept sets
        params["custom_params"] = {"return_top_p_token_ids": True}
    return params


class GenerateState(metaclass=SingletonMeta):
    """Per-process rollout state: tokenizer, processor, concurrency gate, in-flight group tasks."""

    def __init__(self, args: Any) -> None:
        self.args = args
        checkpoint = args.hf_checkpoint
        self.tokenizer = load_tokenizer(checkpoint, trust_remote_code=True)
        self.processor = load_processor(checkpoint, trust_remote_code=True)
        capacity = args.sglang_server_concurrency * get_rollout_num_engines(args)
        self.semaphore = asyncio.Semaphore(capacity)
        self.sampling_params: dict[str, Any] = _initial_sampling_params(args)
        self._rank_load = [0] * (getattr(args, "sglang_dp_size", None) or 1)
        self.reset()

    def reset(self) -> None:
        """Forget the finished rollout: no pending groups, not aborted."""
        self.pendings: set[asyncio.Task] = set()
        self.aborted = False
        if REQUEST_ABORT:
            self.cancellable_tasks: set[asyncio.Task] = set()
            self.active_server_generations = 0

    @contextlib.contextmanager
    def dp_rank_context(self) -> Iterator[int]:
        """Hold one data-parallel rank for the block: the least busy one, ties broken at random."""
        load = self._rank_load
        rank = min(range(len(load)), key=lambda r: (load[r], random.random()))
        load[rank] += 1
        try:
            yield rank
        finally:
            load[rank] -= 1


# ---- one sample -----------------------------------------------------------------------------------
async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    raise NotImplementedError("the stock non-streaming generate is not part of the slime double")


def _generate_function_for(args: Any, sample: Sample) -> Any:
    # The sample's own path (set per eval dataset) beats the custom path, which beats the stock one.
    path = getattr(sample, "generate_function_path", None) or getattr(args, "custom_generate_function_path", None)
    return generate if path is None else load_function(path)


async def _call_generate(args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool) -> Any:
    fn = _generate_function_for(args, sample)
    extra = {"evaluation": evaluation} if "evaluation" in inspect.signature(fn).parameters else {}
    call = fn(args, sample, sampling_params, **extra)
    if not REQUEST_ABORT:
        return await call
    state = GenerateState(args)
    if getattr(fn, "abort_mode", None) == "request":
        return await _cancellable_by_abort(state, sample, call)
    state.active_server_generations += 1
    try:
        return await call
    finally:
        state.active_server_generations -= 1


async def _cancellable_by_abort(state: GenerateState, sample: Sample, call: Any) -> Any:
    """The task running this sample is what ``abort`` cancels; its cancel becomes ABORTED."""
    me = asyncio.current_task()
    state.cancellable_tasks.add(me)
    try:
        return await call
    except asyncio.CancelledError:
        if me in state.cancellable_tasks:  # still registered: not abort's cancel
            raise
        sample.status = _ABORTED  # whatever the generate function left on the sample stays
        return sample
    finally:
        state.cancellable_tasks.discard(me)


async def _reward(args: Any, sample: Sample) -> Any:
    path = sample.custom_rm_path or getattr(args, "custom_rm_path", None)
    if path is None:
        raise NotImplementedError("the slime double computes rewards only through a custom reward path")
    reward_fn = load_function(path)
    return await reward_fn(args, sample)


def _leaves(result: Any) -> list[Sample]:
    """A generate function returns one Sample, or a list of them for fan-out."""
    return list(result) if isinstance(result, list) else [result]


async def generate_and_rm(
    args: Any, sample: Sample, sampling_params: dict[str, Any], evaluation: bool = False
) -> Sample | list[Sample]:
    """Generate one sample and score it; aborted samples get no reward."""
    resumed = sample.response_length > 0
    if resumed and args.partial_rollout and args.mask_offpolicy_in_partial_rollout:
        # Before the early return below, so completed samples lose their mask too.
        sample.loss_mask = [0 for _ in range(sample.response_length)]

    if sample.status in _FINISHED:
        if not args.group_rm:
            assert sample.reward is not None, f"finished sample {sample.index} arrived without a reward"
        return sample

    state = GenerateState(args)
    async with state.semaphore:
        with state.dp_rank_context():
            if state.aborted:  # the rollout is being aborted: do not start this one
                sample.status = _ABORTED
                return sample
            result = await _call_generate(args, sample, sampling_params, evaluation)

    if not args.group_rm:
        for done in _leaves(result):
            if done.status is not _ABORTED and done.reward is None:
                done.reward = await _reward(args, done)
    return result


# ---- one group --------------------------------------------------------------------------------------
def _new_session_id() -> str:
    return str(uuid.uuid4())


async def generate_and_rm_group(
    args: Any, group: list[Sample], sampling_params: dict[str, Any], evaluation: bool = False
) -> list:
    """One task per sample, gathered: a CancelledError from any of them ends the whole group."""
    if GenerateState(args).aborted:
        return group
    for member in group:
        if member.session_id is None:
            member.session_id = _new_session_id()
    per_sample = [
        asyncio.create_task(generate_and_rm(args, member, dict(sampling_params), evaluation=evaluation))
        for member in group
    ]
    return list(await asyncio.gather(*per_sample))


# ---- abort --------------------------------------------------------------------------------------------
def _first_sample(group: list) -> Sample:
    head = group[0]
    return head[0] if isinstance(head, list) else head


def _stamp_partial(group: list, rollout_id: int) -> None:
    for entry in group:
        for member in _leaves(entry):
            if member.response:
                member.metadata.setdefault("start_rollout_id", rollout_id)


async def _server_wide_abort(args: Any) -> None:
    router = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    listing = await get(router + "/workers")
    await abort_servers_until_idle([worker["url"] for worker in listing["workers"]])


def _kept_prefix(group: list) -> bool:
    return any(m.status is _ABORTED and m.response_length > 0 for entry in group for m in _leaves(entry))


async def abort(args: Any, rollout_id: int) -> list[list[Sample]]:
    """Stop the rollout's generations, wait for every in-flight group, and with partial rollout
    hand back the groups to buffer: all of them (stock), or those that kept a prefix."""
    state = GenerateState(args)
    assert not state.aborted, "abort() ran twice for one rollout"
    state.aborted = True
    if REQUEST_ABORT:
        cancelled = list(state.cancellable_tasks)
        state.cancellable_tasks.clear()  # the wrapper reads "no longer registered" as "abort's cancel"
        for task in cancelled:
            task.cancel()
        if state.active_server_generations > 0:
            await _server_wide_abort(args)
        await asyncio.gather(*cancelled, return_exceptions=True)
    else:
        await _server_wide_abort(args)

    in_flight, state.pendings = state.pendings, set()
    if not in_flight:
        return []
    finished, _ = await asyncio.wait(in_flight)
    if not args.partial_rollout:
        return []
    returned = []
    for task in finished:
        group = task.result()
        if REQUEST_ABORT and not _kept_prefix(group):
            continue
        _stamp_partial(group, rollout_id)
        returned.append(group)
    return returned


# ---- the rollout --------------------------------------------------------------------------------------
async def generate_rollout_async(args: Any, rollout_id: int, data_source: Any) -> tuple[RolloutFnTrainOutput, list]:
    """Collect ``rollout_batch_size`` finished groups, then abort the surplus still in flight."""
    state = GenerateState(args)
    wanted = args.rollout_batch_size
    launched = 0
    kept: list[list[Sample]] = []
    while len(kept) < wanted:
        while launched < wanted:  # top up with over-sampled groups
            for group in data_source(args.over_sampling_batch_size):
                params = dict(state.sampling_params)
                state.pendings.add(asyncio.create_task(generate_and_rm_group(args, group, params)))
                launched += 1
        finished, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        for task in finished:
            group = task.result()
            if len(group) != args.n_samples_per_prompt:
                raise AssertionError(f"group of {len(group)}, expected {args.n_samples_per_prompt}")
            if len(kept) < wanted:
                kept.append(group)
    # ``abort`` is a module global looked up here, at call time: a rollout plugin may have swapped it.
    leftovers = await abort(args, rollout_id)
    kept.sort(key=lambda group: _first_sample(group).index)
    state.reset()
    return RolloutFnTrainOutput(samples=kept), leftovers


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    if not args.rollout_global_dataset:
        raise AssertionError("the slime double models only the global-dataset rollout")
    if evaluation:
        raise NotImplementedError("evaluation rollouts are not part of the slime double")
    output, leftovers = run(generate_rollout_async(args, rollout_id, data_source.get_samples))
    if leftovers:
        data_source.add_samples(leftovers)
    return output
