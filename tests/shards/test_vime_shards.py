"""The vime adapter with its streams read in Ray shards (``fastaccum_shards: 2``): every scenario of
tests/vime_double/harness.py on each vime line of the double, the vLLM dialect's drain included."""

from __future__ import annotations

from typing import Any

import framework_harness
import pytest

pytest.importorskip("torch")  # vime's Sample holds tensors
pytest.importorskip("httpx")
pytest.importorskip("ray")


harness = framework_harness.vime()


@pytest.fixture(scope="module", params=harness.LINES)
def env(request: pytest.FixtureRequest, ray_instance: Any) -> Any:
    with harness.vime_env("double", harness.DOUBLE_ROOT, request.param) as loaded:
        loaded.shards = 2
        yield loaded


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(env: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(env, **kwargs)
