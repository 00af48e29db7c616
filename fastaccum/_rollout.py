"""What both RL adapters (fastaccum.slime, fastaccum.vime) do alike, written once: read a call's
tokens and log-probs for its ``Sample``, record its timing, and at a rollout abort collect the
pending groups, keep for resuming only those that observed a prefix, and wait until the servers
run nothing. The frameworks differ only in what is passed in (their ``Sample`` status, how a
server's load is read, their server-wide abort)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import numpy as np

from fastaccum.errors import StreamFormatError
from fastaccum.result import StreamResult

__all__ = (
    "call_tokens",
    "record_timing",
    "ModuleAbort",
    "has_in_tree_request_abort",
    "opted_out_of_request_cancel",
    "leaves",
    "kept_a_prefix",
    "collect_groups",
    "wait_until_idle",
)


def call_tokens(result: StreamResult, asked: str) -> tuple[list[int], list[float]]:
    """A call's tokens and their log-probs as lists; every token must have one (``asked``: the
    request key that asks for them, for the message)."""
    tokens = result.token_ids.tolist()
    if not tokens:
        return [], []
    if result.logprobs is None:
        raise StreamFormatError(f"the stream carried {len(tokens)} tokens but no logprobs ({asked})")
    nulls = np.flatnonzero(np.isnan(result.logprobs))
    if nulls.size:
        # A NaN logprob would poison off-policy correction (TIS) for the whole batch.
        raise StreamFormatError(f"null logprob for sampled token at position {int(nulls[0])} of {len(tokens)}")
    return tokens, result.logprobs.tolist()


def record_timing(sample: Any, result: StreamResult) -> None:
    """One entry per generate call in ``sample.metadata["fastaccum_timing"]``, so stragglers
    (a late first token, a long gap) show in the rollout's data; the aiohttp transport has none."""
    if result.timing is not None:
        sample.metadata.setdefault("fastaccum_timing", []).append(dataclasses.asdict(result.timing))


class ModuleAbort:
    """A framework's module-level ``abort`` (looked up at call time), swapped for the adapter's
    ``replacement`` while a rollout runs; ``original()`` is the framework's own, for the adapter to
    call. One per adapter; the lock keeps concurrent rollouts (threads) from keeping the swap."""

    def __init__(self, replacement: Callable[..., Any]) -> None:
        self._replacement = replacement
        self._stock: Any = None
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def swapped(self, rollout_module: Any) -> Iterator[None]:
        with self._lock:
            previous = rollout_module.abort
            if previous is not self._replacement:
                self._stock = previous
            rollout_module.abort = self._replacement
        try:
            yield
        finally:
            with self._lock:
                rollout_module.abort = previous

    def original(self, rollout_module: Any) -> Any:
        current = rollout_module.abort
        return current if current is not self._replacement else self._stock


def has_in_tree_request_abort(state: Any) -> bool:
    """The framework cancels request-abort generate calls itself (slime with pull request 2272,
    vime from 91a8f005): its GenerateState carries these."""
    return hasattr(state, "cancellable_tasks") and hasattr(state, "active_server_generations")


@contextlib.contextmanager
def opted_out_of_request_cancel(state: Any) -> Iterator[None]:
    """A call that must end with the server's own abort, on a framework with request-level abort:
    leave its cancel set and count in ``active_server_generations``, so its ``abort()`` aborts
    server-wide. The task goes back into the set afterwards, so the framework's wrapper still
    tells a caller's own cancel from an abort."""
    task = asyncio.current_task()
    registered = task is not None and task in state.cancellable_tasks
    if registered:
        state.cancellable_tasks.discard(task)
    state.active_server_generations += 1
    try:
        yield
    finally:
        state.active_server_generations -= 1
        if registered:
            state.cancellable_tasks.add(task)


def leaves(group: list[Any]) -> Iterator[Any]:
    """The samples of a group (a fan-out generate returns list[Sample] per task)."""
    for item in group:
        if isinstance(item, list):
            yield from item
        else:
            yield item


def kept_a_prefix(group: list[Any], aborted: Any) -> bool:
    """Some sample of the group was cut (``aborted``: the framework's ABORTED status) with tokens."""
    return any(s.status == aborted and s.response_length > 0 for s in leaves(group))


async def collect_groups(
    state: Any, args: Any, rollout_id: int, aborted: Any, logger: logging.Logger
) -> list[list[Any]]:
    """Wait for every pending group as the framework's own abort does (never cancelling one:
    siblings may be computing rewards); with ``--partial-rollout``, the groups that kept a prefix,
    each resumed sample stamped with the rollout it started in."""
    groups: list[list[Any]] = []
    count = 0
    partial = getattr(args, "partial_rollout", False)
    while state.pendings:
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        if not partial:
            continue
        for task in done:
            group = task.result()
            if not kept_a_prefix(group, aborted):
                continue  # nothing observed: resuming would only redo finished siblings' work
            for sample in leaves(group):
                if sample.response and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            groups.append(group)
            count += len(group)
    if partial:
        logger.info("fastaccum: buffered %d partial groups (%d samples) for resume", len(groups), count)
    return groups


async def wait_until_idle(
    urls: list[str],
    *,
    load: Callable[[str], Awaitable[Any]],
    running: Callable[[Any], int],
    abort_until_idle: Callable[[list[str]], Awaitable[Any]],
    timeout: float,
    poll_interval: float,
    logger: logging.Logger,
) -> None:
    """Poll each worker's load (``load(url)``, ``running(load)`` requests) until none runs one;
    past ``timeout``, or when a load cannot be read, the busy workers are aborted server-wide."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    busy = list(urls)
    while busy:
        try:
            loads = await asyncio.gather(*(load(url) for url in busy))
        except Exception as exc:  # an unreadable load proves nothing: make sure the hard way
            logger.warning("fastaccum: could not read server loads (%r); aborting server-wide", exc)
            break
        busy = [url for url, answer in zip(busy, loads) if running(answer) > 0]
        if not busy:
            return
        if loop.time() >= deadline:
            logger.warning(
                "fastaccum: %s still busy %.1f s after request-level abort; aborting server-wide", busy, timeout
            )
            break
        await asyncio.sleep(poll_interval)
    await abort_until_idle(busy)
