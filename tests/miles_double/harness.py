"""Harness for the Miles adapter tests: a Miles loader, the wiring of each scenario and the scenarios.

Every scenario takes a ``MilesEnv`` (the double of ``tests/miles_double`` or a real Miles checkout
from ``FASTACCUM_MILES_PATH``) and drives ``fastaccum.miles`` through Miles' own loader
(``load_generate_function``, ``load_rollout_function`` and ``call_rollout_function`` for the
rollout class; ``call_rollout_fn`` for the v1 rollout function) against the embedded emulator over
loopback HTTP, so the same assertions run against both (tests/test_miles.py: the double;
tests/test_miles_real.py: both). It builds on the slime harness (tests/slime_double/harness.py):
the emulator thread that doubles as the router, the per-rid plans, the data source with Miles'
buffer semantics, the stand-in tokenizer and the reward function that counts its calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import importlib
import inspect
import logging
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import framework_harness
import numpy as np
import pytest

import fastaccum
import fastaccum.miles as fm
from fastaccum.emulator import Emulator
from fastaccum.errors import ServerError, SettingsError, StreamFormatError, StreamTruncatedError
from fastaccum.miles import _generate, _modules, _pools
from fastaccum.miles._settings import Settings

sh = framework_harness.slime()  # the slime harness: emulator, wiring, data source, tokenizer, rewards

OPEN_STREAM = _pools.POOLS.open_stream  # the adapter's own, which the wiring wraps
NEW_RID = _generate.new_rid  # likewise
DOUBLE_ROOT = str(Path(__file__).resolve().parent)
MILES_PACKAGES = ("miles", "miles_plugins")
PATHS = ("class", "legacy")  # Miles' rollout class, and its v1 rollout function
TRANSPORTS = sh.TRANSPORTS
SHARDS = sh.SHARDS
GENERATE = "fastaccum.miles.generate"
ROLLOUT_CLASS = "fastaccum.miles.InferenceRolloutFn"
PROMPT, REWARDS, FakeTokenizer = sh.PROMPT, sh.REWARDS, sh.FakeTokenizer
emulator_thread, wait_until, expected, prompt_ids = sh.emulator_thread, sh.wait_until, sh.expected, sh.prompt_ids


# ---- loading Miles -----------------------------------------------------------------------------
def _module(name: str, **attrs: Any) -> types.ModuleType:
    made = types.ModuleType(name)
    made.__dict__.update(attrs)
    sys.modules[name] = made
    parent, _, child = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], child, made)
    return made


class _DumperConfig:
    """SGLang's dumper config, as far as Miles' rollout reads it: no phase enabled."""

    @staticmethod
    def _kv_pairs_to_dict(raw: Any) -> dict[str, Any]:
        return {}


def install_stubs() -> list[str]:
    """What a training image has and this one does not: ``transformers`` (the slime harness's
    stand-in, with the names Miles' config and chat-template modules import) and the SGLang
    modules Miles' rollout imports (the OpenAI protocol's types, the dumper). Ray and the
    sglang-router are the installed ones (Miles reads the router's version). Returns the names
    installed, removed again when the env closes."""
    import ray  # noqa: F401  # the real ones, so the slime harness stubs neither
    import sglang_router  # noqa: F401

    before = set(sys.modules)
    sh.install_stubs()
    tf = sys.modules["transformers"]
    tf.AutoConfig = type("AutoConfig", (), {})
    tf.AutoModelForCausalLM = type("AutoModelForCausalLM", (), {})
    for package in ("transformers.utils", "transformers.models", "transformers.models.auto"):
        _module(package, __path__=[])
    _module("transformers.utils.chat_template_utils", render_jinja_template=None)
    _module("transformers.models.auto.configuration_auto", CONFIG_MAPPING_NAMES={})
    for package in ("sglang", "sglang.srt", "sglang.srt.entrypoints", "sglang.srt.entrypoints.openai"):
        _module(package, __path__=[])
    _module("sglang.srt.debug_utils", __path__=[])
    _module("sglang.srt.entrypoints.openai.encoding_dsv4")
    _module("sglang.srt.entrypoints.openai.protocol", Tool=type("Tool", (), {}), ChatCompletionRequest=dict)
    _module("sglang.srt.debug_utils.dumper", DumperConfig=_DumperConfig, _get_rank=lambda: 0, dumper=None)
    return [name for name in sys.modules if name not in before]


def _purge_miles() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in MILES_PACKAGES:
            del sys.modules[name]
    _modules.forget()


@dataclasses.dataclass
class MilesEnv:
    kind: str  # "double" | "real"
    root: str
    transport: str  # fastaccum_transport for every scenario's args (or SHARDS)
    m: SimpleNamespace  # Miles' modules, by short name

    def __getattr__(self, name: str) -> Any:
        return getattr(self.m, name)

    def run(self, coro: Any) -> Any:
        """Run on Miles' background loop, where its rollouts (and so fastaccum) run."""
        return self.m.async_utils.run(coro)

    def reset(self) -> None:
        self.m.misc.SingletonMeta._instances.clear()
        REWARDS.clear()


_NAMES = {
    "types": "miles.utils.types",
    "misc": "miles.utils.misc",
    "http_utils": "miles.utils.http_utils",
    "async_utils": "miles.utils.async_utils",
    "base_types": "miles.rollout.base_types",
    "compatibility": "miles.rollout.inference_rollout.compatibility",
    "common": "miles.rollout.inference_rollout.inference_rollout_common",
    "train": "miles.rollout.inference_rollout.inference_rollout_train",
    "legacy": "miles.rollout.sglang_rollout",
    "endpoint": "miles.rollout.generate_utils.generate_endpoint_utils",
    "single_turn": "miles.rollout.generate_hub.single_turn",
}


@contextlib.contextmanager
def miles_env(kind: str, root: str, transport: str = "client") -> Iterator[MilesEnv]:
    """Miles' modules from ``root`` (the double, or a Miles checkout) on ``sys.path``."""
    stubs = install_stubs()
    _purge_miles()
    sys.path.insert(0, root)
    try:
        found = SimpleNamespace(**{short: importlib.import_module(name) for short, name in _NAMES.items()})
        found.Sample = found.types.Sample
        if kind == "real":
            # Miles registers transformers config aliases before loading a tokenizer; the stand-in
            # tokenizer needs none.
            importlib.import_module("miles.utils.hf_config")._REGISTERED_ALIASES.update({"deepseek_v32", "deepseek_v4"})
        env = MilesEnv(kind, root, transport, found)
        yield env
        env.run(fm.close_session())
        if found.http_utils._http_client is not None:
            env.run(found.http_utils._http_client.aclose())
            found.http_utils._http_client = None
    finally:
        sys.path.remove(root)
        _purge_miles()
        for name in stubs:
            sys.modules.pop(name, None)


# ---- per-scenario wiring -----------------------------------------------------------------------
@contextlib.contextmanager
def wired(env: MilesEnv, emulator: Emulator) -> Iterator[Any]:
    """The slime harness's wiring on fastaccum.miles: rids ``s<index>a<attempt>`` on the wire,
    per-rid plans, the payloads, headers and streams of the scenario; the adapter's own rids are
    still made and held to SGLang's prefix rule at the end."""
    env.reset()
    wiring = sh.Wiring(emulator)
    sh.CURRENT.append(wiring)
    _pools.POOLS.stats.close()  # counts start with the scenario
    patch = pytest.MonkeyPatch()
    patch.setattr(sh, "OPEN_STREAM", OPEN_STREAM)  # the wiring opens fastaccum.miles' streams
    patch.setattr(sh, "NEW_RID", NEW_RID)
    patch.setattr(_generate, "new_rid", wiring.rid)
    patch.setattr(_pools.POOLS, "open_stream", wiring.open_stream)
    try:
        yield wiring
        sh.check_rids(wiring.made)
    finally:
        sh.CURRENT.remove(wiring)
        patch.undo()
        env.reset()


# What Miles' rollout reads besides the slime harness's arguments (Miles is slime's fork and keeps
# their names), and where its defaults differ.
MILES_ARGS: dict[str, Any] = dict(
    chat_template_path=None,
    sglang_router_policy=None,
    use_miles_router=False,
    eval_num_gpus=0,
    num_gpus_per_node=1,
    rollout_max_context_len=None,
    sglang_speculative_algorithm=None,
    custom_generate_function_path=GENERATE,
    custom_agent_function_path=None,
    rollout_submission_granularity=None,
    recompute_logprobs_via_prefill=False,
    dumper_enable=False,
    dumper_inference=None,
    use_rollout_indexer_replay=False,
    lora_rank=0,
    lora_adapter_path=None,
    use_opd=False,
)


def make_args(env: MilesEnv, emulator: Any, **overrides: Any) -> SimpleNamespace:
    """Miles' arguments, as many as its rollout reads on these paths: the slime harness's, with
    Miles' own on top."""
    args: SimpleNamespace = sh.make_args(env, emulator, **{**MILES_ARGS, **overrides})
    env.http_utils.init_http_client(args)  # Miles' rollout manager makes it before any rollout
    return args


class Rollouts:
    """One rollout function of ``path`` for the whole scenario, as Miles' rollout manager holds
    one: the rollout class built once by Miles' loader (its ``GenerateState`` lives as long), or
    the v1 function loaded by path; each call goes through Miles' own call."""

    def __init__(self, env: MilesEnv, args: Any, source: Any, path: str, rollout_path: str | None = None) -> None:
        self.env, self.args, self.source, self.path = env, args, source, path
        if path == "class":
            made = env.base_types.RolloutFnConstructorInput(args=args, data_source=source)
            self.fn = env.compatibility.load_rollout_function(made, rollout_path or ROLLOUT_CLASS)
        else:
            self.fn = env.misc.load_function(rollout_path or "fastaccum.miles.generate_rollout")

    @property
    def train_abort(self) -> Any:
        """The module-level ``abort`` this path's rollout looks up."""
        return (self.env.train if self.path == "class" else self.env.legacy).abort

    def __call__(self, rollout_id: int) -> Any:
        if self.path == "class":
            train = self.env.base_types.RolloutFnTrainInput(rollout_id=rollout_id)
            return self.env.compatibility.call_rollout_function(self.fn, train)
        return self.env.base_types.call_rollout_fn(self.fn, self.args, rollout_id, self.source, evaluation=False)


def new_state(env: MilesEnv, args: Any) -> Any:
    """A rollout class's ``GenerateState`` (tokenizer, gate, sampling parameters, generate function)."""
    return env.common.GenerateState(args)


def new_sample(env: MilesEnv, index: int = 0, prompt: str = PROMPT) -> Any:
    return env.Sample(index=index, group_index=0, prompt=prompt)


def call(env: MilesEnv, state: Any, sample: Any, params: dict[str, Any] | None = None) -> Any:
    """One generate call the way Miles' rollout makes it: the function from Miles' loader, with
    its own copy of the state's sampling parameters."""
    fn = env.compatibility.load_generate_function(state.args.custom_generate_function_path)
    own = copy.deepcopy(state.sampling_params if params is None else params)
    return fn(env.base_types.GenerateFnInput(state=state, sample=sample, sampling_params=own, evaluation=False))


def generate_and_rm(env: MilesEnv, state: Any, sample: Any) -> Any:
    """One sample as Miles' rollout class runs it (gate, aborted check, generate, reward)."""
    return env.common.generate_and_rm(state, sample, state.sampling_params)


def drains(env: MilesEnv) -> bool:
    return sh.drains(env)


def assert_call(sample: Any, emulator: Emulator, rid: str, start: int, n: int, sent: int) -> None:
    """Response positions [start, start + n) are exactly ``rid``'s first n tokens, asked for with
    ``sent`` prompt tokens."""
    sh.assert_call(sample, emulator, rid, start, n, sent)


def rows_of(emulator: Emulator, rid: str, n: int, sent: int, start: int = 0) -> Any:
    return expected(emulator, rid, n, prompt_tokens=sent, routed_experts=True, routed_start=start).routed_experts


async def _started(emu: Emulator, coro: Any, tokens: int) -> asyncio.Task:
    """Start ``coro``; return once the server decoded ``tokens`` and the client holds some."""
    task = asyncio.get_running_loop().create_task(coro)
    await wait_until(lambda: emu.stats.tokens >= tokens and sh.client_holds_tokens())
    return task


def warm_shards(env: MilesEnv, args: Any) -> None:
    """With shards, start both before a rollout whose timing a test depends on: a request handed
    to a shard still starting reaches the server seconds later (after an ``abort_all`` sent
    meanwhile, which it then never sees). Two calls at once, one per shard."""
    if env.transport != SHARDS:
        return
    state = new_state(env, args)
    params = {**state.sampling_params, "max_new_tokens": 2}

    async def both() -> None:
        await asyncio.gather(*(call(env, state, new_sample(env, 90 + i), params) for i in range(2)))

    env.run(both())


def abort_now(state: Any, rollout_id: int = 0) -> Any:
    """fastaccum's abort, as Miles' rollout class calls it when the rollout ends (nothing pending)."""
    return fm.abort(state, set(), rollout_id)


# ---- scenarios ---------------------------------------------------------------------------------
def scenario_completion(env: MilesEnv, incremental: bool, interval: int) -> None:
    """A call to the end: the tokens, log-probs and text of the server's answer, Miles' status
    and bookkeeping, no loss mask (Miles' single-turn generate starts none), the request Miles'
    single-turn generate sends plus a rid and ``stream``; Miles' loader hands over the function
    itself (Miles' own signature, not slime's wrapped)."""
    with (
        emulator_thread(incremental_streaming_output=incremental, stream_interval=interval) as emu,
        wired(env, emu) as wiring,
    ):
        args = make_args(env, emu, rollout_max_response_len=100)
        wiring.plans["s001a00"] = {"stop_at": 7}
        state = new_state(env, args)
        assert env.compatibility.load_generate_function(GENERATE) is fm.generate
        truncated, stopped = new_sample(env, 0), new_sample(env, 1)
        outputs = [env.run(call(env, state, truncated)), env.run(call(env, state, stopped))]
        assert [output.samples for output in outputs] == [truncated, stopped]
        assert all(isinstance(output, env.base_types.GenerateFnOutput) for output in outputs)
        gen = expected(emu, "s000a00", 100)
        assert truncated.tokens == prompt_ids() + list(gen.token_ids)
        assert truncated.rollout_log_probs == [float(x) for x in gen.logprobs]
        assert truncated.response == gen.text(0, 100) and truncated.response_length == 100
        assert truncated.loss_mask is None and truncated.status == env.Sample.Status.TRUNCATED
        assert truncated.weight_versions == ["default"]
        assert truncated.prefix_cache_info.total_prompt_tokens == len(prompt_ids())
        assert truncated.spec_info.completion_token_num == 0  # no speculative algorithm: not counted
        assert stopped.status == env.Sample.Status.COMPLETED and stopped.response_length == 7
        truncated.validate()
        body = wiring.payloads[0]
        assert body["input_ids"] == prompt_ids() and body["return_logprob"] is True and body["stream"] is True
        assert body["return_routed_experts"] is False and body["return_indexer_topk"] is False
        assert body["sampling_params"] == {**state.sampling_params, "max_new_tokens": 100}
        assert wiring.headers[0] is None
        assert all(type(stream) is sh.stream_class(env) for stream in wiring.streams)
        if env.transport != "aiohttp":
            (timing,) = truncated.metadata["fastaccum_timing"]
            assert timing["tokens"] == 100 and timing["events"] >= 100 // interval


def scenario_same_sample_as_miles_own_generate(env: MilesEnv, incremental: bool) -> None:
    """The same request answered to Miles' own single-turn generate (one non-streaming POST, then
    ``update_sample_from_response``) and to fastaccum.miles.generate (a stream) fills the same
    Sample: tokens, text, log-probs, mask, versions, counts, status, and routed experts and
    indexer top-k equal to Miles' own base64 decode, array for array (dtype, shape, values). The
    greedy emulator answers the same prompt the same whatever the rid."""
    with (
        emulator_thread(
            incremental_streaming_output=incremental,
            greedy=True,
            enable_return_routed_experts=True,
            enable_return_indexer_topk=True,
            indexer_topk_num_layers=True,
        ) as emu,
        wired(env, emu),
    ):
        args = make_args(env, emu, use_rollout_routing_replay=True, use_rollout_indexer_replay=True)
        state = new_state(env, args)
        ours = new_sample(env, 0)
        env.run(call(env, state, ours))
        args.custom_generate_function_path = "miles.rollout.generate_hub.single_turn.generate"
        theirs = new_sample(env, 1)
        env.run(call(env, state, theirs))
        assert comparable(ours) == comparable(theirs)
        for name in ("rollout_routed_experts", "rollout_indexer_topk"):
            mine, miles = getattr(ours, name), getattr(theirs, name)
            assert isinstance(mine, np.ndarray) and mine.dtype == miles.dtype == np.int32, name
            assert mine.shape == miles.shape and np.array_equal(mine, miles), name
        layers, width = emu.indexer_shape
        assert ours.rollout_indexer_topk.shape == (len(ours.tokens) - 1, layers, width)
        assert ours.rollout_routed_experts.shape == (len(ours.tokens) - 1, *emu.expert_shape)
        ours.validate()


def comparable(sample: Any) -> dict[str, Any]:
    """Every field Miles' ``update_sample_from_response`` writes, but the arrays and our timing."""
    fields = dataclasses.asdict(sample)
    fields.pop("index")
    fields.pop("rollout_routed_experts")
    fields.pop("rollout_indexer_topk")
    fields["metadata"] = {k: v for k, v in fields["metadata"].items() if k != "fastaccum_timing"}
    return fields


def scenario_abort_keeps_prefix_then_resume(env: MilesEnv, incremental: bool) -> None:
    """fastaccum's abort keeps the observed prefix (ABORTED): drained, with the routed experts of
    every kept position from the terminal abort event; cut, without. The resume sends everything
    the sample holds with the budget less what it kept, asks only for the rows it does not hold
    (``routed_experts_start_len``), and ends with one row per position, none twice."""
    with (
        emulator_thread(
            incremental_streaming_output=incremental, token_rate=400, enable_return_routed_experts=True
        ) as emu,
        wired(env, emu) as wiring,
    ):
        args = make_args(env, emu, use_rollout_routing_replay=True, rollout_max_response_len=2000, partial_rollout=True)
        state = new_state(env, args)
        sample = new_sample(env)
        wiring.plans["s000a01"] = {"stop_at": 5}
        p = len(prompt_ids())

        async def first() -> Any:
            task = await _started(emu, generate_and_rm(env, state, sample), 10)
            assert await abort_now(state) == []  # nothing pending in this direct call
            return await task

        env.run(first())
        k = sample.response_length
        assert sample.status == env.Sample.Status.ABORTED and 0 < k < 2000 and sample.reward is None
        assert sample.weight_versions == ["default"]
        sh.assert_kept_what_was_sent(sample, emu, "s000a00")
        assert emu.server_wide_aborts == 0 and emu.running == 0  # by rid, and idle when it returned
        if drains(env):
            assert emu.aborted_rids == ["s000a00"]
            assert np.array_equal(sample.rollout_routed_experts, rows_of(emu, "s000a00", k, p))
        else:
            assert "s000a00" in emu.stats.disconnected_rids and sample.rollout_routed_experts is None

        state.reset()
        env.run(generate_and_rm(env, state, sample))
        body = wiring.payloads[1]
        held = p + k - 1 if drains(env) else 0
        assert body["input_ids"] == sample.tokens[: p + k]
        assert body["sampling_params"]["max_new_tokens"] == 2000 - k
        assert body.get("routed_experts_start_len", 0) == held
        assert sample.status == env.Sample.Status.COMPLETED and sample.response_length == k + 5
        assert_call(sample, emu, "s000a00", 0, k, p)
        assert_call(sample, emu, "s000a01", k, 5, p + k)
        rows = np.concatenate([rows_of(emu, "s000a00", k, p)[:held], rows_of(emu, "s000a01", 5, p + k, held)])
        assert sample.rollout_routed_experts.dtype == np.int32
        assert np.array_equal(sample.rollout_routed_experts, rows)
        assert REWARDS[0] == 1 and sample.weight_versions == ["default", "default"]
        sample.validate()


def scenario_abort_after_terminal_keeps_result(env: MilesEnv) -> None:
    """An abort after the terminal event (before [DONE]) keeps the finished result, scored once
    and not ABORTED (a resume would generate past its end)."""
    with emulator_thread() as emu, wired(env, emu) as wiring:
        args = make_args(env, emu, rollout_max_response_len=12)
        wiring.plans["s000a00"] = {"fault": {"kind": "stall", "at": "done", "seconds": 30}}
        state, sample = new_state(env, args), new_sample(env)

        async def main() -> None:
            task = asyncio.get_running_loop().create_task(generate_and_rm(env, state, sample))
            await wait_until(lambda: bool(wiring.streams) and wiring.streams[0].tokens >= 12)
            await abort_now(state)
            await task

        env.run(main())
        assert sample.status == env.Sample.Status.TRUNCATED and sample.response_length == 12
        assert REWARDS[0] == 1 and sample.reward == 12.0 and emu.running == 0


def scenario_unrelated_cancellation_propagates(env: MilesEnv) -> None:
    """A cancel that is not the rollout abort's leaves the sample as it was and propagates."""
    with emulator_thread(token_rate=400) as emu, wired(env, emu):
        args = make_args(env, emu, rollout_max_response_len=2000)
        state, sample = new_state(env, args), new_sample(env)

        async def main() -> None:
            task = await _started(emu, generate_and_rm(env, state, sample), 5)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        env.run(main())
        assert sample.response_length == 0 and sample.response == "" and sample.tokens == []
        assert sample.status == env.Sample.Status.PENDING
        assert all(not r.request_streams for r in _pools.POOLS.registries())


def scenario_server_abort_is_aborted_never_an_exception(env: MilesEnv, incremental: bool) -> None:
    """SGLang's ``abort_all`` (a weight update's ``abort`` pause, an operator) ends a running
    stream with its terminal abort event and a queued one with the echo: both samples come back
    ABORTED, the running one with its prefix and routed experts; no call raises."""
    with (
        emulator_thread(
            incremental_streaming_output=incremental,
            token_rate=400,
            max_running_requests=1,
            enable_return_routed_experts=True,
        ) as emu,
        wired(env, emu),
    ):
        args = make_args(env, emu, rollout_max_response_len=2000, use_rollout_routing_replay=True)
        state = new_state(env, args)
        running, queued = new_sample(env, 0), new_sample(env, 1)

        async def main() -> None:
            first = await _started(emu, call(env, state, running), 5)
            second = asyncio.get_running_loop().create_task(call(env, state, queued))
            await wait_until(lambda: emu.queued == 1)
            async with aiohttp.ClientSession() as session:
                await session.post(emu.url + "/abort_request", json={"abort_all": True})
            await asyncio.gather(first, second)

        env.run(main())
        k = running.response_length
        assert running.status == env.Sample.Status.ABORTED and k > 0 and running.weight_versions == ["default"]
        assert_call(running, emu, "s000a00", 0, k, len(prompt_ids()))
        assert np.array_equal(running.rollout_routed_experts, rows_of(emu, "s000a00", k, len(prompt_ids())))
        assert queued.status == env.Sample.Status.ABORTED and queued.response_length == 0


def scenario_miles_own_abort_keeps_prefix(env: MilesEnv, path: str) -> None:
    """fastaccum.miles.generate under Miles' own rollout (no fastaccum rollout function): Miles'
    ``abort_all`` ends each running stream with its terminal abort event, so the buffered group
    keeps every decoded token and its routed experts, and resumes from them."""
    with emulator_thread(token_rate=400, enable_return_routed_experts=True) as emu, wired(env, emu) as wiring:
        args = make_args(
            env,
            emu,
            partial_rollout=True,
            over_sampling_batch_size=2,
            rollout_max_response_len=3000,
            use_rollout_routing_replay=True,
        )
        wiring.plans.update({"s000a00": {"stop_at": 3}, "s001a01": {"stop_at": 4}})
        warm_shards(env, args)
        source = sh.BufferedPrompts(env, args)
        own = "miles.rollout.inference_rollout.inference_rollout_common.InferenceRolloutFn"
        rollouts = Rollouts(
            env, args, source, path, own if path == "class" else "miles.rollout.sglang_rollout.generate_rollout"
        )
        first = rollouts(0)
        assert [s.index for group in first.samples for s in group] == [0]
        (group,) = source.buffer
        (cut,) = group
        k = cut.response_length
        assert cut.status == env.Sample.Status.ABORTED and k > 0 and emu.server_wide_aborts >= 1
        assert cut.metadata["start_rollout_id"] == 0
        assert np.array_equal(cut.rollout_routed_experts, rows_of(emu, "s001a00", k, len(prompt_ids())))
        rollouts(1)
        assert cut.status == env.Sample.Status.COMPLETED and cut.response_length == k + 4
        (resumed,) = [body for body in wiring.payloads if body["rid"] == "s001a01"]
        assert resumed["routed_experts_start_len"] == len(prompt_ids()) + k - 1
        assert cut.rollout_routed_experts.shape == (len(cut.tokens) - 1, *emu.expert_shape)
        cut.validate()


def scenario_errors_fail_closed(env: MilesEnv) -> None:
    """Stream errors raise with nothing committed; results fastaccum refuses to commit: an abort
    with a status code, an unknown finish type, a null log-prob, an indexer top-k without its
    layer count (plain SGLang sends none; Miles asserts it)."""
    faults = [
        ({"kind": "error_event", "at": 2, "message": "boom"}, ServerError),
        ({"kind": "cut", "at": 2}, StreamTruncatedError),
        ({"kind": "malformed_json", "at": 1}, StreamFormatError),
        ({"kind": "http_500"}, ServerError),
    ]
    with emulator_thread() as emu, wired(env, emu) as wiring:
        args = make_args(env, emu, fastaccum_retries=0)
        state = new_state(env, args)
        for index, (fault, error) in enumerate(faults):
            wiring.plans[f"s{index:03d}a00"] = {"fault": fault}
            sample = new_sample(env, index)
            with pytest.raises(error):
                env.run(call(env, state, sample))
            assert sample.response_length == 0 and sample.status == env.Sample.Status.PENDING
    with emulator_thread(enable_return_indexer_topk=True) as emu, wired(env, emu):
        args = make_args(env, emu, use_rollout_indexer_replay=True)
        sample = new_sample(env)
        with pytest.raises(StreamFormatError, match="indexer_topk_num_layers"):
            env.run(call(env, new_state(env, args), sample))
        assert sample.response_length == 0 and sample.tokens == []
    from fastaccum.miles._commit import commit_terminal

    for result, error in sh.refused_results():
        sample = new_sample(env)
        with pytest.raises(error):
            commit_terminal(
                SimpleNamespace(sglang_speculative_algorithm=None), sample, result, FakeTokenizer(), [1], None
            )
        assert sample.response_length == 0 and sample.tokens == []


def scenario_register_then_check(env: MilesEnv) -> None:
    """A call that starts once the rollout is being aborted sends nothing and is ABORTED."""
    with emulator_thread() as emu, wired(env, emu):
        state = new_state(env, make_args(env, emu))
        state.aborted = True
        sample = new_sample(env)
        env.run(call(env, state, sample))
        assert sample.status == env.Sample.Status.ABORTED and sample.response_length == 0
        assert emu.stats.requests == 0


def scenario_request_as_miles_builds_it(env: MilesEnv) -> None:
    """What Miles' single-turn request carries, carried: the routing key header its routing
    policies set, ``lora_path``, ``image_data``, the context cap (TRUNCATED without a request
    when nothing fits), a spent budget (TRUNCATED without a request), an overrun refused."""
    from PIL import Image

    with emulator_thread() as emu, wired(env, emu) as wiring:
        args = make_args(env, emu, sglang_router_policy="consistent_hashing", rollout_max_response_len=3, lora_rank=8)
        state = new_state(env, args)
        sample = new_sample(env)
        sample.routing_key = "key-1"
        image = Image.new("RGB", (2, 2), (255, 0, 0))
        sample.multimodal_inputs = {"images": [image]}
        env.run(call(env, state, sample))
        assert wiring.headers[0] == {"X-SMG-Routing-Key": "key-1"}
        body = wiring.payloads[0]
        from miles.utils.processing_utils import encode_image_for_rollout_engine

        assert body["lora_path"] == "miles_lora" and body["image_data"] == [encode_image_for_rollout_engine(image)]
        unkeyed = new_sample(env, 1)
        with pytest.raises(ValueError, match="routing"):
            env.run(call(env, state, unkeyed))
        sample.status = env.Sample.Status.ABORTED  # resumed with its budget spent
        env.run(call(env, state, sample))
        assert sample.status == env.Sample.Status.TRUNCATED and len(wiring.payloads) == 1
        sample.status = env.Sample.Status.ABORTED
        with pytest.raises(ValueError, match="max_new_tokens"):
            env.run(call(env, state, sample, {**state.sampling_params, "max_new_tokens": 2}))
        capped = make_args(env, emu, rollout_max_context_len=len(prompt_ids()) + 2, rollout_max_response_len=40)
        short = new_sample(env, 2)
        env.run(call(env, new_state(env, capped), short))
        assert wiring.payloads[1]["sampling_params"]["max_new_tokens"] == 2 and short.response_length == 2
        full = make_args(env, emu, rollout_max_context_len=len(prompt_ids()))
        none_left = new_sample(env, 3)
        env.run(call(env, new_state(env, full), none_left))
        assert none_left.status == env.Sample.Status.TRUNCATED and len(wiring.payloads) == 2


def scenario_text_decoded_once(env: MilesEnv) -> None:
    """A server without a tokenizer sends no text: the call's text is decoded once."""
    with emulator_thread(skip_tokenizer_init=True) as emu, wired(env, emu):
        args = make_args(env, emu, rollout_max_response_len=12)
        state = new_state(env, args)
        before = FakeTokenizer.decodes
        sample = new_sample(env)
        env.run(call(env, state, sample))
        assert FakeTokenizer.decodes == before + 1
        assert sample.response == FakeTokenizer().decode(sample.tokens[len(prompt_ids()) :])


def scenario_stream_mode_checked_first(env: MilesEnv, path: str) -> None:
    """Servers streaming in the other mode fail the rollout before it sends anything, naming both
    flags; ``fastaccum_stream_mode: auto`` lets the events decide."""
    with emulator_thread(incremental_streaming_output=True) as emu, wired(env, emu):
        args = make_args(env, emu, sglang_incremental_streaming_output=False)
        rollouts = Rollouts(env, args, sh.BufferedPrompts(env, args), path)
        with pytest.raises(ValueError, match=r"--sglang-incremental-streaming-output off.*output on"):
            rollouts(0)
        assert emu.stats.requests == 0 and rollouts.train_abort not in (fm.abort, fm.request_abort)
        args.fastaccum_stream_mode = "auto"
        output = rollouts(1)
        assert output.samples[0][0].response_length == 40


def scenario_evaluation_delegates(env: MilesEnv, path: str) -> None:
    """An evaluation runs Miles' own, with Miles' abort in place."""
    seen = []

    async def eval_call(self: Any, input: Any) -> Any:  # noqa: A002
        seen.append(env.train.abort)
        return env.base_types.RolloutFnEvalOutput(data={"eval": {}})

    def eval_function(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
        seen.append(env.legacy.abort)
        return env.base_types.RolloutFnEvalOutput(data={"eval": {}})

    with emulator_thread() as emu, wired(env, emu):
        args = make_args(env, emu)
        patch = pytest.MonkeyPatch()
        patch.setattr(env.common.InferenceRolloutFn, "_call_eval", eval_call)
        patch.setattr(env.legacy, "generate_rollout", eval_function)
        try:
            rollouts = Rollouts(env, args, sh.BufferedPrompts(env, args), path)
            if path == "class":
                output = env.compatibility.call_rollout_function(
                    rollouts.fn, env.base_types.RolloutFnEvalInput(rollout_id=3)
                )
            else:
                output = env.base_types.call_rollout_fn(rollouts.fn, args, 3, rollouts.source, evaluation=True)
        finally:
            patch.undo()
    assert output.data == {"eval": {}} and len(seen) == 1 and seen[0] not in (fm.abort, fm.request_abort)


def scenario_mixed_groups_buffered_and_resumed(env: MilesEnv, path: str) -> None:
    """The abort at a rollout's end, through Miles' own rollout: one group finished; one with a
    finished sample, one cut mid-stream and one stalled before its first event; one stalled
    whole. Every pending group is buffered, as Miles' abort buffers them (stamped where a sample
    holds a response); by rid, never server-wide; the servers idle. The next rollout resumes only
    the aborted samples: no token, reward or routed-expert row twice."""
    with emulator_thread(token_rate=400, enable_return_routed_experts=True) as emu, wired(env, emu) as wiring:
        args = make_args(
            env,
            emu,
            partial_rollout=True,
            n_samples_per_prompt=3,
            over_sampling_batch_size=3,
            rollout_max_response_len=3000,
            use_rollout_routing_replay=True,
            test_reward_delay=0.1,
        )
        stall = {"fault": {"kind": "stall", "at": 0, "seconds": 30}}
        stops = {"s000a00": 3, "s001a00": 3, "s002a00": 3, "s003a00": 2}
        wiring.plans.update({rid: {"stop_at": k} for rid, k in stops.items()})
        wiring.plans.update({f"s00{i}a00": stall for i in (5, 6, 7, 8)})
        source = sh.BufferedPrompts(env, args)
        rollouts = Rollouts(env, args, source, path)
        miles_abort = rollouts.train_abort
        first = rollouts(0)
        assert rollouts.train_abort is miles_abort  # Miles' own abort is back
        assert [s.index for s in first.samples[0]] == [0, 1, 2]
        metrics: dict[str, Any] = {}
        assert fm.log_rollout_data(0, args, first.samples, metrics, 1.0) is False
        assert metrics["fastaccum/calls"] == 9 and metrics["fastaccum/finished"] == 4
        assert metrics["fastaccum/aborted_drained"] + metrics["fastaccum/aborted_cut"] == 5
        buffered = [[s.index for s in group] for group in source.buffer]
        assert sorted(buffered) == [[3, 4, 5], [6, 7, 8]]  # Miles buffers a group that kept nothing too
        done, partial, empty = source.created[1]
        k = partial.response_length
        assert done.status == env.Sample.Status.COMPLETED and REWARDS[3] == 1
        assert partial.status == env.Sample.Status.ABORTED and k > 0 and partial.reward is None
        sh.assert_kept_what_was_sent(partial, emu, "s004a00")
        assert partial.metadata["start_rollout_id"] == 0 and "start_rollout_id" not in empty.metadata
        assert empty.status == env.Sample.Status.ABORTED and empty.response_length == 0
        assert emu.server_wide_aborts == 0 and emu.running == 0
        snapshot = (list(done.tokens), done.response, done.reward, list(done.rollout_log_probs))

        wiring.plans.update({"s004a01": {"stop_at": 4}, "s005a01": {"stop_at": 6}})
        wiring.plans.update({f"s00{i}a01": {"stop_at": 2} for i in (6, 7, 8)})
        args.rollout_batch_size = 2
        second = rollouts(1)
        assert sorted(s.index for group in second.samples for s in group) == [3, 4, 5, 6, 7, 8]
        assert (list(done.tokens), done.response, done.reward, list(done.rollout_log_probs)) == snapshot
        assert wiring.attempts[3] == 1  # the finished sibling never called generate again
        p = len(prompt_ids())
        assert_call(partial, emu, "s004a00", 0, k, p)
        assert_call(partial, emu, "s004a01", k, 4, p + k)
        assert partial.response_length == k + 4 and partial.status == env.Sample.Status.COMPLETED
        held = p + k - 1 if drains(env) else 0
        rows = np.concatenate([rows_of(emu, "s004a00", k, p)[:held], rows_of(emu, "s004a01", 4, p + k, held)])
        assert np.array_equal(partial.rollout_routed_experts, rows)
        assert_call(empty, emu, "s005a01", 0, 6, p)
        assert empty.response_length == 6
        assert all(REWARDS[i] == 1 for i in range(9))
        for sample in (partial, empty):
            sample.validate()


def scenario_idle_wait_and_fallback(env: MilesEnv) -> None:
    """After its aborts by rid fastaccum waits until every worker is idle; a request it cannot
    see keeps a worker busy, so past the wait Miles' own abort_all runs, until idle."""
    with emulator_thread(token_rate=200) as emu, wired(env, emu):
        args = make_args(env, emu, rollout_max_response_len=100_000, fastaccum_idle_timeout=0.3)
        state = new_state(env, args)

        async def main() -> tuple[int, int]:
            async with aiohttp.ClientSession() as session:
                body = {"input_ids": [1, 2, 3], "rid": "zombie-1", "sampling_params": {"max_new_tokens": 100_000}}
                zombie = await session.post(emu.url + "/generate", json={**body, "stream": True})
                await wait_until(lambda: emu.running == 1)
                task = await _started(emu, generate_and_rm(env, state, new_sample(env)), 5)
                await abort_now(state)
                await task
                zombie.close()
                return emu.server_wide_aborts, emu.running

        aborted, running = env.run(main())
        assert aborted >= 1 and running == 0

    with emulator_thread(token_rate=200) as emu, wired(env, emu):
        state = new_state(env, make_args(env, emu, rollout_max_response_len=100_000))

        async def quiet() -> None:
            task = await _started(emu, generate_and_rm(env, state, new_sample(env)), 5)
            await abort_now(state)
            await task
            assert emu.running == 0

        env.run(quiet())
        assert emu.server_wide_aborts == 0
        assert emu.aborted_rids == (["s000a00"] if drains(env) else [])


async def miles_foreign_generate(input: Any) -> Any:  # noqa: A002
    """A generate function of Miles' signature that is not fastaccum's (no ``abort_mode``)."""
    input.sample.tokens, input.sample.response_length, input.sample.response = [1, 7], 1, "x"
    input.sample.status = type(input.sample).Status.COMPLETED
    return importlib.import_module("miles.rollout.base_types").GenerateFnOutput(samples=input.sample)


def scenario_foreign_generate_keeps_miles_abort(env: MilesEnv, path: str) -> None:
    """fastaccum cannot see another generate function's requests: its abort hands over to Miles'."""
    calls = []

    async def class_abort(state: Any, pendings: set, rollout_id: int) -> list:
        calls.append(rollout_id)
        state.aborted = True
        return []

    async def legacy_abort(args: Any, rollout_id: int) -> list:
        calls.append(rollout_id)
        env.legacy.GenerateState(args).aborted = True
        return []

    with emulator_thread() as emu, wired(env, emu):
        args = make_args(env, emu, custom_generate_function_path="fastaccum_miles_harness.miles_foreign_generate")
        patch = pytest.MonkeyPatch()
        patch.setattr(env.train, "abort", class_abort)
        patch.setattr(env.legacy, "abort", legacy_abort)
        try:
            output = Rollouts(env, args, sh.BufferedPrompts(env, args), path)(4)
        finally:
            patch.undo()
    assert calls == [4] and output.samples[0][0].status == env.Sample.Status.COMPLETED


def scenario_agent_plugins_stop_before_groups_are_awaited(env: MilesEnv) -> None:
    """As Miles' abort does, fastaccum's asks the agent plugin (``--custom-agent-function-path``)
    to stop its trials before it waits for the pending groups: a group that only the plugin's
    stop ends is awaited, not waited on forever."""
    trials: list[asyncio.Event] = []  # the plugin's running trials

    async def stop(args: Any) -> None:
        for trial in trials:
            trial.set()

    plugin = _module("fastaccum_miles_agent_plugin", agent=None, abort=stop)
    try:
        with emulator_thread() as emu, wired(env, emu):
            state = new_state(env, make_args(env, emu, custom_agent_function_path=f"{plugin.__name__}.agent"))

            async def main() -> None:
                trials.append(asyncio.Event())
                group = asyncio.ensure_future(trials[0].wait())  # a group whose trial runs until stopped
                assert await fm.abort(state, {group}, 0) == []  # not --partial-rollout: nothing buffered
                assert group.done()

            env.run(main())
    finally:
        sys.modules.pop(plugin.__name__, None)


def scenario_sample_as_miles_keeps_it(env: MilesEnv) -> None:
    """``update_from_meta_info``'s rules the adapter relies on (keeps the double faithful): the
    status from the finish type (another leaves it), one version when the answer has one, the
    prefix-cache counts always, the speculative ones only with a speculative algorithm."""
    S = env.Sample
    plain, spec = (
        SimpleNamespace(sglang_speculative_algorithm=None),
        SimpleNamespace(sglang_speculative_algorithm="eagle"),
    )
    for kind, status in (("stop", S.Status.COMPLETED), ("length", S.Status.TRUNCATED), ("abort", S.Status.ABORTED)):
        sample = S()
        sample.update_from_meta_info(
            plain, {"finish_reason": {"type": kind}, "weight_version": "w3", "prompt_tokens": 4}
        )
        assert sample.status == status and sample.weight_versions == ["w3"]
        assert sample.prefix_cache_info.total_prompt_tokens == 4
    sample = S()
    sample.update_from_meta_info(plain, {"finish_reason": {"type": "weird"}, "completion_tokens": 5})
    assert (
        sample.status == S.Status.PENDING
        and sample.weight_versions == []
        and sample.spec_info.completion_token_num == 0
    )
    sample.update_from_meta_info(spec, {"finish_reason": {"type": "stop"}, "completion_tokens": 5, "cached_tokens": 2})
    assert sample.spec_info.completion_token_num == 5 and sample.prefix_cache_info.cached_tokens == 2
    with pytest.raises(TypeError):
        S().update_from_meta_info(plain, {"finish_reason": None})
    fields = {f.name for f in dataclasses.fields(S)}
    assert {"rollout_routed_experts", "rollout_indexer_topk", "routing_key", "weight_versions"} <= fields


def scenario_first_day(env: MilesEnv) -> None:
    """A misspelt key is refused before anything is sent (naming the key it meant); a restarting
    server's 503s are retried and counted; the first call says which core and settings run."""
    with emulator_thread() as emu, wired(env, emu):
        bad = make_args(env, emu, fastaccum_idle_timout=3)
        with pytest.raises(SettingsError, match="'fastaccum_idle_timout' .did you mean 'fastaccum_idle_timeout'."):
            env.run(call(env, new_state(env, bad), new_sample(env)))
        with pytest.raises(SettingsError, match="fastaccum_idle_timout"):
            Rollouts(env, bad, sh.BufferedPrompts(env, bad), "class")(0)
        with pytest.raises(SettingsError, match="fastaccum_stream_mode='incremental', but Miles starts"):
            Settings.from_args(make_args(env, emu, fastaccum_stream_mode="incremental"))
        assert emu.generates == 0
        args = make_args(env, emu, fastaccum_retry_max_delay_s=0.0)
        emu.refuse = [503, 502]
        _pools.FRAMEWORK._announced = False
        records: list[logging.LogRecord] = []
        handler = logging.Handler(logging.INFO)
        handler.emit = records.append  # type: ignore[method-assign]
        logger = logging.getLogger("fastaccum.miles")
        logger.addHandler(handler)
        level = logger.level
        logger.setLevel(logging.INFO)
        try:
            sample = new_sample(env, 1)
            env.run(call(env, new_state(env, args), sample))
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
        assert emu.generates == 3 and sample.response_length == args.rollout_max_response_len
        if env.transport != "aiohttp":
            assert sample.metadata["fastaccum_timing"][0]["retries"] == 2
        first = records[0].getMessage()
        assert f"fastaccum {fastaccum.__version__} ({fastaccum.IMPLEMENTATION} core) for miles" in first


def scenario_loader_contract(env: MilesEnv) -> None:
    """What Miles' loader makes of the two flags: the generate function is called as it is (its
    first parameter is ``input``, so not wrapped as slime's), marked request-abortable; the
    rollout class is built with the constructor input, a subclass of Miles' own; the v1 rollout
    function has Miles' v1 signature."""
    assert list(inspect.signature(fm.generate).parameters) == ["input"]
    assert not env.compatibility._is_legacy_generate_fn(fm.generate)
    with emulator_thread() as emu, wired(env, emu):
        args = make_args(env, emu)
        source = sh.BufferedPrompts(env, args)
        built = Rollouts(env, args, source, "class").fn
        assert isinstance(built, env.common.InferenceRolloutFn) and type(built).__name__ == "InferenceRolloutFn"
        assert type(built) is env.misc.load_function(ROLLOUT_CLASS) and built.data_source is source
        assert built.state.generate_function is fm.generate and fm.generate.abort_mode == "request"
    mine = inspect.signature(fm.generate_rollout).parameters
    theirs = inspect.signature(env.legacy.generate_rollout).parameters
    assert [(p.name, p.kind, p.default) for p in mine.values()] == [
        (p.name, p.kind, p.default) for p in theirs.values()
    ]


def scenario_weight_update_mid_rollout(env: MilesEnv, path: str, mode: str) -> None:
    """Miles' weight update pauses SGLang (``--pause-generation-mode`` retract, its default, or
    in_place), loads new weights as "v2" and continues: the rollout notices nothing but the
    versions. Every sample finishes, records both versions in order, and its routed experts
    cover its sequence."""
    with emulator_thread(token_rate=200, enable_return_routed_experts=True) as emu, wired(env, emu) as wiring:
        args = make_args(
            env, emu, rollout_max_response_len=150, n_samples_per_prompt=2, use_rollout_routing_replay=True
        )
        rollouts = Rollouts(env, args, sh.BufferedPrompts(env, args), path)

        async def update() -> None:
            # What Miles' update does to each engine, over HTTP: pause, load, continue.
            await wait_until(lambda: len(wiring.streams) == 2 and min(s.tokens for s in wiring.streams) >= 10)
            async with aiohttp.ClientSession() as session:
                for route, body in (
                    ("/pause_generation", {"mode": mode}),
                    (
                        "/update_weights_from_disk",
                        {"model_path": "second", "weight_version": "v2", "flush_cache": mode == "retract"},
                    ),
                    ("/continue_generation", {}),
                ):
                    async with session.post(emu.url + route, json=body) as reply:
                        assert reply.status == 200, await reply.text()

        updating = asyncio.run_coroutine_threadsafe(update(), env.async_utils.get_async_loop().loop)
        output = rollouts(0)
        updating.result()
    (group,) = output.samples
    for sample in group:
        assert sample.status == env.Sample.Status.TRUNCATED and sample.response_length == 150
        assert sample.weight_versions == ["default", "v2"]
        assert sample.rollout_routed_experts.shape == (len(sample.tokens) - 1, *emu.expert_shape)
        sample.validate()
    assert emu.server_wide_aborts == 0 and emu.weights == "second"


# (name, function, parameter sets): both test tiers run exactly this list.
SCENARIOS: list[tuple[str, Any, list[dict[str, Any]]]] = [
    (
        "completion",
        scenario_completion,
        [{"incremental": inc, "interval": iv} for inc in (False, True) for iv in (1, 20)],
    ),
    (
        "same_sample_as_miles_own_generate",
        scenario_same_sample_as_miles_own_generate,
        [{"incremental": False}, {"incremental": True}],
    ),
    (
        "abort_keeps_prefix_then_resume",
        scenario_abort_keeps_prefix_then_resume,
        [{"incremental": False}, {"incremental": True}],
    ),
    ("abort_after_terminal_keeps_result", scenario_abort_after_terminal_keeps_result, [{}]),
    ("unrelated_cancellation_propagates", scenario_unrelated_cancellation_propagates, [{}]),
    (
        "server_abort_is_aborted_never_an_exception",
        scenario_server_abort_is_aborted_never_an_exception,
        [{"incremental": True}],
    ),
    ("miles_own_abort_keeps_prefix", scenario_miles_own_abort_keeps_prefix, [{"path": p} for p in PATHS]),
    ("errors_fail_closed", scenario_errors_fail_closed, [{}]),
    ("register_then_check", scenario_register_then_check, [{}]),
    ("request_as_miles_builds_it", scenario_request_as_miles_builds_it, [{}]),
    ("text_decoded_once", scenario_text_decoded_once, [{}]),
    ("stream_mode_checked_first", scenario_stream_mode_checked_first, [{"path": p} for p in PATHS]),
    ("evaluation_delegates", scenario_evaluation_delegates, [{"path": p} for p in PATHS]),
    ("mixed_groups_buffered_and_resumed", scenario_mixed_groups_buffered_and_resumed, [{"path": p} for p in PATHS]),
    ("idle_wait_and_fallback", scenario_idle_wait_and_fallback, [{}]),
    ("foreign_generate_keeps_miles_abort", scenario_foreign_generate_keeps_miles_abort, [{"path": p} for p in PATHS]),
    ("agent_plugins_stop_first", scenario_agent_plugins_stop_before_groups_are_awaited, [{}]),
    ("sample_as_miles_keeps_it", scenario_sample_as_miles_keeps_it, [{}]),
    ("first_day", scenario_first_day, [{}]),
    ("loader_contract", scenario_loader_contract, [{}]),
    (
        "weight_update_mid_rollout",
        scenario_weight_update_mid_rollout,
        [{"path": p, "mode": m} for p in PATHS for m in ("retract", "in_place")],
    ),
]


def scenario_params() -> list[Any]:
    """pytest params: one per (scenario, parameter set), with readable ids."""
    out = []
    for name, fn, sets in SCENARIOS:
        for kwargs in sets:
            suffix = "-".join(f"{k}={v}" for k, v in kwargs.items())
            out.append(pytest.param(fn, kwargs, id=f"{name}[{suffix}]" if suffix else name))
    return out
