"""Test fixtures shared by tests/ and benchmarks/: every behaviour test runs on both twins."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--no-c-extensions",
        action="store_true",
        default=False,
        help="skip the tests of the compiled twin (fastaccum._cy)",
    )
    parser.addoption(
        "--live",
        action="append",
        default=[],
        choices=["sglang", "vllm"],
        help="run the live tier of this engine (tests/live; installs it on first use: docs/live.md)",
    )
    parser.addoption(
        "--ray",
        action="store_true",
        default=False,
        help="run the Ray shard tier (tests/shards): a local Ray instance on 2 CPUs (docs/scale.md)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--no-c-extensions"):
        return
    skip = pytest.mark.skip(reason="--no-c-extensions given")
    for item in items:
        if "c_extension" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("fastaccum._cy", id="cython", marks=pytest.mark.c_extension),
        pytest.param("fastaccum._py", id="python"),
    ],
)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    """The twin under test. No ImportError guard: an unbuilt extension must fail the run."""
    return importlib.import_module(request.param)


class Outcomes:
    """Runs a stream through an accumulator and compares two runs exactly, so tests that hold two
    paths to each other (the twins, the compiled twin's fast and orjson paths) share one rule."""

    @staticmethod
    def run(
        module: ModuleType, pieces: list[bytes], *, debug: dict[str, object] | None = None, **kwargs: object
    ) -> tuple[tuple[object, ...], object]:
        """(("ok", result) or ("error", class, message), snapshot after the run); ``debug``: the
        compiled twin's switches (``StreamAccumulator._debug``)."""
        acc = module.StreamAccumulator(**kwargs)
        if debug:
            acc._debug(**debug)
        try:
            for piece in pieces:
                acc.feed(piece)
            return ("ok", acc.finish()), acc.snapshot()
        except Exception as exc:  # compared by class and message
            return ("error", type(exc), str(exc)), acc.snapshot()

    @staticmethod
    def assert_same_result(a: object, b: object) -> None:
        """Every field equal, arrays byte for byte (NaN positions included)."""
        for name in (
            "mode",
            "text",
            "events",
            "finish_reason",
            "meta_info",
            "completion_tokens",
            "aborted",
            "weight_version_spans",
        ):
            assert getattr(a, name) == getattr(b, name), name
        arrays = ("token_ids", "logprobs", "top_p_token_ids", "top_p_token_offsets", "routed_experts", "indexer_topk")
        for name in arrays:
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None), name
            if x is not None:
                assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), name

    def assert_same(self, first: tuple[tuple[object, ...], object], second: tuple[tuple[object, ...], object]) -> None:
        """Two ``run`` outcomes agree: same result, or same error class and message; same snapshot."""
        (one, one_snapshot), (other, other_snapshot) = first, second
        assert one[0] == other[0], (one, other)
        if one[0] == "ok":
            self.assert_same_result(one[1], other[1])
        else:
            assert one[1:] == other[1:]
        self.assert_same_result(one_snapshot, other_snapshot)


@pytest.fixture(scope="session")
def outcomes() -> Outcomes:
    """Run-and-compare helpers for tests that hold two code paths to each other."""
    return Outcomes()
