"""``fastaccum.ray.ShardedClient``: Client's streams read in Ray actors, against the emulator, on
both twins (each shard imports the twin under test).

A sharded stream keeps ``Client``'s contract: the same result, an abort drained on the shard, the
caller's own cancel propagating (and cutting the remote stream), counters while it runs, and a
shard that dies is a ``ShardError`` naming it while the client's other streams go on.
"""

from __future__ import annotations

import asyncio
import dataclasses
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from client_helpers import assert_matches, payload, run, wait_until

import fastaccum
from fastaccum import ServerError, ShardError, StreamResult
from fastaccum.emulator import Emulator

ray = pytest.importorskip("ray")
from fastaccum.ray import ShardedClient  # noqa: E402  (after the skip: ray is an optional extra)


def assert_same(a: StreamResult, b: StreamResult) -> None:
    """Equal in every field but timing (each read has its own clock)."""
    for field in dataclasses.fields(StreamResult):
        if field.name == "timing":
            continue
        x, y = getattr(a, field.name), getattr(b, field.name)
        if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            assert isinstance(x, np.ndarray) and isinstance(y, np.ndarray), field.name
            assert x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind == "f"), field.name
        else:
            assert x == y, field.name


def test_each_shard_reads_with_the_twin_under_test(impl: ModuleType, shard_options: dict[str, Any]) -> None:
    env = shard_options["actor_options"]["runtime_env"]
    implementation = ray.remote(lambda: fastaccum.IMPLEMENTATION).options(runtime_env=env).remote()
    assert ray.get(implementation) == ("cython" if impl.__name__ == "fastaccum._cy" else "python")


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_results_equal_clients_on_the_same_streams(
    twin: ModuleType, shard_options: dict[str, Any], incremental: bool
) -> None:
    emulator = Emulator(
        incremental_streaming_output=incremental,
        enable_return_routed_experts=True,
        num_layers=6,
        topk=4,
        num_experts=64,
        stream_interval=3,
    )
    top_p = {"custom_params": {"return_top_p_token_ids": True}}
    bodies = [payload(f"e-{i}", 200 + 37 * i, return_routed_experts=True, sampling_params=top_p) for i in range(6)]

    async def main() -> tuple[list[StreamResult], list[StreamResult]]:
        async with (
            emulator as url,
            fastaccum.Client(url) as client,
            ShardedClient(url, shards=2, **shard_options) as sharded,
        ):
            local = await asyncio.gather(*(client.stream(b, expert_shape=(6, 4)).run() for b in bodies))
            remote = await asyncio.gather(*(sharded.stream(b, expert_shape=(6, 4)).run() for b in bodies))
            assert sharded.shards == 2
            return local, remote

    local, remote = run(main())
    for body, mine, theirs in zip(bodies, local, remote):
        assert_same(mine, theirs)
        assert_matches(emulator, body["rid"], theirs, routed=True, top_p=True)
        assert theirs.timing is not None and theirs.timing.tokens == len(theirs)  # the shard's clock


def test_vllm_dialect_through_shards(twin: ModuleType, shard_options: dict[str, Any]) -> None:
    emulator = Emulator(dialect="vllm", stream_interval=2)
    body = {"request_id": "v-1", "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 90, "logprobs": 1}}

    async def main() -> tuple[StreamResult, StreamResult]:
        async with emulator as url, fastaccum.Client(url, dialect="vllm") as client:
            async with ShardedClient(url, shards=1, dialect="vllm", **shard_options) as sharded:
                return await client.stream(body).run(), await sharded.stream(body).run()

    mine, theirs = run(main())
    assert len(theirs) == 90 and theirs.finished
    assert_same(mine, theirs)


def test_arrays_arrive_read_only_through_the_object_store(twin: ModuleType, shard_options: dict[str, Any]) -> None:
    emulator = Emulator(enable_return_routed_experts=True, num_layers=48, topk=8, num_experts=128, stream_interval=64)

    async def main() -> StreamResult:
        async with emulator as url, ShardedClient(url, shards=1, **shard_options) as sharded:
            return await sharded.stream(payload("big-1", 2000, return_routed_experts=True), expert_shape=(48, 8)).run()

    result = run(main())
    experts = result.routed_experts
    assert experts is not None and experts.shape == (2003, 48, 8) and experts.nbytes > 100_000
    assert not experts.flags.writeable and not experts.flags.owndata  # a view on the shared object
    with pytest.raises(ValueError, match="read-only"):
        experts[0, 0, 0] = 1
    assert_matches(emulator, "big-1", result, routed=True)


def test_abort_drains_on_the_shard_and_keeps_the_prefix(twin: ModuleType, shard_options: dict[str, Any]) -> None:
    emulator = Emulator(token_rate=2000)

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url, ShardedClient(url, shards=2, progress_interval_s=0.02, **shard_options) as sharded:
            stream = sharded.stream(payload("a-1", 100_000))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 50 and stream.events >= 10, timeout=30)  # polled counters
            stream.abort()
            result = await task
            await wait_until(lambda: emulator.running == 0)
            return result, stream

    result, stream = run(main())
    assert result.aborted and stream.aborted and len(result) >= 50
    assert result.finish_reason is not None and result.finish_reason["type"] == "abort"  # the drained terminal event
    assert stream.rid == "a-1" and stream.tokens == len(result)  # exact once run() ended
    assert_same(stream.kept(), result)
    assert_matches(emulator, "a-1", result)


