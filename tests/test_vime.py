"""The vime adapter against the vime test double (tests/vime_double), on both vime lines.

The double models vime with and without request-level abort (docs/vime.md, "Two vime lines");
every scenario of tests/vime_double/harness.py runs against each, with a vLLM-dialect server over
loopback. tests/test_vime_real.py runs the same scenarios inside a real vime tree.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("torch")  # vime's Sample holds tensors; the double does too
pytest.importorskip("httpx")


def _load_harness() -> ModuleType:
    name = "fastaccum_vime_harness"
    if name not in sys.modules:
        path = Path(__file__).resolve().parent / "vime_double" / "harness.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # vime's load_function reaches the reward function by this name
        spec.loader.exec_module(module)
    return sys.modules[name]


harness = _load_harness()


@pytest.fixture(scope="module", params=harness.LINES)
def double(request: pytest.FixtureRequest) -> Any:
    with harness.vime_env("double", harness.DOUBLE_ROOT, request.param) as env:
        yield env


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(double: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(double, **kwargs)


def test_import_is_lazy() -> None:
    """``import fastaccum.vime`` never imports vime (vime's rollout manager imports the rollout
    function at start-up; vime is not a dependency)."""
    import subprocess

    code = "import sys, fastaccum.vime; assert not any(m.split('.')[0] == 'vime' for m in sys.modules)"
    # -P: from the checkout's root, its fastaccum/ folder would hide the installed package
    subprocess.run([sys.executable, "-P", "-c", code], check=True)
