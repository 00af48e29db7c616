"""Both transports (fastaccum.Client and GenerateStream), on both twins, against the emulator as
Dynamo's frontend and as vLLM's /inference/v1/generate (docs/dialects.md): whole results, routed
experts and sampling masks, the aborts (by disconnect, or Client's drain through vLLM's abort
endpoint), and the ways each server ends a stream early."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
from client_helpers import PROMPT, Transport, abort_after, run, wait_until

from fastaccum import ServerError, StreamResult, StreamTruncatedError
from fastaccum.emulator import VLLM_ID_PREFIX, Emulator
from fastaccum.emulator.writer import Generation

PATHS = {"dynamo": "/generate", "vllm": "/inference/v1/generate"}
# The server's id for a request: Dynamo's is the rid, vLLM's its own prefix and the request_id.
WIRE_ID = {"dynamo": "", "vllm": VLLM_ID_PREFIX}
# Paced so that an abort lands mid-stream; a stream long enough never to end first.
RATE, LONG = 2000, 20_000


def body_for(dialect: str, rid: str, n: int, **extra: Any) -> dict[str, Any]:
    """A request in the server's own keys, logprobs asked for, its id given (GenerateStream adds none)."""
    if dialect == "vllm":
        params = {"max_tokens": n, "logprobs": 0, **extra.pop("sampling_params", {})}
        return {"token_ids": PROMPT, "request_id": rid, "sampling_params": params, **extra}
    params = {"max_new_tokens": n, **extra.pop("sampling_params", {})}
    return {"input_ids": PROMPT, "rid": rid, "return_logprob": True, "sampling_params": params, **extra}


def stream_of(make: Any, dialect: str, body: dict[str, Any], **options: Any) -> Any:
    return make(body, path=PATHS[dialect], dialect=dialect, **options)


def assert_prefix(emulator: Emulator, rid: str, result: StreamResult, **truth: Any) -> Generation:
    """Every token and logprob is the emulator's for this prefix; Dynamo's text too (vLLM sends none)."""
    n = len(result)
    gen = emulator.expected(rid, n, prompt_tokens=len(PROMPT), **truth)
    assert np.array_equal(result.token_ids, np.asarray(gen.token_ids, dtype=np.int32))
    if n:
        assert result.logprobs is not None
        assert np.array_equal(result.logprobs, np.asarray(gen.logprobs, dtype=np.float64))
        assert result.text == (gen.text(0, n) if emulator.dialect == "dynamo" else None)
    return gen


def rows_of(result: StreamResult) -> list[list[int]]:
    ids, offsets = result.top_p_token_ids, result.top_p_token_offsets
    assert ids is not None and offsets is not None
    return [list(ids[a:b]) for a, b in zip(offsets[:-1], offsets[1:])]


def no_abort_request_was_sent(emulator: Emulator) -> bool:
    """Neither SGLang's /abort_request nor either of vLLM's abort endpoints was called."""
    return not any("abort" in path for path in emulator.stats.calls)


# ---- whole results ------------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", ["dynamo", "vllm"])
def test_a_whole_request_equals_the_generation_with_its_replay_arrays(transport: Transport, dialect: str) -> None:
    # vLLM's routed experts and sampling mask are its server's switches; SGLang's are asked for.
    emulator = Emulator(
        dialect=dialect, stream_interval=3, enable_return_routed_experts=True, return_sampling_mask=True
    )
    if dialect == "vllm":
        extra: dict[str, Any] = {"sampling_params": {"top_k": 50}}
    else:
        extra = {"return_routed_experts": True, "sampling_params": {"custom_params": {"return_top_p_token_ids": True}}}

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            result: StreamResult = await stream_of(make, dialect, body_for(dialect, "w-1", 40, **extra)).run()
            return result

    result = run(main())
    assert len(result) == 40 and not result.aborted
    assert result.finish_reason == ({"type": "length"} if dialect == "vllm" else {"type": "length", "length": 40})
    gen = assert_prefix(emulator, "w-1", result, top_p=True, routed_experts=True)
    assert result.routed_experts is not None and gen.routed_experts is not None
    assert np.array_equal(result.routed_experts.reshape(gen.routed_experts.shape), gen.routed_experts)
    assert rows_of(result) == [list(r) for r in gen.top_p_rows or ()]
    assert emulator.stats.completed == 1 and no_abort_request_was_sent(emulator)


