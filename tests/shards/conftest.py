"""The Ray shard tier: ``fastaccum.ray`` on a local Ray instance (``ray.init(num_cpus=2)``).

Skipped unless ``--ray`` is given (CI gives it: tools/test.sh). Ray starts once per session, from
a directory outside the checkout: Ray puts the driver's working directory on every worker's
``sys.path``, and the checkout's ``fastaccum/`` would shadow the installed package there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--ray"):
        return
    skip = pytest.mark.skip(reason="Ray shard tier: run with --ray (docs/scale.md)")
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ray_instance(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with contextlib.chdir(tmp_path_factory.mktemp("ray-driver")):
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def shard_options(impl: ModuleType, ray_instance: Any) -> dict[str, Any]:
    """``ShardedClient`` options that make its shards read with the twin under test (each shard is
    its own process, which picks its twin at import)."""
    pure = impl.__name__ == "fastaccum._py"
    # A shard inherits the driver's environment (CI requires the compiled core): the pure twin's
    # shards say otherwise.
    env = (
        {"FASTACCUM_NO_EXTENSIONS": "1", "FASTACCUM_REQUIRE_EXTENSIONS": "0"}
        if pure
        else {
            "FASTACCUM_NO_EXTENSIONS": "0",
            "FASTACCUM_REQUIRE_EXTENSIONS": "1",
        }
    )
    return {"actor_options": {"runtime_env": {"env_vars": env}}}
