"""fastaccum against a real SGLang 0.5.23 (PyPI, on its CPU path) serving the tiny MoE model on one core,
in both stream modes: cumulative, and ``--incremental-streaming-output`` (the ``sglang`` fixture).

Every stream is held to the same server's own answer: its non-streaming ``/generate`` reply to the
same request (tokens, log-probs, text, finish reason, usage, routed experts), or, for an abort, the
greedy answer cut to the kept length. The server runs with ``--enable-return-routed-experts``: the
model has 2 layers and top-2 routing, so ``expert_shape=(2, 2)``. Only greedy streams are compared:
``sampling_seed`` needs ``--enable-deterministic-inference``, which torch_native attention lacks.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from client_helpers import Transport, abort_after, run
from live_helpers import get_json, in_thread, post_json, post_raw

import fastaccum
from fastaccum import ServerError, StreamLengthError, StreamResult
from fastaccum.transport.client import Client, ClientStream

pytestmark = pytest.mark.live_sglang

GENERATE = "/generate"
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
EXPERTS = (2, 2)  # the tiny model's (layers, top-k)
LONG = 2000  # a stream an abort always lands in: about 13 s of decoding at the server's ~150 tokens/s
ABORTED = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
QUEUE_ECHO = {"type": "abort", "message": "Abort in waiting queue"}


def body(
    rid: str | None, prompt: list[int] | str = PROMPT, *, logprob: bool = True, routed: bool = True, **params: Any
) -> dict[str, Any]:
    """A ``/generate`` request: token ids (or text), greedy unless ``params`` say otherwise; rid None:
    the client makes one."""
    request: dict[str, Any] = {"text" if isinstance(prompt, str) else "input_ids": prompt, "sampling_params": params}
    if rid is not None:
        request["rid"] = rid
    if logprob:
        request["return_logprob"] = True
    if routed:
        request["return_routed_experts"] = True
    return request


_REFERENCES: dict[tuple[str, str], dict[str, Any]] = {}


def reference(server: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The server's non-streaming answer to ``request`` (under a rid of its own). Greedy answers do
    not change, so each server is asked once per request."""
    key = (server.url, json.dumps({k: v for k, v in request.items() if k != "rid"}, sort_keys=True))
    if key not in _REFERENCES:
        _REFERENCES[key] = dict(post_json(server.url + GENERATE, {**request, "rid": f"ref-{request.get('rid')}"}))
    return _REFERENCES[key]


def experts_of(meta: dict[str, Any]) -> npt.NDArray[np.int32]:
    """A non-streaming answer's routed experts: base64 of little-endian int32, (rows, layers, top-k)."""
    return np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4").reshape(-1, *EXPERTS)


def logprobs_of(ref: dict[str, Any]) -> list[float]:
    entries = ref["meta_info"]["output_token_logprobs"]
    assert [token for _, token, _ in entries] == ref["output_ids"]
    return [logprob for logprob, _, _ in entries]


def assert_equals_reference(result: StreamResult, ref: dict[str, Any], rid: str | None) -> None:
    meta = ref["meta_info"]
    assert result.token_ids.tolist() == ref["output_ids"]
    if "output_token_logprobs" in meta:
        assert result.logprobs is not None and result.logprobs.tolist() == logprobs_of(ref)
    else:
        assert result.logprobs is None
    assert result.text == ref["text"]
    assert result.finish_reason == meta["finish_reason"]
    assert result.completion_tokens == meta["completion_tokens"] == len(result)
    usage = (result.meta_info["prompt_tokens"], result.meta_info["completion_tokens"])
    assert usage == (meta["prompt_tokens"], meta["completion_tokens"])
    if rid is not None:
        assert result.meta_info["id"] == rid
    if "routed_experts" in meta:
        rows = meta["prompt_tokens"] + meta["completion_tokens"] - 1  # the last token has no row
        assert result.routed_experts is not None and result.routed_experts.shape == (rows, *EXPERTS)
        assert np.array_equal(result.routed_experts, experts_of(meta))
    else:
        assert result.routed_experts is None


def assert_greedy_prefix(server: Any, result: StreamResult) -> dict[str, Any]:
    """The kept tokens and log-probs are the greedy answer cut to their length; that answer."""
    ref = reference(server, body("prefix", max_new_tokens=len(result), temperature=0))
    assert result.token_ids.tolist() == ref["output_ids"]
    assert result.logprobs is not None and result.logprobs.tolist() == logprobs_of(ref)
    return ref


