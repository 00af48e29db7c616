"""The rollout function and request-level abort, written once: the framework's module-level
``abort`` swapped for the adapter's ``request_abort`` while a rollout runs, which stops
fastaccum's streams, buffers the groups that kept a prefix and waits until the servers are idle."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from fastaccum._rollout.endings import has_in_tree_request_abort
from fastaccum._rollout.framework import Framework
from fastaccum._rollout.pools import Pools
from fastaccum._rollout.settings import RolloutSettings
from fastaccum._rollout.stats import CallStats

__all__ = ("ModuleAbort", "Lifecycle", "leaves", "kept_a_prefix", "collect_groups", "wait_until_idle")


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
    pendings: set[asyncio.Task[Any]], args: Any, rollout_id: int, aborted: Any, framework: Framework
) -> list[list[Any]]:
    """Wait for every pending group task as the framework's own abort does (never cancelling one:
    siblings may be computing rewards); with ``--partial-rollout``, the groups to buffer (those
    that kept a prefix, or every one where the framework buffers so), each resumed sample stamped
    with the rollout it started in."""
    groups: list[list[Any]] = []
    count = 0
    partial = getattr(args, "partial_rollout", False)
    while pendings:
        done, pendings = await asyncio.wait(pendings, return_when=asyncio.FIRST_COMPLETED)
        if not partial:
            continue
        for task in done:
            group = task.result()
            if not framework.buffers_every_group and not kept_a_prefix(group, aborted):
                continue  # nothing observed: resuming would only redo finished siblings' work
            for sample in leaves(group):
                if sample.response and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            groups.append(group)
            count += len(group)
    if partial:
        framework.logger.info("fastaccum: buffered %d partial groups (%d samples) for resume", len(groups), count)
    return groups


async def wait_until_idle(
    urls: list[str],
    *,
    load: Callable[[str], Awaitable[Any]],
    running: Callable[[Any], int],
    abort_until_idle: Callable[[list[str]], Awaitable[Any]],
    timeout: float,
    poll_interval: float,
    framework: Framework,
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
            framework.logger.warning("fastaccum: could not read server loads (%r); aborting server-wide", exc)
            break
        busy = [url for url, answer in zip(busy, loads) if running(answer) > 0]
        if not busy:
            return
        if loop.time() >= deadline:
            framework.logger.warning(
                "fastaccum: %s still busy %.1f s after request-level abort; aborting server-wide", busy, timeout
            )
            break
        await asyncio.sleep(poll_interval)
    await abort_until_idle(busy)


class Lifecycle:
    """One adapter's rollout function and ``request_abort``.

    ``request_abort`` is the adapter's public function (the one swapped in), which calls
    ``abort()`` here; ``generate`` is the adapter's generate function, whose ``abort_mode``
    marker tells the framework, and this, that fastaccum ends its calls.
    """

    def __init__(
        self,
        framework: Framework,
        pools: Pools,
        request_abort: Callable[..., Any],
        before_rollout: Callable[[Any], None] | None = None,
    ) -> None:
        self.framework = framework
        self.pools = pools
        self.module_abort = ModuleAbort(request_abort)
        self._before_rollout = before_rollout  # the adapter's own checks, before a rollout sends anything

    def generate_rollout(self, args: Any, rollout_id: int, data_source: Any, evaluation: bool) -> Any:
        """The framework's own rollout function, run with ``request_abort`` swapped in."""
        rollout = self.framework.modules().rollout
        return self._run(rollout.generate_rollout, args, rollout_id, data_source, evaluation)

    def with_request_abort(self, rollout_function: Callable[..., Any]) -> Callable[..., Any]:
        """``rollout_function`` (a ``--rollout-function-path`` of your own) run as the adapter's
        ``generate_rollout`` runs the framework's: with the framework's module-level ``abort``
        swapped for ``request_abort`` while it runs, the settings checked first, the rollout's
        line logged and its counts kept for ``log_rollout_data``."""

        @functools.wraps(rollout_function)
        def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
            return self._run(rollout_function, args, rollout_id, data_source, evaluation)

        return generate_rollout

    def _run(self, function: Callable[..., Any], args: Any, rollout_id: int, data_source: Any, evaluation: bool) -> Any:
        if evaluation:
            with self.evaluating(rollout_id):
                return function(args, rollout_id, data_source, evaluation=True)
        with self.rolling_out(args, rollout_id):
            return function(args, rollout_id, data_source, evaluation=False)

    @contextlib.contextmanager
    def evaluating(self, rollout_id: int) -> Iterator[None]:
        """An evaluation runs as the framework runs it; its calls get a log line of their own."""
        try:
            yield
        finally:
            self._report(f"evaluation {rollout_id}", self.pools.stats.close())

    @contextlib.contextmanager
    def rolling_out(self, args: Any, rollout_id: int) -> Iterator[None]:
        """A rollout of the framework's (a function, or a rollout class's call) runs in this block:
        the settings are checked first, the framework's module-level ``abort`` is swapped for the
        adapter's while it runs, and its log line and counts are kept for ``log_rollout_data``."""
        self.framework.settings(args)  # a setting fastaccum cannot take fails here, before any request
        if self._before_rollout is not None:
            self._before_rollout(args)
        self.pools.stats.close()  # this rollout's calls from here on (not an evaluation's, say)
        try:
            with self.module_abort.swapped(self.framework.modules().rollout):
                yield
        finally:
            self._report(f"rollout {rollout_id}", self.pools.stats.close(rollout_id))

    def _report(self, what: str, stats: CallStats) -> None:
        """The rollout's one log line: a warning when a drain fell back to a cut or a request was
        retried."""
        if stats.calls:
            level = logging.INFO if stats.quiet else logging.WARNING
            self.framework.logger.log(level, "fastaccum: %s: %s", what, stats.summary())

    def log_rollout_data(
        self, rollout_id: int, args: Any, samples: Any, rollout_extra_metrics: Any, rollout_time: float
    ) -> bool:
        """The framework's ``--custom-rollout-log-function-path``: the rollout's fastaccum counts
        and timing percentiles added to its rollout metrics (``fastaccum/...``); False, so the
        framework logs them with its own."""
        metrics = self.pools.stats.take(rollout_id).metrics()
        if isinstance(rollout_extra_metrics, dict):
            rollout_extra_metrics.update(metrics)
        else:  # a rollout function that returns no metrics dict: nothing to add them to
            self.framework.logger.info("fastaccum: rollout %d metrics: %s", rollout_id, metrics)
        return False

    def framework_abort(self) -> Any:
        """The framework's own module-level ``abort`` (not the one swapped in)."""
        return self.module_abort.original(self.framework.modules().rollout)

    def ends_its_calls(self, args: Any) -> bool:
        """The rollout's generate function is one whose requests fastaccum ends (its
        ``abort_mode``); another's fastaccum cannot see, and the framework's own abort must run."""
        path = getattr(args, "custom_generate_function_path", None)
        found = self.framework.modules().misc.load_function(path) if path else None
        return getattr(found, "abort_mode", None) == "request"

    async def abort(self, args: Any, rollout_id: int) -> list[list[Any]]:
        """The framework's ``abort(args, rollout_id)`` (slime, vime, Miles' legacy rollout): the
        rollout's state and its pending groups are the framework's ``GenerateState(args)``'s."""
        state = self.framework.modules().rollout.GenerateState(args)
        return await self.abort_calls(
            args, rollout_id, state, own_abort=lambda: self.framework_abort()(args, rollout_id)
        )

    async def abort_calls(
        self,
        args: Any,
        rollout_id: int,
        state: Any,
        *,
        own_abort: Callable[[], Awaitable[list[list[Any]]]],
        pendings: set[asyncio.Task[Any]] | None = None,
    ) -> list[list[Any]]:
        """Abort the rollout's in-flight work and return the groups to buffer for partial rollout.
        When it returns, every stream fastaccum stopped is closed or drained and the servers are idle.

        ``state``: the rollout's ``GenerateState``; ``own_abort``: the framework's own abort, for a
        framework that cancels fastaccum's calls itself; ``pendings``: the pending group tasks where
        the framework hands them over (Miles), else the state's."""
        fw = self.framework
        if not self.ends_its_calls(args):
            # Another generate function: fastaccum cannot see its requests, the framework's abort can.
            return await own_abort()
        settings = fw.settings(args)
        streams = self.pools.registry()
        if has_in_tree_request_abort(state):
            # The framework cancels the request-abort calls itself (generate commits each prefix as
            # it is cancelled) and buffers the same groups; it only does not wait for the servers,
            # which may notice a closed connection late and still be decoding.
            server_wide = state.active_server_generations > 0
            in_tree = await own_abort()
            if not server_wide:
                await self._settle(args, settings)
            return in_tree
        assert not state.aborted, "request_abort called twice in one rollout"
        state.aborted = True  # before the first await: generate calls starting from now stop at once
        for stream in list(streams.request_streams):
            stream.abort()
        server_wide = streams.server_generations > 0
        if server_wide:
            # Calls that must end with their terminal event and cannot drain: only the server-wide
            # abort ends them that way.
            await fw.server_abort(args, await fw.worker_urls(args))
        await fw.before_collecting(args)
        if pendings is None:
            pendings, state.pendings = state.pendings, set()
        aborted = fw.modules().Sample.Status.ABORTED
        groups = await collect_groups(pendings, args, rollout_id, aborted, fw)
        if not server_wide:
            await self._settle(args, settings)
        return groups

    async def _settle(self, args: Any, settings: RolloutSettings) -> None:
        """After fastaccum stopped its streams: tell the servers what was cut, then wait until
        every worker is idle (offloading and weight updates must not run under live requests)."""
        fw = self.framework
        await fw.after_cut(args, settings)
        await wait_until_idle(
            await fw.worker_urls(args),
            load=lambda url: fw.load(args, url),
            running=fw.running,
            abort_until_idle=lambda busy: fw.server_abort(args, busy),
            timeout=settings.idle_timeout,
            poll_interval=settings.idle_poll_interval,
            framework=fw,
        )
