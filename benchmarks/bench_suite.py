"""pytest-benchmark suite: impl x mode x stream interval x payload, each case against the naive
consumer and the orjson floor timed in the same run.

Every case builds its stream with ``fastaccum.emulator.writer`` (through bench_core's workload builder, so the
outputs are checked against the generation) and feeds it in 64 KiB pieces to the twin, the naive
consumer and the floor, timed interleaved (bench_core.timed_case); the three times and their ratios
go in ``extra_info``. ``benchmarks/regress.py`` compares those ratios with the committed
baseline. CI runs ``pytest benchmarks --benchmark-disable`` (each case once, outputs checked).
"""

from __future__ import annotations

import os
import sys
from functools import cache
from types import ModuleType
from typing import Any

import pytest

# bench_core holds the workload builder, the two baselines and the output checks; pytest's
# importlib mode does not put this folder on sys.path, so add it for the sibling import.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402

MODES = ("cumulative", "incremental")
INTERVALS = (1, 20, 64)
# The suite's payloads, each adding to the previous one. "logprobs" is --skip-tokenizer-init (no
# text key, logprob triples end in null), as W1.
PAYLOADS: dict[str, dict[str, Any]] = {
    "logprobs": {"text": False},
    "text": {"text": True},
    "top-p": {"text": True, "top_p": True},
    "experts": {"text": True, "top_p": True, "expert_shape": (48, 8)},
}
# Sizes keep the whole folder under ~90 s with --benchmark-disable on 2 cores and still give each
# timed case milliseconds of work. Cumulative bytes grow as N^2 / interval: at interval 1, 1,024
# tokens are ~27 MB with every payload (the naive consumer needs ~1 s for them).
TOKENS = {"cumulative": 1024, "incremental": 16384}
PROMPT_TOKENS = 256  # routed-expert rows = prompt + tokens - 1 (16,639 x 48 x 8 int32 = 25.6 MB)


def case_id(mode: str, interval: int, payload: str) -> str:
    return f"{mode}-i{interval}-{payload}"


CASES = [(m, i, p) for m in MODES for i in INTERVALS for p in PAYLOADS]


@cache
def build_case(mode: str, interval: int, payload: str) -> core.Workload:
    """One case's stream as 64 KiB pieces with its expected outputs (cached across both twins)."""
    spec = core.WorkloadSpec(
        case_id(mode, interval, payload),
        mode,
        TOKENS[mode],
        prompt_tokens=PROMPT_TOKENS,
        interval=interval,
        **PAYLOADS[payload],
    )
    return core.build(spec)


@pytest.fixture(scope="module", params=CASES, ids=[case_id(*c) for c in CASES])
def case(request: pytest.FixtureRequest) -> core.Workload:
    return build_case(*request.param)


def test_suite(benchmark: Any, impl: ModuleType, case: core.Workload) -> None:
    spec = case.spec
    benchmark.group = f"suite {spec.name}"
    benchmark.extra_info.update(
        mode=spec.mode,
        interval=spec.interval,
        payload=spec.name.split("-", 2)[2],
        **core.timed_case(benchmark, impl, case),
    )
