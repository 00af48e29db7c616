"""The live tiers' server control (tools/live/engines.py) without an engine: what a stopped server
leaves in /dev/shm is removed, and nothing another process still holds."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

SHM = Path("/dev/shm")
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="POSIX shared memory in /dev/shm (Linux)")

_multiprocessing = pytest.importorskip("_multiprocessing")


def _semaphore_name() -> str:
    return f"/mp-fastaccum-test-{uuid.uuid4().hex[:12]}"  # sem_open's name; the file is sem.<name[1:]>


@pytest.fixture(scope="module")
def engines() -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "tools" / "live" / "engines.py"
    name = "fastaccum_live_engines"  # the name tests/live/live_helpers.py loads it under
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # its dataclasses look their module up while it loads
        spec.loader.exec_module(module)
    return sys.modules[name]


def _leak_semaphore(name: str) -> None:
    """A process that makes a multiprocessing semaphore and exits without unlinking it."""
    code = f"import _multiprocessing; _multiprocessing.SemLock(1, 1, 1, {name!r}, False)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.fixture
def names() -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:  # whatever a failing test left
        (SHM / name).unlink(missing_ok=True)


def test_a_leaked_semaphore_and_a_load_slot_are_removed(engines: ModuleType, names: list[str]) -> None:
    before = set(os.listdir(SHM))
    leaked = _semaphore_name()
    _leak_semaphore(leaked)  # as SGLang's processes leave theirs when its shutdown SIGKILLs the tracker
    slot = "sglang_loads_fastaccum_test.shm"
    (SHM / slot).write_bytes(b"\0" * 64)
    names += [f"sem.{leaked[1:]}", slot]
    assert set(names) <= set(os.listdir(SHM))

    removed = engines.remove_shm_leftovers(before)

    assert sorted(names) == [name for name in removed if name in names]
    assert not set(names) & set(os.listdir(SHM))


def test_a_semaphore_a_process_still_holds_stays(engines: ModuleType, names: list[str]) -> None:
    before = set(os.listdir(SHM))
    held_name = _semaphore_name()
    held = _multiprocessing.SemLock(1, 1, 1, held_name, False)
    names.append(f"sem.{held_name[1:]}")

    removed = engines.remove_shm_leftovers(before)

    assert names[0] not in removed and names[0] in os.listdir(SHM)
    del held


def test_what_was_there_before_stays(engines: ModuleType, names: list[str]) -> None:
    earlier = _semaphore_name()
    _leak_semaphore(earlier)
    names.append(f"sem.{earlier[1:]}")

    removed = engines.remove_shm_leftovers(set(os.listdir(SHM)))

    assert names[0] not in removed and names[0] in os.listdir(SHM)
