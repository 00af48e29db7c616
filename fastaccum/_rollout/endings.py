"""A generate call's endings at a rollout abort, and the server's own abort outside one.

Who ends a call when the rollout is aborted: the framework itself, on a line that cancels
request-abortable calls (slime with request-level abort, vime 2b83ea20), or fastaccum's
``request_abort``; by ending this request (drained by id, or cut) or by the framework's
server-wide abort. The result is committed once, here, through the adapter's ``commit``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from fastaccum._rollout.pools import Pools, RolloutStream
from fastaccum.errors import StreamTruncatedError
from fastaccum.result import StreamResult

__all__ = ("committer", "end_call", "has_in_tree_request_abort", "opted_out_of_request_cancel")

Commit = Callable[[StreamResult], None]


def committer(*, terminal: Commit, prefix: Commit) -> Commit:
    """One rule for every adapter: a result that holds the request's terminal event (a finish, a
    drained abort, the server's abort chunk) is committed with its terminal bookkeeping; anything
    else (a cut, [DONE] without a finish_reason, a call never sent) is the observed prefix."""

    def commit(result: StreamResult) -> None:
        (terminal if result.finished else prefix)(result)

    return commit


def has_in_tree_request_abort(state: Any) -> bool:
    """The framework cancels request-abort generate calls itself (slime with pull request 2272,
    vime 2b83ea20): its GenerateState carries these."""
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


def _ended_by_server_without_finish(dialect: str, exc: StreamTruncatedError) -> bool:
    # vLLM before 0.32 ends a request it aborted with [DONE] and no finish_reason; a body cut
    # mid-stream (a lost connection), or SGLang's [DONE] early (it always finishes first), is an
    # error of another kind and stays one.
    return dialect == "vllm" and "[DONE] before a terminal finish_reason" in str(exc)


async def end_call(
    pools: Pools, state: Any, stream: RolloutStream, commit: Commit, *, drain: bool, server_wide: bool
) -> None:
    """Run one call's stream and commit its result once.

    ``server_wide``: the call needs its terminal event and no drain can give it (or the user
    asked for ``fastaccum_abort_mode: server``), so it is ended by the server-wide abort. A server
    that ends the request by itself ([DONE] without a finish_reason) is a server-side abort, the
    same as vLLM 0.32's abort chunk: the prefix is committed ABORTED, never raised, so the
    framework's buffer can resume it.
    """
    in_tree = has_in_tree_request_abort(state)
    commit = _counted(pools, stream, commit)
    try:
        if in_tree and not server_wide:
            result = await _ended_by_framework(pools, state, stream, commit, drain=drain)
            if result is None:  # committed whole: the terminal event beat the framework's abort
                return
        elif in_tree:
            with opted_out_of_request_cancel(state):
                result = await _run_unless_aborted(state, stream)
        elif server_wide:
            result = await _ended_by_server_abort(pools, state, stream)
        else:
            result = await _ended_by_request_abort(pools, state, stream)
    except StreamTruncatedError as exc:
        if not _ended_by_server_without_finish(pools.framework.dialect, exc):
            raise
        result = stream.kept()
    commit(result)


def _counted(pools: Pools, stream: RolloutStream, commit: Commit) -> Commit:
    """``commit``, then the call counted for the rollout's log line and metrics."""

    def counted(result: StreamResult) -> None:
        commit(result)
        abort_error = getattr(stream, "abort_error", None)
        pools.stats.record(result, abort_error=abort_error, retries=getattr(stream, "retries", 0))

    return counted


async def _run_unless_aborted(state: Any, stream: RolloutStream) -> StreamResult:
    if state.aborted:  # the rollout is already being aborted: send nothing
        stream.abort()
    return await stream.run()


async def _ended_by_request_abort(pools: Pools, state: Any, stream: RolloutStream) -> StreamResult:
    """A framework without request-level abort: fastaccum's request_abort aborts this stream
    (``abort()``: run() returns the drained terminal abort event, or the observed prefix,
    aborted=True); any other cancellation of this task propagates unchanged."""
    registry = pools.registry()
    registry.request_streams.add(stream)
    try:
        # Register, then check: an abort that swept the registry before we registered has set
        # state.aborted, so this call is stopped before it sends anything.
        result = await _run_unless_aborted(state, stream)
    finally:
        registry.request_streams.discard(stream)
    _note_cut(pools, stream, result)
    return result


async def _ended_by_server_abort(pools: Pools, state: Any, stream: RolloutStream) -> StreamResult:
    """A framework without request-level abort, a call that needs its terminal event:
    request_abort aborts server-wide and the stream ends with the server's own end."""
    registry = pools.registry()
    registry.server_generations += 1
    try:
        return await _run_unless_aborted(state, stream)
    finally:
        registry.server_generations -= 1


async def _ended_by_framework(
    pools: Pools, state: Any, stream: RolloutStream, commit: Commit, *, drain: bool
) -> StreamResult | None:
    """The framework's own abort cancels the task running this call.

    The framework registers that task in ``state.cancellable_tasks`` before this call starts, and
    its ``abort()`` removes it from the set, then cancels it. Exactly that cancellation ends the
    request: with ``drain`` the stream runs in a task of its own, so the cancel leaves it reading,
    and ``abort()`` asks the server to end the request, whose terminal abort event (routed experts,
    top-p rows) is read; without, the stream is cut. Either way the result is committed here,
    before the ``CancelledError`` reaches the framework's wrapper (which marks the sample ABORTED
    and returns it as left). Returns None when the abort came after the terminal event: the result
    is then committed here and the cancel withdrawn (resuming would generate past its end).
    """
    task = asyncio.current_task()
    registered = task is not None and task in state.cancellable_tasks
    reading = asyncio.ensure_future(_run_unless_aborted(state, stream)) if drain else None
    try:
        if reading is None:
            return await _run_unless_aborted(state, stream)
        return await asyncio.shield(reading)
    except asyncio.CancelledError:
        ended_by_abort = (
            task is not None
            and registered
            and state.aborted
            and task not in state.cancellable_tasks
            and task.cancelling() == 1  # a caller's own cancel on top makes it theirs
        )
        if reading is not None and not ended_by_abort:
            reading.cancel()  # the caller's cancel: the stream's too
        if not ended_by_abort:
            raise
        kept = await _drained(stream, reading) if reading is not None else stream.kept()
        if kept.aborted:
            commit(kept)
            _note_cut(pools, stream, kept)
            raise
    assert task is not None
    task.uncancel()
    commit(kept)
    return None


async def _drained(stream: RolloutStream, reading: asyncio.Future[StreamResult]) -> StreamResult:
    """The stream's result after ``abort()``: its terminal abort event, or at the drain deadline the
    prefix; a second cancel of this task cuts it at once."""
    stream.abort()
    try:
        return await reading
    except asyncio.CancelledError:
        reading.cancel()
        raise


def _note_cut(pools: Pools, stream: RolloutStream, result: StreamResult) -> None:
    """A request cut before its terminal event: the server may not know yet (the framework's
    ``after_cut`` may name it)."""
    rid = getattr(stream, "rid", None)
    if result.aborted and not result.finished and rid is not None:
        pools.registry().cut_rids.append(rid)
