"""The Miles adapter scenarios against a real radixark/miles checkout and the double, side by side.

Skipped unless ``FASTACCUM_MILES_PATH`` points at one or more Miles source trees (separated by
``os.pathsep``; trees outside this repository: Miles installs from its checkout and its code is
never committed here), for example the commit docs/miles.md names. Every scenario of
tests/miles_double/harness.py runs through Miles' own loader, rollout class and v1 rollout
function, which is what keeps tests/miles_double faithful. Needs torch (CPU), httpx, pybase64,
numpy, ray and sglang_router; transformers and the SGLang modules Miles' rollout imports are
stood in for (tests/miles_double/harness.py, ``install_stubs``).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType
from typing import Any

import framework_harness
import pytest

MILES_PATH = os.environ.get("FASTACCUM_MILES_PATH")
if not MILES_PATH:
    pytest.skip("FASTACCUM_MILES_PATH is not set (a radixark/miles checkout)", allow_module_level=True)
pytest.importorskip("torch")
for needed in ("httpx", "pybase64", "ray", "sglang_router"):
    pytest.importorskip(needed)

harness = framework_harness.miles()

MILES_ROOTS = [str(Path(p).resolve()) for p in MILES_PATH.split(os.pathsep) if p]
# The double on the default transport (tests/test_miles.py runs it on both), each checkout on both.
ENVS = [("double", harness.DOUBLE_ROOT, "client")] + [
    ("real", root, transport) for root in MILES_ROOTS for transport in harness.TRANSPORTS
]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{k}-{Path(root).name}-{t}" for k, root, t in ENVS])
def env(request: pytest.FixtureRequest) -> Any:
    kind, root, transport = request.param
    with harness.miles_env(kind, root, transport) as loaded:
        if kind == "real":
            assert Path(loaded.train.__file__).resolve().is_relative_to(Path(root)), "not the checkout's Miles"
        yield loaded


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(env: Any, twin: ModuleType, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(env, **kwargs)
