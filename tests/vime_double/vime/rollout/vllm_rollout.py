"""Double of vime.rollout.vllm_rollout: the rollout loop the adapter runs in (tests/vime_double/README.md).

The line (vime._line) decides ``abort()``: on request-abort (2b83ea20, ``cancellable_tasks``) it
cancels the task running each request-abortable sample, aborts server-wide only while counted
generations run, buffers only groups that kept a prefix and does not wait for the servers; on
stock (052693a8) it aborts every worker's in-flight requests, again every sweep interval while
groups are pending, and buffers every pending group; on pause (edbcb4c9) it pauses every worker
with ``mode=abort``, waits for the pending groups, buffers every one and resumes the workers.
"""

import asyncio
import importlib
import inspect
import uuid

from transformers import AutoTokenizer

from vime._line import LINE
from vime.rollout.base_types import RolloutFnTrainOutput
from vime.utils.async_utils import AsyncPacer, run
from vime.utils.http_utils import get, get_rollout_num_engines, post
from vime.utils.misc import SingletonMeta, load_function
from vime.utils.types import Sample

REQUEST_ABORT = LINE == "request-abort"
# The pause line has no vime.backends at all.
server_control = None if LINE == "pause" else importlib.import_module("vime.backends.vllm_utils.server_control")
RESWEEP_INTERVAL_S = 0.05  # the stock line re-sweeps every 3 s while groups are pending


def _coerce_flat_int_token_ids(ids):
    if ids is None:
        return []
    if hasattr(ids, "tolist") and not isinstance(ids, (list, tuple)):
        ids = ids.tolist()
    if isinstance(ids, (list, tuple)):
        return [t for item in ids for t in _coerce_flat_int_token_ids(item)]
    return [int(ids)]


def _prepare_prompt_ids(sample, tokenizer, processor):
    if sample.tokens:
        return _coerce_flat_int_token_ids(sample.tokens)
    return _coerce_flat_int_token_ids(tokenizer.encode(sample.prompt, add_special_tokens=False))


def _build_inference_sampling_params(params, logprobs=1):
    sp = {
        "max_tokens": params["max_new_tokens"],
        "temperature": params["temperature"],
        "top_p": params["top_p"],
        "logprobs": logprobs,
    }
    if params.get("top_k") is not None and (params["top_k"] > 0 or params["top_k"] == -1):
        sp["top_k"] = params["top_k"]
    if params.get("stop"):
        sp["stop"] = params["stop"]
        if params.get("no_stop_trim"):
            sp["include_stop_str_in_output"] = True
    if params.get("stop_token_ids"):
        sp["stop_token_ids"] = params["stop_token_ids"]
    if params.get("skip_special_tokens") is not None:
        sp["skip_special_tokens"] = bool(params["skip_special_tokens"])
    if params.get("spaces_between_special_tokens") is not None:
        sp["spaces_between_special_tokens"] = bool(params["spaces_between_special_tokens"])
    return sp


class GenerateState(metaclass=SingletonMeta):
    def __init__(self, args):
        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
        self.processor = None
        self.semaphore = asyncio.Semaphore(args.vllm_server_concurrency * get_rollout_num_engines(args))
        self.generation_pacer = AsyncPacer()
        self.sampling_params = dict(
            temperature=args.rollout_temperature,
            top_p=args.rollout_top_p,
            top_k=args.rollout_top_k,
            max_new_tokens=args.rollout_max_response_len,
            stop=args.rollout_stop,
            stop_token_ids=args.rollout_stop_token_ids,
            skip_special_tokens=args.rollout_skip_special_tokens,
            no_stop_trim=True,
            spaces_between_special_tokens=False,
        )
        self.reset()

    def reset(self):
        self.remaining_batch_size = 0
        self.pendings = set()
        self.aborted = False
        if REQUEST_ABORT:
            self.cancellable_tasks = set()
            self.active_server_generations = 0

    def submit_generate_tasks(self, samples):
        for group in samples:
            self.pendings.add(asyncio.create_task(generate_and_rm_group(self.args, group, self.sampling_params.copy())))
        self.remaining_batch_size += len(samples)


if REQUEST_ABORT:  # what tells 2b83ea20 apart (tests/vime_double/harness.py, real_line)

    async def _run_request_abortable_generate(state, sample, call):
        task = asyncio.current_task()
        state.cancellable_tasks.add(task)
        try:
            return await call
        except asyncio.CancelledError:
            if task in state.cancellable_tasks:
                raise
            sample.status = Sample.Status.ABORTED
            return sample
        finally:
            state.cancellable_tasks.discard(task)

    async def _run_server_abort_generate(state, call):
        state.active_server_generations += 1
        try:
            return await call
        finally:
            state.active_server_generations -= 1


