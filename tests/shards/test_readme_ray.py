"""The README's Ray example runs as written, in the session of its "Using it" examples, against the
emulator its command starts (tests/test_readme.py runs the rest). The shards run the default core
(the compiled one in CI), as they would for a user."""

from __future__ import annotations

from typing import Any

import pytest
import test_readme

import fastaccum

pytest.importorskip("ray")


def test_the_readme_ray_example_runs_as_written(ray_instance: Any, capsys: pytest.CaptureFixture[str]) -> None:
    command, examples = test_readme.using_it()
    (ray_example,) = [code for code in test_readme.python_blocks() if "ShardedClient" in code]
    session: dict[str, object] = {"__name__": "readme"}
    with test_readme.readme_emulator_process(command):
        for example in examples:
            exec(compile(example, "README.md", "exec"), session)
        capsys.readouterr()
        exec(compile(ray_example, "README.md", "exec"), session)
    assert capsys.readouterr().out.strip() == "64"  # the sharded stream's length, as Client's
    assert isinstance(session["result"], fastaccum.StreamResult)
