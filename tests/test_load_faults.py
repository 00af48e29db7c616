"""Load and faults over loopback (tools/load_test.py): many concurrent streams with random aborts,
outer cancellations and server faults, round after round, leave no task, socket or accumulator
behind (nor any file descriptor), keep RSS flat, on both transports (GenerateStream and
fastaccum.Client), and surface every fault as its documented error with the prefix kept.

The default suite runs 128 streams x 3 rounds per twin; the issue's 512 x 10 is marked slow
(``pytest -m slow tests/test_load_faults.py``, or ``python tools/load_test.py``).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

# The tool drives both twins itself (it swaps client.StreamAccumulator); it needs the compiled one.
pytestmark = pytest.mark.c_extension


def _tool() -> ModuleType:
    path = Path(__file__).parent.parent / "tools" / "load_test.py"
    spec = importlib.util.spec_from_file_location("fastaccum_load_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


LOAD = _tool()
# RSS may grow while allocator arenas and aiohttp's caches warm up in round 1; after that it must
# stay flat. 512 x 10 measured +1.3 MiB from round 2 to round 10 (docs/reliability.md).
RSS_GROWTH_LIMIT_MIB = 16.0


def _check(reports: list, streams: int) -> None:
    for report in reports:
        assert report.failures == [], report.failures[:10]
        assert report.leaked_tasks == 0 and report.open_sockets == 0 and report.open_fds == 0
        assert report.live_accumulators == 0 and report.server_busy == 0
        assert sum(report.outcomes.values()) == streams
        # Every fault kind ran, and the errors are exactly the faults' documented classes.
        assert set(report.plans) == set(LOAD.PLANS)
        expected: dict[str, int] = {}
        for plan, (error, _) in LOAD.EXPECTED_ERRORS.items():
            expected[error.__name__] = expected.get(error.__name__, 0) + report.plans[plan]
        assert {k: report.outcomes.get(k, 0) for k in expected} == expected
    rss = [r.rss_mib for r in reports]
    assert rss[-1] - rss[min(1, len(rss) - 1)] < RSS_GROWTH_LIMIT_MIB, rss


@pytest.mark.parametrize("transport", ["aiohttp", "client"])
@pytest.mark.parametrize("twin", ["cython", "python"])
def test_concurrent_streams_with_aborts_cancels_and_faults(twin: str, transport: str) -> None:
    reports = LOAD.run(128, 3, seed=7, twin=twin, transport=transport)
    _check(reports, 128)


@pytest.mark.slow
@pytest.mark.parametrize("transport", ["aiohttp", "client"])
@pytest.mark.parametrize("twin", ["cython", "python"])
def test_512_streams_10_rounds(twin: str, transport: str, request: pytest.FixtureRequest) -> None:
    # Plain pytest does not deselect the slow marker: run only with -m slow or FASTACCUM_SLOW=1.
    if "slow" not in (request.config.getoption("markexpr") or "") and os.environ.get("FASTACCUM_SLOW") != "1":
        pytest.skip("slow: run with -m slow or FASTACCUM_SLOW=1")
    reports = LOAD.run(512, 10, seed=0, twin=twin, transport=transport)
    _check(reports, 512)
