"""Harness for the AReaL adapter tests: the loader (the double of tests/areal_double or a real AReaL
checkout), the emulator on its own thread, and the scenarios.

Every scenario runs AReaL's own ``RemoteSGLangEngine`` and fastaccum's ``StreamingSGLangEngine``
side by side against the same emulated SGLang server, asserts what each must do, and returns a
row of what each did (tests/test_areal.py runs them on the double, tests/test_areal_real.py on
the double and a checkout, and writes the rows as a table).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import importlib
import importlib.machinery
import json
import os
import subprocess
import sys
import threading
import types
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web

import fastaccum.areal as fa
from fastaccum.areal import _engine, _modules
from fastaccum.emulator import Emulator

DOUBLE_ROOT = str(Path(__file__).resolve().parent)
KINDS = ("areal", "fastaccum")  # AReaL's own engine, then fastaccum's
PROMPT = [11, 12, 13, 14, 15, 16, 17, 18]
EXPERTS = (4, 2)  # the emulator's (layers, top-k): a row holds 8 ids
N = 40
WAIT_S = 60  # a guard against a hang, never a measure: every wait is on a condition


# ---- loading ------------------------------------------------------------------------------------
class _Anything(type):
    """Whatever a stubbed module is asked for: a class that takes any call, item or attribute."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Stub

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return _Stub

    def __getitem__(cls, item: Any) -> Any:
        return _Stub

    def __or__(cls, other: Any) -> Any:
        return _Stub

    __ror__ = __or__


class _Stub(metaclass=_Anything):
    pass


class _StubFinder:
    """Modules AReaL imports that a training image has and this venv need not: torchdata,
    transformers (tokenizers come from the tests), omegaconf and hydra (its config parsing),
    numba, flask, openai and the like. Only names not importable here are stubbed."""

    NAMES = (
        "aiofiles",
        "einops",
        "flask",
        "hydra",
        "lark",
        "numba",
        "omegaconf",
        "openai",
        "tenacity",
        "torchdata",
        "transformers",
        "werkzeug",
    )

    def __init__(self) -> None:
        self.missing = {name for name in self.NAMES if importlib.util.find_spec(name) is None}

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name.split(".")[0] in self.missing:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []

        def anything(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return _Stub

        module.__getattr__ = anything  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def _purge() -> None:
    for name in list(sys.modules):
        if name == "areal" or name.startswith("areal."):
            del sys.modules[name]
    _modules.forget()
    _engine.forget()


@dataclasses.dataclass
class AReaLEnv:
    kind: str  # "double" | "real"
    root: str
    api: Any  # areal.api.io_struct
    cli: Any  # areal.api.cli_args
    RemoteSGLangEngine: Any
    RLVRWorkflow: Any
    workflow_context: Any

    def config(self, **options: Any) -> Any:
        options.setdefault("experiment_name", "fastaccum")
        options.setdefault("trial_name", "areal")
        options.setdefault("consumer_batch_size", 4)
        return self.cli.InferenceEngineConfig(**options)

    def engine(self, kind: str, servers: list[Emulator], **options: Any) -> Any:
        """AReaL's engine (``kind`` "areal") or fastaccum's, initialized on ``servers``."""
        cls = self.RemoteSGLangEngine if kind == "areal" else fa.StreamingSGLangEngine
        engine = cls(self.config(**options))
        engine.initialize(addr=[s.url.removeprefix("http://") for s in servers], train_data_parallel_size=1)
        return engine

    def request(self, n: int = N, prompt: list[int] | None = None, **gconfig: Any) -> Any:
        g = self.cli.GenerationHyperparameters(max_new_tokens=n, greedy=True, **gconfig)
        return self.api.ModelRequest(input_ids=list(prompt or PROMPT), gconfig=g)

    def start(self, engine: Any, req: Any) -> concurrent.futures.Future[Any]:
        """``engine.agenerate(req)`` on a workflow thread's loop of its own, as AReaL's task runner
        runs it; its connections are closed before that loop ends."""
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        async def call() -> Any:
            try:
                return await engine.agenerate(req)
            finally:
                if isinstance(engine, fa.StreamingSGLangEngine):
                    await fa.close_session(engine)
                else:
                    await (await self.workflow_context.get_aiohttp_session()).close()

        def thread() -> None:
            try:
                future.set_result(asyncio.run(call()))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=thread, daemon=True).start()
        return future

    def generate(self, engine: Any, req: Any) -> Any:
        return self.start(engine, req).result(WAIT_S)


