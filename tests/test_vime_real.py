"""The vime adapter scenarios inside a real vllm-project/vime tree, and on the double, side by side.

Skipped unless ``FASTACCUM_VIME_PATH`` points at one or more vime source trees (separated by
``os.pathsep``; vime installs from source and its code is never committed here), each one of
the vime lines listed file by file in tests/vime_double/lines/ (its README says how to lay one
out). Each tree is run as the line it is detected to be (``harness.real_line``). Needs
torch (CPU), numpy, httpx, aiohttp, tqdm, pillow and pybase64; ray, transformers, safetensors
and the vime modules a partial tree may lack are stubbed by tests/vime_double/harness.py. Running
the same scenarios on both is what keeps tests/vime_double faithful.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import framework_harness
import pytest

VIME_PATH = os.environ.get("FASTACCUM_VIME_PATH")
if not VIME_PATH:
    pytest.skip(
        "FASTACCUM_VIME_PATH is not set (vllm-project/vime trees laid out as tests/vime_double/lines/ lists)",
        allow_module_level=True,
    )
pytest.importorskip("torch")
for needed in ("tqdm", "PIL", "pybase64", "httpx"):
    pytest.importorskip(needed)


harness = framework_harness.vime()

VIME_ROOTS = [str(Path(p).resolve()) for p in VIME_PATH.split(os.pathsep) if p]
ENVS = [("double", harness.DOUBLE_ROOT, line) for line in harness.LINES] + [("real", root, None) for root in VIME_ROOTS]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{k}-{line or Path(root).name}" for k, root, line in ENVS])
def env(request: pytest.FixtureRequest) -> Any:
    kind, root, line = request.param
    if kind == "real" and not (Path(root) / "vime" / "rollout" / "vllm_rollout.py").is_file():
        pytest.skip(f"{root} is not a vime tree (no vime/rollout/vllm_rollout.py)")
    with harness.vime_env(kind, root, line) as loaded:
        if kind == "real":
            assert Path(loaded.rollout.__file__).resolve().is_relative_to(Path(root)), "not the tree's vime"
        yield loaded


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(env: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(env, **kwargs)


@pytest.mark.parametrize(("scenario", "kwargs"), harness.in_tree_params())
def test_in_tree_reader(env: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    """vime's own streaming reader on the same streams (only a real tree has it)."""
    if env.kind != "real":
        pytest.skip("the double does not model vime's generate_streaming")
    scenario(env, **kwargs)
