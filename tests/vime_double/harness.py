"""Harness for the vime adapter tests: stubs, a vime loader, the vLLM server thread and the scenarios.

Every scenario takes a ``VimeEnv`` (the double of ``tests/vime_double`` or a real vime tree from
``FASTACCUM_VIME_PATH``) and drives ``fastaccum.vime`` against fastaccum's emulator in its vLLM
dialect (``Emulator(dialect="vllm")``, with what vime's loop needs around it: ``VimeEmulator``)
over loopback HTTP, so the same assertions run against both (tests/test_vime.py: the double,
both vime lines; tests/test_vime_real.py: both). Loaded by file path and registered as
``fastaccum_vime_harness`` so vime's ``load_function`` can reach the reward function below.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import inspect
import os
import re
import sys
import threading
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import orjson
import pytest
from aiohttp import web

import fastaccum.vime as fv
from fastaccum.emulator import FAULT_KEY, VLLM_ID_PREFIX, Emulator, writer
from fastaccum.errors import SettingsError
from fastaccum.vime import _generate, _modules, _pools

NEW_RID = _generate.new_rid  # the adapter's own, which wired() records
OPEN_STREAM = _pools.POOLS.open_stream  # likewise: the streams the scenario opened, in OPENED
OPENED: list[Any] = []

DOUBLE_ROOT = str(Path(__file__).resolve().parent)
PROMPT = "alpha beta gamma delta epsilon zeta eta theta"
LINES = ("request-abort", "stock", "pause")
DOUBLE_LINE = "FASTACCUM_VIME_DOUBLE_LINE"  # the double's, each a real line's shape (vime/_line.py)
# The emulator draws token ids below writer.synthetic_generation's vocab (it passes none): the
# tokenizer stand-in has exactly that vocabulary, its last 1000 ids "special".
VOCAB: int = inspect.signature(writer.synthetic_generation).parameters["vocab"].default
SPECIAL_FROM = VOCAB - 1000


# ---- stubs ---------------------------------------------------------------------------------------
class FakeTokenizer:
    """A tokenizer of the emulator's vocabulary (``VOCAB`` ids): one id per word; decode renders
    ids (``<id>``), refusing ids outside the vocabulary, skipping ids >= ``SPECIAL_FROM`` as
    "special" tokens when asked, so the skip rule shows in assertions; counts decode calls."""

    decodes = 0
    vocab_size = VOCAB

    def __len__(self) -> int:
        return VOCAB

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1000 + (sum(map(ord, word)) % 5000) for word in text.split()]

    def decode(self, ids: Any, skip_special_tokens: bool = False, **options: Any) -> str:
        FakeTokenizer.decodes += 1
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < VOCAB]
        if bad:
            raise ValueError(f"token ids outside the vocabulary of {VOCAB}: {bad[:5]}")
        return "".join(f"<{i}>" for i in ids if not (skip_special_tokens and i >= SPECIAL_FROM))


TOKENIZER: Any = FakeTokenizer()  # what AutoTokenizer.from_pretrained returns (the benchmark sets a real one)


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


def _stubbed(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("stubbed by the fastaccum vime harness")


class _Span:
    def update(self, attrs: Any) -> _Span:
        return self


@contextlib.contextmanager
def _trace_span(target: Any, name: str, *, attrs: Any = None, record_error: bool = True) -> Iterator[_Span]:
    yield _Span()


def _trace_function(name: str, **options: Any) -> Any:
    return lambda fn: fn


STUBS = (
    "vllm_router",
    "ray",
    "ray.util",
    "ray.util.scheduling_strategies",
    "transformers",
    "safetensors",
    "safetensors.torch",
    "vime.observability.trace_utils",
    "vime.utils.data",
    "vime.utils.eval_config",
    "vime.utils.accelerator",
    *(f"vime.rollout.rm_hub.{n}" for n in ("deepscaler", "f1", "gpqa", "math_dapo_utils", "math_utils")),
)


def install_stubs() -> list[str]:
    """Third-party modules vime imports at module level (ray, transformers, safetensors) and the
    vime modules a laid-out tree lacks (docs/vime.md, "Testing inside vime"); names installed."""
    before = set(sys.modules)
    _module("vllm_router")  # imported for its side effects by the 052693a8 and edbcb4c9 rollouts
    if "ray" not in sys.modules:  # a loaded Ray is real (the Ray tier): vime imports it as it is
        ray = _module("ray", get=_stubbed, nodes=lambda: [], remote=_stubbed)
        ray.util = _module("ray.util")
        ray.util.scheduling_strategies = _module(
            "ray.util.scheduling_strategies", NodeAffinitySchedulingStrategy=_stubbed
        )
    tf = _module("transformers")
    tf.AutoTokenizer = type("AutoTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: TOKENIZER)})

    def no_processor(*args: Any, **kwargs: Any) -> Any:
        raise OSError("no processor in tests")

    tf.AutoProcessor = type("AutoProcessor", (), {"from_pretrained": staticmethod(no_processor)})
    tf.PreTrainedTokenizerBase = type("PreTrainedTokenizerBase", (), {})
    tf.ProcessorMixin = type("ProcessorMixin", (), {})
    st = _module("safetensors", safe_open=_stubbed)
    st.torch = _module("safetensors.torch", load_file=_stubbed, save_file=_stubbed)
    _module(
        "vime.observability.trace_utils",
        trace_span=_trace_span,
        trace_function=_trace_function,
        build_vllm_meta_trace_attrs=lambda meta: {},
    )
    _module("vime.utils.data", Dataset=_stubbed)
    _module("vime.utils.eval_config", EvalDatasetConfig=type("EvalDatasetConfig", (), {}))
    _module("vime.utils.accelerator", initialize_accelerator=lambda: None)
    rewards = {
        "deepscaler": ("get_deepscaler_rule_based_reward",),
        "f1": ("f1_score",),
        "gpqa": ("compute_gpqa_reward",),
        "math_dapo_utils": ("compute_score",),
        "math_utils": ("extract_answer", "grade_answer_verl"),
    }
    for name, functions in rewards.items():
        _module(f"vime.rollout.rm_hub.{name}", **{f: _stubbed for f in functions})
    return [name for name in STUBS if name not in before]


def _purge_vime() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] == "vime":
            del sys.modules[name]
    _modules.forget()


@dataclasses.dataclass
class VimeEnv:
    kind: str  # "double" | "real"
    root: str
    line: str  # "request-abort" | "stock"
    rollout: Any
    misc: Any
    http_utils: Any
    async_utils: Any
    server_control: Any
    Sample: Any
    shards: int | None = None  # fastaccum_shards: the Ray tier runs every scenario with 2 (tests/shards)

    def run(self, coro: Any) -> Any:
        """Run on vime's background loop, where vime's rollouts (and so fastaccum) run."""
        return self.async_utils.run(coro)

    def reset(self) -> None:
        self.misc.SingletonMeta._instances.clear()
        vars(self.rollout.GenerateState).get("_instances", {}).clear()
        getattr(self.misc.load_function, "cache_clear", lambda: None)()  # uncached on the pause line
        REWARDS.clear()


def real_line(rollout: Any) -> str:
    """Which vime line a real tree is, from what its rollout module offers (docs/vime.md, "vime
    lines"): request-level cancel (2b83ea20), pause?mode=abort (edbcb4c9), else the server-wide
    abort with re-sweeps (052693a8)."""
    if hasattr(rollout, "_run_request_abortable_generate"):
        return "request-abort"
    return "pause" if hasattr(rollout, "_resume_vllm_workers") else "stock"


@contextlib.contextmanager
def vime_env(kind: str, root: str, line: str | None = None) -> Iterator[VimeEnv]:
    """vime's modules from ``root``: the double models the ``line`` asked for; a real tree is the
    line it is (``GenerateState`` with ``cancellable_tasks`` is the request-abort line)."""
    _purge_vime()
    sys.path.insert(0, root)
    stubs = install_stubs()
    if kind == "double":
        assert line in LINES, line
        os.environ[DOUBLE_LINE] = line  # read once, when the double's modules are imported
    try:
        try:  # the pause/resume line has no vime.backends at all
            server_control: Any = importlib.import_module("vime.backends.vllm_utils.server_control")
        except ModuleNotFoundError:
            server_control = None
        from vime.rollout import vllm_rollout
        from vime.utils import async_utils, http_utils, misc
        from vime.utils.types import Sample

        if kind == "double":
            assert real_line(vllm_rollout) == line, (real_line(vllm_rollout), line)
        else:
            line = real_line(vllm_rollout)
        env = VimeEnv(kind, root, line, vllm_rollout, misc, http_utils, async_utils, server_control, Sample)
        yield env
        env.run(fv.close_session())
        if http_utils._http_client is not None:
            env.run(http_utils._http_client.aclose())
            http_utils._http_client = None
    finally:
        os.environ.pop(DOUBLE_LINE, None)
        sys.path.remove(root)
        _purge_vime()
        for name in stubs:
            sys.modules.pop(name, None)


# ---- the vLLM server on its own thread ---------------------------------------------------------
GENERATE = "/inference/v1/generate"
WEIGHT_VERSION = "w1"
# A chunk with a choice (not the usage chunk, not an error): its closing brace, at the event's end.
_CHOICE_EVENT = re.compile(rb'(data: \{[^\n]*"choices":\[\{[^\n]*)\}\n\n')


class VimeEmulator(Emulator):
    """``Emulator(dialect="vllm")`` plus what vime's loop reaches that the emulator does not serve,
    added around its app (the emulator itself is not changed):

    - ``GET /workers``: the emulator doubles as vime's router, one worker (itself);
    - a top-level ``weight_version`` on every chunk with a choice, which vime's reader and
      fastaccum.vime read into ``Sample.weight_versions``: vime's first, until a version is set;
    - ``cancel_endpoint=False``: a vLLM without the RL dev API, both abort endpoints 404;
    - ``holds[request_id] = s``: the request reaches the emulator ``s`` seconds late (queued
      before the server: no token until then; its client leaving ends the wait);
    - the bodies received: ``payloads``/``headers`` (generate), ``abort_bodies`` (the aborts served);
    - ``abort_lag_polls = n``: a worker slow to end its requests: an abort of every request (``/abort_requests
      {}``, ``/pause?mode=abort``) takes effect once ``/load`` was asked n times after it.
    """

    def __init__(self, *, cancel_endpoint: bool = True, **options: Any) -> None:
        super().__init__(dialect="vllm", **options)
        self.cancel_endpoint = cancel_endpoint
        self.holds: dict[str, float] = {}
        self.payloads: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.abort_bodies: list[dict[str, Any]] = []
        self.pauses: list[str] = []
        self.resumes = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        # A worker slow to end its requests: an abort of every request takes effect only once
        # /load has been asked this many times after it (0: at once).
        self.abort_lag_polls = 0
        self.load_polls = 0
        self._deferred_at: int | None = None

    def abort(self, rid: str = "", *, abort_all: bool = False) -> int:
        if abort_all and self.abort_lag_polls:
            if self._deferred_at is None:
                self._deferred_at = self.load_polls
            return self.running + self.queued
        return super().abort(rid, abort_all=abort_all)

    def make_app(self) -> web.Application:
        app = super().make_app()
        app.middlewares.append(self._observe)
        app.router.add_get("/workers", self._workers)
        if not self.vllm_server_dev_mode:  # else the emulator's own pause endpoints serve them
            app.router.add_post("/pause", self._pause)
            app.router.add_post("/resume", self._resume)
        app.on_response_prepare.append(self._stamp_weight_version)
        return app

    async def _pause(self, request: web.Request) -> web.Response:
        """vLLM's ``POST /pause?mode=abort`` (what the edbcb4c9 line's abort sends): every request
        held ends with its abort chunk."""
        self.pauses.append(request.query.get("mode", ""))
        if request.query.get("mode") == "abort":
            self.abort(abort_all=True)
        return web.json_response({})

    async def _resume(self, request: web.Request) -> web.Response:
        self.resumes += 1
        return web.json_response({})

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": self.url}]})

    @web.middleware
    async def _observe(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/load":
            self.load_polls += 1
            if self._deferred_at is not None and self.load_polls - self._deferred_at >= self.abort_lag_polls:
                self._deferred_at = None
                super().abort(abort_all=True)  # the slow worker ends its requests now
        if request.method == "POST":
            try:  # read() keeps the bytes: the emulator's handler reads the same body
                body = orjson.loads(await request.read() or b"{}")
            except orjson.JSONDecodeError:
                body = None
            if request.path == GENERATE and isinstance(body, dict):
                self.payloads.append(body)
                self.headers.append(dict(request.headers))
                hold = self.holds.get(str(body.get("request_id")))
                if hold:
                    await asyncio.sleep(hold)
            elif request.path.endswith("/abort_requests"):
                if not self.cancel_endpoint:
                    return web.json_response({"detail": "Not Found"}, status=404)
                self.abort_bodies.append(body if isinstance(body, dict) else {"invalid": True})
        response: web.StreamResponse = await handler(request)
        return response

    def _stamp(self) -> str:
        # After an /update_weight_version the chunks carry the version set, as vime's vLLM stamps
        # each step's; before it, vime's first.
        return self.weight_version if self.scheduler.stamps else WEIGHT_VERSION

    async def _stamp_weight_version(self, request: web.Request, response: web.StreamResponse) -> None:
        if request.path != GENERATE:
            return
        write = response.write

        async def stamped(data: Any) -> None:
            await write(_CHOICE_EVENT.sub(rb'\1,"weight_version":"' + self._stamp().encode() + rb'"}\n\n', bytes(data)))

        response.write = stamped  # type: ignore[method-assign]

    # ---- what the scenarios read (request ids as the client gave them) -------------------------
    def written(self, rid: str) -> int:
        """Tokens of the client's request ``rid`` whose write returned (the emulator keys vLLM's id)."""
        return self.stats.written.get(VLLM_ID_PREFIX + rid, 0)

    @property
    def requests(self) -> int:
        """Generate requests received (served or not)."""
        return self.stats.calls.get(GENERATE, 0)

    def abort_now(self, rid: str) -> int:
        """A server-side abort of the client's request ``rid`` (``Emulator.abort``, on its loop)."""
        assert self.loop is not None

        async def abort() -> int:
            return self.abort(VLLM_ID_PREFIX + rid)

        return asyncio.run_coroutine_threadsafe(abort(), self.loop).result(5)

    def stop_tokens(self, plans: dict[str, int], others: dict[str, int]) -> list[int]:
        """``stop_token_ids`` that end each planned request at its k-th token (vLLM keeps the stop
        token) and never sooner, and leave the first n tokens of every other request alone."""
        stops = {rid: self.expected(rid, k).token_ids[k - 1] for rid, k in plans.items()}
        for rid, k in {**plans, **others}.items():
            seen = self.expected(rid, k).token_ids[: k - 1 if rid in plans else k]
            assert not set(seen) & set(stops.values()), (rid, "hits a stop token early: pick another seed")
        return list(stops.values())