def commit_of(root: str) -> str:
    """The AReaL commit a table's rows come from (``FASTACCUM_AREAL_COMMIT`` for a tree without git)."""
    done = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or os.environ.get("FASTACCUM_AREAL_COMMIT", "unknown (no git checkout)")


@contextlib.contextmanager
def areal_env(kind: str, root: str) -> Iterator[AReaLEnv]:
    """AReaL's modules from ``root``: the double, or a checkout with the stubs above."""
    finder = _StubFinder() if kind == "real" else None
    if finder is not None:
        sys.meta_path.insert(0, finder)
    _purge()
    sys.path.insert(0, root)
    try:
        from areal.api import cli_args, io_struct
        from areal.engine.sglang_remote import RemoteSGLangEngine
        from areal.infra import workflow_context
        from areal.workflow.rlvr import RLVRWorkflow

        yield AReaLEnv(kind, root, io_struct, cli_args, RemoteSGLangEngine, RLVRWorkflow, workflow_context)
    finally:
        sys.path.remove(root)
        _purge()
        if finder is not None:
            sys.meta_path.remove(finder)
            for name in list(sys.modules):
                if name.split(".")[0] in finder.missing:
                    del sys.modules[name]


# ---- the emulator on its own thread -------------------------------------------------------------
class ScenarioEmulator(Emulator):
    """The emulator, recording every ``/generate`` body; ``faults`` go to the next requests in
    turn (the request key would be in AReaL's payload otherwise), ``refuse`` answers the next
    ones with an error status, and ``cut_bodies`` closes the connection of the next non-streaming
    answers after their first bytes (a streamed one is cut by the ``cut`` fault)."""

    def __init__(self, **options: Any) -> None:
        options.setdefault("enable_return_routed_experts", True)
        options.setdefault("num_layers", EXPERTS[0])
        options.setdefault("topk", EXPERTS[1])
        super().__init__(greedy=True, **options)
        self.bodies: list[dict[str, Any]] = []
        self.faults: list[dict[str, Any]] = []
        self.refuse: list[int] = []
        self.cut_bodies = 0

    def make_app(self) -> web.Application:
        app = super().make_app()

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path == "/generate":
                body = json.loads(await request.read())
                self.bodies.append(body)
                if self.refuse:
                    return web.json_response({"error": "injected"}, status=self.refuse.pop(0))
                if self.cut_bodies and not body.get("stream"):
                    self.cut_bodies -= 1
                    response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "999"})
                    await response.prepare(request)
                    await response.write(b'{"text": "')
                    assert request.transport is not None
                    request.transport.close()
                    return response
            return await handler(request)

        app.middlewares.append(record)
        return app

    def _make_request(self, body: dict[str, Any], fault: dict[str, Any]) -> Any:
        if self.faults:
            fault = self.faults.pop(0)
        return super()._make_request(body, fault)

    @property
    def streamed(self) -> list[bool]:
        return [bool(body.get("stream")) for body in self.bodies]