def test_vllm_routed_experts_arrive_as_the_narrowest_npy(transport: Transport) -> None:
    # 16 experts: vLLM writes uint8, and the result keeps that dtype, shaped (rows, layers, topk).
    emulator = Emulator(dialect="vllm", enable_return_routed_experts=True, num_layers=3, topk=2, num_experts=16)

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            body = body_for("vllm", "r-1", 25)
            result: StreamResult = await stream_of(make, "vllm", body, expert_shape=(3, 2)).run()
            return result

    result = run(main())
    gen = emulator.expected("r-1", 25, prompt_tokens=len(PROMPT), routed_experts=True)
    assert result.routed_experts is not None and result.routed_experts.dtype == np.uint8
    assert result.routed_experts.shape == (len(PROMPT) + 25 - 1, 3, 2)
    assert np.array_equal(result.routed_experts, gen.routed_experts)


def test_vllm_sampling_mask_rows_come_one_per_token_across_chunks(transport: Transport) -> None:
    emulator = Emulator(dialect="vllm", stream_interval=4, return_sampling_mask=True)

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            body = body_for("vllm", "m-1", 30, sampling_params={"logprobs": None, "top_k": 20})
            result: StreamResult = await stream_of(make, "vllm", body).run()
            return result

    result = run(main())
    gen = emulator.expected("m-1", 30, prompt_tokens=len(PROMPT), top_p=True)
    assert result.logprobs is None and result.routed_experts is None  # neither was asked for
    assert rows_of(result) == [list(r) for r in gen.top_p_rows or ()]


# ---- abort ------------------------------------------------------------------------------------
# Dynamo's abort is the disconnect, and so is every GenerateStream's. Client drains vLLM's: it posts
# vLLM's id for the request (generate-tokens-<request_id>) to vLLM's abort endpoint and reads on to
# the end the server writes.


@pytest.mark.parametrize("dialect", ["dynamo", "vllm"])
def test_abort_by_disconnect_keeps_the_received_prefix_and_stops_the_server(transport: Transport, dialect: str) -> None:
    emulator = Emulator(dialect=dialect, token_rate=RATE)

    async def main() -> StreamResult:
        # abort_drain_s=None: Client cuts vLLM's stream too (GenerateStream always does).
        async with emulator as url, transport.open(url, abort_drain_s=None) as make:
            stream = stream_of(make, dialect, body_for(dialect, "a-1", LONG))
            result = await abort_after(stream, 5)
            await wait_until(lambda: emulator.running == 0)
            return result

    result = run(main())
    assert result.aborted and 5 <= len(result) < LONG and result.finish_reason is None
    assert_prefix(emulator, "a-1", result)
    assert emulator.stats.disconnected_rids == [WIRE_ID[dialect] + "a-1"] and emulator.stats.aborted == 0
    assert no_abort_request_was_sent(emulator), emulator.stats.calls


def test_dynamo_client_abort_never_drains(twin: Any) -> None:
    # Dynamo has no abort endpoint: Client cuts whatever its abort_drain_s says.
    emulator = Emulator(dialect="dynamo", token_rate=RATE)

    async def main() -> StreamResult:
        async with emulator as url, Transport("client").open(url) as make:
            result = await abort_after(stream_of(make, "dynamo", body_for("dynamo", "c-1", LONG)), 5)
            await wait_until(lambda: emulator.running == 0)
            return result

    result = run(main())
    assert result.aborted and result.finish_reason is None and emulator.stats.disconnected_rids == ["c-1"]
    assert_prefix(emulator, "c-1", result)
    assert no_abort_request_was_sent(emulator), emulator.stats.calls


@pytest.mark.parametrize("shape", ["0.32", "0.31"])
def test_vllm_client_abort_drains_through_the_servers_abort_endpoint(twin: Any, shape: str) -> None:
    emulator = Emulator(dialect="vllm", vllm_shape=shape, token_rate=RATE)

    async def main() -> StreamResult:
        async with emulator as url, Transport("client").open(url) as make:
            result = await abort_after(stream_of(make, "vllm", body_for("vllm", "d-1", LONG)), 5)
            await wait_until(lambda: emulator.running == 0)
            return result

    result = run(main())
    assert result.aborted and 5 <= len(result) < LONG
    # 0.32 writes an abort chunk; 0.31 ends with [DONE] alone, which the client asked for.
    assert result.finish_reason == ({"type": "abort"} if shape == "0.32" else None)
    assert_prefix(emulator, "d-1", result)
    assert emulator.stats.disconnects == 0 and emulator.stats.aborted == 1
    tried = {
        "0.32": {"/inference/v1/abort_requests": 1},
        "0.31": {"/inference/v1/abort_requests": 1, "/abort_requests": 1},
    }
    assert {path: n for path, n in emulator.stats.calls.items() if "abort" in path} == tried[shape]


