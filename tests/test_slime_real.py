"""The slime adapter scenarios against real THUDM/slime checkouts and the double, side by side.

Skipped unless ``FASTACCUM_SLIME_PATH`` points at one or more slime source trees (separated by
``os.pathsep``; work trees exported outside this repository: slime is not on PyPI and its code is
never committed here), for example stock slime and a build with request-level abort
(docs/slime.md, "Two slime lines"). Running the same scenarios on both is what keeps
tests/slime_double faithful. Needs torch 2.13.0 (CPU), httpx, pybase64, numpy, tqdm, pillow and
pylatexenc; ray, sglang_router and transformers are stubbed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import framework_harness
import pytest

SLIME_PATH = os.environ.get("FASTACCUM_SLIME_PATH")
if not SLIME_PATH:
    pytest.skip("FASTACCUM_SLIME_PATH is not set (a THUDM/slime checkout)", allow_module_level=True)
pytest.importorskip("torch")
for needed in ("tqdm", "PIL", "pybase64", "httpx"):
    pytest.importorskip(needed)


harness = framework_harness.slime()


SLIME_ROOTS = [str(Path(p).resolve()) for p in SLIME_PATH.split(os.pathsep) if p]
# The double on the default transport (tests/test_slime.py runs it on both), each checkout on both.
ENVS = [("double", harness.DOUBLE_ROOT, line, "client") for line in harness.LINES] + [
    ("real", root, None, transport) for root in SLIME_ROOTS for transport in harness.TRANSPORTS
]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{k}-{line or Path(root).name}-{t}" for k, root, line, t in ENVS])
def env(request: pytest.FixtureRequest) -> Any:
    kind, root, line, transport = request.param
    with harness.slime_env(kind, root, line, transport) as loaded:
        if kind == "real":
            pytest.importorskip("slime.utils.types")
            assert Path(loaded.rollout.__file__).resolve().is_relative_to(Path(root)), "not the checkout's slime"
        yield loaded


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(env: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(env, **kwargs)


# ---- slime's own plugin contract tests, pointed at fastaccum -------------------------------------
def _contract(root: str, test_file: str, variable: str, value: str, deselect: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **{variable: value})
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    path = Path(root) / "tests" / "plugin_contracts" / test_file
    command = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", str(path), "-k", f"not {deselect}"]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("test_file", "variable", "value", "runtime_test"),
    [
        (
            "test_plugin_generate_contracts.py",
            "SLIME_CONTRACT_CUSTOM_GENERATE_FUNCTION_PATH",
            "fastaccum.slime.generate",
            "test_custom_generate_function_path_supports_user_override",
        ),
        (
            "test_plugin_rollout_contracts.py",
            "SLIME_CONTRACT_ROLLOUT_FUNCTION_PATH",
            "fastaccum.slime.generate_rollout",
            "test_rollout_function_path_contract_supports_user_override",
        ),
    ],
)
@pytest.mark.parametrize("root", SLIME_ROOTS, ids=[Path(r).name for r in SLIME_ROOTS])
def test_slime_plugin_contracts(root: str, test_file: str, variable: str, value: str, runtime_test: str) -> None:
    """Every contract test passes; the one that runs the plugin with a minimal Args and no server
    (generate) or ``args=None`` (rollout) is deselected: a network-bound plugin can meet only its
    signature part, which scenario ``signatures`` checks (docs/slime.md, known limits)."""
    done = _contract(root, test_file, variable, value, runtime_test)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
