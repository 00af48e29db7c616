"""slime's real rollout loop (``generate_rollout``, its data source, abort, buffer and resume) with
fastaccum.slime against the live SGLang 0.5.23 server, incremental mode, routing replay on.

One rollout of two groups of two samples: the group whose greedy answer meets the stop token
finishes, which ends the rollout; its abort drains the other group's streams by rid (each sample
keeps its prefix and, from the terminal abort event, the routed experts of every kept position)
and buffers the group; the next rollout resumes it to the end. Every sample is held to the
server's own non-streaming answer for the same prompt and the sampling parameters slime sends:
tokens, log-probs and routed experts exactly. Exactly, because SGLang's CPU path is
batch-invariant for this model (tests/live/test_sglang.py) and because the resume reuses the KV
the drained request left in SGLang's radix cache (asserted): a resume that recomputes its prefix
does not give the answer (below). It runs on the slime double of both lines (tests/slime_double)
and, with ``FASTACCUM_SLIME_PATH``, on real slime checkouts (tests/test_slime_real.py says how).

``PassThroughRouter`` stands in for slime's router (PyPI's sglang-router drops
``return_routed_experts``); ``ModelTokenizer`` for the harness's ``AutoTokenizer`` stand-in, whose
ids the model does not have.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import framework_harness
import numpy as np
import numpy.typing as npt
import pytest
from aiohttp import web
from live_helpers import ModelTokenizer, engines, get_json, post_json, post_raw

pytest.importorskip("torch")  # slime's Sample holds tensors; the double's does too

pytestmark = pytest.mark.live_sglang


harness = framework_harness.slime()
fs = harness.fs

EXPERTS = (2, 2)  # the tiny model's (layers, top-k)
MAX = 128  # --rollout-max-response-len
EOS_ID = 0  # the tiny model's (tools/live/build_tiny_moe.py)
STOP_AT = 16  # the finishing group's answer ends with the stop token here (1-based) or a little later
SHORT = "the quick brown fox"  # the group that finishes
LONG = "zeta eta theta iota kappa"  # the group the rollout aborts and the next one resumes

SLIME_PATH = os.environ.get("FASTACCUM_SLIME_PATH", "")
SLIME_ROOTS = [str(Path(p).resolve()) for p in SLIME_PATH.split(os.pathsep) if p]
ENVS = [("double", harness.DOUBLE_ROOT, line) for line in harness.LINES] + [
    ("real", root, None) for root in SLIME_ROOTS
]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{k}-{line or Path(root).name}" for k, root, line in ENVS])
def env(request: pytest.FixtureRequest) -> Iterator[Any]:
    kind, root, line = request.param
    if kind == "real":
        for needed in ("tqdm", "PIL", "pybase64", "httpx"):
            pytest.importorskip(needed)
    with harness.slime_env(kind, root, line) as loaded:
        if kind == "real":
            assert Path(loaded.rollout.__file__).resolve().is_relative_to(Path(root)), "not the checkout's slime"
        yield loaded


# ---- the router slime talks to ------------------------------------------------------------------


class PassThroughRouter:
    """What slime's router fork does for one worker, on a loop of its own: ``GET /workers`` lists
    the live server, every other request is passed to it byte for byte, the response streamed back
    as it comes. It stands in for slime's router because PyPI's sglang-router 0.3.2 rebuilds the
    request body without ``return_routed_experts`` (slime's images install a fork that keeps it;
    it is not on PyPI). Records the ``/generate`` bodies it passed on."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.generate_bodies: list[dict[str, Any]] = []
        self.events: dict[str, int] = {}  # rid -> events passed on to the client
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="router")
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def __enter__(self) -> PassThroughRouter:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), trust_env=False)
        app = web.Application()
        app.router.add_get("/workers", self._workers)
        app.router.add_route("*", "/{path:.*}", self._pass)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": self.worker}]})

    async def _pass(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        rid = None
        if request.path == "/generate":
            self.generate_bodies.append(json.loads(body))
            rid = self.generate_bodies[-1].get("rid")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        async with self._session.request(
            request.method, self.worker + request.path_qs, data=body, headers=headers
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for key in ("Content-Type", "Cache-Control"):
                if key in upstream.headers:
                    response.headers[key] = upstream.headers[key]
            await response.prepare(request)
            # A client that leaves ends the write, and leaving this block closes the worker's
            # connection: SGLang sees the disconnect as it would behind slime's router.
            async for data in upstream.content.iter_any():
                await response.write(data)
                if rid is not None:  # events passed on per request, for a test that acts mid-stream
                    self.events[rid] = self.events.get(rid, 0) + data.count(b"data: {")
            await response.write_eof()
            return response


# ---- the server's own answers -------------------------------------------------------------------


def experts_of(meta: dict[str, Any]) -> npt.NDArray[np.int32]:
    """A non-streaming answer's routed experts: base64 of little-endian int32, (rows, layers, top-k)."""
    return np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4").reshape(-1, *EXPERTS)


def answer(server: Any, prompt_ids: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
    """The server's non-streaming answer to the request slime's generate sends for a prompt."""
    body = {
        "input_ids": prompt_ids,
        "sampling_params": sampling_params,
        "return_logprob": True,
        "return_routed_experts": True,
    }
    return dict(post_json(server.url + "/generate", body))


def logprobs_of(ref: dict[str, Any]) -> list[float]:
    entries = ref["meta_info"]["output_token_logprobs"]
    assert [token for _, token, _ in entries] == ref["output_ids"]
    return [float(logprob) for logprob, _, _ in entries]


def stop_token(short: list[int], long: list[int]) -> tuple[int, int]:
    """A stop token that ends ``short`` at position STOP_AT or a little later (not sooner) and
    never occurs in ``long``; with its position (1-based)."""
    for at in range(STOP_AT, STOP_AT + 16):
        token = short[at - 1]
        if token not in short[: at - 1] and token not in long:
            return token, at
    raise AssertionError("pick other prompts: every candidate stop token recurs")


def idle(server: Any) -> bool:
    (entry,) = get_json(server.url + "/v1/loads")["loads"]
    return bool(entry["num_running_reqs"] == entry["num_waiting_reqs"] == 0)


def wait_idle(server: Any) -> None:
    """Until the server runs nothing (what an earlier test cut may take a moment to leave)."""
    deadline = time.monotonic() + 120
    while not idle(server):
        assert time.monotonic() < deadline, "the server stayed busy"
        time.sleep(0.05)


# ---- the rollout --------------------------------------------------------------------------------


class Prompts:
    """slime's buffer semantics (``harness.BufferedPrompts``: buffered groups first, whole groups
    only) with one text per new group, in order."""

    def __init__(self, env: Any, args: Any, texts: list[str]) -> None:
        self._buffered = harness.BufferedPrompts(env, args)
        self.texts = texts
        self.created: list[list[Any]] = self._buffered.created  # every new group, in order
        self.added: list[list[list[Any]]] = self._buffered.added  # each add_samples call's groups

    def get_samples(self, num_groups: int) -> list[list[Any]]:
        made = len(self.created)
        groups: list[list[Any]] = self._buffered.get_samples(num_groups)
        for number, group in enumerate(self.created[made:], start=made):
            for sample in group:
                sample.prompt = self.texts[number]
        return groups

    def add_samples(self, groups: list[list[Any]]) -> None:
        self._buffered.add_samples(groups)


@contextlib.contextmanager
def server_wide_aborts(env: Any) -> Iterator[list[list[str]]]:
    """Every call of slime's server-wide abort (``abort_servers_until_idle``), by either caller:
    slime's own abort and fastaccum's idle-wait fallback."""
    calls: list[list[str]] = []
    original = env.server_control.abort_servers_until_idle

    async def spy(urls: list[str]) -> None:
        calls.append(list(urls))
        await original(urls)

    patch = pytest.MonkeyPatch()
    patch.setattr(env.server_control, "abort_servers_until_idle", spy)
    if hasattr(env.rollout, "abort_servers_until_idle"):
        patch.setattr(env.rollout, "abort_servers_until_idle", spy)
    try:
        yield calls
    finally:
        patch.undo()


@contextlib.contextmanager
def model_tokenizer(env: Any, tokenizer: ModelTokenizer) -> Iterator[None]:
    """slime's ``load_tokenizer`` (through the stubbed ``transformers.AutoTokenizer``) returns the
    model's own tokenizer."""
    patch = pytest.MonkeyPatch()
    patch.setattr(sys.modules["transformers"].AutoTokenizer, "from_pretrained", staticmethod(lambda *a, **k: tokenizer))
    env.reset()  # a GenerateState made before holds the other tokenizer
    try:
        yield
    finally:
        patch.undo()
        env.reset()


def rollout_args(
    env: Any, router: PassThroughRouter, model: Path, stop: int, make_args: Callable[..., Any] = harness.make_args
) -> SimpleNamespace:
    """The loop's arguments through the framework harness's ``make_args`` (slime's by default)."""
    host, port = router.url.removeprefix("http://").split(":")
    target = SimpleNamespace(host=host, port=int(port), expert_shape=EXPERTS, incremental_streaming_output=True)
    args: SimpleNamespace = make_args(
        env,
        target,
        hf_checkpoint=str(model),
        rollout_temperature=0.0,  # greedy: each sample has one right answer
        rollout_max_response_len=MAX,
        rollout_stop_token_ids=[stop],
        use_rollout_routing_replay=True,
        partial_rollout=True,
        rollout_batch_size=1,
        n_samples_per_prompt=2,
        over_sampling_batch_size=2,
        fastaccum_transport="client",  # the default: a rollout abort drains each stream by rid
        fastaccum_idle_timeout=120.0,  # a fallback to the server-wide abort fails the test instead
        fastaccum_idle_poll_interval=0.05,
    )
    return args


def assert_equals_answer(
    sample: Any, prompt_ids: list[int], ref: dict[str, Any], kept: int | None = None, *, masked: bool = True
) -> None:
    """The sample holds the answer's first ``kept`` tokens (all of them by default) after its prompt,
    their log-probs, and the routed experts of every position but the last; ``masked``: a loss
    mask of ones over them (slime's), else none."""
    tokens, logprobs = ref["output_ids"], logprobs_of(ref)
    n = len(tokens) if kept is None else kept
    assert sample.tokens == prompt_ids + tokens[:n]
    assert sample.response_length == n and sample.loss_mask == ([1] * n if masked else None)
    assert sample.rollout_log_probs == logprobs[:n]
    rows = len(prompt_ids) + n - 1
    experts = sample.rollout_routed_experts
    assert experts is not None and tuple(experts.shape) == (rows, *EXPERTS)
    assert np.array_equal(np.asarray(experts), experts_of(ref["meta_info"])[:rows])


@pytest.mark.parametrize("sglang_mode", ["incremental"])  # slime's --sglang-incremental-streaming-output
def test_a_rollout_aborted_mid_stream_buffers_drained_prefixes_and_resumes_them_to_the_servers_answer(
    sglang: Any, env: Any
) -> None:
    tokenizer = ModelTokenizer(sglang.model)
    with PassThroughRouter(sglang.url) as router, model_tokenizer(env, tokenizer), server_wide_aborts(env) as hard:

        def start(args: Any, source: Prompts) -> tuple[Callable[[int], Any], dict[str, Any]]:
            env.http_utils.init_http_client(args)  # slime's RolloutManager makes it before any rollout
            # slime's rollout function, and the sampling parameters its GenerateState sends
            return (lambda rollout_id: fs.generate_rollout(args, rollout_id, source)), harness.sampling_params(
                env, args
            )

        abort_then_resume(
            sglang,
            env,
            router,
            hard,
            tokenizer,
            args_for=lambda stop: rollout_args(env, router, sglang.model, stop),
            start=start,
            abort_home=env.rollout,
            equals_answer=assert_equals_answer,
        )


def abort_then_resume(
    sglang: Any,
    env: Any,
    router: PassThroughRouter,
    hard: list[Any],
    tokenizer: ModelTokenizer,
    *,
    args_for: Callable[[int], Any],
    start: Callable[[Any, Prompts], tuple[Callable[[int], Any], dict[str, Any]]],
    abort_home: Any,
    equals_answer: Callable[..., None],
) -> None:
    """The loop, on a framework's code: two rollouts of ``start(args, source)``'s rollout (rollout
    id in, output out; with the sampling parameters the framework sends), whose abort the
    framework looks up as ``abort_home.abort``; ``args_for(stop)``: the framework's arguments;
    ``equals_answer``: the sample against the server's answer, as the framework keeps it; ``hard``:
    the server-wide aborts sent, which must stay none."""
    short_ids, long_ids = tokenizer.encode(SHORT), tokenizer.encode(LONG)
    greedy = {"max_new_tokens": MAX, "temperature": 0}
    stop, stop_at = stop_token(
        answer(sglang, short_ids, greedy)["output_ids"], answer(sglang, long_ids, greedy)["output_ids"]
    )
    args = args_for(stop)
    source = Prompts(env, args, [SHORT, LONG])
    rollout, params = start(args, source)
    short_ref, long_ref = answer(sglang, short_ids, params), answer(sglang, long_ids, params)
    assert short_ref["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert len(short_ref["output_ids"]) == stop_at
    assert long_ref["meta_info"]["finish_reason"]["type"] == "length" and len(long_ref["output_ids"]) == MAX
    version = long_ref["meta_info"]["weight_version"]  # one entry per committed call
    # The loop's requests compute every KV themselves, not from the answers' (see the resume).
    wait_idle(sglang)  # the cache is flushed only on an idle server
    assert post_raw(sglang.url + "/flush_cache", {})[0] == 200
    stock_abort = abort_home.abort

    # Rollout 0: the short group finishes, which ends the rollout; the long one is aborted.
    first = rollout(0)
    assert abort_home.abort is stock_abort and idle(sglang)
    finished, aborted = source.created
    assert first.samples == [finished]
    for sample in finished:
        assert sample.status == env.Sample.Status.COMPLETED
        equals_answer(sample, short_ids, short_ref)
        assert sample.response == short_ref["text"] and sample.weight_versions == [version]
        assert sample.reward == float(stop_at) and harness.REWARDS[sample.index] == 1
    assert source.added == [[aborted]]  # buffered: it kept a prefix
    kept = []
    for sample in aborted:
        k = sample.response_length
        assert sample.status == env.Sample.Status.ABORTED and 0 < k < MAX and sample.reward is None
        # Drained: the terminal abort event carried the routed experts of every kept position.
        equals_answer(sample, long_ids, long_ref, kept=k)
        assert sample.metadata["start_rollout_id"] == 0 and sample.weight_versions == [version]
        kept.append(k)
    assert hard == []  # aborted by rid, never server-wide
    bodies = router.generate_bodies
    assert len(bodies) == 4 and all(b["return_routed_experts"] is True for b in bodies)

    # Rollout 1: the buffered group comes back first and alone; it resumes where it stopped.
    args.over_sampling_batch_size = 1
    cached_before = [sample.prefix_cache_info.cached_tokens for sample in aborted]
    second = rollout(1)
    assert abort_home.abort is stock_abort and idle(sglang)
    # nothing buffered again (Miles hands its buffer an empty list where slime hands none)
    assert second.samples == [aborted] and [groups for groups in source.added if groups] == [[aborted]]
    # Each resume sent its prompt and kept prefix, with the budget that is left, and asked
    # only for the routing the sample does not hold (the drain brought prompt + k - 1 rows).
    resumes = router.generate_bodies[4:]
    assert sorted(len(b["input_ids"]) for b in resumes) == sorted(len(long_ids) + k for k in kept)
    for body in resumes:
        k = len(body["input_ids"]) - len(long_ids)
        assert body["input_ids"] == long_ids + long_ref["output_ids"][:k]
        assert body["sampling_params"]["max_new_tokens"] == MAX - k
        assert body["routed_experts_start_len"] == len(long_ids) + k - 1
    for sample, k, before in zip(aborted, kept, cached_before):
        assert sample.status == env.Sample.Status.TRUNCATED
        equals_answer(sample, long_ids, long_ref)  # no token twice, none lost
        # The resume computed only its last input token: the prompt and kept prefix came from
        # the KV the drained request left in SGLang's radix cache. A resume that recomputes
        # them (the cache flushed before it) is a bf16 prefill where the answer was decoded:
        # measured, its greedy tokens left the answer's after kept prefixes of 5 and 13 tokens
        # (not 1 or 40), and where they held, log-probs differed by up to 0.09.
        assert sample.prefix_cache_info.cached_tokens - before == len(long_ids) + k - 1
        assert sample.response == long_ref["text"] and sample.weight_versions == [version, version]
        assert harness.REWARDS[sample.index] == 1 and sample.reward == float(MAX)
    assert hard == []


@pytest.mark.parametrize("sglang_mode", ["incremental"])
@pytest.mark.parametrize("pause_mode", ["retract", "in_place"])
def test_a_weight_update_mid_rollout_leaves_every_sample_complete_with_both_versions(
    sglang: Any, env: Any, pause_mode: str
) -> None:
    """What Miles (retract, its default) and in-flight refit (in_place) do around a weight update:
    the server pauses mid-rollout, loads the second checkpoint as version "v2" and goes on. The
    rollout never notices but in the versions: every sample completes, its routed experts cover
    its sequence, and it records both versions, in order."""
    tokenizer = ModelTokenizer(sglang.model)
    second = engines.model_dir(sglang.python, seed="b")
    with PassThroughRouter(sglang.url) as router, model_tokenizer(env, tokenizer), server_wide_aborts(env) as hard:
        args = rollout_args(env, router, sglang.model, stop=-1)
        args.rollout_stop_token_ids = None
        args.over_sampling_batch_size = 1
        env.http_utils.init_http_client(args)
        source = Prompts(env, args, [LONG])
        output = rollout_across_a_weight_update(
            sglang, router, lambda: fs.generate_rollout(args, 0, source), second, pause_mode
        )
        assert_both_versions(env, output)
        assert hard == [] and idle(sglang)


def rollout_across_a_weight_update(
    sglang: Any, router: PassThroughRouter, rollout: Callable[[], Any], second: Path, pause_mode: str
) -> Any:
    """``rollout()`` (a rollout of one group of two samples) run while the server, once both samples
    stream, pauses in ``pause_mode``, loads ``second`` as version "v2" and continues, as the
    framework's weight update does; the server's first weights are loaded again afterwards.
    Returns the rollout's output."""
    done: list[Any] = []
    running = threading.Thread(target=lambda: done.append(rollout()), daemon=True)
    try:
        running.start()
        deadline = time.monotonic() + 120
        while len(router.events) < 2 or min(router.events.values()) < 10:  # both samples streaming
            assert time.monotonic() < deadline and running.is_alive(), "the rollout did not start streaming"
            time.sleep(0.005)
        assert post_raw(sglang.url + "/pause_generation", {"mode": pause_mode})[0] == 200
        update = {"model_path": str(second), "weight_version": "v2", "flush_cache": pause_mode == "retract"}
        status, reply = post_raw(sglang.url + "/update_weights_from_disk", update)
        assert status == 200, reply
        assert post_raw(sglang.url + "/continue_generation", {})[0] == 200
        running.join(300)
        assert not running.is_alive()
    finally:
        restore = {"model_path": str(sglang.model), "weight_version": "default"}
        post_raw(sglang.url + "/continue_generation", {})
        running.join(300)
        assert post_raw(sglang.url + "/update_weights_from_disk", restore)[0] == 200
    return done[0]


def assert_both_versions(env: Any, output: Any) -> None:
    """Every sample of the rollout's one group ran to its end, records both versions in order,
    and holds a routed-expert row per position but the last and a log-prob per token. Its end is
    the budget, or the EOS when the second checkpoint chose it: where the weights switch is the
    server's timing, and so is the answer after it."""
    ((group,),) = [output.samples]
    for sample in group:
        n = sample.response_length
        if sample.status == env.Sample.Status.COMPLETED:
            assert 0 < n < MAX and sample.tokens[-1] == EOS_ID, (n, sample.tokens[-1])
        else:
            assert sample.status == env.Sample.Status.TRUNCATED and n == MAX
        assert sample.weight_versions == ["default", "v2"], sample.weight_versions
        assert tuple(sample.rollout_routed_experts.shape) == (len(sample.tokens) - 1, *EXPERTS)
        assert len(sample.rollout_log_probs) == n and sample.reward == float(n)
