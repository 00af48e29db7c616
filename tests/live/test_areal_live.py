"""fastaccum.areal against the live SGLang 0.5.23 (the tiny MoE, routed experts on, greedy), AReaL's
own engine and fastaccum's side by side in the same run, on the compiled and the pure twin: the
AReaL double always, a real AReaL checkout too where ``FASTACCUM_AREAL_PATH`` names one.

- an uninterrupted answer: both are the server's own answer (tokens, routed-expert rows);
- a real abort pause mid-answer, then the loop's resume: fastaccum's rows are the server's
  uninterrupted answer's, row for row; AReaL's hold the prompt's and the prefix's rows twice;
- AReaL's two-step pause (abort, then in place) with a real weight update to the second tiny
  checkpoint as version 1: the tokens after the resume are the second weights' greedy answer,
  fastaccum labels them 1, AReaL 0;
- ``ttft`` and ``itl``: fastaccum's are measured, AReaL's ``ttft`` is its latency;
- a request SGLang refuses (400): AReaL sends it ``request_retries`` times, fastaccum once;
- the connection cut mid-answer: AReaL asks for the whole answer again, fastaccum for the rest;
- routed experts asked of a server that sends none (SGLang started without them, last, as a
  server of its own): AReaL's error from both.

Each row of what each engine did goes to ``FASTACCUM_AREAL_TABLE`` when set (docs/areal.md), the
first column saying whose AReaL code ran: the double or the checkout (its commit in the heading).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiohttp import web
from live_helpers import engines, get_json, post_json
from test_areal import harness

import fastaccum
from fastaccum.areal._generate import ROUTED_EXPERTS_MISSING

PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
EXPERTS = (2, 2)
N = 120
PREFIX = 20  # tokens decoded before a pause lands: it then keeps a prefix to resume from
CONTEXT = 4096  # the tiny model's context: a request for more is refused
LOGPROB_NOISE = 0.1  # a resumed request prefills what the uninterrupted one decoded (other shapes)
ENVS = [("double", harness.DOUBLE_ROOT)]
if os.environ.get("FASTACCUM_AREAL_PATH"):
    ENVS.append(("real", str(Path(os.environ["FASTACCUM_AREAL_PATH"]).resolve())))
ROWS: list[str] = []


@pytest.fixture(scope="module", params=ENVS, ids=[kind for kind, _ in ENVS])
def env(request: pytest.FixtureRequest) -> Iterator[Any]:
    kind, root = request.param
    with harness.areal_env(kind, root) as loaded:
        if kind == "real":
            assert Path(loaded.api.__file__).resolve().is_relative_to(Path(root)), "not the checkout's AReaL"
        yield loaded
    table = os.environ.get("FASTACCUM_AREAL_TABLE")
    if table and ROWS:
        checkouts = [f"the checkout at {harness.commit_of(root)}" for kind, root in ENVS if kind == "real"]
        heading = ["AReaL's code: " + ", ".join(["the double (tests/areal_double)", *checkouts])]
        head = ["", "| AReaL | twin | scenario | AReaL's engine | fastaccum's engine |", "|---|---|---|---|---|"]
        Path(table).write_text("\n".join(heading + head + ROWS) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def world() -> Iterator[Any]:
    world = harness.World()
    yield world
    world.close()


@pytest.fixture
def relay(sglang: Any, world: Any) -> Iterator[Relay]:
    relay = Relay(sglang.url)
    world.call(relay.start())
    yield relay
    world.call(relay.stop())


@dataclasses.dataclass(frozen=True)
class WithoutRoutedExperts(engines.Engine):
    """SGLang as the tier starts it, but without ``--enable-return-routed-experts``: it answers a
    request for routed experts with none, as a server of a model that is not a MoE does."""

    def arguments(self, *args: Any, **kwargs: Any) -> list[str]:
        return [a for a in super().arguments(*args, **kwargs) if a != "--enable-return-routed-experts"]


@pytest.fixture(scope="module")
def sglang_without_routed_experts(live_servers: Any) -> Iterator[Any]:
    # Its tests take no stream mode, which orders them after every other SGLang test
    # (tests/live/conftest.py), so the tier's own server is stopped once and never started again.
    live_servers.close()  # one server at a time
    server = engines.Server("sglang", incremental=True)
    server.engine = WithoutRoutedExperts(**vars(server.engine))
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Relay:
    """A pass-through in front of the live server that records each ``/generate`` body and, when
    ``cut_after`` is set, closes the client's connection once that many bytes of the next answer
    went through: a network's cut, which SGLang sees as its client leaving."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.url = ""
        self.bodies: list[dict[str, Any]] = []
        self.cut_after: int | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), trust_env=False)
        app = web.Application()
        app.router.add_route("*", "/{path:.*}", self._pass)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _pass(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        cut = None
        if request.path == "/generate":
            self.bodies.append(json.loads(body))
            cut, self.cut_after = self.cut_after, None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(
            request.method, self.target + request.path_qs, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            if "Content-Type" in upstream.headers:
                response.headers["Content-Type"] = upstream.headers["Content-Type"]
            await response.prepare(request)
            passed = 0
            async for data in upstream.content.iter_any():
                if cut is not None and passed + len(data) >= cut:
                    await response.write(data[: cut - passed])
                    assert request.transport is not None
                    request.transport.close()  # leaving the block closes the server's side too
                    return response
                await response.write(data)
                passed += len(data)
            await response.write_eof()
            return response

    def asked(self, since: int) -> list[int]:
        """How many output tokens each ``/generate`` since the ``since``-th already held."""
        return [len(body["input_ids"]) - len(PROMPT) for body in self.bodies[since:]]


def request(env: Any, n: int = N) -> Any:
    return env.request(n, prompt=PROMPT, ignore_eos=True)


def reference(sglang: Any, n: int = N, prompt: list[int] | None = None) -> fastaccum.StreamResult:
    """The server's own uninterrupted greedy answer, routed experts as AReaL shapes them."""
    body = {
        "input_ids": prompt or PROMPT,
        "return_logprob": True,
        "return_routed_experts": True,
        "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
    }

    async def main() -> Any:
        async with fastaccum.Client(sglang.url) as client:
            return await client.generate(body, expert_shape=EXPERTS)

    return asyncio.run(main())


def flat(result: fastaccum.StreamResult) -> np.ndarray:
    assert result.routed_experts is not None
    return result.routed_experts.reshape(result.routed_experts.shape[0], -1)


def wait_until_decoding(sglang: Any) -> None:
    """Until the one running request holds the prompt and ``PREFIX`` decoded tokens in the KV pool
    (SGLang's load report): AReaL's request streams nothing to watch, and a pause now keeps a prefix."""
    deadline = time.monotonic() + harness.WAIT_S
    while True:
        (load,) = get_json(sglang.url + "/v1/loads")["loads"]
        if load["num_running_reqs"] == 1 and load.get("num_used_tokens", 0) >= len(PROMPT) + PREFIX:
            return
        assert time.monotonic() < deadline, f"the request did not decode {PREFIX} tokens: {load}"
        time.sleep(0.005)  # a poll's pace, not a wait for anything


def note(env: Any, twin: ModuleType, scenario: str, row: dict[str, str]) -> None:
    name = twin.__name__.rsplit(".", 1)[-1].lstrip("_")
    ROWS.append(f"| {env.kind} | {name} | {scenario} | {row['areal']} | {row['fastaccum']} |")


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_an_answer_is_the_server_s_own(sglang: Any, twin: ModuleType, env: Any) -> None:
    ref = reference(sglang)
    row = {}
    for kind in harness.KINDS:
        resp = env.generate(env.engine(kind, [sglang], return_routed_experts=True), request(env))
        assert resp.output_tokens == ref.token_ids.tolist() and resp.stop_reason == "length"
        assert np.array_equal(resp.routed_experts, flat(ref))
        assert np.allclose(resp.output_logprobs, ref.logprobs, rtol=0, atol=LOGPROB_NOISE)
        row[kind] = f"{N} tokens, {resp.routed_experts.shape[0]} rows = the server's"
    note(env, twin, "completion", row)


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_an_abort_pause_then_a_resume_keeps_every_row_once(sglang: Any, twin: ModuleType, env: Any) -> None:
    ref = reference(sglang)
    truth = flat(ref)
    row = {}
    for kind in harness.KINDS:
        pending = env.start(env.engine(kind, [sglang], return_routed_experts=True), request(env))
        wait_until_decoding(sglang)
        assert post_json(sglang.url + "/pause_generation", {"mode": "abort"})  # returns once streams ended
        post_json(sglang.url + "/continue_generation", {})
        resp = pending.result(harness.WAIT_S * 5)
        assert resp.output_tokens == ref.token_ids.tolist()
        rows = resp.routed_experts.shape[0]
        if kind == "fastaccum":
            assert np.array_equal(resp.routed_experts, truth)
            row[kind] = f"{rows} rows = the uninterrupted answer's, row for row"
        else:
            repeated = rows - len(truth)
            assert repeated >= len(PROMPT)  # the prompt's rows and the kept tokens' came twice
            assert np.array_equal(resp.routed_experts[repeated:], truth)
            assert np.array_equal(resp.routed_experts[:repeated], truth[:repeated])
            row[kind] = f"{rows} rows for {len(truth)}: the first {repeated} twice"
    note(env, twin, "abort pause, resume", row)


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_the_two_step_pause_with_new_weights_labels_each_token_with_its_version(
    sglang: Any, twin: ModuleType, env: Any
) -> None:
    second = str(engines.model_dir(sglang.python, seed="b"))
    first_answer = reference(sglang).token_ids.tolist()
    row = {}
    for kind in harness.KINDS:
        engine = env.engine(kind, [sglang], return_routed_experts=True)
        pending = env.start(engine, request(env))
        try:
            wait_until_decoding(sglang)
            post_json(sglang.url + "/pause_generation", {"mode": "abort"})
            post_json(sglang.url + "/pause_generation", {"mode": "in_place"})
            meta = env.api.WeightUpdateMeta(type="disk", path=second).with_version(1)
            meta.path = second  # the checkpoint itself, not AReaL's versioned folder beside it
            for update in engine._engine.backend.build_disk_weight_update_requests(meta).requests:
                assert post_json(sglang.url + update.endpoint, update.payload)["success"]
            post_json(sglang.url + "/continue_generation", {})
            engine.set_version(1)
            resp = pending.result(harness.WAIT_S * 5)
            split = where_new_weights_begin(sglang, resp.output_tokens, first_answer)
        finally:
            post_json(
                sglang.url + "/update_weights_from_disk", {"model_path": str(sglang.model), "weight_version": "default"}
            )
        assert 0 < split < N
        right = [0] * split + [1] * (N - split)
        if kind == "fastaccum":
            assert resp.output_versions == right and resp.routed_experts.shape[0] == len(PROMPT) + N - 1
        else:
            assert resp.output_versions == [0] * N
        wrong = sum(a != b for a, b in zip(resp.output_versions, right))
        row[kind] = f"{split} tokens by v0, {N - split} by v1: {wrong} labelled wrong"
    note(env, twin, "abort + in_place pause, new weights as v1", row)


def where_new_weights_begin(sglang: Any, tokens: list[int], first_answer: list[int]) -> int:
    """The token from which ``tokens`` are the second weights' (still loaded) greedy answer to
    prompt + the tokens before it: at or a few tokens before where they leave the first weights'
    answer (both weights may agree on a token or two)."""
    leaves = next((i for i, (a, b) in enumerate(zip(tokens, first_answer)) if a != b), N)
    for split in range(leaves, max(leaves - 8, 1) - 1, -1):
        body = {
            "input_ids": PROMPT + tokens[:split],
            "sampling_params": {"max_new_tokens": N - split, "temperature": 0, "ignore_eos": True},
        }
        if split < N and list(post_json(sglang.url + "/generate", body)["output_ids"]) == tokens[split:]:
            return split
    raise AssertionError(f"no token from which the answer is the second weights' (it leaves the first's at {leaves})")


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_ttft_and_itl_are_measured(sglang: Any, twin: ModuleType, env: Any) -> None:
    row = {}
    for kind in harness.KINDS:
        resp = env.generate(env.engine(kind, [sglang]), request(env))
        if kind == "fastaccum":
            assert 0 < resp.ttft < resp.latency and len(resp.itl) == N - 1 and min(resp.itl) >= 0
            assert resp.ttft + sum(resp.itl) <= resp.latency
            spread = f"{N - 1} itl, mean {np.mean(resp.itl) * 1e3:.1f} ms"
            row[kind] = f"ttft {resp.ttft * 1e3:.0f} ms, {spread}, latency {resp.latency * 1e3:.0f} ms"
        else:
            assert resp.ttft == resp.latency and resp.itl == []
            row[kind] = f"ttft = latency = {resp.latency * 1e3:.0f} ms, itl []"
    note(env, twin, "ttft and itl", row)


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_a_refused_request_is_reported_at_once(sglang: Any, twin: ModuleType, env: Any, relay: Relay) -> None:
    """More tokens than the model's context: SGLang answers 400 with its message. AReaL sends the
    request again up to ``request_retries`` times; the request itself is wrong, fastaccum says so
    at once, with the server's status and message."""
    row = {}
    for kind in harness.KINDS:
        engine = env.engine(kind, [relay], request_retries=2)
        before = len(relay.bodies)
        with pytest.raises(Exception) as caught:  # the engines raise different types: the finding
            env.generate(engine, request(env, CONTEXT))
        sent = len(relay.bodies) - before
        if kind == "fastaccum":
            assert isinstance(caught.value, fastaccum.ServerError) and caught.value.status == 400 and sent == 1
            assert "context" in str(caught.value)
        else:
            assert isinstance(caught.value, RuntimeError) and sent == 2
            assert "400" in str(caught.value)
        row[kind] = f"{type(caught.value).__name__} after {sent} request{'s' * (sent > 1)}"
    note(env, twin, f"refused (max_new_tokens {CONTEXT}), request_retries 2", row)


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
def test_a_connection_cut_mid_answer_is_resumed_from_what_was_read(
    sglang: Any, twin: ModuleType, env: Any, relay: Relay
) -> None:
    """The connection is cut once mid-answer (after the answer's first bytes; a stream's, after a
    few of its events): AReaL asks for the whole answer again, fastaccum keeps the tokens it read
    and asks for the rest. Both end on the server's answer, routed experts included."""
    ref = reference(sglang)
    row = {}
    for kind in harness.KINDS:
        relay.cut_after = 4096 if kind == "fastaccum" else 64
        before = len(relay.bodies)
        resp = env.generate(env.engine(kind, [relay], return_routed_experts=True), request(env))
        assert resp.output_tokens == ref.token_ids.tolist() and np.array_equal(resp.routed_experts, flat(ref))
        asked = relay.asked(before)
        assert len(asked) == 2 and asked[0] == 0 and (asked[1] > 0) == (kind == "fastaccum"), asked
        row[kind] = f"asked again for {N - asked[1]} of {N} tokens; {resp.routed_experts.shape[0]} rows = the server's"
    note(env, twin, "connection cut mid-answer", row)


@pytest.mark.live_sglang
def test_routed_experts_asked_of_a_server_that_sends_none(
    sglang_without_routed_experts: Any, twin: ModuleType, env: Any
) -> None:
    row = {}
    for kind in harness.KINDS:
        engine = env.engine(kind, [sglang_without_routed_experts], return_routed_experts=True)
        with pytest.raises(RuntimeError) as caught:
            env.generate(engine, request(env, 8))
        assert str(caught.value) == ROUTED_EXPERTS_MISSING  # AReaL's own message
        row[kind] = "RuntimeError: AReaL's message (not a MoE model)"
    note(env, twin, "routed experts asked, none sent", row)
