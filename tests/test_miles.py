"""The Miles adapter against the Miles test double (tests/miles_double), on both of Miles'
rollout paths (its rollout class and its v1 rollout function), both transports and both twins.

Every scenario of tests/miles_double/harness.py runs with the emulator over loopback, through
Miles' own loader; tests/test_miles_real.py runs the same scenarios against a real Miles checkout.
"""

from __future__ import annotations

import subprocess
import sys
from types import ModuleType
from typing import Any

import framework_harness
import pytest

pytest.importorskip("torch")  # the slime harness this one builds on holds tensors
pytest.importorskip("httpx")  # Miles' own client (its post and get)
pytest.importorskip("ray")  # Miles' rollout imports it (the test extra has it; the wheels' fast tests do not)
pytest.importorskip("sglang_router")  # Miles reads the router's version

# Registered under this name, so Miles' load_function reaches the harness's generate functions.
harness = framework_harness.miles()


@pytest.fixture(scope="module", params=harness.TRANSPORTS)
def double(request: pytest.FixtureRequest) -> Any:
    with harness.miles_env("double", harness.DOUBLE_ROOT, request.param) as env:
        yield env


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(double: Any, twin: ModuleType, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(double, **kwargs)


def test_import_loads_no_miles() -> None:
    """``import fastaccum.miles`` imports no Miles (Miles' rollout manager imports the rollout
    function at start-up, and Miles is not a dependency); ``fastaccum.miles.InferenceRolloutFn``
    is made when first asked for, and says where Miles comes from when it is not there."""
    code = (
        "import sys, fastaccum.miles as m\n"
        "assert not any(n.split('.')[0] == 'miles' for n in sys.modules)\n"
        "try:\n    m.InferenceRolloutFn\nexcept ImportError as e:\n    print(e)\n"
    )
    # -P: from the checkout's root, its fastaccum/ folder would hide the installed package
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd="/")
    assert done.returncode == 0, done.stderr
    assert "fastaccum.miles runs inside radixark/miles, which is not importable here" in done.stdout
