"""The SGLang emulator over real loopback HTTP, checked byte for byte against fastaccum.emulator.writer."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import numpy as np
import orjson
import pybase64
import pytest

from fastaccum.emulator import ABORT_REASON, Emulator, writer, writer_vllm

T = TypeVar("T")
PROMPT = [11, 12, 13, 14, 15]


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def events_of(body: bytes) -> list[Any]:
    """Split SGLang's exact framing (one data line, LF LF); [DONE] becomes the string."""
    assert body.endswith(b"\n\n"), body[-40:]
    out: list[Any] = []
    for block in body[:-2].split(b"\n\n"):
        assert block.startswith(b"data: "), block[:40]
        data = block[len(b"data: ") :]
        out.append("[DONE]" if data == b"[DONE]" else orjson.loads(data))
    return out


def payload(rid: str, n: int, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": n, **extra.pop("sampling_params", {})}
    return {"input_ids": PROMPT, "rid": rid, "stream": True, "sampling_params": params, **extra}


async def post_body(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(f"{url}/generate", json=body) as resp:
        return resp.status, await resp.read()


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("version", ["0.5.23", "0.5.15"])
@pytest.mark.parametrize("interval", [1, 20, 64])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_stream_bytes_match_the_wire_writer(incremental: bool, interval: int, version: str) -> None:
    emulator = Emulator(incremental_streaming_output=incremental, stream_interval=interval, version=version)

    async def main() -> bytes:
        async with emulator as url:
            status, body = await post_body(url, payload("r-1", 150, return_logprob=True))
            assert status == 200
            return body

    body = run(main())
    gen = emulator.expected("r-1", 150, prompt_tokens=len(PROMPT))
    opts = writer.WireOptions(incremental=incremental, version=version)
    # Lockstep decoding (no token_rate) sends every emission point: the exact bytes SGLang would.
    assert body == writer.stream_bytes(writer.stream_events(gen, opts, interval=interval))


def test_request_stream_interval_overrides_the_server_flag() -> None:
    async def main() -> list[Any]:
        async with Emulator(stream_interval=1) as url:
            _, body = await post_body(url, payload("r-1", 45, sampling_params={"stream_interval": 20}))
            return events_of(body)

    events = run(main())
    assert [len(e["output_ids"]) for e in events[:-1]] == [1, 21, 41, 45]


def test_terminal_event_carries_routed_experts_and_top_p() -> None:
    emulator = Emulator(enable_return_routed_experts=True, num_layers=3, topk=2, num_experts=8)

    async def main() -> list[Any]:
        async with emulator as url:
            body = payload(
                "r-1",
                30,
                return_logprob=True,
                return_routed_experts=True,
                sampling_params={"custom_params": {"return_top_p_token_ids": True}},
            )
            return events_of((await post_body(url, body))[1])

    events = run(main())
    assert events[-1] == "[DONE]"
    *normal, terminal = events[:-1]
    assert all("routed_experts" not in e["meta_info"] and "top_p_token_ids" not in e["meta_info"] for e in normal)
    meta = terminal["meta_info"]
    routed = np.frombuffer(pybase64.b64decode(meta["routed_experts"]), dtype="<i4").reshape(-1, 3, 2)
    gen = emulator.expected("r-1", 30, prompt_tokens=len(PROMPT), top_p=True, routed_experts=True)
    assert routed.shape[0] == len(PROMPT) + 30 - 1
    assert np.array_equal(routed, gen.routed_experts)
    offsets = np.frombuffer(pybase64.b64decode(meta["top_p_token_offsets"]), dtype="<i4")
    ids = np.frombuffer(pybase64.b64decode(meta["top_p_token_ids"]), dtype="<i4")
    assert gen.top_p_rows is not None and len(offsets) == 31
    assert [list(ids[offsets[i] : offsets[i + 1]]) for i in range(30)] == [list(r) for r in gen.top_p_rows]


def test_routed_experts_need_the_server_flag() -> None:
    async def main() -> list[Any]:
        async with Emulator() as url:
            return events_of((await post_body(url, payload("r-1", 5, return_routed_experts=True)))[1])

    assert "routed_experts" not in run(main())[-2]["meta_info"]


def test_skip_tokenizer_init_drops_text_and_refuses_text_prompts() -> None:
    async def main() -> tuple[list[Any], int]:
        async with Emulator(skip_tokenizer_init=True) as url:
            events = events_of((await post_body(url, payload("r-1", 5)))[1])
            status, _ = await post_body(url, {"text": "hello world", "stream": True})
            return events, status

    events, status = run(main())
    assert all("text" not in e for e in events[:-1])
    assert status == 400


def test_text_prompt_and_return_text_in_logprobs() -> None:
    emulator = Emulator()

    async def main() -> list[Any]:
        async with emulator as url:
            body = {
                "text": "one two three",
                "rid": "t-1",
                "stream": True,
                "return_logprob": True,
                "return_text_in_logprobs": True,
                "sampling_params": {"max_new_tokens": 4},
            }
            return events_of((await post_body(url, body))[1])

    terminal = run(main())[-2]
    gen = emulator.expected("t-1", 4, prompt_tokens=3)
    assert terminal["meta_info"]["prompt_tokens"] == 3
    assert [t[2] for t in terminal["meta_info"]["output_token_logprobs"]] == list(gen.token_texts)


def test_stop_token_ids_end_the_generation_at_the_first_match() -> None:
    emulator = Emulator()
    gen = emulator.expected("s-1", 50, prompt_tokens=len(PROMPT))
    stop = gen.token_ids[17]
    first = gen.token_ids.index(stop)

    async def main() -> list[Any]:
        async with emulator as url:
            return events_of((await post_body(url, payload("s-1", 50, sampling_params={"stop_token_ids": [stop]})))[1])

    terminal = run(main())[-2]
    assert terminal["output_ids"] == list(gen.token_ids[: first + 1])
    assert terminal["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_non_stream_returns_the_cumulative_terminal_object() -> None:
    emulator = Emulator(incremental_streaming_output=True)

    async def main() -> tuple[int, bytes]:
        async with emulator as url:
            body = payload("n-1", 12, return_logprob=True)
            body["stream"] = False
            return await post_body(url, body)

    status, raw = run(main())
    gen = emulator.expected("n-1", 12, prompt_tokens=len(PROMPT))
    assert status == 200
    assert raw == orjson.dumps(writer.normal_event(gen, writer.WireOptions(), 0, 12, terminal=True, first=True))


def test_info_health_and_loads_endpoints() -> None:
    async def main() -> tuple[Any, ...]:
        async with Emulator(incremental_streaming_output=True, stream_interval=8) as url:
            async with aiohttp.ClientSession() as session:
                info = await (await session.get(f"{url}/server_info")).json()
                health = (await session.get(f"{url}/health")).status
                loads = await (await session.get(f"{url}/v1/loads")).json()
                return info, health, loads

    info, health, loads = run(main())
    assert info["incremental_streaming_output"] is True and info["stream_interval"] == 8
    assert health == 200
    assert loads["num_running_reqs"] == 0 and loads["num_waiting_reqs"] == 0


def test_abort_of_a_running_request_adds_one_token_and_a_full_terminal_event() -> None:
    # 50 tokens/s: the abort request's round trip must fit in one decode step for the bound below
    # to be exact; at 500 tokens/s a loaded machine occasionally missed it.
    emulator = Emulator(token_rate=50, enable_return_routed_experts=True, num_layers=2, topk=2)

    async def main() -> tuple[list[Any], int]:
        async with emulator as url, aiohttp.ClientSession() as session:
            body = payload(
                "a-1",
                100_000,
                return_logprob=True,
                return_routed_experts=True,
                sampling_params={"custom_params": {"return_top_p_token_ids": True}},
            )
            async with session.post(f"{url}/generate", json=body) as resp:
                await wait_until(lambda: emulator.stats.tokens >= 20)
                await wait_until(lambda: emulator.running == 1)
                held = emulator.stats.tokens
                await session.post(f"{url}/abort_request", json={"rid": "a-1"})
                return events_of(await resp.read()), held

    events, held = run(main())
    terminal = events[-2]
    n = len(terminal["output_ids"])
    assert held < n <= held + 2  # one more decode step (a tick may land between the reads)
    meta = terminal["meta_info"]
    assert meta["finish_reason"] == ABORT_REASON and meta["prompt_tokens"] == len(PROMPT)
    assert len(pybase64.b64decode(meta["routed_experts"])) == (len(PROMPT) + n - 1) * 2 * 2 * 4
    assert len(pybase64.b64decode(meta["top_p_token_offsets"])) == (n + 1) * 4
    assert emulator.stats.aborted == 1 and emulator.stats.disconnects == 0


@pytest.mark.parametrize("version", ["0.5.23", "0.5.15"])
@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_abort_of_a_queued_request_sends_the_echo_chunk(incremental: bool, version: str) -> None:
    emulator = Emulator(
        max_running_requests=1, token_rate=200, incremental_streaming_output=incremental, version=version
    )

    async def main() -> bytes:
        async with emulator as url, aiohttp.ClientSession() as session:
            async with session.post(f"{url}/generate", json=payload("q-run", 100_000)):
                async with session.post(f"{url}/generate", json=payload("q-wait", 50, return_logprob=True)) as resp:
                    await wait_until(lambda: emulator.queued == 1)
                    await session.post(f"{url}/abort_request", json={"rid": "q-wait"})
                    return await resp.read()

    body = run(main())
    gen = emulator.expected("q-wait", 50, prompt_tokens=len(PROMPT))
    opts = writer.WireOptions(incremental=incremental, version=version)
    assert body == writer.sse(writer.echo_event(gen, opts, 0, first=True)) + writer.DONE


def test_abort_matches_rids_by_prefix_and_abort_all_hits_everything() -> None:
    emulator = Emulator(token_rate=200)

    async def main() -> dict[str, Any]:
        async with emulator as url, aiohttp.ClientSession() as session:
            responses = {
                rid: await session.post(f"{url}/generate", json=payload(rid, 100_000)) for rid in ("p-1", "p-10", "p-2")
            }
            await wait_until(lambda: emulator.running == 3)
            await session.post(f"{url}/abort_request", json={"rid": "p-1"})
            reasons = {
                rid: events_of(await responses[rid].read())[-2]["meta_info"]["finish_reason"] for rid in ("p-1", "p-10")
            }
            assert emulator.running == 1
            await session.post(f"{url}/abort_request", json={"abort_all": True})
            reasons["p-2"] = events_of(await responses["p-2"].read())[-2]["meta_info"]["finish_reason"]
            return reasons

    assert run(main()) == {"p-1": ABORT_REASON, "p-10": ABORT_REASON, "p-2": ABORT_REASON}


def test_an_abort_for_a_rid_the_server_does_not_hold_is_dropped_even_if_it_prefixes_one() -> None:
    """SGLang's tokenizer manager passes an abort on only for a rid it holds exactly; only then does
    the scheduler match by prefix. A bare prefix aborts nothing."""
    emulator = Emulator(token_rate=200)

    async def main() -> None:
        async with emulator as url, aiohttp.ClientSession() as session:
            response = await session.post(f"{url}/generate", json=payload("q-10", 100_000))
            await wait_until(lambda: emulator.running == 1)
            answer = await session.post(f"{url}/abort_request", json={"rid": "q-1"})
            assert answer.status == 200
            decoded = emulator.stats.tokens
            await wait_until(lambda: emulator.stats.tokens >= decoded + 5)  # decode steps after the abort
            assert emulator.running == 1 and emulator.stats.aborted == 0
            response.close()

    run(main())


@pytest.mark.parametrize("queued", [False, True], ids=["running", "queued"])
def test_client_disconnect_stops_generation(queued: bool) -> None:
    emulator = Emulator(token_rate=1000, max_running_requests=1)

    async def main() -> None:
        async with emulator as url, aiohttp.ClientSession() as session:
            blocker = await session.post(f"{url}/generate", json=payload("d-block", 100_000)) if queued else None
            resp = await session.post(f"{url}/generate", json=payload("d-1", 100_000))
            if not queued:
                await resp.content.readany()
            await wait_until(lambda: (emulator.queued if queued else emulator.running) == 1)
            resp.close()
            await wait_until(lambda: emulator.stats.disconnects == 1)
            assert emulator.stats.disconnected_rids == ["d-1"]
            # Out of the running set: its decoding stopped with the client (nothing decodes outside it).
            assert emulator.queued == 0 and emulator.running == (1 if queued else 0)
            loads = await (await session.get(f"{url}/v1/loads")).json()
            assert loads["disconnects"] == 1
            if blocker is not None:
                blocker.close()

    run(main())


def test_http_500_and_unknown_fault_kinds() -> None:
    async def main() -> tuple[tuple[int, bytes], tuple[int, bytes]]:
        async with Emulator() as url:
            a = await post_body(url, payload("f-1", 5, fastaccum_fault={"kind": "http_500"}))
            b = await post_body(url, payload("f-2", 5, fastaccum_fault={"kind": "nope"}))
            return a, b

    (status, body), (bad_status, bad_body) = run(main())
    assert status == 500 and orjson.loads(body)["code"] == 500
    assert bad_status == 400 and b"unknown fault kind" in bad_body


@pytest.mark.parametrize(
    ("fault", "tail"),
    [
        (
            {"kind": "error_event", "message": "boom", "code": 503, "at": 2},
            writer.sse(writer.error_event("boom", 503)) + writer.DONE,
        ),
        ({"kind": "malformed_json", "at": 2}, b'data: {"text":"broken","output_ids":[1,\n\n' + writer.DONE),
    ],
    ids=["error_event", "malformed_json"],
)
def test_faults_that_replace_an_event(fault: dict[str, Any], tail: bytes) -> None:
    emulator = Emulator()

    async def main() -> bytes:
        async with emulator as url:
            return (await post_body(url, payload("f-1", 10, fastaccum_fault=fault)))[1]

    body = run(main())
    gen = emulator.expected("f-1", 10, prompt_tokens=len(PROMPT))
    head = writer.stream_bytes(
        list(writer.stream_events(gen, writer.WireOptions(return_logprob=False)))[:2], done=False
    )
    assert body == head + tail


def test_cut_fault_ends_the_connection_mid_event() -> None:
    async def main() -> None:
        async with Emulator() as url, aiohttp.ClientSession() as session:
            async with session.post(f"{url}/generate", json=payload("c-1", 10, fastaccum_fault={"kind": "cut"})) as r:
                with pytest.raises(aiohttp.ClientPayloadError):
                    await r.read()

    run(main())


def test_split_coalesce_and_zero_token_terminal_faults() -> None:
    emulator = Emulator(incremental_streaming_output=True)
    gen = emulator.expected("f-1", 10, prompt_tokens=len(PROMPT))
    opts = writer.WireOptions(incremental=True, return_logprob=False)

    async def main() -> dict[str, bytes]:
        async with emulator as url:
            return {
                kind: (await post_body(url, payload("f-1", 10, fastaccum_fault={"kind": kind})))[1]
                for kind in ("split", "coalesce", "zero_token_terminal")
            }

    bodies = run(main())
    normal = list(writer.stream_events(gen, opts))
    assert bodies["split"] == writer.stream_bytes(normal)
    merged = [writer.coalesce(normal[i : i + 3]) for i in range(0, 10, 3)]
    merged[0]["meta_info"]["response_sent_to_client_ts"] = normal[0]["meta_info"]["response_sent_to_client_ts"]
    coalesced = events_of(bodies["coalesce"])
    assert [e["output_ids"] for e in coalesced[:-1]] == [m["output_ids"] for m in merged]
    zero = events_of(bodies["zero_token_terminal"])
    assert zero[-2]["output_ids"] == [] and zero[-2]["meta_info"]["finish_reason"] == gen.finish_reason
    assert zero[-3]["meta_info"]["finish_reason"] is None and zero[-3]["meta_info"]["completion_tokens"] == 10


def test_server_wide_fault_applies_to_every_request() -> None:
    async def main() -> list[int]:
        async with Emulator(fault={"kind": "http_500"}) as url:
            return [(await post_body(url, payload(f"w-{i}", 3)))[0] for i in range(2)]

    assert run(main()) == [500, 500]


def test_duplicate_rid_is_an_error_event() -> None:
    emulator = Emulator(token_rate=100)

    async def main() -> bytes:
        async with emulator as url, aiohttp.ClientSession() as session:
            async with session.post(f"{url}/generate", json=payload("dup-", 100_000)):
                await wait_until(lambda: emulator.running == 1)
                return (await post_body(url, payload("dup-", 5)))[1]

    assert run(main()) == writer.sse(writer.error_event("Duplicate request ID: dup-")) + writer.DONE


def test_expected_is_prefix_stable_and_seeded() -> None:
    a, b = Emulator(seed=1), Emulator(seed=2)
    long, short = a.expected("x", 100), a.expected("x", 40)
    assert list(long.token_ids[:40]) == list(short.token_ids)
    assert list(a.expected("x", 40).token_ids) != list(b.expected("x", 40).token_ids)
    assert dataclasses.asdict(a.expected("x", 5)) == dataclasses.asdict(a.expected("x", 5))


@pytest.mark.parametrize("incremental", [False, True], ids=["cumulative", "incremental"])
def test_retracted_request_ends_with_the_echo_of_everything_decoded(incremental: bool) -> None:
    """A retracted request keeps its output; an abort then ends it with the echo chunk, which holds
    every token decoded (here one more than the events carried: the retract comes before event 3)."""
    emulator = Emulator(incremental_streaming_output=incremental)

    async def main() -> list[Any]:
        async with emulator as url:
            task = asyncio.ensure_future(
                post_body(url, payload("r-1", 40, return_logprob=True, fastaccum_fault={"kind": "retract", "at": 3}))
            )
            await wait_until(lambda: emulator.retracted == 1)
            assert emulator.running == 1  # a retracted request still holds its slot
            emulator.abort(abort_all=True)
            _, body = await task
            return events_of(body)

    events = run(main())
    assert events[-1] == "[DONE]" and len(events) == 5
    echo = events[-2]
    gen = emulator.expected("r-1", 4, prompt_tokens=len(PROMPT))
    expected_echo = writer.echo_event(gen, writer.WireOptions(incremental=incremental, return_logprob=True), 4)
    assert echo == orjson.loads(orjson.dumps(expected_echo))
    assert echo["meta_info"]["completion_tokens"] == 4 and len(echo["meta_info"]["output_token_logprobs"]) == 4
    assert emulator.stats.written["r-1"] == 4 and emulator.retracted == 0


def test_strip_keys_fault_and_written_counts() -> None:
    emulator = Emulator()

    async def main() -> list[Any]:
        async with emulator as url:
            fault = {"kind": "strip_keys", "keys": ["output_token_logprobs_length", "weight_version"]}
            _, body = await post_body(url, payload("r-1", 6, return_logprob=True, fastaccum_fault=fault))
            return events_of(body)

    events = run(main())
    assert len(events) == 7
    for event in events[:-1]:
        assert "output_token_logprobs_length" not in event["meta_info"]
        assert "weight_version" not in event["meta_info"] and "completion_tokens" in event["meta_info"]
    assert emulator.stats.written == {"r-1": 6}


def test_plain_text_has_none_of_the_separators_json_leaves_raw() -> None:
    """str.splitlines() also breaks at U+2028, U+2029 and U+0085, which JSON writers leave raw
    (the other control characters it breaks at are escaped)."""
    plain = Emulator(plain_text=True).expected("r-1", 2000).text(0, 2000)
    assert not set(plain) & {"\u2028", "\u2029", "\x85"}
    assert set(Emulator().expected("r-1", 2000).text(0, 2000)) & {"\u2028", "\u2029", "\x85"}


# ---- the other servers: Dynamo's frontend and vLLM's /inference/v1/generate ---------------------


async def post_raw(url: str, path: str, body: Any, **kwargs: Any) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(f"{url}{path}", json=body, **kwargs) as resp:
        return resp.status, await resp.read()


def test_dynamo_streams_sglang_incremental_events_with_the_public_id() -> None:
    emulator = Emulator(dialect="dynamo", stream_interval=4)  # incremental, whatever was asked

    async def main() -> tuple[bytes, Any, Any, tuple[int, bytes]]:
        async with emulator as url:
            _, body = await post_body(url, payload("dyn-1", 30, return_logprob=True))
            headed = payload("", 3)
            del headed["rid"]
            _, by_header = await post_raw(url, "/generate", headed, headers={"x-request-id": "hdr-7"})
            _, generated = await post_raw(url, "/generate", headed)
            abort = await post_raw(url, "/abort_request", {"rid": "dyn-1"})
            return body, events_of(by_header)[0], events_of(generated)[0], abort

    body, by_header, generated, (abort_status, _) = run(main())
    gen = emulator.expected("dyn-1", 30, prompt_tokens=len(PROMPT))
    assert body == writer.stream_bytes(writer.stream_events(gen, writer.WireOptions(incremental=True), interval=4))
    assert by_header["meta_info"]["id"] == "hdr-7"
    assert len(generated["meta_info"]["id"]) == 36 and generated["meta_info"]["id"].count("-") == 4  # a UUID
    assert abort_status == 404 and emulator.stats.calls["/abort_request"] == 1


def test_dynamo_refuses_what_its_frontend_refuses() -> None:
    async def main() -> list[tuple[int, bytes]]:
        async with Emulator(dialect="dynamo") as url:
            not_streamed = {**payload("d", 3), "stream": False}
            text = {"text": "hi there", "rid": "d", "stream": True}
            empty = {**payload("d", 3), "input_ids": []}
            return [await post_raw(url, "/generate", body) for body in (not_streamed, text, empty)]

    (s501, b501), (s400, b400), (empty_status, empty_body) = run(main())
    assert s501 == 501 and b"set stream=true" in orjson.loads(b501)["error"]["message"].encode()
    assert s400 == 400 and "input_ids" in orjson.loads(b400)["error"]["message"]
    assert empty_status == 400 and orjson.loads(empty_body) == {"error": {"message": "input_ids cannot be empty."}}


@pytest.mark.parametrize("kind", ["dynamo_error", "dynamo_killed", "dynamo_stopped"])
def test_dynamo_faults_end_the_stream_as_its_frontend_does(kind: str) -> None:
    emulator = Emulator(dialect="dynamo")

    async def main() -> bytes:
        async with emulator as url:
            status, body = await post_body(url, payload("f-1", 10, fastaccum_fault={"kind": kind, "at": 2}))
            assert status == 200  # a cleanly ended body: aiohttp read it whole
            return body

    body = run(main())
    gen = emulator.expected("f-1", 10, prompt_tokens=len(PROMPT))
    events = list(writer.stream_events(gen, writer.WireOptions(incremental=True, return_logprob=False)))
    tails = {
        "dynamo_error": writer.stream_bytes(events[:2], done=False)
        + b'data: {"error":{"message":"Internal server error"}}\n\n',
        "dynamo_killed": writer.stream_bytes(events[:3], done=False),
        "dynamo_stopped": writer.stream_bytes(events[:3], done=False),
    }
    assert body == tails[kind] + (b"" if kind == "dynamo_killed" else writer.DONE)
    assert events[2]["meta_info"]["finish_reason"] is None


def vllm_body(rid: str, n: int, **extra: Any) -> dict[str, Any]:
    params = {"max_tokens": n, "logprobs": 0, **extra.pop("sampling_params", {})}
    return {"token_ids": PROMPT, "request_id": rid, "sampling_params": params, "stream": True, **extra}


@pytest.mark.parametrize("shape", ["0.32", "0.31"])
def test_vllm_stream_bytes_match_the_chunk_writer(shape: str) -> None:
    emulator = Emulator(dialect="vllm", vllm_shape=shape, stream_interval=3)

    async def main() -> tuple[bytes, bytes]:
        async with emulator as url:
            _, full = await post_raw(
                url, "/inference/v1/generate", vllm_body("v-1", 20, stream_options={"include_usage": True})
            )
            _, bare = await post_raw(
                url, "/inference/v1/generate", vllm_body("v-2", 5, sampling_params={"logprobs": None})
            )
            return full, bare

    full, bare = run(main())
    # Tokens keyed by the request_id, the chunks carrying vLLM's own id for it.
    gen = emulator.expected("v-1", 20, prompt_tokens=len(PROMPT), finish_reason={"type": "length"})
    gen = dataclasses.replace(gen, rid="generate-tokens-v-1")
    assert full == writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, shape=shape, interval=3))
    gen = emulator.expected("v-2", 5, prompt_tokens=len(PROMPT), finish_reason={"type": "length"})
    gen = dataclasses.replace(gen, rid="generate-tokens-v-2")
    chunks = writer_vllm.stream_chunks(gen, shape=shape, interval=3, logprobs=False, usage=False)
    assert bare == writer_vllm.stream_bytes(chunks)


@pytest.mark.parametrize("shape", ["0.32", "0.31"])
def test_vllm_routed_experts_sampling_mask_and_stop_tokens(shape: str) -> None:
    # Both are the server's switches (vLLM asks nothing of the request); the mask is streamed from 0.32.
    emulator = Emulator(
        dialect="vllm",
        vllm_shape=shape,
        enable_return_routed_experts=True,
        return_sampling_mask=True,
        num_layers=3,
        topk=2,
        num_experts=8,
    )
    stop = emulator.expected("v-1", 30, prompt_tokens=len(PROMPT)).token_ids[11]

    async def main() -> tuple[list[Any], tuple[int, bytes]]:
        async with emulator as url:
            body = vllm_body("v-1", 30, sampling_params={"stop_token_ids": [stop], "top_k": 20})
            stream = events_of((await post_raw(url, "/inference/v1/generate", body))[1])
            return stream, await post_raw(url, "/inference/v1/generate", vllm_body("v-2", 5))

    (*chunks, done), (refused, message) = run(main())
    assert done == "[DONE]" and len(chunks) == 12
    gen = emulator.expected("v-1", 12, prompt_tokens=len(PROMPT), top_p=True, routed_experts=True)
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "stop" and last.get("stop_reason", stop) == stop
    assert all(c["choices"][0]["routed_experts"] is None for c in chunks[:-1])
    routed = np.load(io.BytesIO(pybase64.b64decode(last["routed_experts"])), allow_pickle=False)
    assert routed.dtype == np.uint8 and np.array_equal(routed, gen.routed_experts)
    rows = [c["choices"][0]["sampling_mask"] for c in chunks]
    if shape == "0.32":
        assert [row for chunk_rows in rows for row in chunk_rows] == [list(r) for r in gen.top_p_rows or ()]
    else:
        assert rows == [None] * 12
    assert refused == 400 and b"top_k > 0" in message  # vLLM bounds the mask's size by top_k


@pytest.mark.parametrize("shape", ["0.32", "0.31"])
def test_vllm_abort_ends_the_stream_in_the_shape_of_its_release(shape: str) -> None:
    emulator = Emulator(dialect="vllm", vllm_shape=shape, token_rate=200, enable_return_routed_experts=True)

    async def main() -> tuple[list[Any], Any, Any, Any]:
        async with emulator as url, aiohttp.ClientSession() as session:
            body = vllm_body("a-1", 100_000, stream_options={"include_usage": True})
            async with session.post(f"{url}/inference/v1/generate", json=body) as resp:
                await resp.content.readuntil(b"\n\n")
                busy = await (await session.get(f"{url}/load?include_inflight=true&inflight_limit=100")).json()
                reply = await (await session.post(f"{url}/abort_requests", json={})).json()
                rest = await resp.read()
            idle = await (await session.get(f"{url}/load")).json()
            return events_of(rest), busy, idle, reply

    events, busy, idle, reply = run(main())
    assert busy == {"server_load": 1} and idle == {"server_load": 0} and emulator.stats.aborted == 1
    assert reply == {"status": "aborted", "aborted": 1}
    *tokens, usage, done = events
    assert done == "[DONE]" and usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == emulator.stats.written["generate-tokens-a-1"]
    if shape == "0.32":
        abort = tokens[-1]["choices"][0]
        assert abort["finish_reason"] == "abort" and abort["token_ids"] == []
        routed = np.load(io.BytesIO(pybase64.b64decode(abort["routed_experts"])), allow_pickle=False)
        forwarded = len(PROMPT) + emulator.stats.written["generate-tokens-a-1"] - 1
        assert routed.shape[0] == forwarded  # every position forwarded so far
    else:  # before 0.32 the abort's empty output was skipped
        assert all(e["choices"][0]["finish_reason"] is None for e in tokens)
        assert all(e["choices"][0]["routed_experts"] is None for e in tokens)


@pytest.mark.parametrize("shape", ["0.32", "0.31"])
def test_vllm_aborts_name_vllms_own_id_exactly(shape: str) -> None:
    emulator = Emulator(dialect="vllm", vllm_shape=shape, token_rate=200)

    async def main() -> tuple[int, int, int, list[Any]]:
        async with emulator as url, aiohttp.ClientSession() as session:
            path = f"{url}/inference/v1/generate"
            one = await session.post(path, json=vllm_body("b-1", 100_000))
            two = await session.post(path, json=vllm_body("", 100_000), headers={"X-Request-Id": "b-10"})
            await one.content.readuntil(b"\n\n")
            await two.content.readuntil(b"\n\n")
            missing = (await session.post(f"{url}/inference/v1/abort_requests", json={})).status
            # The client's request_id is not vLLM's id: it aborts nothing, nor does a prefix.
            await session.post(f"{url}/abort_requests", json={"request_ids": ["b-1", "generate-tokens-b-"]})
            by_id = await session.post(
                f"{url}/inference/v1/abort_requests", json={"request_ids": "generate-tokens-b-1"}
            )
            if by_id.status == 404:  # before 0.32: the RL dev API
                await session.post(f"{url}/abort_requests", json={"request_ids": ["generate-tokens-b-1"]})
            rest = events_of(await one.read())
            running = emulator.running
            two.close()
            return missing, by_id.status, running, rest

    missing, status, running, rest = run(main())
    assert (missing, status) == ((400, 200) if shape == "0.32" else (404, 404))
    assert running == 1 and emulator.stats.aborted == 1  # generate-tokens-b-10 still decoding
    assert emulator.stats.disconnected_rids == ["generate-tokens-b-10"]  # the header named it
    assert rest[-1] == "[DONE]" and all(e["request_id"] == "generate-tokens-b-1" for e in rest[:-1])


def test_vllm_error_fault_and_refusals() -> None:
    emulator = Emulator(dialect="vllm")

    async def main() -> list[tuple[int, bytes]]:
        async with emulator as url:
            fault = {"kind": "vllm_error", "message": "boom", "at": 1}
            bodies = [vllm_body("e-1", 5, fastaccum_fault=fault), {**vllm_body("e-2", 5), "token_ids": "hi"}]
            bodies.append(vllm_body("e-3", 5, fastaccum_fault={"kind": "dynamo_killed"}))
            return [await post_raw(url, "/inference/v1/generate", body) for body in bodies]

    (status, body), (bad_status, bad), (wrong_status, wrong) = run(main())
    gen = emulator.expected("e-1", 5, prompt_tokens=len(PROMPT))
    first = writer_vllm.sse(writer_vllm.chunk(dataclasses.replace(gen, rid="generate-tokens-e-1"), 0, 1))
    # By default the engine error vLLM writes: InternalServerError, 500.
    assert status == 200 and body == first + writer_vllm.error_chunk("boom", "InternalServerError", 500) + writer.DONE
    assert bad_status == 400 and "token_ids" in orjson.loads(bad)["error"]["message"]
    assert wrong_status == 400 and b"not one a vllm server produces" in wrong
    with pytest.raises(ValueError, match="vllm_shape"):
        Emulator(dialect="vllm", vllm_shape="0.30")
    with pytest.raises(ValueError, match="dialect"):
        Emulator(dialect="trtllm")
