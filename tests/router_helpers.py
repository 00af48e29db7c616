"""The real sglang-router (PyPI ``sglang-router``, the Rust gateway slime launches) in front of
emulator workers, for tests/test_router.py and benchmarks/abort_drain.py.

What the router does that matters here (sglang-router 0.3.2): it streams a worker's SSE bytes
through unchanged; it answers ``/abort_request`` with 404 and lists its workers at ``GET /workers``;
it needs ``Content-Type: application/json``; and it rebuilds the request body from the fields it
knows, dropping ``return_routed_experts``, ``return_indexer_topk``, ``custom_params`` and
``stream_interval`` (slime's images install a fork of the router that keeps them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

__all__ = ("ROUTER_AVAILABLE", "router", "start_router")

ROUTER_AVAILABLE = importlib.util.find_spec("sglang_router") is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_router(workers: list[str], *, policy: str = "round_robin") -> tuple[subprocess.Popen[bytes], str]:
    """Start the router on a free port and wait until every worker is healthy behind it."""
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "sglang_router.launch_router",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(_free_port()),
        "--policy",
        policy,
        "--log-level",
        "warn",
        "--disable-retries",  # a worker's 500 must reach the client once, not five times
        "--worker-urls",
        *workers,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        # /health answers 200 before any worker is registered: /readiness counts healthy workers.
        with contextlib.suppress(OSError, ValueError):
            with urllib.request.urlopen(f"{url}/readiness", timeout=2) as response:
                if json.load(response).get("healthy_workers") == len(workers):
                    return proc, url
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise RuntimeError(f"sglang-router did not become ready: {err.decode(errors='replace')[-2000:]}")
        time.sleep(0.05)


@contextlib.contextmanager
def router(workers: list[str], *, policy: str = "round_robin") -> Iterator[str]:
    proc, url = start_router(workers, policy=policy)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
