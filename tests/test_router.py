"""Through the real sglang-router (PyPI), as slime deploys it: two emulator workers behind it.

Streams pass through unchanged; a disconnect reaches the worker; the drain abort, which the router
does not forward, reaches the worker that holds the request; a rollout abort leaves every worker
idle. Both twins. tests/test_slime.py runs the slime adapter's rollout abort through it too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import subprocess
from collections.abc import AsyncIterator
from types import ModuleType

import client_helpers
import pytest
from client_helpers import abort_after, abort_together, assert_matches, payload, run
from router_helpers import ROUTER_AVAILABLE, start_router

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import ABORT_REASON, Emulator

pytestmark = pytest.mark.skipif(not ROUTER_AVAILABLE, reason="sglang-router is not installed (the test extra has it)")

wait_until = functools.partial(client_helpers.wait_until, timeout=30.0)


@contextlib.asynccontextmanager
async def routed(*workers: Emulator) -> AsyncIterator[str]:
    """The router in front of the running emulators (started from a thread: they answer its
    health checks on this loop meanwhile)."""
    proc, url = await asyncio.to_thread(start_router, [w.url for w in workers])
    try:
        yield url
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            await asyncio.to_thread(proc.wait, 10)
        if proc.poll() is None:
            proc.kill()


def _holder(workers: tuple[Emulator, ...], rid: str) -> Emulator:
    (holder,) = [w for w in workers if rid in w.stats.written or any(r.rid == rid for r in w._running)]
    return holder


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_streams_pass_through_unchanged(twin: ModuleType, incremental: bool) -> None:
    workers = tuple(Emulator(incremental_streaming_output=incremental, token_rate=5000) for _ in range(2))

    async def main() -> list[tuple[str, StreamResult, Emulator]]:
        async with workers[0], workers[1], routed(*workers) as url, fastaccum.Client(url) as client:
            rids = [f"pt-{i}" for i in range(4)]
            results = await asyncio.gather(*(client.stream(payload(rid, 200)).run() for rid in rids))
            return [(rid, result, _holder(workers, rid)) for rid, result in zip(rids, results)]

    done = run(main())
    assert {id(holder) for _, _, holder in done} == {id(w) for w in workers}  # round robin used both
    for rid, result, holder in done:
        assert result.finish_reason == {"type": "length", "length": 200}
        assert_matches(holder, rid, result)


def test_a_disconnect_reaches_the_worker(twin: ModuleType) -> None:
    workers = (Emulator(token_rate=500), Emulator(token_rate=500))

    async def main() -> StreamResult:
        async with workers[0], workers[1], routed(*workers) as url:
            async with fastaccum.Client(url, abort_drain_s=None) as client:
                result = await abort_after(client.stream(payload("dc-1", 100_000)), 10)
            # The router notices at its next forward: tokens are flowing, so at once.
            await wait_until(lambda: sum(w.stats.disconnects for w in workers) == 1)
            await wait_until(lambda: all(w.running == 0 for w in workers))
            return result

    result = run(main())
    assert result.aborted and not result.replay_complete


def test_a_drained_abort_reaches_the_worker_that_holds_the_request(twin: ModuleType) -> None:
    workers = (Emulator(token_rate=500), Emulator(token_rate=500))

    async def main() -> tuple[StreamResult, Emulator]:
        async with workers[0], workers[1], routed(*workers) as url, fastaccum.Client(url, abort_drain_s=60) as client:
            result = await abort_after(client.stream(payload("dr-1", 100_000)), 10)
            await wait_until(lambda: all(w.running == 0 for w in workers))
            return result, _holder(workers, "dr-1")

    result, holder = run(main())
    assert result.aborted and result.replay_complete and result.finish_reason == ABORT_REASON
    assert_matches(holder, "dr-1", result)
    assert holder.stats.aborted == 1 and holder.stats.disconnects == 0


def test_a_rollout_abort_of_many_streams_leaves_every_worker_idle(twin: ModuleType) -> None:
    # 128 streams at 20 tokens/s: where the aborts go is tested, not how fast streams run (at 200
    # tokens/s this one process wrote 25,600 events/s, more than one loaded core serves).
    workers = (Emulator(token_rate=20), Emulator(token_rate=20))
    n = 128

    async def main() -> tuple[list[StreamResult], int]:
        # A deadline a loaded CI machine cannot reach: what is tested is where the aborts go.
        async with workers[0], workers[1], routed(*workers) as url, fastaccum.Client(url, abort_drain_s=60) as client:
            streams = [client.stream(payload(f"ra-{i:04d}", 100_000)) for i in range(n)]
            results = await abort_together(streams)
            # The worker releases a request after its last write, which the router forwards first.
            await wait_until(lambda: all(w.running == 0 and w.queued == 0 for w in workers))
            cut = [(s.rid, r.finish_reason, s.abort_error) for s, r in zip(streams, results) if not r.replay_complete]
            assert not cut, cut[:5]
            return results, client._aborts_for("sglang").sent

    results, sent = run(main())
    assert all(r.aborted and r.replay_complete for r in results)
    # One per rid and worker (SGLang takes an exact rid), after one that found the router.
    assert sent == 1 + n * len(workers)
    for i, result in enumerate(results):
        assert_matches(_holder(workers, f"ra-{i:04d}"), f"ra-{i:04d}", result)


def test_the_router_drops_the_replay_request_fields(twin: ModuleType) -> None:
    """sglang-router 0.3.2 rebuilds the request body and leaves out return_routed_experts (and
    return_indexer_topk, custom_params): no routed experts come back through it. slime's images
    install a fork that keeps them; this pins the upstream behaviour docs/client.md describes."""
    workers = (Emulator(enable_return_routed_experts=True), Emulator(enable_return_routed_experts=True))

    async def main() -> tuple[StreamResult, StreamResult]:
        async with workers[0], workers[1], routed(*workers) as url:
            body = payload("rx-1", 20, return_routed_experts=True)
            async with fastaccum.Client(url) as client:
                through = await client.stream(body).run()
            async with fastaccum.Client(workers[0].url) as client:
                direct = await client.stream({**body, "rid": "rx-2"}).run()
            return through, direct

    through, direct = run(main())
    assert direct.routed_experts is not None
    assert through.routed_experts is None and through.finished