class World:
    """Emulators on one background loop, and waits on their state."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.servers: list[ScenarioEmulator] = []

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT_S)

    def emulator(self, **options: Any) -> ScenarioEmulator:
        emulator = ScenarioEmulator(**options)
        self.call(emulator.start())
        self.servers.append(emulator)
        return emulator

    def wait(self, emulator: Emulator, predicate: Callable[[], bool]) -> None:
        """Until ``predicate()`` holds, judged on the emulator's loop whenever its scheduler says it
        changed, and every 20 ms besides: a request its paused tokenizer holds says nothing."""

        async def until() -> None:
            while not predicate():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(emulator.scheduler.changed().wait(), 0.02)

        self.call(until())

    def close(self) -> None:
        for emulator in self.servers:
            self.call(emulator.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


def post(emulator: Emulator, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        emulator.url + path, json.dumps(body or {}).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=WAIT_S) as response:
        return json.loads(response.read() or b"{}")


def truth(emulator: Emulator, n: int, prompt: list[int] | None = None) -> tuple[list[int], np.ndarray]:
    """The uninterrupted greedy answer to ``prompt``: its tokens and its routed-expert rows as
    AReaL shapes them, ``(prompt + n - 1, layers * top_k)``."""
    prompt = list(prompt or PROMPT)
    key, first = emulator.key_of("", prompt)
    gen = emulator.expected(key, n, prompt_tokens=len(prompt), routed_experts=True, first_position=first)
    assert gen.routed_experts is not None
    return list(gen.token_ids), gen.routed_experts.reshape(len(prompt) + n - 1, -1)


# ---- scenarios ------------------------------------------------------------------------------------
Row = dict[str, str]


def _rows(resp: Any) -> int:
    return 0 if resp.routed_experts is None else int(resp.routed_experts.shape[0])


def completion(env: AReaLEnv, world: World) -> Row:
    """An uninterrupted answer: both engines give the server's answer, with AReaL's types and
    shapes; only fastaccum's has a first-token time of its own."""
    emulator = world.emulator()
    tokens, rows = truth(emulator, N)
    row: Row = {}
    for kind in KINDS:
        resp = env.generate(env.engine(kind, [emulator], return_routed_experts=True), env.request())
        assert resp.output_tokens == tokens and resp.stop_reason == "length"
        assert resp.input_tokens == PROMPT and resp.output_versions == [0] * N
        assert all(type(v) is list for v in (resp.output_tokens, resp.output_logprobs, resp.output_versions))
        assert len(resp.output_logprobs) == N and all(type(p) is float for p in resp.output_logprobs)
        assert resp.routed_experts.dtype == np.int32 and np.array_equal(resp.routed_experts, rows)
        row[kind] = f"{N} tokens, {_rows(resp)} rows = the server's (prompt {len(PROMPT)} + {N} - 1)"
    assert emulator.streamed == [False, True]  # AReaL's request, then fastaccum's
    return row


def abort_then_resume(env: AReaLEnv, world: World) -> Row:
    """SGLang's abort pause lands mid-answer (the server pauses itself at the 10th token), the
    loop asks again once the server goes on: fastaccum's routed experts are the uninterrupted
    answer's rows, AReaL's hold the prompt's and the prefix's rows twice."""
    emulator = world.emulator()
    tokens, rows = truth(emulator, N)
    row: Row = {}
    for kind in KINDS:
        emulator.faults.append({"kind": "pause", "mode": "abort", "at": 10})
        engine = env.engine(kind, [emulator], return_routed_experts=True)
        pending = env.start(engine, env.request())
        # The resumed request waits at the paused server (its tokenizer holds new requests).
        world.wait(emulator, lambda emulator=emulator: bool(emulator.scheduler.gated))
        post(emulator, "/continue_generation")
        resp = pending.result(WAIT_S)
        kept = len(emulator.bodies[-1]["input_ids"]) - len(PROMPT)
        assert 10 <= kept < N and resp.output_tokens == tokens and resp.stop_reason == "length"
        if kind == "fastaccum":
            assert emulator.bodies[-1]["routed_experts_start_len"] == len(PROMPT) + kept - 1
            assert np.array_equal(resp.routed_experts, rows)
            row[kind] = f"kept {kept}, resumed: {_rows(resp)} rows = the uninterrupted answer's"
        else:
            repeated = len(PROMPT) + kept - 1
            assert _rows(resp) == len(rows) + repeated  # each segment sent its whole sequence's rows
            assert np.array_equal(resp.routed_experts[:repeated], rows[:repeated])
            assert np.array_equal(resp.routed_experts[repeated:], rows)
            row[kind] = f"kept {kept}, resumed: {_rows(resp)} rows, the first {repeated} twice (truth {len(rows)})"
    return row


