"""fastaccum.areal against the AReaL double (tests/areal_double), on both twins: every scenario
runs AReaL's own engine and fastaccum's side by side on the emulator (the same scenarios run
against a real AReaL checkout in tests/test_areal_real.py)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import framework_harness
import numpy as np
import pytest

import fastaccum.areal

harness = framework_harness.areal()  # registered by name: the reward function is pickled by it


@pytest.fixture(scope="module")
def world() -> Iterator[Any]:
    world = harness.World()
    yield world
    world.close()


@pytest.fixture(scope="module")
def env() -> Iterator[Any]:
    with harness.areal_env("double", harness.DOUBLE_ROOT) as loaded:
        yield loaded


@pytest.mark.parametrize("scenario", harness.SCENARIOS, ids=[s.__name__ for s in harness.SCENARIOS])
def test_scenario(env: Any, world: Any, twin: ModuleType, scenario: Any) -> None:
    row = scenario(env, world)
    assert set(row) == set(harness.KINDS)


def test_the_adapter_imports_without_areal_and_says_what_is_missing() -> None:
    # A fresh interpreter: this one has the double's modules loaded by the fixtures.
    code = (
        "import sys, fastaccum.areal as fa\n"
        "assert 'areal' not in sys.modules\n"
        "try:\n    fa.StreamingSGLangEngine\n"
        "except ImportError as exc:\n    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("fastaccum.areal runs inside AReaL (areal-project/AReaL), which is not importable")


def test_agenerate_refuses_what_is_no_areal_engine(env: Any) -> None:
    with pytest.raises(TypeError, match="agenerate needs AReaL's RemoteSGLangEngine or the RemoteInfEngine"):
        asyncio.run(fastaccum.areal.agenerate(object(), env.request()))


def test_agenerate_streams_for_areal_s_own_engine_and_its_inner_one(env: Any, world: Any, twin: ModuleType) -> None:
    emulator = world.emulator()
    tokens, rows = harness.truth(emulator, harness.N)
    engine = env.engine("areal", [emulator], return_routed_experts=True)

    async def both() -> list[Any]:
        try:
            return [await fastaccum.areal.agenerate(e, env.request()) for e in (engine, engine._engine)]
        finally:
            await fastaccum.areal.close_session(engine)

    for resp in asyncio.run(both()):
        assert resp.output_tokens == tokens and np.array_equal(resp.routed_experts, rows)
    assert emulator.streamed == [True, True]


def test_workflows_handed_the_inner_engine_stream(env: Any, world: Any, twin: ModuleType) -> None:
    """AReaL's executor hands each workflow the inner engine: fastaccum's streams there too."""
    emulator = world.emulator()
    for kind in harness.KINDS:
        engine = env.engine(kind, [emulator])
        workflow = harness.workflow(env)
        out = engine.rollout_batch([{"messages": f"prompt {i}"} for i in range(3)], workflow=workflow)
        assert len(out) == 3
    assert emulator.streamed == [False] * 3 + [True] * 3
