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