def two_step_pause_with_new_weights(env: AReaLEnv, world: World) -> Row:
    """AReaL's weight update: its two pause steps (SGLang's abort, here landing at the 10th token,
    then in place), each engine's own disk-update request for version 1, continue, then
    ``set_version(1)``. The loop's resumed request waited at the paused server, so the new weights
    computed every token after the kept ones: fastaccum's versions say so, AReaL stamps the
    version it pinned before sending."""
    row: Row = {}
    for kind in KINDS:
        emulator = world.emulator()  # each engine starts on the first weights
        engine = env.engine(kind, [emulator], return_routed_experts=True)
        emulator.faults.append({"kind": "pause", "mode": "abort", "at": 10})
        pending = env.start(engine, env.request())
        world.wait(emulator, lambda emulator=emulator: bool(emulator.scheduler.gated))
        post(emulator, "/pause_generation", {"mode": "in_place"})
        meta = env.api.WeightUpdateMeta(type="disk", path="/checkpoints/weight_update").with_version(1)
        for update in engine._engine.backend.build_disk_weight_update_requests(meta).requests:
            post(emulator, update.endpoint, update.payload)
        post(emulator, "/continue_generation")
        engine.set_version(1)
        resp = pending.result(WAIT_S)
        kept = len(emulator.bodies[-1]["input_ids"]) - len(PROMPT)
        key, first = emulator.key_of("", emulator.bodies[-1]["input_ids"])
        new = emulator.expected(
            key, N - kept, prompt_tokens=len(PROMPT) + kept, first_position=first, token_weights=((0, meta.path),)
        )
        assert resp.output_tokens[kept:] == list(new.token_ids)  # the second weights' answer
        right = [0] * kept + [1] * (N - kept)
        if kind == "fastaccum":
            assert resp.output_versions == right and _rows(resp) == len(PROMPT) + N - 1
        else:
            assert resp.output_versions == [0] * N
        wrong = sum(a != b for a, b in zip(resp.output_versions, right))
        row[kind] = f"kept {kept} (v0), {N - kept} by v1: {wrong} tokens labelled wrong"
    return row


def paused_executor_holds_the_loop(env: AReaLEnv, world: World) -> Row:
    """The trainer pauses the workflow executor before a weight update and resumes it after
    ``set_version``: an aborted request is asked again only then, under the new version. Here the
    server pauses in place at the 10th token, the executor is paused, every request is aborted
    (AReaL's ``abort_all_requests``; it ends at continue); versions 0 for the kept tokens and 1
    for the rest prove the loop waited (the server's label is "default": no weights changed)."""
    row: Row = {}
    for kind in KINDS:
        emulator = world.emulator()
        engine = env.engine(kind, [emulator], return_routed_experts=True)
        emulator.faults.append({"kind": "pause", "mode": "in_place", "at": 10})
        pending = env.start(engine, env.request())
        world.wait(emulator, lambda emulator=emulator: any(r.paused_at for r in emulator.scheduler.running))
        engine.pause()
        post(emulator, "/abort_request", {"abort_all": True})
        post(emulator, "/continue_generation")
        world.wait(emulator, lambda emulator=emulator: not emulator.scheduler.inflight)
        requests_then = len(emulator.bodies)
        engine.set_version(1)
        engine.resume()
        resp = pending.result(WAIT_S)
        kept = len(emulator.bodies[-1]["input_ids"]) - len(PROMPT)
        assert requests_then == 1 and len(emulator.bodies) == 2
        assert resp.output_versions == [0] * kept + [1] * (N - kept)
        row[kind] = f"asked again after resume(): versions 0 x {kept}, 1 x {N - kept}"
    return row


