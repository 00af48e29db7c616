"""The slime adapter against the slime test double (tests/slime_double) and the emulator over loopback.

The scenarios live in tests/slime_double/harness.py so that tests/test_slime_real.py runs the same
ones against a real slime checkout; the in-tree request-abort cooperation can only be modelled by
the double (slime 624b824a8 predates it), so it is tested here alone.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("torch")  # slime's Sample holds tensors; the double does too


def _load_harness() -> ModuleType:
    name = "fastaccum_slime_harness"
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / "slime_double" / "harness.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # slime's load_function reaches the reward function by this name
        spec.loader.exec_module(module)
    return sys.modules[name]


harness = _load_harness()


@pytest.fixture(scope="module")
def double() -> Any:
    with harness.slime_env("double", harness.DOUBLE_ROOT) as env:
        yield env


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(double: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(double, **kwargs)


# ---- slime builds with request-level abort in-tree (modelled by the double) --------------------
@pytest.fixture
def in_tree(double: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(double.rollout, "IN_TREE_REQUEST_ABORT", True)
    return double


def test_in_tree_build_runs_its_own_lifecycle(in_tree: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """generate registers its stream task in GenerateState.cancellable_tasks; slime's own abort
    cancels it and the prefix is committed; generate_rollout is a plain delegation (no abort swap)."""
    import fastaccum.slime as fs

    env = in_tree
    with harness.emulator_thread(token_rate=400) as emu, harness.wired(env, emu) as wiring:
        args = harness.make_args(emu, partial_rollout=True, rollout_batch_size=1, n_samples_per_prompt=1,
                                 over_sampling_batch_size=2, rollout_max_response_len=3000, test_reward_delay=0.1)
        env.http_utils.init_http_client(args)
        wiring.plans["s000a00"] = {"stop_at": 3}  # sample 0 finishes; sample 1 runs long and is cut
        abort_seen = []
        original = env.rollout.generate_rollout_async

        async def spy(*a: Any, **k: Any) -> Any:
            abort_seen.append(env.rollout.abort)
            return await original(*a, **k)

        monkeypatch.setattr(env.rollout, "generate_rollout_async", spy)
        source = harness.BufferedPrompts(env, args)
        output = fs.generate_rollout(args, 0, source)
        assert abort_seen and abort_seen[0] is not fs.request_abort
        assert [s.index for s in output.samples[0]] == [0]
        (group,) = source.buffer
        (sample,) = group
        k = sample.response_length
        assert sample.status == env.Sample.Status.ABORTED and k > 0
        harness.assert_call(sample, emu, "s001a00", 0, k, len(harness.prompt_ids()))
        # The emulator (another thread) sees the closed socket a moment after the client closes it.
        deadline = time.monotonic() + 5.0
        while "s001a00" not in emu.stats.disconnected_rids and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "s001a00" in emu.stats.disconnected_rids and emu.stats.aborted == 0


def test_in_tree_unrelated_cancel_and_server_count(in_tree: Any) -> None:
    """Only slime's cancel of the registered task becomes ABORTED; top-p calls are counted in
    active_server_generations instead."""
    import fastaccum.slime as fs

    env = in_tree
    with harness.emulator_thread(token_rate=400) as emu, harness.wired(env, emu):
        args = harness.make_args(emu, rollout_max_response_len=3000)
        sample = harness.new_sample(env)

        async def main() -> None:
            task = await harness._start_and_wait(emu, fs.generate(args, sample, harness.sampling_params(env, args)), 5)
            state = env.rollout.GenerateState(args)
            assert len(state.cancellable_tasks) == 1
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert not state.cancellable_tasks
            top_p_args = harness.make_args(emu, rollout_max_response_len=3000, rollout_top_p=0.9)
            task = await harness._start_and_wait(
                emu, fs.generate(top_p_args, harness.new_sample(env, 1), harness.sampling_params(env, top_p_args)), 10)
            assert state.active_server_generations == 1 and not state.cancellable_tasks
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert state.active_server_generations == 0

        env.run(main())
        assert sample.response_length == 0 and sample.status == env.Sample.Status.PENDING
