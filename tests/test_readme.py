"""The README's examples run as written: its emulator command starts the server, and its Python
examples run in order, as one session, against it, on both twins. Every Python block of the
README compiles; the Ray example runs in the Ray tier (tests/shards/test_readme_ray.py)."""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import fastaccum

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    """Every Python example of the README, in order."""
    return [code for kind, code in BLOCK.findall(README.read_text(encoding="utf-8")) if kind == "python"]


def using_it() -> tuple[str, list[str]]:
    """The emulator command and the Python examples of the README's "Using it" section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Using it") :]
    section = section[: section.index("\n## ", 1)]
    blocks = BLOCK.findall(section)
    (command,) = [code.strip() for kind, code in blocks if kind == "bash" and code.startswith("fastaccum emulator")]
    return command, [code for kind, code in blocks if kind == "python"]


@contextlib.contextmanager
def readme_emulator_process(command: str) -> Iterator[None]:
    args = shlex.split(command.removesuffix("&").strip())
    assert args[0] == "fastaccum"
    script = Path(sys.executable).with_name("fastaccum")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "fastaccum"]
    process = subprocess.Popen([*launcher, *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if "listening on" not in line:
            pytest.fail(f"the README's emulator did not start: {line}{process.stdout.read()}")
        yield
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def readme_emulator() -> Iterator[list[str]]:
    command, examples = using_it()
    with readme_emulator_process(command):
        yield examples


def test_every_python_block_of_the_readme_compiles() -> None:
    """No example is a SyntaxError as printed (``await`` outside a function, say)."""
    for code in python_blocks():
        if code.lstrip().startswith(">>>"):
            continue  # an interpreter session, not a script
        compile(code, str(README), "exec")


def test_the_readme_has_runnable_examples() -> None:
    command, examples = using_it()
    assert "--incremental-streaming-output" in command  # the examples ask for incremental mode
    assert len(examples) >= 3


def test_the_readme_examples_run_as_written(
    readme_emulator: list[str], twin: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fastaccum, "StreamAccumulator", twin.StreamAccumulator)
    session: dict[str, object] = {"__name__": "readme"}
    for example in readme_emulator:
        exec(compile(example, str(README), "exec"), session)
    result = session["result"]
    assert isinstance(result, fastaccum.StreamResult) and result.finished and len(result) == 64
    whole = session["whole"]  # the non-streaming answer: one event, the same length
    assert isinstance(whole, fastaccum.StreamResult) and whole.events == 1 and len(whole) == 64
    assert capsys.readouterr().out.count("\n") == 4  # each example printed its line
