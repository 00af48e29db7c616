"""The slime adapter with its streams read in Ray shards (``fastaccum_shards: 2``): every scenario
of tests/slime_double/harness.py, on both slime lines of the double and, where
``FASTACCUM_SLIME_PATH`` names real slime checkouts (tests/test_slime_real.py), on each of them.
The scenarios are the adapter's guarantees (prefix, replay data, buffering, idle wait), unchanged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import framework_harness
import pytest

pytest.importorskip("torch")  # slime's Sample holds tensors
pytest.importorskip("ray")


harness = framework_harness.slime()
REAL = [str(Path(p).resolve()) for p in os.environ.get("FASTACCUM_SLIME_PATH", "").split(os.pathsep) if p]
ENVS = [("double", harness.DOUBLE_ROOT, line) for line in harness.LINES] + [("real", root, None) for root in REAL]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{kind}-{line or Path(root).name}" for kind, root, line in ENVS])
def env(request: pytest.FixtureRequest, ray_instance: Any) -> Any:
    kind, root, line = request.param
    with harness.slime_env(kind, root, line, harness.SHARDS) as loaded:
        if kind == "real":
            pytest.importorskip("slime.utils.types")
            assert Path(loaded.rollout.__file__).resolve().is_relative_to(Path(root)), "not the checkout's slime"
        yield loaded


@pytest.mark.parametrize(("scenario", "kwargs"), harness.scenario_params())
def test_scenario(env: Any, scenario: Any, kwargs: dict[str, Any]) -> None:
    scenario(env, **kwargs)


def test_slimes_distributed_post_flag_puts_the_streams_on_shards(ray_instance: Any) -> None:
    """``--use-distributed-post`` places ``num_gpus_per_node`` shards on each node, as slime places
    its POST actors; ``fastaccum_shards: 0`` keeps the streams in the rollout's own loop."""
    from types import SimpleNamespace

    from fastaccum.slime._settings import Settings

    on = Settings.from_args(SimpleNamespace(use_distributed_post=True, num_gpus_per_node=4))
    assert on.sharded and on.shards_per_node == 4 and on.shards is None
    off = Settings.from_args(SimpleNamespace(use_distributed_post=True, num_gpus_per_node=4, fastaccum_shards=0))
    assert not off.sharded
    plain = Settings.from_args(SimpleNamespace(use_distributed_post=True, fastaccum_transport="aiohttp"))
    assert not plain.sharded  # the flag keeps meaning slime's own POSTs there
    with pytest.raises(ValueError, match="fastaccum_transport to 'client'"):
        Settings.from_args(SimpleNamespace(fastaccum_shards=2, fastaccum_transport="aiohttp"))
    with pytest.raises(ValueError, match="fastaccum_shards must be a count"):
        Settings.from_args(SimpleNamespace(fastaccum_shards=-1))
