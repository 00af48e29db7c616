"""The compiled twin's C headers compile on their own with -Wall -Wextra -Werror, GNU extensions
on and off (tools/check_headers.sh), and a cross compiler for aarch64 when one is installed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tools" / "check_headers.sh"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def test_headers_compile_without_warnings() -> None:
    env = {k: v for k, v in os.environ.items() if k != "CROSS_CC"}
    done = subprocess.run([str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "4 headers compile cleanly" in done.stdout


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-gcc") is None, reason="needs aarch64-linux-gnu-gcc")
def test_headers_compile_for_aarch64() -> None:
    env = {**os.environ, "CROSS_CC": "aarch64-linux-gnu-gcc"}
    done = subprocess.run([str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "aarch64-linux-gnu-gcc: 4 headers compile cleanly" in done.stdout


def test_a_warning_in_a_header_fails_the_check(tmp_path: Path) -> None:
    # The check must be able to fail: a copy of the tree with one header that warns.
    copy = tmp_path / "repo"
    (copy / "tools").mkdir(parents=True)
    shutil.copy(SCRIPT, copy / "tools")
    shutil.copytree(ROOT / "src_cython", copy / "src_cython", ignore=shutil.ignore_patterns("*.c", "*.so"))
    (copy / "src_cython" / "fa_bytes.h").write_text("static inline int f(int x) { int unused; return x; }\n")
    done = subprocess.run([str(copy / "tools" / "check_headers.sh")], cwd=copy, capture_output=True, text=True)
    assert done.returncode != 0
    assert "FAILED" in done.stderr