async def stream_on(transport: Transport, url: str, request: dict[str, Any], **options: Any) -> StreamResult:
    async with transport.open(url) as make:
        result: StreamResult = await make(request, path=GENERATE, expert_shape=EXPERTS, **options).run()
        return result


# ---- the server's load -----------------------------------------------------------------------------


def load(server: Any) -> tuple[int, int]:
    """(running, waiting) requests, from ``GET /v1/loads``."""
    (entry,) = get_json(server.url + "/v1/loads")["loads"]
    return int(entry["num_running_reqs"]), int(entry["num_waiting_reqs"])


async def wait_for_load(server: Any, predicate: Callable[[int, int], bool], timeout: float = 120) -> tuple[int, int]:
    deadline = time.monotonic() + timeout
    while True:
        now: tuple[int, int] = await in_thread(load, server)
        if predicate(*now):
            return now
        assert time.monotonic() < deadline, f"the server's load stayed at (running, waiting) = {now}"
        await asyncio.sleep(0.05)


async def wait_idle(server: Any) -> None:
    await wait_for_load(server, lambda running, waiting: running == waiting == 0, timeout=60)


# ---- a finished request equals the server's own answer -------------------------------------------

CASES: dict[str, Callable[[str], dict[str, Any]]] = {
    "greedy": lambda rid: body(rid, max_new_tokens=48, temperature=0),
    "text-prompt": lambda rid: body(rid, "The tiny model says", max_new_tokens=32, temperature=0),
    "no-logprobs": lambda rid: body(rid, logprob=False, max_new_tokens=24, temperature=0),
    "no-routed-experts": lambda rid: body(rid, routed=False, max_new_tokens=24, temperature=0),
    "one-token": lambda rid: body(rid, max_new_tokens=1, temperature=0),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stream_equals_the_servers_non_streaming_answer(sglang: Any, transport: Transport, case: str) -> None:
    request = CASES[case](f"eq-{case}-{transport.kind}")
    ref = reference(sglang, request)
    result = run(stream_on(transport, sglang.url, request))
    assert_equals_reference(result, ref, request["rid"])


def test_a_stop_token_id_ends_the_stream_where_the_server_stops(sglang: Any, transport: Transport) -> None:
    greedy = reference(sglang, body("stop-probe", logprob=False, routed=False, max_new_tokens=40, temperature=0))
    stop = greedy["output_ids"][9]  # the server stops at its first occurrence: at index 9 or before
    request = body(f"stop-{transport.kind}", max_new_tokens=40, temperature=0, stop_token_ids=[stop])
    ref = reference(sglang, request)
    assert ref["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    result = run(stream_on(transport, sglang.url, request))
    assert_equals_reference(result, ref, request["rid"])
    assert result.token_ids[-1] == stop and len(result) <= 10


def test_auto_mode_reads_the_servers_stream_mode(sglang: Any, sglang_mode: str, transport: Transport) -> None:
    request = body(f"auto-{transport.kind}", max_new_tokens=24, temperature=0)
    result = run(stream_on(transport, sglang.url, request))
    assert result.mode == sglang_mode
    assert_equals_reference(result, reference(sglang, request), request["rid"])


def test_declaring_the_other_mode_fails_naming_both(sglang: Any, sglang_mode: str, transport: Transport) -> None:
    declared = "incremental" if sglang_mode == "cumulative" else "cumulative"
    request = body(f"mode-{transport.kind}", max_new_tokens=24, temperature=0)
    with pytest.raises(StreamLengthError) as caught:
        run(stream_on(transport, sglang.url, request, mode=declared))
    assert caught.value.mode == declared
    message = str(caught.value)
    assert f"not a{'n' if declared == 'incremental' else ''} {declared} event" in message
    assert f"the {sglang_mode} reading holds" in message


# ---- aborts -----------------------------------------------------------------------------------------


async def abort_at(url: str, request: dict[str, Any], tokens: int, **client: Any) -> tuple[StreamResult, Any]:
    """A stream on a Client, aborted once it holds ``tokens`` tokens: its result and abort_error."""
    async with fastaccum.Client(url, **client) as c:
        stream = c.stream(request, expert_shape=EXPERTS)
        result = await abort_after(stream, tokens, timeout=120)
        return result, stream.abort_error


def test_the_drain_ends_with_the_abort_event_and_the_routed_experts_of_every_kept_token(
    sglang: Any, twin: ModuleType
) -> None:
    request = body("drain-1", max_new_tokens=LONG, temperature=0)

    async def main() -> tuple[StreamResult, Any]:
        done = await abort_at(sglang.url, request, 10)  # Client's defaults: a drain, 2 s deadline
        await wait_idle(sglang)
        return done

    result, error = run(main())
    assert error is None
    assert result.aborted and result.replay_complete and result.finish_reason == ABORTED
    n = len(result)
    assert 10 <= n < LONG and result.completion_tokens == result.meta_info["completion_tokens"] == n
    assert result.meta_info["id"] == "drain-1" and result.meta_info["prompt_tokens"] == len(PROMPT)
    assert result.routed_experts is not None and result.routed_experts.shape == (len(PROMPT) + n - 1, *EXPERTS)
    ref = assert_greedy_prefix(sglang, result)  # asked for with max_new_tokens = kept
    assert np.array_equal(result.routed_experts, experts_of(ref["meta_info"]))


async def fill_the_token_budget(client: Client, server: Any) -> list[tuple[ClientStream, asyncio.Task[Any]]]:
    """Long requests until SGLang queues one. It admits a request only while the tokens the running
    ones may still produce (max_new_tokens, 4,000 here, times a ratio that starts at 0.7) fit its
    32,768 token slots: about ten run, the next waits. The queue is first come, first served, and
    the blockers ignore EOS, so none ends and lets another in while the test runs."""
    blockers: list[tuple[ClientStream, asyncio.Task[Any]]] = []
    while True:
        assert len(blockers) < 40, "SGLang admitted 40 long requests: its token budget never filled"
        request = body(None, [40 + len(blockers), 41, 42, 43], logprob=False, routed=False, max_new_tokens=4000)
        request["sampling_params"].update(temperature=0, ignore_eos=True)
        stream = client.stream(request)
        blockers.append((stream, asyncio.ensure_future(stream.run())))
        _, waiting = await wait_for_load(server, lambda running, waiting: running + waiting == len(blockers))
        if waiting:
            return blockers


def test_a_queued_requests_abort_ends_with_the_queue_echo(sglang: Any, twin: ModuleType) -> None:
    async def main() -> tuple[StreamResult, Any, tuple[int, int]]:
        await wait_idle(sglang)
        # A deadline no loaded machine reaches: what is tested is what the drain reads.
        async with fastaccum.Client(sglang.url, abort_drain_s=60) as client:
            blockers = await fill_the_token_budget(client, sglang)
            stream = client.stream(body("queued-1", max_new_tokens=24, temperature=0), expert_shape=EXPERTS)
            task = asyncio.ensure_future(stream.run())
            # Once the server holds it, it waits: it came last, and the queue is not empty.
            at_abort = await wait_for_load(sglang, lambda running, waiting: running + waiting == len(blockers) + 1)
            assert stream.events == 0
            stream.abort()
            result = await task
            error = stream.abort_error
            for blocker, _ in blockers:
                blocker.abort()
            ended = await asyncio.gather(*(blocker_task for _, blocker_task in blockers))
            assert all(r.aborted and r.replay_complete for r in ended)
        await wait_idle(sglang)
        return result, error, at_abort

    result, error, (_, waiting) = run(main())
    assert waiting >= 1 and error is None
    assert result.aborted and result.replay_complete and result.finish_reason == QUEUE_ECHO
    assert len(result) == 0 and result.routed_experts is None  # it never ran: nothing collected
    assert result.meta_info["id"] == "queued-1" and result.meta_info["completion_tokens"] == 0


def test_a_cut_keeps_the_prefix_and_returns_the_server_to_idle(sglang: Any, transport: Transport) -> None:
    request = body(f"cut-{transport.kind}", max_new_tokens=LONG, temperature=0)

    async def main() -> StreamResult:
        async with transport.open(sglang.url, abort_drain_s=None) as make:
            result = await abort_after(make(request, path=GENERATE, expert_shape=EXPERTS), 10, timeout=120)
        await wait_idle(sglang)  # SGLang aborts a request whose client went away
        return result

    result = run(main())
    assert result.aborted and not result.replay_complete and result.finish_reason is None
    assert result.routed_experts is None  # they come only in the terminal event, never read
    assert 10 <= len(result) < LONG
    assert_greedy_prefix(sglang, result)


async def spin(predicate: Callable[[], bool], timeout: float = 60) -> None:
    """Wait for ``predicate`` a loop iteration at a time (no sleep in between)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0)


EARLY = ("before-run", "before-the-write", "at-the-write", "at-the-response-head")


@pytest.mark.parametrize("when", EARLY)
def test_an_abort_before_the_first_event_still_ends_replay_complete(sglang: Any, twin: ModuleType, when: str) -> None:
    """Either the request was never written (nothing on the server to replay), or the drain reads its
    terminal abort event: an abort SGLang got before it held the rid is sent again at the first event.
    Never a cut."""

    async def main() -> tuple[StreamResult, Any]:
        # A deadline no loaded machine reaches: what is tested is where the abort lands.
        async with fastaccum.Client(sglang.url, abort_drain_s=30) as client:
            stream = client.stream(body(None, max_new_tokens=LONG, temperature=0), expert_shape=EXPERTS)
            if when == "before-run":
                stream.abort()
                result = await stream.run()
            else:
                task = asyncio.ensure_future(stream.run())
                await asyncio.sleep(0)  # run() has started: it is connecting
                if when == "at-the-write":
                    await spin(lambda: stream.timing is not None)
                elif when == "at-the-response-head":
                    await spin(lambda: stream.status is not None)
                assert (stream.timing is not None) == (when != "before-the-write")
                stream.abort()
                result = await task
            error = stream.abort_error
        await wait_idle(sglang)
        return result, error

    result, error = run(main())
    assert error is None
    assert result.aborted and result.replay_complete
    if when in ("before-run", "before-the-write"):
        assert not result.request_sent and not result.finished and len(result) == 0 and result.events == 0
        return
    assert result.request_sent and result.finish_reason is not None
    if result.finish_reason == QUEUE_ECHO:  # the abort found it before it ran
        assert len(result) == 0 and result.routed_experts is None
    else:
        assert result.finish_reason == ABORTED
        n = len(result)
        assert result.routed_experts is not None and result.routed_experts.shape == (len(PROMPT) + n - 1, *EXPERTS)
        ref = assert_greedy_prefix(sglang, result)
        assert np.array_equal(result.routed_experts, experts_of(ref["meta_info"]))


# ---- many at once -------------------------------------------------------------------------------------


def test_sixteen_concurrent_streams_each_equal_their_single_answer(sglang: Any, twin: ModuleType) -> None:
    prompts = [[30 + i, 31 + i, 32 + i, 33 + i, 34 + i] for i in range(16)]
    requests = [body(f"many-{i:02d}", prompt, max_new_tokens=32, temperature=0) for i, prompt in enumerate(prompts)]
    refs = [reference(sglang, r) for r in requests]

    async def main() -> tuple[list[StreamResult], int]:
        async with fastaccum.Client(sglang.url) as client:
            tasks = [asyncio.ensure_future(client.stream(r, expert_shape=EXPERTS).run()) for r in requests]
            most = 0
            while not all(task.done() for task in tasks):
                most = max(most, (await in_thread(load, sglang))[0])
                await asyncio.sleep(0.01)
            return [task.result() for task in tasks], most

    results, most = run(main())
    assert most > 1  # they ran as a batch
    # SGLang's CPU path is batch-invariant for this model: in batches of 16 (all 16 running at once),
    # tokens, log-probs and routed experts were bit-equal to the single answers (largest log-prob
    # difference seen: 0.0, over 4 batches of 16 in each stream mode), so equality is exact.
    for request, ref, result in zip(requests, refs, results):
        assert_equals_reference(result, ref, request["rid"])


# ---- refusals -------------------------------------------------------------------------------------------

# Requests SGLang refuses: 400 with {"error": {"message": ...}} without "stream"; with it, 200 and
# one error event (the same message, "type": "invalid_request_error", "code": 400), then [DONE].
# Not here: an out-of-vocabulary input id (>= 4096), which SGLang 0.5.23 does not check: the
# scheduler's embedding lookup raises IndexError and the whole server exits.
BAD = {
    "max-new-tokens-beyond-the-context": body("bad-ctx", max_new_tokens=5000),
    "prompt-longer-than-the-context": body("bad-prompt", [11] * 4100, max_new_tokens=4),
    "negative-temperature": body("bad-temp", max_new_tokens=4, temperature=-1),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_request_the_server_refuses_is_a_server_error_quoting_it(
    sglang: Any, transport: Transport, case: str
) -> None:
    request = BAD[case]
    status, answer = post_raw(sglang.url + GENERATE, request)
    assert status == 400
    message = json.loads(answer)["error"]["message"]
    status, streamed = post_raw(sglang.url + GENERATE, {**request, "stream": True})
    assert status == 200
    event, done, _ = streamed.split(b"\n\n")
    assert done == b"data: [DONE]"
    error = json.loads(event.removeprefix(b"data: "))["error"]
    assert error == {"message": message, "type": "invalid_request_error", "code": 400, "retryable": False}
    with pytest.raises(ServerError) as caught:
        run(stream_on(transport, sglang.url, request))
    assert caught.value.status == 400 and caught.value.event_index == 0
    assert caught.value.message == message and message in str(caught.value)
