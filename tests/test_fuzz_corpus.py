"""Replay the committed fuzz seed corpus (tests/fuzz_corpus/) through both twins, without atheris.

Each input must end the same way on the pure twin, the compiled twin and the compiled twin fed in
one piece, raise nothing but StreamError, and leave consistent snapshots (tests/fuzz/fuzz_core.py).
Inputs named ``bug-*`` reproduced core bugs (docs/reliability.md); they are fixed, and the inputs
stay as regression seeds.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.c_extension  # every input runs both twins

HERE = Path(__file__).parent
CORPUS = HERE / "fuzz_corpus"
# Core bugs reported and not yet fixed, by corpus file name -> reason (strict xfail, so a fix turns
# the entry into a failure to remove). B1-B3 are fixed.
KNOWN_BUGS: dict[str, str] = {}


def _harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastaccum_fuzz_core", HERE / "fuzz" / "fuzz_core.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


HARNESS = _harness()
FILES = sorted(p for p in CORPUS.iterdir() if not p.name.startswith("."))


def _param(path: Path) -> object:
    bug = KNOWN_BUGS.get(path.name)
    marks = [pytest.mark.xfail(strict=True, reason=bug)] if bug else []
    return pytest.param(path, id=path.name, marks=marks)


@pytest.mark.parametrize("path", [_param(p) for p in FILES])
def test_corpus_input(path: Path) -> None:
    HARNESS.check_input(path.read_bytes())


def test_corpus_is_small_and_covers_both_modes() -> None:
    assert 20 <= len(FILES) <= 200
    assert sum(p.stat().st_size for p in FILES) < 512 * 1024
    assert {"valid-inc", "valid-cum", "echo-coalesced", "frame-crlf"} <= {p.name for p in FILES}
    assert set(KNOWN_BUGS) <= {p.name for p in FILES}


@pytest.mark.parametrize("seed", range(200))
def test_structured_mutations_of_the_corpus(seed: int) -> None:
    """The fuzzer's SSE/JSON-aware mutator, replayed deterministically on the corpus."""
    import random

    rng = random.Random(seed)
    data = FILES[seed % len(FILES)].read_bytes()
    for _ in range(rng.randint(1, 4)):
        data = HARNESS.mutate(data, rng)
    try:
        HARNESS.check_input(data)
    except Exception as exc:
        if HARNESS.known_bug(exc) is None:
            raise
        pytest.xfail(HARNESS.known_bug(exc))
