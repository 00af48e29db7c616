"""The slime adapter against the slime test double (tests/slime_double), on both slime lines.

The double models stock slime and slime with request-level abort (docs/slime.md, "Two slime
lines"); every scenario of tests/slime_double/harness.py runs against each, with the emulator over
loopback. tests/test_slime_real.py runs the same scenarios against real slime checkouts.
"""

from __future__ import annotations

import importlib.util
import sys
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


@pytest.fixture(scope="module", params=[(line, t) for line in harness.LINES for t in harness.TRANSPORTS], ids="-".join)
def double(request: pytest.FixtureRequest) -> Any:
    line, transport = request.param
    with harness.slime_env("double", harness.DOUBLE_ROOT, line, transport) as env:
        yield env


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(double: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(double, **kwargs)