@pytest.mark.parametrize("where", ["stream", "client"])
def test_vllm_drain_aborts_the_id_an_x_request_id_header_runs_the_request_under(twin: Any, where: str) -> None:
    """vLLM runs a request under its X-Request-Id header's id, not the body's request_id: the drain
    names that one, so the server ends the request with its abort chunk (not the deadline's cut)."""
    emulator = Emulator(dialect="vllm", token_rate=RATE)
    header = {"X-Request-Id": "hdr-1"}

    async def main() -> tuple[StreamResult, Any]:
        client_headers, stream_headers = (header, None) if where == "client" else (None, header)
        async with emulator as url, Transport("client").open(url, headers=client_headers, abort_drain_s=5) as make:
            stream = stream_of(make, "vllm", body_for("vllm", "body-1", LONG), headers=stream_headers)
            result = await abort_after(stream, 5)
            await wait_until(lambda: emulator.running == 0)
            return result, stream.abort_error

    result, error = run(main())
    assert error is None
    assert result.aborted and result.replay_complete and result.finish_reason == {"type": "abort"}
    assert result.meta_info["request_id"] == VLLM_ID_PREFIX + "hdr-1"
    assert emulator.stats.aborted == 1 and emulator.stats.disconnects == 0


# ---- how each server ends a stream early ----------------------------------------------------------

DYNAMO_ENDS = {
    "dynamo_error": (ServerError, "Internal server error", 2),
    "dynamo_killed": (StreamTruncatedError, "Dynamo ends a request it killed", 3),
    "dynamo_stopped": (StreamTruncatedError, "Dynamo stopped the request", 3),
}


@pytest.mark.parametrize("kind", sorted(DYNAMO_ENDS))
def test_dynamo_ends_are_typed_errors_that_keep_the_prefix(transport: Transport, kind: str) -> None:
    error, words, kept = DYNAMO_ENDS[kind]
    emulator = Emulator(dialect="dynamo")

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            body = body_for("dynamo", "f-1", 10, fastaccum_fault={"kind": kind, "at": 2})
            stream = stream_of(make, "dynamo", body)
            with pytest.raises(error, match=words):
                await stream.run()
            snapshot: StreamResult = stream.snapshot()
            return snapshot

    snapshot = run(main())
    assert len(snapshot) == kept and snapshot.finish_reason is None  # the events before the end
    assert_prefix(emulator, "f-1", snapshot)


def test_vllm_0_32_server_abort_ends_with_its_abort_chunk(transport: Transport) -> None:
    emulator = Emulator(dialect="vllm", vllm_shape="0.32", token_rate=RATE)

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            stream = stream_of(make, "vllm", body_for("vllm", "s-1", LONG))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 5)
            assert emulator.abort("generate-tokens-s-1") == 1
            result: StreamResult = await task
            return result

    result = run(main())
    assert result.finish_reason == {"type": "abort"} and 5 <= len(result) < LONG
    assert result.meta_info["finish_reason"] == "abort"  # the raw string, beside the counts it was checked by
    assert_prefix(emulator, "s-1", result)
    assert no_abort_request_was_sent(emulator)


@pytest.mark.parametrize("client_abort", [False, True], ids=["server-only", "client-too"])
def test_vllm_0_31_server_abort_is_a_truncation_unless_the_client_asked(
    transport: Transport, client_abort: bool
) -> None:
    emulator = Emulator(dialect="vllm", vllm_shape="0.31", token_rate=RATE)

    async def main() -> StreamResult:
        async with emulator as url, transport.open(url) as make:
            stream = stream_of(make, "vllm", body_for("vllm", "o-1", LONG))
            task = asyncio.ensure_future(stream.run())
            await wait_until(lambda: stream.tokens >= 5)
            assert emulator.abort("generate-tokens-o-1") == 1
            if client_abort:  # the rollout aborts: it asked the server and closes its stream
                stream.abort()
                result: StreamResult = await task
                return result
            with pytest.raises(StreamTruncatedError, match="vLLM before 0.32 ends an aborted request"):
                await task
            snapshot: StreamResult = stream.snapshot()
            return snapshot

    result = run(main())
    assert 5 <= len(result) < LONG and result.finish_reason is None
    assert result.aborted is client_abort
    assert_prefix(emulator, "o-1", result)


@pytest.mark.parametrize(("server", "asked"), [("sglang", "vllm"), ("vllm", "sglang")])
def test_a_server_of_another_dialect_is_named_in_the_404(transport: Transport, server: str, asked: str) -> None:
    """The generate route of the dialect asked for is not there: the error says which route each
    server serves instead of a bare 404."""

    async def main() -> None:
        async with Emulator(dialect=server) as url, transport.open(url, dialect=asked) as make:
            body = body_for(asked, "wrong-1", 5)
            path = {**PATHS, "sglang": "/generate"}[asked]
            stream = make(body, dialect=asked) if transport.kind == "client" else make(body, path=path, dialect=asked)
            with pytest.raises(ServerError, match="HTTP 404 .*is the dialect the server's") as info:
                await stream.run()
            assert info.value.status == 404 and f"dialect={asked!r}" in str(info.value)

    run(main())
