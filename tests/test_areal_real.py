"""The AReaL adapter scenarios against a real areal-project/AReaL checkout and the double, side by
side: AReaL's own ``RemoteSGLangEngine`` and fastaccum's ``StreamingSGLangEngine`` in the same
run, each scenario's row of what each did written to ``FASTACCUM_AREAL_TABLE`` when set.

Skipped unless ``FASTACCUM_AREAL_PATH`` points at an AReaL source tree (docs/areal.md names the
commit tested; ``FASTACCUM_AREAL_COMMIT`` records the one run when the tree is no git checkout).
Running the same scenarios on both is what keeps tests/areal_double faithful. Needs torch (CPU),
aiohttp, requests, uvloop, pybase64 and numpy; what else AReaL imports and these paths never call
(transformers, torchdata, omegaconf, hydra, numba, flask, openai, tenacity, ...) is stubbed where
it is not installed (tests/areal_double/harness.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from test_areal import harness

AREAL_PATH = os.environ.get("FASTACCUM_AREAL_PATH")
if not AREAL_PATH:
    pytest.skip("FASTACCUM_AREAL_PATH is not set (an areal-project/AReaL checkout)", allow_module_level=True)
for needed in ("torch", "requests", "uvloop", "pybase64"):
    pytest.importorskip(needed)

ROOT = str(Path(AREAL_PATH).resolve())
ENVS = [("double", harness.DOUBLE_ROOT), ("real", ROOT)]
ROWS: list[tuple[str, str, str, str, str]] = []


@pytest.fixture(scope="module")
def world() -> Iterator[Any]:
    world = harness.World()
    yield world
    world.close()
    table = os.environ.get("FASTACCUM_AREAL_TABLE")
    if table and ROWS:
        head = "| env | twin | scenario | AReaL's engine | fastaccum's engine |"
        lines = [f"AReaL {harness.commit_of(ROOT)}", "", head, "|---|---|---|---|---|"]
        lines += ["| " + " | ".join(row) + " |" for row in ROWS]
        Path(table).write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module", params=ENVS, ids=[kind for kind, _ in ENVS])
def env(request: pytest.FixtureRequest) -> Iterator[Any]:
    kind, root = request.param
    with harness.areal_env(kind, root) as loaded:
        if kind == "real":
            assert Path(loaded.api.__file__).resolve().is_relative_to(Path(root)), "not the checkout's AReaL"
        yield loaded


@pytest.mark.parametrize("scenario", harness.SCENARIOS, ids=[s.__name__ for s in harness.SCENARIOS])
def test_scenario(env: Any, world: Any, twin: ModuleType, scenario: Any) -> None:
    row = scenario(env, world)
    twin_name = twin.__name__.rsplit(".", 1)[-1].lstrip("_")
    ROWS.append((env.kind, twin_name, scenario.__name__, row["areal"], row["fastaccum"]))


def test_workflows_handed_the_inner_engine_stream(env: Any, world: Any, twin: ModuleType) -> None:
    """AReaL's own executor and single-turn workflow: a rollout batch on fastaccum's engine streams."""
    emulator = world.emulator()
    for kind in harness.KINDS:
        engine = env.engine(kind, [emulator])
        out = engine.rollout_batch([{"messages": f"prompt {i}"} for i in range(3)], workflow=harness.workflow(env))
        assert len(out["input_ids"] if isinstance(out, dict) else out) == 3
        engine.destroy()
    assert emulator.streamed == [False] * 3 + [True] * 3