def test_abort_before_run_sends_nothing(twin: ModuleType, shard_options: dict[str, Any]) -> None:
    emulator = Emulator()

    async def main() -> StreamResult:
        async with emulator as url, ShardedClient(url, shards=1, **shard_options) as sharded:
            stream = sharded.stream(payload("n-1", 10))
            stream.abort()
            return await stream.run()

    result = run(main())
    assert result.aborted and not result.request_sent and result.replay_complete and len(result) == 0
    assert emulator.stats.requests == 0


def test_abort_after_the_end_returns_the_complete_result(twin: ModuleType, shard_options: dict[str, Any]) -> None:
    emulator = Emulator()

    async def main() -> tuple[StreamResult, Any]:
        async with emulator as url, ShardedClient(url, shards=1, **shard_options) as sharded:
            stream = sharded.stream(payload("late-1", 30))
            result = await stream.run()
            stream.abort()  # nothing is left to stop
            return result, stream

    result, stream = run(main())
    assert result.finished and not result.aborted and len(result) == 30


def test_the_callers_cancel_propagates_cuts_the_remote_stream_and_keeps_its_prefix(
    twin: ModuleType, shard_options: dict[str, Any]
) -> None:
    emulator = Emulator(token_rate=2000)

    async def main() -> Any:
        async with emulator as url, ShardedClient(url, shards=1, progress_interval_s=0.02, **shard_options) as sharded:
            stream = sharded.stream(payload("o-1", 100_000))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 20, timeout=30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await wait_until(lambda: emulator.stats.disconnects == 1)  # the shard closed the connection
            return stream

    stream = run(main())
    kept = stream.kept()
    assert kept.aborted and not kept.finished and len(kept) >= 20
    assert_matches(emulator, "o-1", kept)


def test_a_server_error_keeps_its_type_and_the_prefix(twin: ModuleType, shard_options: dict[str, Any]) -> None:
    emulator = Emulator()
    fault = {"kind": "error_event", "message": "too long", "code": 400, "at": 3}

    async def main() -> tuple[pytest.ExceptionInfo[ServerError], Any]:
        async with emulator as url, ShardedClient(url, shards=1, **shard_options) as sharded:
            stream = sharded.stream(payload("f-1", 20, fastaccum_fault=fault))
            with pytest.raises(ServerError, match="too long") as info:
                await stream.run()
            return info, stream

    info, stream = run(main())
    assert info.value.status == 400 and info.value.event_index == 3
    assert any("shard 0" in note for note in getattr(info.value, "__notes__", ()))
    assert len(stream.kept()) == 3 and not stream.kept().finished


def test_a_shard_killed_mid_stream_is_a_shard_error_and_is_replaced(
    twin: ModuleType, shard_options: dict[str, Any]
) -> None:
    emulator = Emulator(token_rate=1000)

    async def main() -> None:
        async with emulator as url, ShardedClient(url, shards=2, progress_interval_s=0.02, **shard_options) as sharded:
            doomed, survivor = sharded.stream(payload("k-1", 100_000)), sharded.stream(payload("k-2", 400))
            tasks = [asyncio.ensure_future(doomed.run()), asyncio.ensure_future(survivor.run())]
            await wait_until(lambda: doomed.tokens >= 20 and survivor.tokens >= 1, timeout=30)
            assert {doomed.shard, survivor.shard} == {0, 1}  # one stream per shard: the fewest first
            ray.kill(sharded.actors()[doomed.shard])
            with pytest.raises(ShardError, match=f"shard {doomed.shard} ") as info:
                await tasks[0]
            assert info.value.shard == doomed.shard
            survived = await tasks[1]  # the other shard's stream goes on
            assert survived.finished and len(survived) == 400
            assert sharded.replaced == 1
            after = await sharded.stream(payload("k-3", 50)).run()  # the new actor serves
            assert after.finished and len(after) == 50

    run(main())


def test_placement_per_node_and_bad_options(ray_instance: Any) -> None:
    async def main() -> None:
        emulator = Emulator()
        async with emulator as url, ShardedClient(url, per_node=2) as sharded:
            results = await asyncio.gather(*(sharded.stream(payload(f"p-{i}", 20)).run() for i in range(4)))
            assert sharded.shards == 2 * len([n for n in ray.nodes() if n["Alive"]])
            assert all(r.finished for r in results)

    run(main())
    with pytest.raises(ValueError, match="not both"):
        ShardedClient("http://127.0.0.1:1", shards=2, per_node=1)
    with pytest.raises(ValueError, match="shards must be a positive int"):
        ShardedClient("http://127.0.0.1:1", shards=0)
    with pytest.raises(ValueError, match="Client needs an http"):  # Client's own checks, in the caller
        ShardedClient("https://127.0.0.1:1")
    with pytest.raises(ValueError, match="abort_drain_s"):
        ShardedClient("http://127.0.0.1:1").stream({}, abort_drain_s=-1)