@contextlib.contextmanager
def server_thread(**options: Any) -> Iterator[VimeEmulator]:
    """``VimeEmulator`` (the emulator's vLLM dialect) on a loop of its own."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="vllm-server")
    thread.start()
    server = VimeEmulator(**options)
    server.loop = loop
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


# ---- per-test wiring -----------------------------------------------------------------------------
REWARDS: Counter[int] = Counter()


async def count_reward(args: Any, sample: Any, **kwargs: Any) -> float:
    """The tests' reward function: counts calls per sample index."""
    REWARDS[sample.index] += 1
    return float(sample.response_length)


FAULTS: dict[str, dict[str, Any]] = {}  # the emulator's fault for a request id, while a scenario runs


@contextlib.contextmanager
def wired(env: VimeEnv) -> Iterator[Counter[int]]:
    """Deterministic request ids ``s<index>a<attempt>`` (the server keys tokens by them)."""
    env.reset()
    attempts: Counter[int] = Counter()

    made: list[str] = []  # the adapter's own request ids, one per call (held to vLLM's rule at the end)

    def rid(sample: Any) -> str:
        made.append(NEW_RID(sample))
        value = f"s{sample.index:03d}a{attempts[sample.index]:02d}"
        attempts[sample.index] += 1
        return value

    env.http_utils.init_http_client(
        SimpleNamespace(rollout_num_engines=1, vllm_server_concurrency=8, use_distributed_post=False)
    )

    def open_stream(args: Any, settings: Any, payload: dict[str, Any], **kwargs: Any) -> Any:
        fault = FAULTS.get(str(payload.get("request_id")))
        stream = OPEN_STREAM(args, settings, {**payload, FAULT_KEY: fault} if fault else payload, **kwargs)
        OPENED.append(stream)
        return stream

    OPENED.clear()
    FAULTS.clear()
    patch = pytest.MonkeyPatch()
    patch.setattr(_generate, "new_rid", rid)
    patch.setattr(_pools.POOLS, "open_stream", open_stream)
    try:
        yield attempts
        assert len(set(made)) == len(made), f"a request id was made twice: {sorted(made)}"
    finally:
        patch.undo()
        env.reset()


