"""Harness for the slime adapter tests: stubs, a slime loader, the emulator thread and the scenarios.

Every scenario takes a ``SlimeEnv`` (the double of ``tests/slime_double`` or a real slime checkout)
and drives ``fastaccum.slime`` against the embedded emulator over loopback HTTP, so the same
assertions run against both (tests/test_slime.py: double; tests/test_slime_real.py: both). Loaded
by file path and registered as ``fastaccum_slime_harness`` so slime's ``load_function`` can reach
the reward function below.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import sys
import threading
import time
import types
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np
import pytest
import torch
from aiohttp import web

import fastaccum
import fastaccum.slime as fs
from fastaccum.emulator import FAULT_KEY, Emulator
from fastaccum.errors import ServerError, SettingsError, StreamFormatError, StreamTruncatedError
from fastaccum.result import StreamResult
from fastaccum.slime import _commit, _generate, _modules, _pools, _probe
from fastaccum.transport.aiohttp_stream import GenerateStream
from fastaccum.transport.client import DEFAULT_COALESCE_MS, ClientStream
from fastaccum.transport.consumer import StreamConsumer

OPEN_STREAM = _pools.POOLS.open_stream  # the adapter's own, which Wiring wraps
NEW_RID = _generate.new_rid  # likewise

DOUBLE_ROOT = str(Path(__file__).resolve().parent)
PROMPT = "alpha beta gamma delta epsilon zeta eta theta"
SLIME_PACKAGES = ("slime", "slime_plugins")


# ---- stubs and loading -------------------------------------------------------------------------
class FakeTokenizer:
    """One id per word; decode renders ids, so a decoded text is recognisable in assertions."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [1000 + (sum(map(ord, word)) % 5000) for word in text.split()]

    def decode(self, ids: Any, **options: Any) -> str:
        FakeTokenizer.decodes += 1
        return "".join(f"<{int(i)}>" for i in ids)

    decodes = 0


