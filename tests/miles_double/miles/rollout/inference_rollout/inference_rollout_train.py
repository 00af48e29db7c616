"""Stand-in for miles.rollout.inference_rollout.inference_rollout_train: the rollout class's
training loop and its abort.

``generate_rollout_async`` keeps the pending group tasks itself, submits whole groups while fewer
are pending than groups still wanted, takes finished groups until it has ``rollout_batch_size``
(a group whose task failed is logged and skipped), then calls this module's ``abort`` looked up
at call time, ``abort(state, pendings, rollout_id)``, and resets the state. ``abort`` sends
``abort_all`` to every worker once (no wait for idle), runs the agent abort hook, awaits every
pending group and, with ``--partial-rollout``, returns every one of them, each sample with a
response stamped with the rollout it started in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from miles.rollout.base_types import RolloutFnTrainOutput
from miles.rollout.inference_rollout.inference_rollout_common import generate_and_rm_group
from miles.utils.http_utils import get, post, router_worker_base_urls
from miles.utils.misc import as_completed_async, call_agent_abort_hook

log = logging.getLogger(__name__)


async def get_worker_urls(args: Any) -> list[str]:
    """The router's workers (Miles' own router answers ``/list_workers``), ranks folded."""
    router = f"http://{args.sglang_router_ip}:{args.sglang_router_port}"
    if args.use_miles_router:
        urls = (await get(f"{router}/list_workers"))["urls"]
    else:
        urls = [worker["url"] for worker in (await get(f"{router}/workers"))["workers"]]
    return router_worker_base_urls(urls)


async def abort(state: Any, pendings: set, rollout_id: int) -> list[list[Any]]:
    args = state.args
    assert not state.aborted
    state.aborted = True
    urls = await get_worker_urls(args)
    await asyncio.gather(*(post(f"{url}/abort_request", {"abort_all": True}) for url in urls))
    await call_agent_abort_hook(args)
    buffered = []
    async for group in as_completed_async(pendings):
        if not args.partial_rollout:
            continue
        for sample in group:
            if sample.response and "start_rollout_id" not in sample.metadata:
                sample.metadata["start_rollout_id"] = rollout_id
        buffered.append(group)
    return buffered


def submit_generate_tasks(state: Any, groups: list) -> list[asyncio.Task]:
    return [
        asyncio.create_task(generate_and_rm_group(state, group, sampling_params=state.sampling_params.copy()))
        for group in groups
    ]


def _first_index(group: list) -> int:
    return group[0][0].index if isinstance(group[0], list) else group[0].index


async def generate_rollout_async(state: Any, rollout_id: int, data_source: Any) -> tuple[RolloutFnTrainOutput, list]:
    args = state.args
    assert args.rollout_global_dataset
    wanted = args.rollout_batch_size
    pendings: set[asyncio.Task] = set()
    data: list[list[Any]] = []
    while len(data) < wanted:
        while len(pendings) < wanted - len(data):
            pendings.update(submit_generate_tasks(state, data_source(args.over_sampling_batch_size)))
        done, pendings = await asyncio.wait(pendings, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            try:
                group = task.result()
            except Exception as exc:
                log.error("[rollout] a group task raised %r; skipped", exc)
                continue
            assert len(group) == args.n_samples_per_prompt
            if len(data) < wanted:
                data.append(group)
    aborted = await abort(state, pendings, rollout_id)  # the module global, looked up now
    data.sort(key=_first_index)
    state.reset()
    return RolloutFnTrainOutput(samples=data, metrics={}), aborted