async def generate_and_rm(args, sample, sampling_params, evaluation=False):
    if args.partial_rollout and args.mask_offpolicy_in_partial_rollout and sample.response_length > 0:
        sample.loss_mask = [0] * sample.response_length
    if sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED):
        return sample
    state = GenerateState(args)
    async with state.semaphore:
        await state.generation_pacer.wait()
        if state.aborted:
            sample.status = Sample.Status.ABORTED
            return sample
        path = sample.generate_function_path or args.custom_generate_function_path
        func = load_function(path)
        if "evaluation" in inspect.signature(func).parameters:
            call = func(args, sample, sampling_params, evaluation=evaluation)
        else:
            call = func(args, sample, sampling_params)
        if not REQUEST_ABORT:
            sample = await call
        elif getattr(func, "abort_mode", None) == "request":
            sample = await _run_request_abortable_generate(state, sample, call)
        else:
            sample = await _run_server_abort_generate(state, call)
    if args.group_rm or sample.status == Sample.Status.ABORTED:
        return sample
    if sample.reward is None:
        sample.reward = await load_function(args.custom_rm_path)(args, sample)
    return sample


async def generate_and_rm_group(args, group, sampling_params, evaluation=False):
    state = GenerateState(args)
    if state.aborted:
        return group
    for sample in group:
        if sample.session_id is None:
            sample.session_id = str(uuid.uuid4())
    tasks = [asyncio.create_task(generate_and_rm(args, s, sampling_params.copy(), evaluation)) for s in group]
    return list(await asyncio.gather(*tasks))


async def _worker_urls(args):
    response = await get(f"http://{args.vllm_router_ip}:{args.vllm_router_port}/workers")
    return [worker["url"] for worker in response["workers"]]


if LINE == "pause":

    async def _resume_vllm_workers(urls):
        """``POST /resume`` on each worker after ``pause?mode=abort``."""
        await asyncio.gather(*(post(f"{url.rstrip('/')}/resume", {}, max_retries=3) for url in urls))


async def abort(args, rollout_id):
    state = GenerateState(args)
    assert not state.aborted
    state.aborted = True
    cancelled = []
    if REQUEST_ABORT:
        cancelled = list(state.cancellable_tasks)
        state.cancellable_tasks.difference_update(cancelled)
        for task in cancelled:
            task.cancel()
    urls = []
    if REQUEST_ABORT and state.active_server_generations > 0:
        await server_control.abort_servers_until_idle(await _worker_urls(args))
    elif LINE == "stock" and state.pendings:
        urls = await _worker_urls(args)
        await server_control.abort_inflight_requests(urls)
    elif LINE == "pause" and state.pendings:
        urls = await _worker_urls(args)
        await asyncio.gather(*(post(f"{url.rstrip('/')}/pause?mode=abort", {}, max_retries=3) for url in urls))
    await asyncio.gather(*cancelled, return_exceptions=True)
    groups = []
    while state.pendings:
        timeout = RESWEEP_INTERVAL_S if LINE == "stock" else None
        done, state.pendings = await asyncio.wait(state.pendings, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if LINE == "stock" and state.pendings:  # a late straggler (a second turn) is aborted too
            await server_control.abort_inflight_requests(urls)
        if not args.partial_rollout:
            continue
        for task in done:
            group = task.result()
            if REQUEST_ABORT and not any(s.status == Sample.Status.ABORTED and s.response_length > 0 for s in group):
                continue
            for sample in group:
                if sample.response and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            groups.append(group)
    if LINE == "pause" and urls:
        await _resume_vllm_workers(urls)
    return groups


async def generate_rollout_async(args, rollout_id, data_source):
    state = GenerateState(args)
    data = []
    while len(data) < args.rollout_batch_size:
        while state.remaining_batch_size < args.rollout_batch_size:
            state.submit_generate_tasks(data_source(args.over_sampling_batch_size))
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            group = task.result()
            assert len(group) == args.n_samples_per_prompt
            if len(data) < args.rollout_batch_size:
                data.append(group)
    aborted_samples = await abort(args, rollout_id)  # the module global, looked up at call time
    state.reset()
    data.sort(key=lambda group: group[0].index)
    return RolloutFnTrainOutput(samples=data), aborted_samples


def generate_rollout(args, rollout_id, data_source, evaluation=False):
    assert not evaluation, "eval rollouts are not modelled"
    output, aborted_samples = run(generate_rollout_async(args, rollout_id, data_source.get_samples))
    if aborted_samples:
        data_source.add_samples(aborted_samples)
    return output
