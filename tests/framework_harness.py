"""The framework doubles' scenario harnesses (tests/slime_double, tests/vime_double,
tests/miles_double and tests/areal_double, each ``harness.py``), loaded once per session under the
module names the frameworks' ``load_function`` reaches them by (the reward function lives there)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

__all__ = ("slime", "vime", "miles", "areal")

TESTS = Path(__file__).resolve().parent


def slime() -> ModuleType:
    return _load("fastaccum_slime_harness", TESTS / "slime_double" / "harness.py")


def vime() -> ModuleType:
    return _load("fastaccum_vime_harness", TESTS / "vime_double" / "harness.py")


def miles() -> ModuleType:
    return _load("fastaccum_miles_harness", TESTS / "miles_double" / "harness.py")


def areal() -> ModuleType:
    return _load("fastaccum_areal_harness", TESTS / "areal_double" / "harness.py")


def _load(name: str, path: Path) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # registered before it runs: its own imports may reach it
        spec.loader.exec_module(module)
    return sys.modules[name]