def install_stubs() -> list[str]:
    """ray, sglang_router and transformers, the way slime's plugin-contract tests stub them;
    returns the names installed (removed again when the env closes)."""
    before = set(sys.modules)
    if "ray" not in sys.modules:
        ray = types.ModuleType("ray")
        ray._private = SimpleNamespace(services=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"))
        sys.modules["ray"] = ray
    sys.modules.setdefault("sglang_router", types.ModuleType("sglang_router"))
    if "transformers" not in sys.modules:
        tf = types.ModuleType("transformers")
        tf.AutoTokenizer = type("AutoTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: FakeTokenizer())})

        def no_processor(*args: Any, **kwargs: Any) -> Any:
            raise OSError("no processor in tests")

        tf.AutoProcessor = type("AutoProcessor", (), {"from_pretrained": staticmethod(no_processor)})
        tf.PreTrainedTokenizerBase = type("PreTrainedTokenizerBase", (), {})
        tf.ProcessorMixin = type("ProcessorMixin", (), {})
        sys.modules["transformers"] = tf
    return [name for name in ("ray", "sglang_router", "transformers") if name not in before]


def _purge_slime() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in SLIME_PACKAGES:
            del sys.modules[name]
    _modules.forget()


@dataclasses.dataclass
class SlimeEnv:
    kind: str  # "double" | "real"
    root: str
    line: str  # "stock" | "request-abort" (docs/slime.md, "Two slime lines")
    rollout: Any
    misc: Any
    http_utils: Any
    async_utils: Any
    server_control: Any
    Sample: Any
    transport: str = "client"  # fastaccum_transport for every scenario's args

    def run(self, coro: Any) -> Any:
        """Run on slime's background loop, where slime's rollouts (and so fastaccum) run."""
        return self.async_utils.run(coro)

    def reset(self) -> None:
        self.misc.SingletonMeta._instances.clear()
        self.misc.load_function.cache_clear()
        _probe.checked_modes.clear()
        REWARDS.clear()


LINES = ("stock", "request-abort")
TRANSPORTS = ("client", "aiohttp")  # fastaccum_transport: Client is the default
# Client's streams read in Ray actors (fastaccum_shards; tests/shards runs the scenarios this way)
SHARDS = "shards"


@contextlib.contextmanager
def slime_env(kind: str, root: str, line: str | None = None, transport: str = "client") -> Iterator[SlimeEnv]:
    """slime's modules from ``root``. The double models the ``line`` asked for; a real checkout
    is the line it is (a build with request-level abort has ``_run_request_abortable_generate``)."""
    stubs = install_stubs()
    _purge_slime()
    sys.path.insert(0, root)
    try:
        from slime.backends.sglang_utils import server_control
        from slime.rollout import sglang_rollout
        from slime.utils import async_utils, http_utils, misc
        from slime.utils.types import Sample

        if kind == "double":
            assert line in LINES, line
            sglang_rollout.REQUEST_ABORT = line == "request-abort"
        else:
            line = "request-abort" if hasattr(sglang_rollout, "_run_request_abortable_generate") else "stock"
        env = SlimeEnv(
            kind, root, line, sglang_rollout, misc, http_utils, async_utils, server_control, Sample, transport
        )
        yield env
        env.run(fs.close_session())
        if http_utils._http_client is not None:
            env.run(http_utils._http_client.aclose())
            http_utils._http_client = None
    finally:
        sys.path.remove(root)
        _purge_slime()
        for name in stubs:
            sys.modules.pop(name, None)


# ---- the emulator on its own thread ------------------------------------------------------------
class RouterEmulator(Emulator):
    """The emulator doubling as slime's router: ``GET /workers`` lists itself as the one worker.
    It records every ``/abort_request`` body, to tell the server-wide abort from aborts by rid."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.abort_bodies: list[dict[str, Any]] = []
        self.refuse: list[int] = []  # statuses for the next /generate requests, as a restarting server answers
        self.generates = 0  # /generate requests received, refused ones included

    @property
    def server_wide_aborts(self) -> int:
        return sum(1 for body in self.abort_bodies if body.get("abort_all"))

    @property
    def aborted_rids(self) -> list[str]:
        return [body["rid"] for body in self.abort_bodies if body.get("rid")]

    def make_app(self) -> web.Application:
        app = super().make_app()
        app.router.add_get("/workers", self._workers)

        @web.middleware
        async def refuse(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path == "/generate":
                self.generates += 1
                if self.refuse:
                    await request.read()
                    return web.json_response({"error": "starting"}, status=self.refuse.pop(0))
            return await handler(request)

        app.middlewares.append(refuse)
        return app

    async def _abort_request(self, request: web.Request) -> web.Response:
        self.abort_bodies.append(await request.json())
        return await super()._abort_request(request)

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": self.url}]})

    def _make_request(self, body: dict[str, Any], fault: dict[str, Any]) -> Any:
        # Generate functions that send no rid (slime's own) get a fixed one, so their token
        # stream is known in advance like fastaccum's.
        body.setdefault("rid", UNNAMED_RID)
        return super()._make_request(body, fault)


UNNAMED_RID = "unnamed-000"


@contextlib.contextmanager
def emulator_thread(**options: Any) -> Iterator[RouterEmulator]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True, name="emulator")
    thread.start()
    emulator = RouterEmulator(**options)
    asyncio.run_coroutine_threadsafe(emulator.start(), loop).result(10)
    try:
        yield emulator
    finally:
        asyncio.run_coroutine_threadsafe(emulator.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


# ---- per-test wiring: deterministic rids, per-rid plans, reward counting -----------------------
REWARDS: Counter[int] = Counter()


async def count_reward(args: Any, sample: Any) -> float:
    """The tests' reward function: counts calls per sample index; a short sleep lets streams run."""
    REWARDS[sample.index] += 1
    await asyncio.sleep(getattr(args, "test_reward_delay", 0.0))
    return float(sample.response_length)


@dataclasses.dataclass
class Wiring:
    """Names every request ``s<index>a<attempt>`` on the wire (fixed width: never a prefix of
    another rid), so the emulator's tokens are known in advance, and applies per-rid plans:
    ``{"stop_at": k}`` (a stop token at position k) or ``{"fault": {...}}``. The adapter's own
    ``new_rid`` still runs for every call, and what it made is held to SGLang's rule when the
    scenario ends (``check_rids``)."""

    emulator: Emulator
    plans: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    attempts: Counter[int] = dataclasses.field(default_factory=Counter)
    payloads: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    headers: list[Any] = dataclasses.field(default_factory=list)
    streams: list[StreamConsumer] = dataclasses.field(default_factory=list)
    made: list[str] = dataclasses.field(default_factory=list)  # the adapter's own rids, one per call

    def rid(self, sample: Any) -> str:
        self.made.append(NEW_RID(sample))
        rid = f"s{sample.index:03d}a{self.attempts[sample.index]:02d}"
        self.attempts[sample.index] += 1
        return rid

    def open_stream(self, args: Any, settings: Any, payload: dict[str, Any], **kwargs: Any) -> StreamConsumer:
        """``fastaccum.slime._pools.POOLS.open_stream`` with this wiring's plan applied to the request."""
        self.payloads.append(payload)
        self.headers.append(kwargs.get("headers"))
        plan = self.plans.get(payload["rid"], {})
        payload = dict(payload)
        if "stop_at" in plan:
            k = plan["stop_at"]
            stop = self.emulator.expected(payload["rid"], k).token_ids[k - 1]
            payload["sampling_params"] = {**payload["sampling_params"], "stop_token_ids": [stop]}
        if "fault" in plan:
            payload[FAULT_KEY] = plan["fault"]
        stream = OPEN_STREAM(args, settings, payload, **kwargs)
        self.streams.append(stream)
        return stream


CURRENT: list[Wiring] = []  # the scenario's wiring, while it runs


@contextlib.contextmanager
def wired(env: SlimeEnv, emulator: Emulator) -> Iterator[Wiring]:
    env.reset()
    # slime's RolloutManager creates the shared httpx client before any rollout.
    env.http_utils.init_http_client(
        SimpleNamespace(rollout_num_engines=1, sglang_server_concurrency=8, use_distributed_post=False)
    )
    wiring = Wiring(emulator)
    CURRENT.append(wiring)
    _pools.POOLS.stats.close()  # counts start with the scenario
    patch = pytest.MonkeyPatch()
    patch.setattr(_generate, "new_rid", wiring.rid)
    patch.setattr(_pools.POOLS, "open_stream", wiring.open_stream)
    try:
        yield wiring
        check_rids(wiring.made)
    finally:
        CURRENT.remove(wiring)
        patch.undo()
        env.reset()


def check_rids(rids: list[str]) -> None:
    """SGLang's scheduler aborts every rid that starts with the one asked for: each call's rid is
    its own, and none is a prefix of another (in sorted order a prefix sits right before a rid it
    starts)."""
    assert len(set(rids)) == len(rids), f"a rid was made twice: {sorted(rids)}"
    ordered = sorted(rids)
    clashes = [(a, b) for a, b in zip(ordered, ordered[1:]) if b.startswith(a)]
    assert not clashes, f"rids that prefix another: {clashes}"


def make_args(env: SlimeEnv, emulator: Emulator, **overrides: Any) -> SimpleNamespace:
    args = SimpleNamespace(
        hf_checkpoint="fake-model",
        sglang_router_ip=emulator.host,
        sglang_router_port=emulator.port,
        sglang_server_concurrency=8,
        rollout_num_engines=1,
        rollout_num_gpus=1,
        rollout_num_gpus_per_engine=1,
        sglang_dp_size=None,
        use_distributed_post=False,
        rollout_temperature=1.0,
        rollout_top_p=1.0,
        rollout_top_k=-1,
        rollout_max_response_len=40,
        rollout_stop=None,
        rollout_stop_token_ids=None,
        rollout_skip_special_tokens=False,
        rollout_seed=0,
        sglang_enable_deterministic_inference=False,
        ci_test=False,
        partial_rollout=False,
        mask_offpolicy_in_partial_rollout=False,
        group_rm=False,
        custom_generate_function_path="fastaccum.slime.generate",
        custom_rm_path="fastaccum_slime_harness.count_reward",
        rm_type=None,
        reward_key=None,
        rollout_global_dataset=True,
        rollout_batch_size=1,
        n_samples_per_prompt=1,
        over_sampling_batch_size=1,
        dynamic_sampling_filter_path=None,
        rollout_sample_filter_path=None,
        rollout_all_samples_process_path=None,
        rollout_sample_hook_path=None,
        buffer_filter_path=None,
        use_rollout_routing_replay=False,
        num_layers=emulator.expert_shape[0],
        moe_router_topk=emulator.expert_shape[1],
        router_policy=None,
        sglang_incremental_streaming_output=emulator.incremental_streaming_output,
        fastaccum_idle_timeout=5.0,
        fastaccum_idle_poll_interval=0.02,
        fastaccum_transport="client" if env.transport == SHARDS else env.transport,
        fastaccum_shards=2 if env.transport == SHARDS else None,
    )
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


class BufferedPrompts:
    """A data source with slime's buffer semantics: buffered groups first, ``add_samples`` asserts
    whole groups (``len(group) == n_samples_per_prompt``)."""

    def __init__(self, env: SlimeEnv, args: Any) -> None:
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
                group.append(self.env.Sample(index=self.next_index, group_index=len(groups), prompt=PROMPT))
                self.next_index += 1
            groups.append(group)
            self.created.append(group)
        return groups

    def add_samples(self, groups: list[list[Any]]) -> None:
        for group in groups:
            assert len(group) == self.args.n_samples_per_prompt
        self.buffer.extend(groups)
        self.added.append(groups)


def new_sample(env: SlimeEnv, index: int = 0) -> Any:
    return env.Sample(index=index, prompt=PROMPT)


def sampling_params(env: SlimeEnv, args: Any) -> dict[str, Any]:
    return env.rollout.GenerateState(args).sampling_params.copy()


async def wait_until(predicate: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def prompt_ids() -> list[int]:
    return FakeTokenizer().encode(PROMPT)


def expected(emulator: Emulator, rid: str, n: int, *, prompt_tokens: int | None = None, **kwargs: Any) -> Any:
    return emulator.expected(
        rid, n, prompt_tokens=len(prompt_ids()) if prompt_tokens is None else prompt_tokens, **kwargs
    )


def assert_call(sample: Any, emulator: Emulator, rid: str, start: int, n: int, prompt_tokens: int) -> None:
    """Response positions [start, start + n) are exactly ``rid``'s first n tokens (no duplicates)."""
    gen = expected(emulator, rid, n, prompt_tokens=prompt_tokens)
    base = len(prompt_ids())
    assert sample.tokens[base + start : base + start + n] == list(gen.token_ids)
    assert sample.rollout_log_probs[start : start + n] == [float(x) for x in gen.logprobs]


# ---- scenarios ---------------------------------------------------------------------------------
def scenario_stream_modes(env: SlimeEnv, incremental: bool, interval: int) -> None:
    with (
        emulator_thread(incremental_streaming_output=incremental, stream_interval=interval) as emu,
        wired(env, emu) as wiring,
    ):
        args = make_args(env, emu, rollout_max_response_len=100)
        wiring.plans["s001a00"] = {"stop_at": 7}

        async def main() -> tuple[Any, Any]:
            truncated = await fs.generate(args, new_sample(env, 0), sampling_params(env, args))
            stopped = await fs.generate(args, new_sample(env, 1), sampling_params(env, args))
            return truncated, stopped

        truncated, stopped = env.run(main())
        gen = expected(emu, "s000a00", 100)
        assert truncated.tokens == prompt_ids() + list(gen.token_ids)
        assert all(isinstance(t, int) for t in truncated.tokens)
        assert truncated.rollout_log_probs == [float(x) for x in gen.logprobs]
        assert truncated.response == gen.text(0, 100)
        assert truncated.response_length == 100 and truncated.loss_mask == [1] * 100
        assert truncated.status == env.Sample.Status.TRUNCATED
        assert truncated.weight_versions == ["default"]  # one terminal commit
        assert truncated.prefix_cache_info.total_prompt_tokens == len(prompt_ids())
        assert stopped.status == env.Sample.Status.COMPLETED and stopped.response_length == 7
        # fastaccum_transport picks the transport; only Client measures timing.
        assert all(type(stream) is stream_class(env) for stream in wiring.streams)
        if env.transport != "aiohttp":
            (timing,) = truncated.metadata["fastaccum_timing"]
            assert timing["tokens"] == 100 and timing["events"] >= 100 // interval
            assert 0 < timing["first_token_s"] <= timing["duration_s"]
        else:
            assert "fastaccum_timing" not in truncated.metadata
        body = wiring.payloads[0]
        assert body["stream"] is True and body["return_logprob"] is True and body["input_ids"] == prompt_ids()
        assert body["sampling_params"]["max_new_tokens"] == 100 and "return_routed_experts" not in body


def scenario_routed_experts_and_top_p(env: SlimeEnv, incremental: bool) -> None:
    with (
        emulator_thread(
            incremental_streaming_output=incremental, stream_interval=5, enable_return_routed_experts=True
        ) as emu,
        wired(env, emu) as wiring,
    ):
        args = make_args(env, emu, use_rollout_routing_replay=True, rollout_top_p=0.9, rollout_max_response_len=30)
        sample = env.run(fs.generate(args, new_sample(env), sampling_params(env, args)))
        gen = expected(emu, "s000a00", 30, top_p=True, routed_experts=True)
        assert wiring.payloads[0]["return_routed_experts"] is True
        assert wiring.payloads[0]["sampling_params"]["custom_params"] == {"return_top_p_token_ids": True}
        experts = sample.rollout_routed_experts
        assert torch.is_tensor(experts) and experts.dtype == torch.int32
        assert tuple(experts.shape) == (len(sample.tokens) - 1, *emu.expert_shape)
        assert np.array_equal(experts.numpy(), gen.routed_experts)
        ids, offsets = sample.rollout_top_p_token_ids, sample.rollout_top_p_token_offsets
        assert torch.is_tensor(ids) and ids.dtype == torch.int32 and offsets.dtype == torch.int32
        assert offsets.tolist() == list(np.cumsum([0] + [len(r) for r in gen.top_p_rows]))
        assert ids.tolist() == [t for row in gen.top_p_rows for t in row]


async def _start_and_wait(emu: Emulator, coro: Any, tokens: int) -> asyncio.Task:
    """Start ``coro`` and return once the server decoded ``tokens`` and the client holds some."""
    task = asyncio.get_running_loop().create_task(coro)
    await wait_until(lambda: emu.stats.tokens >= tokens and client_holds_tokens())
    return task


def client_holds_tokens() -> bool:
    """A stream the current scenario opened has read tokens (its progress counter)."""
    return any(stream.tokens for stream in CURRENT[-1].streams)


def drains(env: SlimeEnv) -> bool:
    """A request-level abort ends the request by rid and reads its terminal abort event (fastaccum's
    Client, the default transport, also in shards); the aiohttp transport cuts the connection instead."""
    return env.transport != "aiohttp"


def stream_class(env: SlimeEnv) -> type:
    if env.transport == SHARDS:
        from fastaccum.ray import ShardStream

        return ShardStream
    return ClientStream if env.transport == "client" else GenerateStream


def generate_and_rm(env: SlimeEnv, args: Any, sample: Any) -> Any:
    """One sample the way slime's rollout runs it (on a request-abort line: inside the wrapper
    that registers the task for abort's cancel)."""
    return env.rollout.generate_and_rm(args, sample, sampling_params(env, args))


def assert_kept_what_was_sent(sample: Any, emulator: Emulator, rid: str, start: int = 0) -> None:
    """The cut call kept a non-empty prefix of what the server wrote, token for token. Events the
    server wrote after the client's last read and before its close were never received: the
    server sees a closed connection only at its next write."""
    k = sample.response_length - start
    written = emulator.stats.written.get(rid, 0)
    assert 0 < k <= written, (k, written)
    assert_call(sample, emulator, rid, start, k, len(prompt_ids()))


def scenario_deliberate_cancel_then_resume(env: SlimeEnv, incremental: bool) -> None:
    """request_abort keeps the observed prefix (ABORTED): drained, with the routing of every kept
    position from the terminal abort event; cut, without. The resume adds no duplicated token and
    asks only for the routing the sample does not hold (routed_experts_start_len = the rows held:
    prompt + k - 1 drained, none cut), then holds one row per position, none twice."""
    with (
        emulator_thread(
            incremental_streaming_output=incremental, token_rate=400, enable_return_routed_experts=True
        ) as emu,
        wired(env, emu) as wiring,
    ):
        args = make_args(env, emu, use_rollout_routing_replay=True, rollout_max_response_len=2000, partial_rollout=True)
        sample = new_sample(env)
        wiring.plans["s000a01"] = {"stop_at": 5}

        async def first() -> Any:
            task = await _start_and_wait(emu, generate_and_rm(env, args, sample), 10)
            groups = await fs.request_abort(args, 0)
            assert groups == []  # nothing pending in this direct call
            return await task

        env.run(first())
        k = sample.response_length
        assert sample.status == env.Sample.Status.ABORTED and 0 < k < 2000 and sample.reward is None
        assert sample.weight_versions == ["default"]
        assert_kept_what_was_sent(sample, emu, "s000a00")
        assert sample.response == expected(emu, "s000a00", k).text(0, k)
        assert emu.server_wide_aborts == 0
        if drains(env):  # ended by rid: the terminal abort event routed every kept position
            assert emu.aborted_rids == ["s000a00"] and "s000a00" not in emu.stats.disconnected_rids
            assert tuple(sample.rollout_routed_experts.shape) == (len(prompt_ids()) + k - 1, *emu.expert_shape)
            rows = expected(emu, "s000a00", k, prompt_tokens=len(prompt_ids()), routed_experts=True).routed_experts
            assert np.array_equal(sample.rollout_routed_experts.numpy(), rows)
        else:
            assert "s000a00" in emu.stats.disconnected_rids and emu.abort_bodies == []
        assert emu.running == 0  # request_abort returned with the server idle

        env.rollout.GenerateState(args).reset()
        env.run(fs.generate(args, sample, sampling_params(env, args)))
        assert wiring.payloads[1]["input_ids"] == sample.tokens[: len(prompt_ids()) + k]
        assert wiring.payloads[1]["sampling_params"]["max_new_tokens"] == 2000 - k
        held = len(prompt_ids()) + k - 1 if drains(env) else 0
        assert wiring.payloads[1].get("routed_experts_start_len", 0) == held
        assert sample.status == env.Sample.Status.COMPLETED and sample.response_length == k + 5
        assert_call(sample, emu, "s000a00", 0, k, len(prompt_ids()))
        assert_call(sample, emu, "s000a01", k, 5, len(prompt_ids()) + k)
        assert len(sample.loss_mask) == len(sample.rollout_log_probs) == k + 5
        new_rows = expected(
            emu, "s000a01", 5, prompt_tokens=len(prompt_ids()) + k, routed_experts=True, routed_start=held
        ).routed_experts
        first_rows = expected(emu, "s000a00", k, prompt_tokens=len(prompt_ids()), routed_experts=True).routed_experts
        rows = np.concatenate([first_rows[:held], new_rows])
        assert tuple(sample.rollout_routed_experts.shape) == (len(sample.tokens) - 1, *emu.expert_shape)
        assert np.array_equal(sample.rollout_routed_experts.numpy(), rows)


def scenario_unrelated_cancellation_propagates(env: SlimeEnv) -> None:
    """A cancel that is not the rollout abort's leaves the sample as it was and propagates, also
    when it arrives together with the abort's."""
    with emulator_thread(token_rate=400) as emu, wired(env, emu):
        args = make_args(env, emu, rollout_max_response_len=2000)
        sample = new_sample(env)

        async def main() -> None:
            task = await _start_and_wait(emu, generate_and_rm(env, args, sample), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # A rollout abort racing with the caller's own cancel: the caller's wins.
            other = new_sample(env, 1)
            state = env.rollout.GenerateState(args)
            task = asyncio.get_running_loop().create_task(fs.generate(args, other, sampling_params(env, args)))
            if env.line == "request-abort":
                state.cancellable_tasks.add(task)  # as slime's wrapper does, before the call starts
            await wait_until(lambda: emu.stats.tokens >= 20 and client_holds_tokens())
            if env.line == "request-abort":  # what slime's abort() does to a registered task
                state.aborted = True
                state.cancellable_tasks.discard(task)
                task.cancel()
            else:
                for stream in list(_pools.POOLS.registry().request_streams):
                    stream.abort()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert other.response_length == 0 and other.status == env.Sample.Status.PENDING

        env.run(main())
        assert sample.response_length == 0 and sample.response == ""  # nothing committed
        assert sample.status == env.Sample.Status.PENDING and sample.loss_mask is None
        assert all(not r.request_streams for r in _pools.POOLS.registries())


def scenario_server_abort_commits_terminal(env: SlimeEnv, incremental: bool) -> None:
    """SGLang's abort_all ends a running stream with a terminal abort chunk and a queued one with
    the echo chunk: both are terminal events, committed like any other."""
    with (
        emulator_thread(incremental_streaming_output=incremental, token_rate=400, max_running_requests=1) as emu,
        wired(env, emu),
    ):
        args = make_args(env, emu, rollout_max_response_len=2000)
        running, queued = new_sample(env, 0), new_sample(env, 1)

        async def main() -> None:
            first = await _start_and_wait(emu, fs.generate(args, running, sampling_params(env, args)), 5)
            second = asyncio.get_running_loop().create_task(fs.generate(args, queued, sampling_params(env, args)))
            await wait_until(lambda: emu.queued == 1)
            async with aiohttp.ClientSession() as session:
                await session.post(emu.url + "/abort_request", json={"abort_all": True})
            await asyncio.gather(first, second)

        env.run(main())
        assert running.status == env.Sample.Status.ABORTED and running.response_length > 0
        assert running.weight_versions == ["default"]  # terminal bookkeeping ran
        assert_call(running, emu, "s000a00", 0, running.response_length, len(prompt_ids()))
        assert queued.status == env.Sample.Status.ABORTED and queued.response_length == 0


def scenario_weight_update_pause(env: SlimeEnv, pause_mode: str, incremental: bool) -> None:
    """SGLang paused mid-answer for a weight update, as a trainer pauses it. retract and in_place
    are invisible to the sample but in its versions: the answer is whole and records the version
    before the pause and the one set during it, in order. An abort pause ends the stream with
    SGLang's abort event: the sample is ABORTED with its prefix and the routing of every kept
    position, never an exception."""
    with (
        emulator_thread(
            incremental_streaming_output=incremental, token_rate=400, enable_return_routed_experts=True
        ) as emu,
        wired(env, emu) as wiring,
    ):
        args = make_args(env, emu, use_rollout_routing_replay=True, rollout_max_response_len=60)
        sample = new_sample(env, 0)
        # The request stops at its 10th token until the pause call, which so lands mid-answer.
        wiring.plans["s000a00"] = {"fault": {"kind": "hold", "at": 10}}

        async def main() -> None:
            call = await _start_and_wait(emu, fs.generate(args, sample, sampling_params(env, args)), 10)
            assert emu.stats.tokens == 10  # held there
            async with aiohttp.ClientSession() as session:
                # SGLang answers an abort pause once every stream ended, the others at once.
                async with session.post(emu.url + "/pause_generation", json={"mode": pause_mode}) as reply:
                    assert reply.status == 200
                if pause_mode != "abort":
                    version = {"new_version": "v2", "abort_all_requests": False}
                    async with session.post(emu.url + "/update_weight_version", json=version) as reply:
                        assert reply.status == 200
                    assert not call.done()
                async with session.post(emu.url + "/continue_generation", json={}) as reply:
                    assert reply.status == 200
            await call

        env.run(main())
        n = sample.response_length
        assert_call(sample, emu, "s000a00", 0, n, len(prompt_ids()))
        experts = sample.rollout_routed_experts
        assert tuple(experts.shape) == (len(sample.tokens) - 1, *emu.expert_shape)
        gen = expected(emu, "s000a00", n, routed_experts=True)
        assert np.array_equal(experts.numpy(), gen.routed_experts)
        if pause_mode == "abort":
            assert sample.status == env.Sample.Status.ABORTED and 10 <= n <= 11, n  # with the step in flight
            assert sample.weight_versions == ["default"]
        else:
            assert sample.status == env.Sample.Status.TRUNCATED and n == 60
            assert sample.weight_versions == ["default", "v2"]


def scenario_errors_fail_closed(env: SlimeEnv) -> None:
    faults = [
        ({"kind": "error_event", "at": 2, "message": "boom"}, ServerError),
        ({"kind": "cut", "at": 2}, StreamTruncatedError),
        ({"kind": "malformed_json", "at": 1}, StreamFormatError),
        ({"kind": "http_500"}, ServerError),
    ]
    with emulator_thread() as emu, wired(env, emu) as wiring:
        args = make_args(env, emu)
        for index, (fault, error) in enumerate(faults):
            wiring.plans[f"s{index:03d}a00"] = {"fault": fault}
            sample = new_sample(env, index)
            with pytest.raises(error):
                env.run(fs.generate(args, sample, sampling_params(env, args)))
            assert sample.response_length == 0 and sample.status == env.Sample.Status.PENDING
    for result, error in refused_results():
        sample = new_sample(env)
        sample.tokens = prompt_ids()
        with pytest.raises(error):
            _commit.commit_terminal(SimpleNamespace(), sample, result, FakeTokenizer(), None)
        assert sample.response_length == 0


def refused_results() -> list[tuple[StreamResult, type[Exception]]]:
    """Terminal results an adapter refuses to commit, with the error each raises: an abort with a
    status code, an unknown finish type, a null logprob."""
    base = StreamResult(
        mode="cumulative",
        token_ids=np.array([5, 6], np.int32),
        logprobs=np.array([-0.1, -0.2]),
        text="ab",
        meta_info={},
    )
    return [
        (dataclasses.replace(base, finish_reason={"type": "abort", "status_code": 400, "message": "bad"}), ServerError),
        (dataclasses.replace(base, finish_reason={"type": "weird"}), StreamFormatError),
        (
            dataclasses.replace(base, finish_reason={"type": "stop"}, logprobs=np.array([-0.1, np.nan])),
            StreamFormatError,
        ),
    ]


def scenario_register_then_check(env: SlimeEnv) -> None:
    """A generate call that starts after the abort swept the registry sends nothing."""
    with emulator_thread() as emu, wired(env, emu):
        for top_p in (1.0, 0.9):
            args = make_args(env, emu, rollout_top_p=top_p)
            env.rollout.GenerateState(args).aborted = True
            sample = env.run(fs.generate(args, new_sample(env), sampling_params(env, args)))
            assert sample.status == env.Sample.Status.ABORTED and sample.response_length == 0
            env.reset()
        assert emu.stats.requests == 0


def scenario_budget_and_headers(env: SlimeEnv) -> None:
    with emulator_thread() as emu, wired(env, emu) as wiring:
        args = make_args(env, emu, router_policy="consistent_hashing", rollout_max_response_len=3)
        sample = new_sample(env)
        sample.session_id = "session-1"
        env.run(fs.generate(args, sample, sampling_params(env, args)))
        assert wiring.headers[0] == {"X-SMG-Routing-Key": "session-1"}
        sample.status = env.Sample.Status.ABORTED  # a resumed sample whose budget is spent
        env.run(fs.generate(args, sample, sampling_params(env, args)))
        assert sample.status == env.Sample.Status.TRUNCATED and len(wiring.payloads) == 1
        sample.status = env.Sample.Status.ABORTED
        params = sampling_params(env, args)
        params["max_new_tokens"] = 2  # overrun (THUDM/slime#2260)
        with pytest.raises(ValueError, match="max_new_tokens"):
            env.run(fs.generate(args, sample, params))
        params["max_new_tokens"] = None
        with pytest.raises(ValueError, match="rollout-max-response-len"):
            env.run(fs.generate(args, new_sample(env, 1), params))
        for key, value in (
            ("fastaccum_transport", "httpx"),
            ("fastaccum_coalesce_ms", -1),
            ("fastaccum_coalesce_ms", "x"),
        ):
            bad = make_args(env, emu, **{key: value})
            with pytest.raises(ValueError, match=key):
                env.run(fs.generate(bad, new_sample(env, 2), sampling_params(env, bad)))


def scenario_second_router_gets_its_own_pool(env: SlimeEnv) -> None:
    """A second router URL on the same loop gets a Client of its own, so a stream still running on
    the first router is not cut; each call reads with the window its own settings name, also on a
    pool made under other settings; close_session closes every pool."""
    # Shards: the second router's pool starts Ray actors first (seconds on a busy machine), so the
    # first stream is paced to outlast that.
    with (
        emulator_thread(token_rate=25 if env.transport == SHARDS else 200) as first,
        emulator_thread() as second,
        wired(env, first) as wiring,
    ):
        args = make_args(env, first, rollout_max_response_len=200)
        other_args = make_args(env, second, rollout_max_response_len=200, fastaccum_coalesce_ms=0)
        again_args = make_args(env, first, rollout_max_response_len=200, fastaccum_coalesce_ms=0)
        running, other, again = new_sample(env, 0), new_sample(env, 1), new_sample(env, 2)

        async def main() -> dict[str, Any]:
            task = await _start_and_wait(first, fs.generate(args, running, sampling_params(env, args)), 10)
            await fs.generate(other_args, other, sampling_params(env, other_args))
            assert not task.done()  # the first router's stream ran on while the second answered
            await task
            await fs.generate(again_args, again, sampling_params(env, again_args))
            clients = dict(_pools.POOLS.registry().clients)
            await fs.close_session()
            assert _pools.POOLS.registry().clients == {}
            return clients

        clients = env.run(main())
        for sample, emu, rid in ((running, first, "s000a00"), (other, second, "s001a00"), (again, first, "s002a00")):
            assert sample.status == env.Sample.Status.TRUNCATED and sample.response_length == 200
            assert_call(sample, emu, rid, 0, 200, len(prompt_ids()))
        if env.transport != "aiohttp":
            if env.transport == "client":
                windows = [stream._pacer.window for stream in wiring.streams]
                assert windows == [DEFAULT_COALESCE_MS / 1000, 0.0, 0.0]
            urls = [f"http://{emu.host}:{emu.port}" for emu in (first, second)]
            keys = [f"{url} (shards)" if env.transport == SHARDS else url for url in urls]
            assert all(clients[key].base_url == url for key, url in zip(keys, urls))
            assert all(client.closed for client in clients.values())
        else:
            assert clients == {}


def scenario_text_decoded_once_without_tokenizer_text(env: SlimeEnv, incremental: bool) -> None:
    with emulator_thread(incremental_streaming_output=incremental, skip_tokenizer_init=True) as emu, wired(env, emu):
        args = make_args(env, emu, rollout_max_response_len=12)
        before = FakeTokenizer.decodes
        sample = env.run(fs.generate(args, new_sample(env), sampling_params(env, args)))
        assert FakeTokenizer.decodes == before + 1
        assert sample.response == FakeTokenizer().decode(sample.tokens[len(prompt_ids()) :])


def scenario_mode_check(env: SlimeEnv) -> None:
    with emulator_thread(incremental_streaming_output=True) as emu, wired(env, emu):
        args = make_args(env, emu, sglang_incremental_streaming_output=False)
        with pytest.raises(
            ValueError, match=r"--sglang-incremental-streaming-output off.*--incremental-streaming-output on"
        ):
            env.run(fs.generate(args, new_sample(env), sampling_params(env, args)))
        data_source = BufferedPrompts(env, args)
        with pytest.raises(ValueError, match="sglang-incremental-streaming-output"):
            fs.generate_rollout(args, 0, data_source)
        assert emu.stats.requests == 0  # failed before anything was sent
        args.fastaccum_stream_mode = "auto"
        sample = env.run(fs.generate(args, new_sample(env), sampling_params(env, args)))
        assert sample.response_length == 40


def scenario_evaluation_delegates(env: SlimeEnv) -> None:
    calls = []

    def fake_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> str:
        calls.append((evaluation, env.rollout.abort))
        return "eval-output"

    with emulator_thread() as emu, wired(env, emu):
        patch = pytest.MonkeyPatch()
        patch.setattr(env.rollout, "generate_rollout", fake_rollout)
        try:
            assert fs.generate_rollout(make_args(env, emu), 3, None, evaluation=True) == "eval-output"
        finally:
            patch.undo()
    assert calls == [(True, env.rollout.abort)] and env.rollout.abort is not fs.request_abort


def scenario_mixed_group_abort_buffer_resume(env: SlimeEnv) -> None:
    """One completed, one aborted with a prefix and one aborted without: the group is buffered
    whole, only the aborted siblings resume, nothing is duplicated, each reward is computed once;
    a group with no observed prefix is dropped."""
    with emulator_thread(token_rate=400) as emu, wired(env, emu) as wiring:
        args = make_args(
            env,
            emu,
            partial_rollout=True,
            rollout_batch_size=1,
            n_samples_per_prompt=3,
            over_sampling_batch_size=3,
            rollout_max_response_len=3000,
            test_reward_delay=0.1,
        )
        stall = {"fault": {"kind": "stall", "at": 0, "seconds": 30}}
        # rollout 0: group 0 (samples 0-2) finishes; group 1 = {3: completes, 4: long, 5: stalled};
        # group 2 (6-8) is stalled before its first event (no prefix anywhere).
        wiring.plans.update(
            {
                "s000a00": {"stop_at": 3},
                "s001a00": {"stop_at": 3},
                "s002a00": {"stop_at": 3},
                "s003a00": {"stop_at": 2},
                "s005a00": stall,
                "s006a00": stall,
                "s007a00": stall,
                "s008a00": stall,
            }
        )
        source = BufferedPrompts(env, args)
        first = fs.generate_rollout(args, 0, source)
        assert [s.index for s in first.samples[0]] == [0, 1, 2]
        metrics: dict[str, Any] = {"rollout/own": 1.0}  # slime's RolloutManager hands over its metrics dict
        assert fs.log_rollout_data(0, args, first.samples, metrics, 1.0) is False  # slime then logs them
        assert_rollout_metrics(env, metrics, finished=4, aborted=5)
        assert len(source.added) == 1 and len(source.buffer) == 1  # group 2 dropped
        group = source.buffer[0]
        done, partial, empty = group
        assert [s.index for s in group] == [3, 4, 5]
        assert done.status == env.Sample.Status.COMPLETED and REWARDS[3] == 1
        k = partial.response_length
        assert partial.status == env.Sample.Status.ABORTED and k > 0 and partial.reward is None
        assert_kept_what_was_sent(partial, emu, "s004a00")
        assert partial.metadata["start_rollout_id"] == 0 and "start_rollout_id" not in empty.metadata
        assert empty.status == env.Sample.Status.ABORTED and empty.response_length == 0
        assert env.rollout.abort is not fs.request_abort  # the swap was undone
        snapshot = (list(done.tokens), done.response, done.reward, list(done.rollout_log_probs))

        # rollout 1: the buffered group comes back first (plus 9-17); its aborted siblings finish
        # quickly while the fresh groups run long.
        wiring.plans.update({"s004a01": {"stop_at": 4}, "s005a01": {"stop_at": 6}})
        second = fs.generate_rollout(args, 1, source)
        assert [s.index for s in second.samples[0]] == [3, 4, 5]
        assert (list(done.tokens), done.response, done.reward, list(done.rollout_log_probs)) == snapshot
        assert wiring.attempts[3] == 1  # the completed sibling never called generate again
        assert_call(partial, emu, "s004a00", 0, k, len(prompt_ids()))
        assert_call(partial, emu, "s004a01", k, 4, len(prompt_ids()) + k)
        assert partial.response_length == k + 4 and partial.status == env.Sample.Status.COMPLETED
        assert_call(empty, emu, "s005a01", 0, 6, len(prompt_ids()))
        assert empty.response_length == 6
        assert REWARDS[3] == REWARDS[4] == REWARDS[5] == 1
        # The fresh groups (9-17) ran long: each is buffered exactly when it kept a prefix (which of
        # them got semaphore slots in time is up to the scheduler).
        fresh = [g for g in source.created if g[0].index >= 9]  # the same Sample objects
        buffered = [[s.index for s in g] for g in source.added[1]]
        assert buffered and all(g[0] >= 9 for g in buffered)
        for g in fresh:
            kept = any(s.status == env.Sample.Status.ABORTED and s.response_length > 0 for s in g)
            assert ([s.index for s in g] in buffered) == kept
        assert emu.server_wide_aborts == 0  # request-level only: no server-wide abort was needed


def assert_rollout_metrics(env: SlimeEnv, metrics: dict[str, Any], *, finished: int, aborted: int) -> None:
    """fastaccum's counts of one rollout, as its log function adds them to slime's metrics: every
    call once, the finished ones, the aborted ones drained (Client, shards) or cut (aiohttp)."""
    assert metrics["rollout/own"] == 1.0  # slime's own metrics stay
    assert metrics["fastaccum/calls"] == finished + aborted
    assert metrics["fastaccum/finished"] == finished
    assert metrics["fastaccum/aborted_drained"] + metrics["fastaccum/aborted_cut"] == aborted
    if drains(env):
        assert metrics["fastaccum/aborted_drained"] >= 1  # the long sample's drain read its abort event
        assert metrics["fastaccum/replay_complete"] >= finished + metrics["fastaccum/aborted_drained"]
    else:
        assert metrics["fastaccum/aborted_drained"] == 0 and metrics["fastaccum/replay_complete"] == finished
    assert metrics["fastaccum/retries"] == 0 and metrics["fastaccum/server_aborted"] == 0
    if env.transport != "aiohttp":  # only Client measures timing
        assert 0 < metrics["fastaccum/ttft_p50_s"] <= metrics["fastaccum/ttft_p99_s"]


def scenario_first_day(env: SlimeEnv) -> None:
    """What a new user meets first: a misspelt fastaccum key is refused before anything is sent,
    naming the key it meant and the known ones; a server restarting (503s) is retried, counted
    and reported; the first call says which core and settings run."""
    with emulator_thread() as emu, wired(env, emu):
        bad = make_args(env, emu, fastaccum_read_timout=600)
        with pytest.raises(
            SettingsError, match="'fastaccum_read_timout' .did you mean 'fastaccum_read_timeout'."
        ) as info:
            env.run(fs.generate(bad, new_sample(env), sampling_params(env, bad)))
        assert "fastaccum_retries" in str(info.value)  # the known keys are listed
        with pytest.raises(SettingsError, match="fastaccum_read_timout"):
            fs.generate_rollout(bad, 0, BufferedPrompts(env, bad))
        assert emu.generates == 0
        for key, value in (("fastaccum_retries", -1), ("fastaccum_retries", 1.5), ("fastaccum_retry_max_delay_s", "x")):
            wrong = make_args(env, emu, **{key: value})
            with pytest.raises(SettingsError, match=key):
                env.run(fs.generate(wrong, new_sample(env), sampling_params(env, wrong)))

        args = make_args(env, emu, fastaccum_retry_max_delay_s=0.0)
        emu.refuse = [503, 502]
        fs._pools.FRAMEWORK._announced = False
        records: list[logging.LogRecord] = []
        handler = logging.Handler(logging.INFO)
        handler.emit = records.append  # type: ignore[method-assign]
        logger = logging.getLogger("fastaccum.slime")
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)
        try:
            sample = env.run(fs.generate(args, new_sample(env, 1), sampling_params(env, args)))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        assert emu.generates == 3 and sample.response_length == args.rollout_max_response_len
        if env.transport != "aiohttp":
            assert sample.metadata["fastaccum_timing"][0]["retries"] == 2
        (first, *_) = [r.getMessage() for r in records]
        assert f"fastaccum {fastaccum.__version__} ({fastaccum.IMPLEMENTATION} core) for slime" in first
        assert f"transport {args.fastaccum_transport}" in first and "retries 60" in first
        metrics: dict[str, Any] = {}
        fs.log_rollout_data(7, args, [sample], metrics, 1.0)  # calls since the last rollout: this one
        assert metrics["fastaccum/retries"] == 2 and metrics["fastaccum/calls"] == 1


def scenario_idle_wait_and_fallback(env: SlimeEnv) -> None:
    """After the request-level cancel fastaccum waits for idle servers; a request it cannot see
    (a zombie) keeps a server busy, so the wait times out and falls back to the server-wide abort."""
    with emulator_thread(token_rate=200) as emu, wired(env, emu):
        args = make_args(env, emu, rollout_max_response_len=100_000, fastaccum_idle_timeout=0.3)
        env.http_utils.init_http_client(args)

        async def main() -> tuple[int, int]:
            async with aiohttp.ClientSession() as session:
                body = {
                    "input_ids": [1, 2, 3],
                    "rid": "zombie-1",
                    "sampling_params": {"max_new_tokens": 100_000},
                    "stream": True,
                }
                zombie = await session.post(emu.url + "/generate", json=body)
                await wait_until(lambda: emu.running == 1)
                task = await _start_and_wait(emu, generate_and_rm(env, args, new_sample(env)), 5)
                await fs.request_abort(args, 0)
                await task
                aborted_while_fastaccum_only = emu.server_wide_aborts
                zombie.close()
                return aborted_while_fastaccum_only, emu.running

        aborted, running = env.run(main())
        assert aborted >= 1 and running == 0  # the fallback hit the zombie

    with emulator_thread(token_rate=200) as emu, wired(env, emu):
        args = make_args(env, emu, rollout_max_response_len=100_000)
        env.http_utils.init_http_client(args)

        async def quiet() -> None:
            task = await _start_and_wait(emu, generate_and_rm(env, args, new_sample(env)), 5)
            await fs.request_abort(args, 0)
            await task
            assert emu.running == 0

        env.run(quiet())
        assert emu.server_wide_aborts == 0  # idle without the server-wide abort
        assert emu.aborted_rids == (["s000a00"] if drains(env) else [])


def scenario_top_p_kept_at_abort(env: SlimeEnv) -> None:
    """With top-p replay the stream must end with its terminal chunk (the only one carrying the
    CSR): drained, the abort by rid reads it; cut, request_abort aborts server-wide instead. The
    resumed CSR covers every response token."""
    with emulator_thread(token_rate=400) as emu, wired(env, emu) as wiring:
        args = make_args(env, emu, rollout_top_p=0.9, rollout_max_response_len=5000, partial_rollout=True)
        env.http_utils.init_http_client(args)
        sample = new_sample(env)
        wiring.plans["s000a01"] = {"stop_at": 3}

        async def main() -> None:
            task = await _start_and_wait(emu, generate_and_rm(env, args, sample), 5)
            state, registry = env.rollout.GenerateState(args), _pools.POOLS.registry()
            if drains(env):  # request-abortable: ended by rid like any other call
                if env.line == "request-abort":
                    assert state.active_server_generations == 0 and len(state.cancellable_tasks) == 1
                else:
                    assert registry.server_generations == 0 and len(registry.request_streams) == 1
            elif env.line == "request-abort":  # out of slime's cancel set, counted for its server-wide abort
                assert state.active_server_generations == 1 and not state.cancellable_tasks
            else:
                assert registry.server_generations == 1 and not registry.request_streams
            await fs.request_abort(args, 0)
            await task

        env.run(main())
        k = sample.response_length
        assert sample.status == env.Sample.Status.ABORTED and k > 0
        if drains(env):
            assert emu.aborted_rids == ["s000a00"] and emu.server_wide_aborts == 0
        else:
            assert emu.server_wide_aborts >= 1
        assert len(sample.rollout_top_p_token_offsets) == k + 1
        env.rollout.GenerateState(args).reset()
        env.run(fs.generate(args, sample, sampling_params(env, args)))
        assert sample.response_length == k + 3 and sample.status == env.Sample.Status.COMPLETED
        offsets = sample.rollout_top_p_token_offsets
        assert len(offsets) == k + 4 and int(offsets[-1]) == len(sample.rollout_top_p_token_ids)
        rows = expected(emu, "s000a01", 3, prompt_tokens=len(prompt_ids()) + k, top_p=True).top_p_rows
        assert sample.rollout_top_p_token_ids[int(offsets[k]) :].tolist() == [t for r in rows for t in r]


def scenario_sample_fidelity(env: SlimeEnv) -> None:
    """append_response_tokens rules the adapter relies on (keeps the double faithful to slime)."""
    S = env.Sample
    args = SimpleNamespace(num_layers=2, moe_router_topk=1)
    s = S(tokens=[1, 2])
    with pytest.raises(ValueError, match="log_probs length"):
        s.append_response_tokens(args, tokens=[3], log_probs=[0.1, 0.2])
    with pytest.raises(ValueError, match="require rollout log probabilities"):
        s.append_response_tokens(args, tokens=[3])
    s.append_response_tokens(
        args,
        tokens=np.array([3, 4]).tolist(),
        log_probs=[-0.5, -0.25],
        text="x",
        meta_info=None,
        update_terminal_info=False,
    )
    assert (s.tokens, s.response, s.response_length, s.loss_mask, s.status) == (
        [1, 2, 3, 4],
        "x",
        2,
        [1, 1],
        S.Status.PENDING,
    )
    with pytest.raises(TypeError):
        s.append_response_tokens(args, tokens=[], log_probs=[], meta_info={"finish_reason": None})
    s.append_response_tokens(args, tokens=[5], log_probs=[-1.0], meta_info={"finish_reason": {"type": "weird"}})
    assert s.status == S.Status.PENDING  # unknown types keep the status
    for kind, status in (("stop", S.Status.COMPLETED), ("length", S.Status.TRUNCATED), ("abort", S.Status.ABORTED)):
        t = S(tokens=[1])
        t.append_response_tokens(
            args, tokens=[2], log_probs=[-1.0], meta_info={"finish_reason": {"type": kind}, "weight_version": "w3"}
        )
        assert t.status == status and t.weight_versions == ["w3"]
    # top-p: rows for all call tokens, as int32 arrays; a partial CSR is refused
    t = S(tokens=[1])
    ids, offsets = np.array([7, 8, 9], np.int32), np.array([0, 1, 3], np.int32)
    t.append_response_tokens(
        args, tokens=[2, 3], log_probs=[-1.0, -1.0], meta_info={"top_p_token_ids": ids, "top_p_token_offsets": offsets}
    )
    assert t.rollout_top_p_token_offsets.dtype == torch.int32 and t.rollout_top_p_token_ids.tolist() == [7, 8, 9]
    with pytest.raises(ValueError, match="generated token count"):
        t.append_response_tokens(
            args,
            tokens=[4, 5],
            log_probs=[-1.0, -1.0],
            meta_info={"top_p_token_ids": ids[:1], "top_p_token_offsets": offsets[:2]},
        )
    with pytest.raises(ValueError, match="response_length"):  # a prefix without rows on a CSR sample
        t.append_response_tokens(args, tokens=[6], log_probs=[-1.0])
    # routed experts: rows == len(tokens) - 1, overwritten with start_len 0
    r = S(tokens=[1, 2, 3])
    r.append_response_tokens(
        args, tokens=[4], log_probs=[-1.0], meta_info={"routed_experts": np.arange(6, dtype=np.int32)}
    )
    assert tuple(r.rollout_routed_experts.shape) == (3, 2, 1)
    r.append_response_tokens(
        args, tokens=[5], log_probs=[-1.0], meta_info={"routed_experts": np.arange(8, dtype=np.int32)}
    )
    assert tuple(r.rollout_routed_experts.shape) == (4, 2, 1)
    with pytest.raises(ValueError, match="routed_experts element count"):
        r.append_response_tokens(
            args, tokens=[6], log_probs=[-1.0], meta_info={"routed_experts": np.arange(4, dtype=np.int32)}
        )


def scenario_signatures(env: SlimeEnv) -> None:
    """The parameter names and defaults slime's plugin contract tests check."""
    import inspect

    assert tuple(inspect.signature(fs.generate).parameters)[:3] == ("args", "sample", "sampling_params")
    assert env.misc.load_function("fastaccum.slime.generate").abort_mode == "request"
    mine = inspect.signature(fs.generate_rollout).parameters
    stock = inspect.signature(env.rollout.generate_rollout).parameters
    assert tuple(mine) == tuple(stock)
    assert [(p.kind, p.default) for p in mine.values()] == [(p.kind, p.default) for p in stock.values()]


async def foreign_generate(args: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    """A generate function that is not request-abortable (no ``abort_mode``)."""
    sample.append_response_tokens(
        args, tokens=[7], log_probs=[-0.5], text="x", meta_info={"finish_reason": {"type": "stop"}}
    )
    return sample


def scenario_foreign_generate_keeps_stock_abort(env: SlimeEnv) -> None:
    """request_abort cannot see another function's requests: it hands over to slime's abort."""
    calls = []

    async def stock_abort(args: Any, rollout_id: int) -> list:
        calls.append(rollout_id)
        state = env.rollout.GenerateState(args)
        state.aborted = True
        while state.pendings:
            _, state.pendings = await asyncio.wait(state.pendings)
        return []

    with emulator_thread() as emu, wired(env, emu):
        args = make_args(env, emu, custom_generate_function_path="fastaccum_slime_harness.foreign_generate")
        patch = pytest.MonkeyPatch()
        patch.setattr(env.rollout, "abort", stock_abort)
        try:
            output = fs.generate_rollout(args, 4, BufferedPrompts(env, args))
            assert env.rollout.abort is stock_abort
        finally:
            patch.undo()
    assert calls == [4] and output.samples[0][0].status == env.Sample.Status.COMPLETED


EXAMPLES = str(Path(__file__).resolve().parents[2] / "examples")


def scenario_custom_generate_and_rollout(env: SlimeEnv) -> None:
    """A multi-turn generate function and a rollout function of the user's own
    (examples/slime_multi_turn.py): every turn streams through generate_turn, the tool's answer
    goes in with loss mask 0, and the rollout function composes with request_abort. A rollout
    abort ends the running turn by rid (never server-wide), the sample keeps the turns before and
    the turn's prefix and is ABORTED, and its resume continues without duplicates."""
    sys.path.insert(0, EXAMPLES)
    sys.modules.pop("slime_multi_turn", None)  # it imports slime, whose modules each env loads anew
    try:
        example = importlib.import_module("slime_multi_turn")
        with emulator_thread(token_rate=400) as emu, wired(env, emu) as wiring:
            args = make_args(
                env,
                emu,
                custom_generate_function_path="slime_multi_turn.generate",
                partial_rollout=True,
                n_samples_per_prompt=2,
                over_sampling_batch_size=2,
                rollout_max_response_len=3000,
            )
            assert env.misc.load_function(args.custom_generate_function_path).abort_mode == "request"
            patch = pytest.MonkeyPatch()
            patch.setattr(example, "TURN_TOKENS", 3000)  # a turn ends by its stop token or the abort
            # Group 0 (samples 0, 1) finishes its two turns each; in group 1, sample 2 does too
            # while sample 3's second turn runs until the rollout is aborted. Group 0's first turns
            # are 50 times sample 3's, so that its second turn is streaming when group 0 is done
            # however loaded the machine.
            stops = {"s000a00": 200, "s000a01": 2, "s001a00": 200, "s001a01": 3, "s002a00": 2, "s002a01": 2}
            wiring.plans.update({rid: {"stop_at": k} for rid, k in {**stops, "s003a00": 4}.items()})
            source = BufferedPrompts(env, args)
            try:
                first = example.generate_rollout(args, 0, source)
            finally:
                patch.undo()
            assert env.rollout.abort is not fs.request_abort  # the swap was undone
            assert first.metrics["multi_turn/turns_mean"] == 2  # the user's rollout function ran
            tool = FakeTokenizer().encode(example.tool(""))  # 3 words, whatever the turn said
            for sample in first.samples[0]:
                n1, n2 = stops[f"s{sample.index:03d}a00"], stops[f"s{sample.index:03d}a01"]
                assert sample.status == env.Sample.Status.COMPLETED and sample.metadata["turns"] == 2
                assert sample.loss_mask == [1] * n1 + [0] * len(tool) + [1] * n2
                assert_call(sample, emu, f"s{sample.index:03d}a00", 0, n1, len(prompt_ids()))
                assert_call_at(sample, emu, f"s{sample.index:03d}a01", n1 + len(tool), n2)
            (group,) = source.buffer
            done, cut = group
            k = cut.response_length - 4 - len(tool)
            assert done.status == env.Sample.Status.COMPLETED
            assert cut.status == env.Sample.Status.ABORTED and k > 0 and cut.reward is None
            assert cut.loss_mask == [1] * 4 + [0] * len(tool) + [1] * k
            assert_call_at(cut, emu, "s003a01", 4 + len(tool), k)
            assert emu.server_wide_aborts == 0
            assert emu.aborted_rids == (["s003a01"] if drains(env) else [])

            # The resume: two more turns from everything the sample holds.
            wiring.plans.update({"s003a02": {"stop_at": 2}, "s003a03": {"stop_at": 3}})
            args.over_sampling_batch_size = 1
            second = example.generate_rollout(args, 1, source)
            assert second.samples == [group] and cut.status == env.Sample.Status.COMPLETED
            held = 4 + len(tool) + k
            assert_call_at(cut, emu, "s003a01", 4 + len(tool), k)
            assert_call_at(cut, emu, "s003a02", held, 2)
            assert_call_at(cut, emu, "s003a03", held + 2 + len(tool), 3)
            assert cut.loss_mask == [1] * 4 + [0] * len(tool) + [1] * (k + 2) + [0] * len(tool) + [1] * 3
            assert wiring.payloads[-1]["input_ids"] == cut.tokens[: len(cut.tokens) - 3]
    finally:
        sys.path.remove(EXAMPLES)
        sys.modules.pop("slime_multi_turn", None)


def assert_call_at(sample: Any, emulator: Emulator, rid: str, start: int, n: int) -> None:
    """Response positions [start, start + n) are ``rid``'s first n tokens, asked for with
    everything the sample held before them."""
    assert_call(sample, emulator, rid, start, n, len(prompt_ids()) + start)


def scenario_slime_abort_keeps_prefix(env: SlimeEnv, incremental: bool) -> None:
    """slime's own abort (no fastaccum rollout function) keeps the prefix on both lines: stock
    slime aborts server-wide and the terminal abort chunk is committed; slime with request-level
    abort cancels the sample's task, and generate ends the request (drained by rid, with the
    terminal abort chunk; or cut) and commits before the cancel leaves it."""
    with (
        emulator_thread(
            incremental_streaming_output=incremental, token_rate=400, enable_return_routed_experts=True
        ) as emu,
        wired(env, emu),
    ):
        args = make_args(env, emu, use_rollout_routing_replay=True, rollout_max_response_len=2000, partial_rollout=True)
        env.http_utils.init_http_client(args)
        sample = new_sample(env)

        async def main() -> None:
            task = await _start_and_wait(emu, generate_and_rm(env, args, sample), 10)
            assert await env.rollout.abort(args, 0) == []  # nothing pending: the sample ran alone
            await task

        env.run(main())
        k = sample.response_length
        assert sample.status == env.Sample.Status.ABORTED and 0 < k < 2000 and sample.reward is None
        assert_call(sample, emu, "s000a00", 0, k, len(prompt_ids()))
        if env.line == "stock":
            assert emu.stats.aborted >= 1 and emu.stats.written["s000a00"] == k
            # the terminal abort chunk carries routing for every position
            assert tuple(sample.rollout_routed_experts.shape) == (len(sample.tokens) - 1, *emu.expert_shape)
        elif drains(env):
            assert_kept_what_was_sent(sample, emu, "s000a00")
            assert emu.aborted_rids == ["s000a00"] and emu.server_wide_aborts == 0
            assert tuple(sample.rollout_routed_experts.shape) == (len(sample.tokens) - 1, *emu.expert_shape)
            assert emu.running == 0 and "s000a00" not in emu.stats.disconnected_rids
        else:
            assert_kept_what_was_sent(sample, emu, "s000a00")
            assert emu.stats.aborted == 0 and sample.rollout_routed_experts is None  # none had arrived
            deadline = time.monotonic() + 5.0  # the emulator's thread sees the close a moment later
            while "s000a00" not in emu.stats.disconnected_rids and time.monotonic() < deadline:
                time.sleep(0.01)
            assert "s000a00" in emu.stats.disconnected_rids


def scenario_abort_after_terminal_keeps_result(env: SlimeEnv) -> None:
    """An abort that arrives after the terminal event (before [DONE]) keeps the complete result:
    the sample is finished, scored once, and not marked ABORTED (which would resume it past its end)."""
    with emulator_thread() as emu, wired(env, emu) as wiring:
        args = make_args(env, emu, rollout_max_response_len=12)
        env.http_utils.init_http_client(args)
        wiring.plans["s000a00"] = {"fault": {"kind": "stall", "at": "done", "seconds": 30}}
        sample = new_sample(env)

        async def main() -> None:
            task = asyncio.get_running_loop().create_task(generate_and_rm(env, args, sample))
            # The 12th token comes in the terminal event: once the stream counts it, [DONE] is all that is left.
            await wait_until(lambda: bool(wiring.streams) and wiring.streams[0].tokens >= 12)
            await fs.request_abort(args, 0)
            await task

        env.run(main())
        assert sample.status == env.Sample.Status.TRUNCATED and sample.response_length == 12
        assert REWARDS[0] == 1 and sample.reward == 12.0
        assert_call(sample, emu, "s000a00", 0, 12, len(prompt_ids()))
        assert emu.running == 0


# ---- where slime's in-tree streaming generate breaks and fastaccum must not ---------------------
def in_tree_streaming(env: SlimeEnv) -> Any:
    """slime's own request-abort streaming generate function, where the checkout has it."""
    if env.kind != "real":
        return None  # the double does not model it
    try:
        module = importlib.import_module("slime.rollout.sglang_streaming_rollout")
    except ImportError:
        return None
    fn = getattr(module, "generate_streaming", None)
    return fn if getattr(fn, "abort_mode", None) == "request" else None


def _generate_with(env: SlimeEnv, fn: Any, args: Any, sample: Any, *, abort_retracted: bool, emu: Emulator) -> Any:
    """Run one generate call; with ``abort_retracted``, SGLang's ``abort_all`` once the request is
    retracted (a server-side abort, as a weight update's pause does)."""

    async def main() -> Any:
        task = asyncio.get_running_loop().create_task(fn(args, sample, sampling_params(env, args)))
        if abort_retracted:
            await wait_until(lambda: emu.retracted == 1 or task.done())
            async with aiohttp.ClientSession() as session:
                await session.post(emu.url + "/abort_request", json={"abort_all": True})
        return await task

    return env.run(main())


def scenario_in_tree_pitfalls(env: SlimeEnv, case: str, incremental: bool) -> None:
    """Three streams SGLang sends that slime's in-tree streaming generate fails on (checked where
    the checkout has it) and fastaccum commits correctly (docs/slime.md, "Why fastaccum instead of
    slime's in-tree streaming"):

    - ``line_separator``: a text holding U+2028, which SGLang writes raw in the JSON; a reader that
      splits lines with ``str.splitlines`` (httpx ``aiter_lines``) cuts the event in two;
    - ``echo``: a retracted request aborted server-side ends with the abort echo chunk, whose
      logprob list is the whole response even in incremental mode;
    - ``no_logprobs_length``: events without ``output_token_logprobs_length``.
    """
    fault = {
        "line_separator": None,
        "echo": {"kind": "retract", "at": 3},
        "no_logprobs_length": {"kind": "strip_keys", "keys": ["output_token_logprobs_length"]},
    }[case]
    n = 40
    with emulator_thread(incremental_streaming_output=incremental, fault=fault) as emu, wired(env, emu):
        if case == "line_separator":
            assert "\u2028" in expected(emu, "s000a00", n).text(0, n)
            assert "\u2028" in expected(emu, UNNAMED_RID, n).text(0, n)
        args = make_args(env, emu, rollout_max_response_len=n)
        env.http_utils.init_http_client(args)
        sample = _generate_with(env, fs.generate, args, new_sample(env), abort_retracted=case == "echo", emu=emu)
        k = emu.stats.written["s000a00"]
        if case == "echo":  # the echo holds every token decoded, one more than the events carried
            assert sample.status == env.Sample.Status.ABORTED and k == 4
        else:
            assert sample.status == env.Sample.Status.TRUNCATED and k == n
        assert sample.response_length == k
        assert_call(sample, emu, "s000a00", 0, k, len(prompt_ids()))
        assert sample.response == expected(emu, "s000a00", k).text(0, k)

        in_tree = in_tree_streaming(env)
        if in_tree is None:
            return
        env.reset()
        args.custom_generate_function_path = "slime.rollout.sglang_streaming_rollout.generate_streaming"
        theirs = new_sample(env, 1)
        expected_error = {
            "line_separator": "terminal finish_reason|inconsistent output_token_logprobs_length",
            "echo": "inconsistent output_token_logprobs_length",
            "no_logprobs_length": "must include output_token_logprobs_length",
        }[case]
        with pytest.raises((RuntimeError, ValueError), match=expected_error):
            _generate_with(env, in_tree, args, theirs, abort_retracted=case == "echo", emu=emu)


# (name, function, parameter sets): both test tiers run exactly this list.
SCENARIOS: list[tuple[str, Any, list[dict[str, Any]]]] = [
    (
        "stream_modes",
        scenario_stream_modes,
        [{"incremental": inc, "interval": iv} for inc in (False, True) for iv in (1, 20, 64)],
    ),
    ("routed_experts_and_top_p", scenario_routed_experts_and_top_p, [{"incremental": False}, {"incremental": True}]),
    (
        "deliberate_cancel_then_resume",
        scenario_deliberate_cancel_then_resume,
        [{"incremental": False}, {"incremental": True}],
    ),
    ("slime_abort_keeps_prefix", scenario_slime_abort_keeps_prefix, [{"incremental": False}, {"incremental": True}]),
    ("abort_after_terminal_keeps_result", scenario_abort_after_terminal_keeps_result, [{}]),
    ("unrelated_cancellation_propagates", scenario_unrelated_cancellation_propagates, [{}]),
    (
        "server_abort_commits_terminal",
        scenario_server_abort_commits_terminal,
        [{"incremental": False}, {"incremental": True}],
    ),
    (
        "weight_update_pause",
        scenario_weight_update_pause,
        [{"pause_mode": m, "incremental": inc} for m in ("abort", "retract", "in_place") for inc in (False, True)],
    ),
    ("errors_fail_closed", scenario_errors_fail_closed, [{}]),
    ("register_then_check", scenario_register_then_check, [{}]),
    ("budget_and_headers", scenario_budget_and_headers, [{}]),
    ("second_router_gets_its_own_pool", scenario_second_router_gets_its_own_pool, [{}]),
    (
        "text_decoded_once",
        scenario_text_decoded_once_without_tokenizer_text,
        [{"incremental": False}, {"incremental": True}],
    ),
    ("mode_check", scenario_mode_check, [{}]),
    ("evaluation_delegates", scenario_evaluation_delegates, [{}]),
    ("mixed_group_abort_buffer_resume", scenario_mixed_group_abort_buffer_resume, [{}]),
    ("idle_wait_and_fallback", scenario_idle_wait_and_fallback, [{}]),
    ("top_p_kept_at_abort", scenario_top_p_kept_at_abort, [{}]),
    ("foreign_generate_keeps_stock_abort", scenario_foreign_generate_keeps_stock_abort, [{}]),
    (
        "in_tree_pitfalls",
        scenario_in_tree_pitfalls,
        [{"case": c, "incremental": inc} for c in ("line_separator", "no_logprobs_length") for inc in (False, True)]
        + [{"case": "echo", "incremental": True}],
    ),
    ("sample_fidelity", scenario_sample_fidelity, [{}]),
    ("first_day", scenario_first_day, [{}]),
    ("custom_generate_and_rollout", scenario_custom_generate_and_rollout, [{}]),
    ("signatures", scenario_signatures, [{}]),
]


def scenario_params() -> list[Any]:
    """pytest params: one per (scenario, parameter set), with readable ids."""
    out = []
    for name, fn, sets in SCENARIOS:
        for kwargs in sets:
            suffix = "-".join(f"{k}={v}" for k, v in kwargs.items())
            out.append(pytest.param(fn, kwargs, id=f"{name}[{suffix}]" if suffix else name))
    return out