def latencies(env: AReaLEnv, world: World) -> Row:
    """Against the emulator's pacing (200 tokens/s): fastaccum's ``ttft`` is the first token's
    arrival and ``itl`` has one entry per token after the first, within the call's latency;
    AReaL's non-streaming client sets ``ttft = latency`` and no ``itl``."""
    emulator = world.emulator(token_rate=200)
    n = 30
    row: Row = {}
    for kind in KINDS:
        resp = env.generate(env.engine(kind, [emulator]), env.request(n))
        assert len(resp.output_tokens) == n
        if kind == "fastaccum":
            assert 0 < resp.ttft < resp.latency and len(resp.itl) == n - 1 and min(resp.itl) >= 0
            assert resp.ttft + sum(resp.itl) <= resp.latency
            spread = f"{len(resp.itl)} itl summing to {sum(resp.itl) * 1e3:.0f} ms"
            row[kind] = f"ttft {resp.ttft * 1e3:.1f} ms, {spread}, latency {resp.latency * 1e3:.0f} ms"
        else:
            assert resp.ttft == resp.latency and resp.itl == []
            row[kind] = f"ttft = latency = {resp.latency * 1e3:.0f} ms, itl []"
    return row


def server_errors(env: AReaLEnv, world: World) -> Row:
    """A server answering 500 twice (``request_retries`` 2): both give up after two requests,
    fastaccum with the server's status and message. A 400 (the request itself is wrong): AReaL
    sends it again, fastaccum reports it at once."""
    emulator = world.emulator()
    row: Row = {}
    for kind in KINDS:
        engine = env.engine(kind, [emulator], request_retries=2)
        found = []
        for status in (500, 400):
            before = len(emulator.bodies)
            emulator.refuse[:] = [status, status]
            try:
                env.generate(engine, env.request())
            except Exception as exc:  # the engines raise different types: that is the finding
                found.append(f"{status}: {type(exc).__name__} after {len(emulator.bodies) - before} requests")
                if kind == "fastaccum":
                    assert getattr(exc, "status", None) == status
            else:
                raise AssertionError(f"{kind}: a server answering {status} gave an answer")
            emulator.refuse.clear()
        expected = ["500: RuntimeError after 2 requests", "400: RuntimeError after 2 requests"]
        if kind == "fastaccum":
            expected = ["500: ServerError after 2 requests", "400: ServerError after 1 requests"]
        assert found == expected, found
        row[kind] = "; ".join(found)
    return row


def cut_connection(env: AReaLEnv, world: World) -> Row:
    """The connection is cut mid-answer once: AReaL asks for the whole answer again; fastaccum
    keeps the tokens it read and asks for the rest, its routed experts still the server's."""
    emulator = world.emulator()
    tokens, rows = truth(emulator, N)
    row: Row = {}
    for kind in KINDS:
        if kind == "fastaccum":
            emulator.faults.append({"kind": "cut", "at": 5})
        else:
            emulator.cut_bodies = 1
        before = len(emulator.bodies)
        resp = env.generate(env.engine(kind, [emulator], return_routed_experts=True), env.request())
        assert resp.output_tokens == tokens and np.array_equal(resp.routed_experts, rows)
        asked = len(emulator.bodies[-1]["input_ids"]) - len(PROMPT)
        assert len(emulator.bodies) - before == 2 and (asked > 0) == (kind == "fastaccum")
        row[kind] = f"asked again for {N - asked} of {N} tokens; rows = the server's"
    return row


