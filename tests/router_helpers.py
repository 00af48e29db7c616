"""The real routers in front of workers: sglang-router (PyPI ``sglang-router``, the Rust gateway
slime launches) for tests/test_router.py and benchmarks/abort_drain.py, and vllm-router (PyPI
``vllm-router``, vime's) for tests/test_vllm_router.py and the live vLLM tier.

What the router does that matters here (sglang-router 0.3.2): it streams a worker's SSE bytes
through unchanged; it answers ``/abort_request`` with 404 and lists its workers at ``GET /workers``;
it needs ``Content-Type: application/json``; and it rebuilds the request body from the fields it
knows, dropping ``return_routed_experts``, ``return_indexer_topk``, ``custom_params`` and
``stream_interval`` (slime's images install a fork of the router that keeps them).

What vllm-router does (0.1.17): it streams ``/inference/v1/generate`` through unchanged; it lists
its workers at ``GET /workers`` (and ``/list_workers``); and it takes ``POST
/inference/v1/abort_requests`` but forwards it to one worker of its own choosing, not to the one
running the request, so fastaccum sends vLLM's aborts to every listed worker itself.
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
from typing import Any

__all__ = ("ROUTER_AVAILABLE", "VLLM_ROUTER_AVAILABLE", "router", "start_router", "start_vllm_router", "vllm_router")

ROUTER_AVAILABLE = importlib.util.find_spec("sglang_router") is not None
VLLM_ROUTER_AVAILABLE = importlib.util.find_spec("vllm_router") is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=2) as response:
        return json.load(response)


def _sglang_ready(url: str, workers: int) -> bool:
    # /health answers 200 before any worker is registered: /readiness counts healthy workers.
    return bool(_get(f"{url}/readiness").get("healthy_workers") == workers)


def _vllm_ready(url: str, workers: int) -> bool:
    listed = _get(f"{url}/workers").get("workers", [])
    return len(listed) == workers and all(w.get("is_healthy") for w in listed)


_ROUTERS = {
    "sglang": ("sglang_router.launch_router", "warn", _sglang_ready),
    "vllm": ("vllm_router.launch_router", "warning", _vllm_ready),
}


def _start(kind: str, workers: list[str], policy: str) -> tuple[subprocess.Popen[bytes], str]:
    """Start the router on a free port and wait until every worker is healthy behind it."""
    module, log_level, ready = _ROUTERS[kind]
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        module,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--prometheus-port",
        str(_free_port()),
        "--policy",
        policy,
        "--log-level",
        log_level,
        "--disable-retries",  # a worker's 500 must reach the client once, not five times
        "--worker-urls",
        *workers,
    ]
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError, ValueError):
            if ready(url, len(workers)):
                return proc, url
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            _, err = proc.communicate()
            raise RuntimeError(f"{module} did not become ready: {err.decode(errors='replace')[-2000:]}")
        time.sleep(0.05)


def start_router(workers: list[str], *, policy: str = "round_robin") -> tuple[subprocess.Popen[bytes], str]:
    """sglang-router in front of ``workers``, ready."""
    return _start("sglang", workers, policy)


def start_vllm_router(workers: list[str], *, policy: str = "round_robin") -> tuple[subprocess.Popen[bytes], str]:
    """vllm-router in front of ``workers``, ready."""
    return _start("vllm", workers, policy)


@contextlib.contextmanager
def _running(kind: str, workers: list[str], policy: str) -> Iterator[str]:
    proc, url = _start(kind, workers, policy)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def router(workers: list[str], *, policy: str = "round_robin") -> contextlib.AbstractContextManager[str]:
    return _running("sglang", workers, policy)


def vllm_router(workers: list[str], *, policy: str = "round_robin") -> contextlib.AbstractContextManager[str]:
    return _running("vllm", workers, policy)
