"""The Miles adapter with its streams read in Ray shards (``fastaccum_shards: 2``): every scenario
of tests/miles_double/harness.py on the double and, where ``FASTACCUM_MILES_PATH`` names Miles
checkouts (tests/test_miles_real.py), on each of them, through Miles' own loader and rollouts.
The scenarios are the adapter's guarantees (prefix, replay data, buffering, idle wait), unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import framework_harness
import pytest

pytest.importorskip("torch")  # the slime harness the Miles one builds on holds tensors
pytest.importorskip("ray")
pytest.importorskip("httpx")  # Miles' own client

harness = framework_harness.miles()
REAL = [str(Path(p).resolve()) for p in os.environ.get("FASTACCUM_MILES_PATH", "").split(os.pathsep) if p]
ENVS = [("double", harness.DOUBLE_ROOT)] + [("real", root) for root in REAL]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{kind}-{Path(root).name}" for kind, root in ENVS])
def env(request: pytest.FixtureRequest, ray_instance: Any) -> Any:
    kind, root = request.param
    with harness.miles_env(kind, root, harness.SHARDS) as loaded:
        if kind == "real":
            assert Path(loaded.train.__file__).resolve().is_relative_to(Path(root)), "not the checkout's Miles"
        yield loaded


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(env: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(env, **kwargs)


def test_miles_distributed_post_flag_puts_the_streams_on_shards() -> None:
    """``--use-distributed-post`` places ``num_gpus_per_node`` shards on each node, as Miles places
    its POST actors (the same flag as slime's); ``fastaccum_shards: 0`` keeps the streams in the
    rollout's own loop, and with the aiohttp transport the flag keeps meaning Miles' own POSTs."""
    from fastaccum.miles._settings import Settings

    on = Settings.from_args(SimpleNamespace(use_distributed_post=True, num_gpus_per_node=4))
    assert on.sharded and on.shards_per_node == 4 and on.shards is None
    off = Settings.from_args(SimpleNamespace(use_distributed_post=True, num_gpus_per_node=4, fastaccum_shards=0))
    assert not off.sharded
    plain = Settings.from_args(SimpleNamespace(use_distributed_post=True, fastaccum_transport="aiohttp"))
    assert not plain.sharded