def not_a_moe_model(env: AReaLEnv, world: World) -> Row:
    """Routed experts asked of a server that sends none (not a MoE model): AReaL's error, from both."""
    emulator = world.emulator(enable_return_routed_experts=False)
    row: Row = {}
    for kind in KINDS:
        try:
            env.generate(env.engine(kind, [emulator], return_routed_experts=True), env.request())
        except RuntimeError as exc:
            assert str(exc) == fa._generate.ROUTED_EXPERTS_MISSING
            row[kind] = "RuntimeError: not a MoE model"
        else:
            raise AssertionError(f"{kind}: no error")
    return row


def checks_and_payload(env: AReaLEnv, world: World) -> Row:
    """AReaL's checks raise the same errors with the same messages, and both engines send the
    same payload (LoRA name for the pinned version, image data, stop ids, seed), but for
    ``stream``."""
    emulator = world.emulator()
    messages: dict[str, list[str]] = {}
    for kind in KINDS:
        engine = env.engine(kind, [emulator], use_lora=True)
        found = messages.setdefault(kind, [])
        for bad in (env.request(n_samples=2), env.request(max_tokens=len(PROMPT))):
            try:
                env.generate(engine, bad)
            except (ValueError, RuntimeError) as exc:
                found.append(f"{type(exc).__name__}: {exc}")
        req = env.request(8, lora_name="adapter", seed=3, stop_token_ids=[7])
        req.image_data = ["data:image/png;base64,AAAA"]
        engine.set_version(2)
        env.generate(engine, req)
    assert len(messages["areal"]) == 2 and messages["areal"] == messages["fastaccum"]
    areal_body, streamed_body = emulator.bodies[-2], emulator.bodies[-1]
    assert areal_body["lora_path"] == "adapter-v2" and areal_body["image_data"] == ["data:image/png;base64,AAAA"]
    assert {k: v for k, v in streamed_body.items() if k not in ("stream", "rid")} == {
        k: v for k, v in areal_body.items() if k != "stream"
    }
    return {kind: "same checks, messages and payload" for kind in KINDS}


def sticky_servers(env: AReaLEnv, world: World) -> Row:
    """A ``rid`` goes to the server it went to before (its KV cache is there); a new one to the
    next server in turn."""
    servers = [world.emulator(), world.emulator()]
    row: Row = {}
    for kind in KINDS:
        engine = env.engine(kind, servers)
        seen = []
        for rid in ("sample-a", "sample-a", "sample-b", "sample-a"):
            req = env.request(4)
            req.rid = rid
            counts = [len(s.bodies) for s in servers]
            env.generate(engine, req)
            seen.append(next(i for i, s in enumerate(servers) if len(s.bodies) > counts[i]))
        assert seen[0] == seen[1] == seen[3] != seen[2], seen
        row[kind] = f"servers {seen}"
    return row


SCENARIOS = (
    completion,
    abort_then_resume,
    two_step_pause_with_new_weights,
    paused_executor_holds_the_loop,
    latencies,
    server_errors,
    cut_connection,
    not_a_moe_model,
    checks_and_payload,
    sticky_servers,
)


# ---- a workflow of AReaL's ------------------------------------------------------------------------
class Tokenizer:
    """What AReaL's single-turn workflow asks of a tokenizer."""

    pad_token_id = 0
    eos_token_id = 1

    def decode(self, ids: Any, **options: Any) -> str:
        return " ".join(map(str, ids))


def reward(prompt: Any, completion: Any, prompt_ids: Any, completion_ids: Any, **data: Any) -> float:
    """Module-level: AReaL runs it in a process pool, which pickles it by name."""
    return float(len(completion_ids))


def input_ids(messages: Any, tokenizer: Any, enable_thinking: bool) -> list[int]:
    return [*PROMPT, len(str(messages))]


def workflow(env: AReaLEnv, n: int = 8) -> Any:
    """AReaL's ``RLVRWorkflow``: one agenerate, its lists concatenated into the trajectory."""
    g = env.cli.GenerationHyperparameters(max_new_tokens=n, greedy=True)
    return env.RLVRWorkflow(reward_fn=reward, gconfig=g, tokenizer=Tokenizer(), get_input_ids_fn=input_ids)
