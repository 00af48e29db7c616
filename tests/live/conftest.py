"""The live tiers: real SGLang 0.5.23 and vLLM 0.32 serving a tiny MoE model on the CPU (docs/live.md).

Skipped unless ``--live sglang`` or ``--live vllm`` names the engine (the first run installs its
venv outside the checkout: tools/live/engines.py). One server runs at a time, pinned to one core:
the tests are ordered by engine and stream mode, and asking for another server stops the
running one first. Every server is stopped at the end of the session, also after a failure or
Ctrl-C (and, if this process is killed, by the kernel: tools/live/engines.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from live_helpers import MISSING_GOLDENS, LiveServers

# Tests run grouped by the server they need, so that each starts once.
_ORDER = {("vllm", None): 0, ("sglang", "cumulative"): 1, ("sglang", "incremental"): 2}


def _server_key(item: pytest.Item) -> tuple[str, str | None] | None:
    for engine in ("vllm", "sglang"):
        if item.get_closest_marker(f"live_{engine}") is not None:
            callspec = getattr(item, "callspec", None)
            mode = callspec.params.get("sglang_mode") if callspec is not None else None
            return engine, mode if engine == "sglang" else None
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    live = [item for item in items if _server_key(item) is not None]
    if not live:
        return
    rank = {id(item): _ORDER.get(_server_key(item) or ("", None), 9) for item in live}
    first = items.index(live[0])
    rest = [item for item in items if _server_key(item) is None]
    ordered = sorted(live, key=lambda item: rank[id(item)])  # stable: file order within a server
    items[:] = rest[:first] + ordered + rest[first:]
    enabled = set(config.getoption("--live"))
    for item in live:
        engine = (_server_key(item) or ("", None))[0]
        if engine not in enabled:
            item.add_marker(pytest.mark.skip(reason=f"live {engine} tier: run with --live {engine} (docs/live.md)"))


@pytest.fixture(scope="session")
def live_servers() -> Iterator[LiveServers]:
    servers = LiveServers()
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def vllm(live_servers: LiveServers) -> Any:
    """The live vLLM 0.32 server (``.url``)."""
    return live_servers.get("vllm")


@pytest.fixture(params=["cumulative", "incremental"])
def sglang_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sglang(live_servers: LiveServers, sglang_mode: str) -> Any:
    """The live SGLang 0.5.23 server, in each stream mode (``.url``, ``.incremental``)."""
    return live_servers.get("sglang", incremental=sglang_mode == "incremental")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """A machine whose CPU class has no engine goldens checks none of them: said once, in red,
    after the run, not only as a skip among skips."""
    for why in sorted(MISSING_GOLDENS):
        terminalreporter.write_line(f"LIVE GOLDENS NOT CHECKED: {why}", red=True, bold=True)