def make_args(env: VimeEnv, server: Any, **overrides: Any) -> SimpleNamespace:
    args = SimpleNamespace(
        hf_checkpoint="fake-model",
        vllm_router_ip=server.host,
        vllm_router_port=server.port,
        vllm_server_concurrency=8,
        vllm_dp_size=None,
        vllm_enable_deterministic_inference=False,
        rollout_num_engines=1,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        rollout_global_dataset=True,
        vllm_speculative_config=None,
        use_distributed_post=False,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_max_response_len=40,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        rollout_seed=0,
        ci_test=False,
        partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False,
        group_rm=False,
        custom_generate_function_path="fastaccum.vime.generate",
        custom_rm_path="fastaccum_vime_harness.count_reward",
        rm_type=None,
        reward_key=None,
        rollout_batch_size=1,
        n_samples_per_prompt=1,
        over_sampling_batch_size=1,
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        rollout_all_samples_process_path=None,
        rollout_sample_hook_path=None,
        rollout_data_transport="object-store",
        use_rollout_routing_replay=False,
        num_layers=server.expert_shape[0],
        moe_router_topk=server.expert_shape[1],
        router_policy=None,
        fastaccum_idle_timeout=5.0,
        fastaccum_idle_poll_interval=0.02,
        fastaccum_shards=env.shards,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


class BufferedPrompts:
    """A data source with vime's buffer semantics: buffered groups first, whole groups only."""

    def __init__(self, env: VimeEnv, args: Any) -> None:
        self.env, self.args = env, args
        self.buffer: list[list[Any]] = []
        self.next_index = 0
        self.added: list[list[list[Any]]] = []
        self.created: list[list[Any]] = []

    def get_samples(self, num_groups: int) -> list[list[Any]]:
        groups, self.buffer = self.buffer[:num_groups], self.buffer[num_groups:]
        while len(groups) < num_groups:
            group = []
            for _ in range(self.args.n_samples_per_prompt):
                group.append(self.env.Sample(index=self.next_index, group_index=len(self.created), prompt=PROMPT))
                self.next_index += 1
            groups.append(group)
            self.created.append(group)
        return groups

    def add_samples(self, groups: list[list[Any]]) -> None:
        for group in groups:
            assert len(group) == self.args.n_samples_per_prompt
        self.buffer.extend(groups)
        self.added.append(groups)


def new_sample(env: VimeEnv, index: int = 0) -> Any:
    return env.Sample(index=index, prompt=PROMPT)


def sampling_params(env: VimeEnv, args: Any) -> dict[str, Any]:
    return env.rollout.GenerateState(args).sampling_params.copy()


def prompt_ids() -> list[int]:
    return FakeTokenizer().encode(PROMPT)


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def generate_and_rm(env: VimeEnv, args: Any, sample: Any) -> Any:
    """One sample the way vime's rollout runs it (request-abort line: inside the wrapper that
    registers the task for abort's cancel)."""
    return env.rollout.generate_and_rm(args, sample, sampling_params(env, args))


def mask(env: VimeEnv, sample: Any) -> Any:
    """The loss mask as the line keeps it: the pause line's own generate leaves a fresh sample's
    mask None (it extends one only once partial rollout masked it); the others write ones."""
    if env.line == "pause":
        assert sample.loss_mask is None
        return [1] * sample.response_length
    return sample.loss_mask


def as_array(tensor: Any) -> Any:
    """Routed experts as numpy int32 (torch on 2b83ea20, in chunks there, and 052693a8; numpy on
    the pause line)."""
    if isinstance(tensor, list):
        tensor = __import__("torch").cat(tensor)
    assert str(tensor.dtype).endswith("int32"), tensor.dtype
    return tensor.numpy() if hasattr(tensor, "numpy") else __import__("numpy").asarray(tensor)


def assert_call(sample: Any, server: Any, rid: str, start: int, n: int, prompt_tokens: int) -> None:
    """Response positions [start, start + n) are exactly ``rid``'s first n tokens (no duplicates)."""
    gen = server.expected(rid, n, prompt_tokens=prompt_tokens)
    assert server.written(rid) >= n  # the emulator wrote them to this request
    base = len(prompt_ids())
    assert sample.tokens[base + start : base + start + n] == list(gen.token_ids)
    assert sample.rollout_log_probs[start : start + n] == [float(x) for x in gen.logprobs]


# ---- scenarios -----------------------------------------------------------------------------------
def scenario_complete(env: VimeEnv, skip_special_tokens: bool) -> None:
    """A finished call: tokens, log-probs, text decoded once with vime's skip rule, loss mask,
    weight version, usage and status, from one request with vime's request body."""
    with server_thread() as srv, wired(env):
        stops = srv.stop_tokens({"s001a00": 7}, {"s000a00": 30})
        args = make_args(
            env,
            srv,
            rollout_max_response_len=30,
            rollout_skip_special_tokens=skip_special_tokens,
            rollout_stop_token_ids=stops,
        )

        async def main() -> tuple[Any, Any]:
            truncated = await fv.generate(args, new_sample(env, 0), sampling_params(env, args))
            stopped = await fv.generate(args, new_sample(env, 1), sampling_params(env, args))
            return truncated, stopped

        before = FakeTokenizer.decodes
        truncated, stopped = env.run(main())
        assert FakeTokenizer.decodes == before + 2  # once per call, never per chunk
        gen = srv.expected("s000a00", 30, prompt_tokens=len(prompt_ids()))
        assert truncated.tokens == prompt_ids() + list(gen.token_ids)
        assert stopped.tokens == prompt_ids() + list(srv.expected("s001a00", 7).token_ids)
        assert all(type(t) is int for t in truncated.tokens)
        assert truncated.rollout_log_probs == [float(x) for x in gen.logprobs]
        assert truncated.response == FakeTokenizer().decode(gen.token_ids, skip_special_tokens=skip_special_tokens)
        assert truncated.response_length == 30 and mask(env, truncated) == [1] * 30
        assert truncated.status == env.Sample.Status.TRUNCATED
        assert truncated.weight_versions == ["w1"]
        assert truncated.prefix_cache_info.total_prompt_tokens == len(prompt_ids())
        assert stopped.status == env.Sample.Status.COMPLETED and stopped.response_length == 7
        (timing,) = truncated.metadata["fastaccum_timing"]
        assert timing["tokens"] == 30
        body = srv.payloads[0]
        assert body["token_ids"] == prompt_ids() and body["model"] == "fake-model"
        assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
        assert body["request_id"] == "s000a00"
        assert body["sampling_params"]["max_tokens"] == 30 and body["sampling_params"]["logprobs"] == 1
        assert body["sampling_params"]["skip_special_tokens"] is skip_special_tokens
        assert body["sampling_params"]["stop_token_ids"] == stops
        assert srv.stats.completed == 2 and srv.stats.disconnects == 0 and srv.running == 0


def scenario_rollout_abort_and_resume(env: VimeEnv, cancel_endpoint: bool) -> None:
    """vime's rollout loop, aborted while requests run: the cut sample holds exactly the tokens
    it received and is ABORTED; its completed sibling comes back unchanged with its reward; only
    the group with a non-empty prefix is buffered; no server-wide abort; the server is idle and
    vime's ``abort`` restored when the rollout returns; the resume continues without duplicates,
    with max_tokens reduced by what was kept."""
    with server_thread(token_rate=400, cancel_endpoint=cancel_endpoint) as srv, wired(env):
        # One stop list for both rollouts (vime's GenerateState keeps its sampling params).
        stops = srv.stop_tokens({"s000a00": 60, "s001a00": 80, "s002a00": 2, "s003a01": 5}, {"s003a00": 2000})
        args = make_args(
            env,
            srv,
            rollout_max_response_len=2000,
            partial_rollout=True,
            n_samples_per_prompt=2,
            over_sampling_batch_size=3,
            rollout_stop_token_ids=stops,
        )
        srv.holds.update({"s004a00": 30, "s005a00": 30})
        source = BufferedPrompts(env, args)
        stock_abort = env.rollout.abort
        out = fv.generate_rollout(args, 0, source)
        assert env.rollout.abort is stock_abort
        assert srv.running == 0  # idle when the rollout returns
        (done,) = out.samples
        assert [s.index for s in done] == [0, 1] and all(s.status == env.Sample.Status.COMPLETED for s in done)
        metrics: dict[str, Any] = {}  # vime's RolloutManager hands over its metrics dict
        assert fv.log_rollout_data(0, args, out.samples, metrics, 1.0) is False  # vime then logs them
        assert metrics["fastaccum/calls"] == 6 and metrics["fastaccum/finished"] == 3, metrics
        drained, cut = metrics["fastaccum/aborted_drained"], metrics["fastaccum/aborted_cut"]
        assert drained + cut == 3 and (drained >= 1 if cancel_endpoint else drained == 0), metrics
        first, second, third = source.created
        assert source.added == [[second]]  # only the group that kept a prefix
        sibling, cut = second
        assert sibling.status == env.Sample.Status.COMPLETED and sibling.response_length == 2
        assert REWARDS[2] == 1 and sibling.reward == 2.0
        k = cut.response_length
        assert cut.status == env.Sample.Status.ABORTED and cut.reward is None
        assert 0 < k <= srv.written("s003a00"), (k, srv.stats.written)
        assert_call(cut, srv, "s003a00", 0, k, len(prompt_ids()))
        assert cut.response == FakeTokenizer().decode(cut.tokens[len(prompt_ids()) :])
        assert len(mask(env, cut)) == len(cut.rollout_log_probs) == k
        assert cut.metadata["start_rollout_id"] == 0 and cut.weight_versions == ["w1"]
        assert all(s.status == env.Sample.Status.ABORTED and s.response_length == 0 for s in third)
        assert {} not in srv.abort_bodies  # never server-wide
        assert not any(srv.written(rid) for rid in ("s004a00", "s005a00"))  # held: no token
        named = [rid for body in srv.abort_bodies for rid in body.get("request_ids", [])]
        if cancel_endpoint:  # vLLM 0.32 with its abort endpoint: aborted by id, the abort chunk read
            assert VLLM_ID_PREFIX + "s003a00" in named and srv.stats.aborted >= 1
            assert VLLM_ID_PREFIX + "s003a00" not in srv.stats.disconnected_rids
        else:  # a server without it (404): cut, the request ended by its client leaving
            assert VLLM_ID_PREFIX + "s003a00" in srv.stats.disconnected_rids and srv.stats.aborted == 0

        args.over_sampling_batch_size = 1
        out = fv.generate_rollout(args, 1, source)
        assert out.samples == [second] and srv.running == 0
        assert sibling.status == env.Sample.Status.COMPLETED and REWARDS[2] == 1  # not generated again
        body = srv.payloads[-1]
        assert body["request_id"] == "s003a01" and body["token_ids"] == cut.tokens[: len(prompt_ids()) + k]
        assert body["sampling_params"]["max_tokens"] == 2000 - k
        assert cut.status == env.Sample.Status.COMPLETED and cut.response_length == k + 5
        assert_call(cut, srv, "s003a00", 0, k, len(prompt_ids()))
        assert_call(cut, srv, "s003a01", k, 5, len(prompt_ids()) + k)
        assert len(mask(env, cut)) == len(cut.rollout_log_probs) == k + 5
        assert cut.weight_versions == ["w1", "w1"]


async def _started(srv: Any, coro: Any, rid: str, tokens: int) -> asyncio.Task:
    """Start ``coro`` and return once the server wrote ``tokens`` of ``rid`` and the client read
    some (past its read window)."""
    task = asyncio.get_running_loop().create_task(coro)
    await wait_until(lambda: srv.written(rid) >= tokens and client_holds_tokens())
    return task


def client_holds_tokens() -> bool:
    """A stream the current scenario opened has read tokens (its progress counter)."""
    return any(stream.tokens for stream in OPENED)


def reader_holds_tokens(sample: Any) -> bool:
    """fastaccum's stream read tokens, or vime's own reader wrote some onto ``sample`` (it writes
    each chunk's tokens as they come)."""
    return client_holds_tokens() or len(sample.tokens or ()) > len(prompt_ids())


def scenario_server_abort_outside_rollout_abort(env: VimeEnv, shape: str) -> None:
    """The server aborts a running request while no rollout abort runs: never an exception in the
    rollout. vLLM 0.32 on ends it with its abort chunk, before 0.32 with [DONE] and no
    finish_reason; either way the sample comes back ABORTED with exactly its prefix, unscored, so
    vime's buffer can resume it."""
    with server_thread(token_rate=400, vllm_shape=shape) as srv, wired(env):
        args = make_args(env, srv, rollout_max_response_len=2000)
        sample = new_sample(env)

        async def main() -> None:
            task = await _started(srv, generate_and_rm(env, args, sample), "s000a00", 5)
            assert srv.abort_now("s000a00") == 1
            await task

        env.run(main())
        k = sample.response_length
        assert sample.status == env.Sample.Status.ABORTED and k == srv.written("s000a00") > 0
        assert_call(sample, srv, "s000a00", 0, k, len(prompt_ids()))
        assert sample.reward is None and REWARDS[0] == 0 and sample.weight_versions == ["w1"]
        # The server ended it (no disconnect), and nothing asked it to.
        assert srv.stats.aborted == 1 and srv.stats.disconnects == 0 and srv.abort_bodies == []
        assert srv.running == 0


def scenario_keep_pause_with_a_version_change(env: VimeEnv, clear_cache: bool) -> None:
    """vLLM paused with keep mid-answer while the trainer sets a new weight version, as vime's
    weight update does: invisible to the sample but in its versions. The answer is whole, every
    token and row as without the pause, and the sample records the version before the pause and
    the one set during it, in order."""
    with (
        server_thread(
            token_rate=400, vllm_server_dev_mode=True, weight_version=WEIGHT_VERSION, enable_return_routed_experts=True
        ) as srv,
        wired(env),
    ):
        args = make_args(env, srv, use_rollout_routing_replay=True, rollout_max_response_len=60)
        sample = new_sample(env)
        # The request stops at its 10th token until the pause call, which so lands mid-answer.
        FAULTS["s000a00"] = {"kind": "hold", "at": 10}

        async def main() -> None:
            call = await _started(srv, generate_and_rm(env, args, sample), "s000a00", 10)
            assert srv.written("s000a00") == 10  # held there
            async with aiohttp.ClientSession() as session:
                pause = {"mode": "keep", "clear_cache": str(clear_cache).lower()}
                async with session.post(srv.url + "/pause", params=pause) as reply:
                    assert reply.status == 200
                async with session.post(srv.url + "/update_weight_version", json={"new_version": "w2"}) as reply:
                    assert reply.status == 200
                assert not call.done()
                async with session.post(srv.url + "/resume") as reply:
                    assert reply.status == 200
            await call

        env.run(main())
        assert sample.status == env.Sample.Status.TRUNCATED and sample.response_length == 60
        assert_call(sample, srv, "s000a00", 0, 60, len(prompt_ids()))
        assert sample.weight_versions == ["w1", "w2"]
        gen = srv.expected("s000a00", 60, prompt_tokens=len(prompt_ids()), routed_experts=True)
        experts = as_array(sample.rollout_routed_experts)
        assert tuple(experts.shape) == (len(sample.tokens) - 1, *srv.expert_shape)
        assert (experts == gen.routed_experts).all()


def scenario_routed_experts(env: VimeEnv) -> None:
    """The finishing chunk's .npy routed experts become vime's int32 tensor of
    (len(tokens) - 1, layers, topk). A resume on the line that resumes from the rows it holds
    (its Sample counts them) asks vLLM for the rest only (routed_experts_prompt_start) and joins
    them to the held rows; on the others it gets and keeps the whole sequence's."""
    with server_thread(enable_return_routed_experts=True, stream_interval=5, num_experts=300) as srv, wired(env):
        args = make_args(env, srv, use_rollout_routing_replay=True, rollout_max_response_len=30)
        sample = env.run(fv.generate(args, new_sample(env), sampling_params(env, args)))
        gen = srv.expected("s000a00", 30, prompt_tokens=len(prompt_ids()), routed_experts=True)
        experts = as_array(sample.rollout_routed_experts)
        assert tuple(experts.shape) == (len(sample.tokens) - 1, *srv.expert_shape)
        assert (experts == gen.routed_experts).all()
        sample.status = env.Sample.Status.ABORTED  # resumed
        params = sampling_params(env, args)
        params["max_new_tokens"] = 40
        env.run(fv.generate(args, sample, params))
        held = len(prompt_ids()) + 29 if hasattr(env.Sample, "get_rollout_routed_experts_length") else 0
        assert srv.payloads[-1]["sampling_params"].get("routed_experts_prompt_start", 0) == held
        rest = srv.expected("s000a01", 10, prompt_tokens=len(prompt_ids()) + 30, routed_experts=True, routed_start=held)
        rows = np.concatenate([gen.routed_experts[:held], rest.routed_experts])
        experts = as_array(sample.rollout_routed_experts)
        assert tuple(experts.shape) == (len(prompt_ids()) + 39, *srv.expert_shape) and (experts == rows).all()


def scenario_sampling_mask(env: VimeEnv) -> None:
    """vLLM's per-chunk sampling_mask becomes vime's top-p CSR (int32 ids and offsets): for a
    finished call, and for a cut prefix (a row for every token kept, as the rows came)."""
    # vLLM replays the sampling distribution only for temperature > 0 and top_k > 0.
    with server_thread(return_sampling_mask=True, stream_interval=3, token_rate=400) as srv, wired(env):
        args = make_args(env, srv, rollout_top_p=0.9, rollout_top_k=50, rollout_max_response_len=30)
        sample = env.run(fv.generate(args, new_sample(env), sampling_params(env, args)))
        if env.line == "pause":  # that line's Sample keeps no top-p CSR (its own generate drops the mask)
            assert not hasattr(sample, "rollout_top_p_token_ids") and sample.response_length == 30
            return
        rows = srv.expected("s000a00", 30, prompt_tokens=len(prompt_ids()), top_p=True).top_p_rows
        ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
        assert ids.dtype == offsets.dtype == __import__("torch").int32
        assert offsets.tolist() == [sum(len(r) for r in rows[:i]) for i in range(31)]
        assert ids.tolist() == [t for row in rows for t in row]

        env.reset()  # a new GenerateState for the new budget
        args = make_args(env, srv, rollout_top_p=0.9, rollout_top_k=50, rollout_max_response_len=2000)
        cut = new_sample(env, 1)

        async def main() -> None:
            task = await _started(srv, generate_and_rm(env, args, cut), "s001a00", 9)
            await fv.request_abort(args, 0)
            await task

        env.run(main())
        k = cut.response_length
        assert cut.status == env.Sample.Status.ABORTED and k > 0
        rows = srv.expected("s001a00", k, prompt_tokens=len(prompt_ids()), top_p=True).top_p_rows
        assert cut.rollout_top_p_token_offsets.tolist() == [sum(len(r) for r in rows[:i]) for i in range(k + 1)]
        assert cut.rollout_top_p_token_ids.tolist() == [t for row in rows for t in row]
        assert srv.running == 0


def scenario_unrelated_cancellation_propagates(env: VimeEnv) -> None:
    """A cancel that is not the rollout abort's leaves the sample as it was and propagates, also
    when it arrives together with the abort's."""
    from fastaccum.vime import _pools

    with server_thread(token_rate=400) as srv, wired(env):
        args = make_args(env, srv, rollout_max_response_len=2000)
        sample, other = new_sample(env, 0), new_sample(env, 1)

        async def main() -> None:
            task = await _started(srv, generate_and_rm(env, args, sample), "s000a00", 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            state = env.rollout.GenerateState(args)
            task = asyncio.get_running_loop().create_task(fv.generate(args, other, sampling_params(env, args)))
            if env.line == "request-abort":
                state.cancellable_tasks.add(task)  # as vime's wrapper does
            await wait_until(lambda: srv.written("s001a00") >= 5)
            if env.line == "request-abort":  # what vime's abort() does to a registered task
                state.aborted = True
                state.cancellable_tasks.discard(task)
                task.cancel()
            else:
                for stream in list(_pools.POOLS.registry().request_streams):
                    stream.abort()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        env.run(main())
        for s in (sample, other):
            assert s.response_length == 0 and s.response == "" and s.loss_mask is None
            assert s.status == env.Sample.Status.PENDING


def scenario_budget_and_headers(env: VimeEnv) -> None:
    """max_new_tokens is reduced by what the sample holds (spent: TRUNCATED, no request; overrun:
    refused); the session header goes out under vime's consistent_hash policy; bad settings fail."""
    with server_thread() as srv, wired(env):
        args = make_args(env, srv, router_policy="consistent_hash", rollout_max_response_len=3)
        sample = new_sample(env)
        sample.session_id = "session-1"
        env.run(fv.generate(args, sample, sampling_params(env, args)))
        assert srv.headers[0]["x-session-id"] == "session-1"
        sample.status = env.Sample.Status.ABORTED
        env.run(fv.generate(args, sample, sampling_params(env, args)))
        assert sample.status == env.Sample.Status.TRUNCATED and srv.requests == 1
        sample.status = env.Sample.Status.ABORTED
        params = sampling_params(env, args)
        params["max_new_tokens"] = 2
        with pytest.raises(ValueError, match="max_new_tokens"):
            env.run(fv.generate(args, sample, params))
        for key, value in (("fastaccum_transport", "aiohttp"), ("fastaccum_abort_mode", "x")):
            bad = make_args(env, srv, **{key: value})
            with pytest.raises(ValueError, match=key):
                env.run(fv.generate(bad, new_sample(env, 2), sampling_params(env, bad)))
        misspelt = make_args(env, srv, fastaccum_cancel_endpiont="off")
        with pytest.raises(SettingsError, match="did you mean 'fastaccum_cancel_endpoint'"):
            env.run(fv.generate(misspelt, new_sample(env, 2), sampling_params(env, misspelt)))
        assert srv.requests == 1


def scenario_register_then_check(env: VimeEnv) -> None:
    """A call that starts after the rollout abort began sends nothing."""
    with server_thread() as srv, wired(env):
        args = make_args(env, srv)
        env.rollout.GenerateState(args).aborted = True
        sample = env.run(fv.generate(args, new_sample(env), sampling_params(env, args)))
        assert sample.status == env.Sample.Status.ABORTED and sample.response_length == 0
        assert srv.requests == 0


def scenario_own_rollout_function(env: VimeEnv) -> None:
    """A rollout function of the user's own runs with vime's abort swapped for request_abort, as
    generate_rollout runs vime's, and the swap is undone afterwards."""
    seen: list[Any] = []

    def mine(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> str:
        seen.append(env.rollout.abort)
        return "output"

    with server_thread() as srv, wired(env):
        assert fv.with_request_abort(mine)(make_args(env, srv), 0, None) == "output"
    assert seen == [fv.request_abort] and env.rollout.abort is not fv.request_abort


def scenario_server_wide_abort_waits_until_idle(env: VimeEnv) -> None:
    """Each line's server-wide abort (until idle; abort_inflight_requests, then /load; pause with
    mode=abort, then /load, then /resume) returns only once the worker is idle, also when it takes
    a few /load polls to end its requests; the call it ended comes back ABORTED with its prefix."""
    with server_thread(token_rate=400) as srv, wired(env):
        args = make_args(env, srv, rollout_max_response_len=100_000)
        sample = new_sample(env)

        async def main() -> int:
            task = await _started(srv, fv.generate(args, sample, sampling_params(env, args)), "s000a00", 5)
            paused = fv._modules.modules().server_abort == "pause"
            srv.abort_lag_polls = 2
            polls = srv.load_polls
            await fv._pools.FRAMEWORK.server_abort(args, [srv.url])
            assert srv.running == 0 and srv.load_polls - polls >= 2  # it waited, asking /load
            await task
            assert srv.resumes == (1 if paused else 0)  # a paused worker takes requests again
            return srv.resumes

        env.run(main())
    assert sample.status == env.Sample.Status.ABORTED and sample.response_length > 0


SCENARIOS: list[tuple[Any, dict[str, Any]]] = [
    (scenario_complete, {"skip_special_tokens": False}),
    (scenario_complete, {"skip_special_tokens": True}),
    (scenario_rollout_abort_and_resume, {"cancel_endpoint": True}),
    (scenario_rollout_abort_and_resume, {"cancel_endpoint": False}),
    (scenario_server_abort_outside_rollout_abort, {"shape": "0.32"}),
    (scenario_server_abort_outside_rollout_abort, {"shape": "0.31"}),
    (scenario_keep_pause_with_a_version_change, {"clear_cache": True}),
    (scenario_keep_pause_with_a_version_change, {"clear_cache": False}),
    (scenario_routed_experts, {}),
    (scenario_sampling_mask, {}),
    (scenario_unrelated_cancellation_propagates, {}),
    (scenario_budget_and_headers, {}),
    (scenario_register_then_check, {}),
    (scenario_own_rollout_function, {}),
    (scenario_server_wide_abort_waits_until_idle, {}),
]


def scenario_params() -> list[Any]:
    return [
        pytest.param(fn, kwargs, id=fn.__name__.removeprefix("scenario_") + "".join(f"-{v}" for v in kwargs.values()))
        for fn, kwargs in SCENARIOS
    ]


# ---- vime's own streaming reader on the same streams (a real tree only) ------------------------
def _in_tree(env: VimeEnv) -> Any:
    return importlib.import_module("vime.rollout.vllm_streaming_rollout").generate_streaming


def comparable(sample: Any) -> dict[str, Any]:
    """What both readers commit, as plain values (vime's reader leaves loss_mask None on a fresh
    sample where vime's append_response_tokens, and so fastaccum, writes ones: compared as such)."""

    def plain(value: Any) -> Any:
        return None if value is None else value.tolist() if hasattr(value, "tolist") else list(value)

    return {
        "tokens": list(sample.tokens),
        "response": sample.response,
        "response_length": sample.response_length,
        "loss_mask": sample.loss_mask if sample.loss_mask is not None else [1] * sample.response_length,
        "rollout_log_probs": list(sample.rollout_log_probs or []),
        "status": sample.status,
        "weight_versions": list(sample.weight_versions),
        "top_p_ids": plain(getattr(sample, "rollout_top_p_token_ids", None)),
        "top_p_offsets": plain(getattr(sample, "rollout_top_p_token_offsets", None)),
        "routed_experts": None
        if sample.rollout_routed_experts is None
        else plain(as_array(sample.rollout_routed_experts)),
        "prefix_cache": (sample.prefix_cache_info.cached_tokens, sample.prefix_cache_info.total_prompt_tokens),
    }


def scenario_in_tree_same_results(env: VimeEnv, stop: bool) -> None:
    """On the same vLLM stream (routed experts, sampling mask, interval 3), vime's
    generate_streaming and fastaccum.vime.generate commit the same sample."""
    options = {"enable_return_routed_experts": True, "return_sampling_mask": True, "stream_interval": 3}
    with server_thread(**options) as srv, wired(env):
        stops = srv.stop_tokens({"s000a00": 17}, {}) if stop else None
        args = make_args(
            env,
            srv,
            rollout_max_response_len=50,
            rollout_top_p=0.9,
            rollout_top_k=50,
            use_rollout_routing_replay=True,
            rollout_stop_token_ids=stops,
        )
        # vime's reader sends no request_id: its X-Request-Id names it as ours is (the same stream).
        env.http_utils._http_client.headers["X-Request-Id"] = "s000a00"
        ours = env.run(fv.generate(args, new_sample(env, 0), sampling_params(env, args)))
        theirs = env.run(_in_tree(env)(args, new_sample(env, 0), sampling_params(env, args)))
        assert "request_id" not in srv.payloads[1] and srv.stats.completed == 2
        assert theirs.loss_mask is None  # vime's streaming reader never sets it on a fresh sample
        mine, vimes = comparable(ours), comparable(theirs)
        if env.line == "pause":
            # That line's reader asks for no usage chunk and reads no weight version: its sample
            # has neither, where fastaccum's has both (the same values as on the other lines).
            assert (vimes["weight_versions"], vimes["prefix_cache"]) == ([], (0, 0))
            assert (mine["weight_versions"], mine["prefix_cache"]) == (["w1"], (0, len(prompt_ids())))
            del mine["weight_versions"], mine["prefix_cache"], vimes["weight_versions"], vimes["prefix_cache"]
        assert mine == vimes, {k: (mine[k], vimes[k]) for k in mine if mine[k] != vimes[k]}
        assert ours.response_length == (17 if stop else 50)


def scenario_in_tree_server_abort_before_0_32(env: VimeEnv) -> None:
    """A server-side abort on vLLM before 0.32 ([DONE], no finish_reason), no rollout abort
    running: fastaccum returns the sample ABORTED with its prefix (vime keeps it unscored, and
    its buffer can resume it); vime's reader writes the partial tokens and either raises
    (2b83ea20) or returns the sample still PENDING (052693a8, edbcb4c9), which vime then scores."""
    with server_thread(token_rate=400, vllm_shape="0.31") as srv, wired(env):
        args = make_args(env, srv, rollout_max_response_len=2000)
        env.http_utils._http_client.headers["X-Request-Id"] = "vime-reader"  # its request, named

        async def run(generate: Any, sample: Any, rid: str) -> BaseException | None:
            task = asyncio.get_running_loop().create_task(generate(args, sample, sampling_params(env, args)))
            await wait_until(lambda: srv.written(rid) >= 5 and reader_holds_tokens(sample))
            assert srv.abort_now(rid) == 1
            try:
                await task
            except Exception as exc:
                return exc
            return None

        ours, theirs = new_sample(env, 0), new_sample(env, 1)
        assert env.run(run(fv.generate, ours, "s000a00")) is None
        assert ours.status == env.Sample.Status.ABORTED and ours.response_length == srv.written("s000a00") > 0
        failed = env.run(run(_in_tree(env), theirs, "vime-reader"))
        if env.line == "request-abort":
            assert "without a terminal finish_reason" in str(failed)
        else:
            assert failed is None
        assert theirs.response_length > 0 and theirs.status == env.Sample.Status.PENDING  # half-written


IN_TREE: list[tuple[Any, dict[str, Any]]] = [
    (scenario_in_tree_same_results, {"stop": False}),
    (scenario_in_tree_same_results, {"stop": True}),
    (scenario_in_tree_server_abort_before_0_32, {}),
]


def in_tree_params() -> list[Any]:
    return [
        pytest.param(fn, kwargs, id=fn.__name__.removeprefix("scenario_") + "".join(f"-{v}" for v in kwargs.values()))
        for fn, kwargs in IN_TREE
    ]
