"""Everyday developer sessions: ``nox -s fast`` while you work, ``nox -s full`` before you push.

    nox -s fast       both twins, no slow tests, no fuzzing, on every core (1.5 minutes of tests on 2)
    nox -s busy       the same set, serially, beside a CPU-bound process (tools/busy.sh)
    nox -s live_vllm  the live tier against a real vLLM 0.32 on the CPU (docs/live.md)
    nox -s live_sglang  the live tier against a real SGLang 0.5.23 on the CPU (docs/live.md)
    nox -s ray        the Ray shard tier: fastaccum.ray on a local Ray (docs/scale.md)
    nox -s lint       ruff (lint and format check) and mypy
    nox -s pure       the pure-Python build alone (FASTACCUM_NO_EXTENSIONS=1)
    nox -s sanitize   the core's suite and the fuzz corpus under AddressSanitizer + UBSan
    nox -s bench      the core benchmarks and the regression gate against the committed baseline
    nox -s mutate     one-line mutations of behaviours that matter, and which the fast tier kills
    nox -s wheels     the sdist and repaired wheels, each tested as users install it
    nox -s full       exactly what CI runs (tools/test.sh)

Sessions reuse their virtual environments (``-R`` skips the reinstall as well). The compiled core
is required wherever it is built, so a broken build fails instead of testing the pure twin.
"""

from __future__ import annotations

import os

import nox

nox.options.sessions = ["fast", "lint"]
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = "venv"

# torch==2.13.0 (.ci/constraints.txt) must be a local CPU wheel, and those are cp311 builds.
PYTHON = "3.11"
REQUIRED = {"FASTACCUM_REQUIRE_EXTENSIONS": "1"}
# Where pip finds that wheel, when its own configuration does not say.
_WHEELS = os.environ.get("FASTACCUM_TORCH_WHEELS")
TORCH_WHEELS = ["--find-links", _WHEELS] if _WHEELS else []


def _install(session: nox.Session, extra: str = "test", **env: str) -> None:
    session.install("--upgrade", "pip")
    session.install(*TORCH_WHEELS, "-c", ".ci/constraints.txt", f".[{extra}]", "torch", env=env or REQUIRED)


@nox.session(python=PYTHON)
def fast(session: nox.Session) -> None:
    """Both twins, without the slow tier, split over every core by pytest-xdist (CI runs the same
    selection serially); pytest arguments pass through (nox -s fast -- -k slime)."""
    _install(session)
    session.install("pytest-xdist>=3")
    session.run(
        "tools/fast_tests.sh",
        "-n",
        "auto",
        *session.posargs,
        env={"PYTHON": session.virtualenv.bin + "/python", **REQUIRED},
        external=True,
    )


@nox.session(python=PYTHON)
def busy(session: nox.Session) -> None:
    """The fast set as CI runs it (serially), with a CPU-bound process on the other core: what a
    shared machine does to timing. Nothing may fail for it."""
    _install(session)
    python = session.virtualenv.bin + "/python"
    session.run(
        "tools/busy.sh", "tools/fast_tests.sh", *session.posargs, env={"PYTHON": python, **REQUIRED}, external=True
    )


def _live(session: nox.Session, engine: str) -> None:
    _install(session)
    # The engine's own venv is installed on first use, outside the checkout (tools/live/engines.py).
    session.run(
        "python", "-P", "-m", "pytest", "tests/live", "--live", engine, "-p", "no:cacheprovider", *session.posargs
    )


@nox.session(python=PYTHON)
def live_vllm(session: nox.Session) -> None:
    _live(session, "vllm")


@nox.session(python=PYTHON)
def live_sglang(session: nox.Session) -> None:
    _live(session, "sglang")


@nox.session(python=PYTHON)
def ray(session: nox.Session) -> None:
    _install(session)
    session.run("python", "-P", "-m", "pytest", "tests/shards", "--ray", "-p", "no:cacheprovider", *session.posargs)


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    session.install("ruff>=0.6", "mypy>=1.10", "numpy>=1.26", "orjson>=3.9", "aiohttp>=3.9", "ray>=2.40")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy", "-p", "fastaccum")


@nox.session(python=PYTHON)
def pure(session: nox.Session) -> None:
    """The fallback users get where the core cannot be compiled, with the compiled tests skipped."""
    _install(session, FASTACCUM_NO_EXTENSIONS="1")
    session.run(
        "python",
        "-P",
        "-c",
        "import fastaccum; assert fastaccum.IMPLEMENTATION == 'python'",
        env={"FASTACCUM_NO_EXTENSIONS": "1"},
    )
    session.run(
        "python",
        "-P",
        "-m",
        "pytest",
        "-m",
        "not slow",
        "--no-c-extensions",
        "-q",
        "tests",
        *session.posargs,
        env={"FASTACCUM_NO_EXTENSIONS": "1"},
    )


@nox.session(python=PYTHON)
def sanitize(session: nox.Session) -> None:
    _install(session)
    session.run("tools/sanitize.sh", "--asan-only", env={"PYTHON": session.virtualenv.bin + "/python"}, external=True)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Speed is judged by ratios against baselines timed in the same run, never by timed tests."""
    _install(session, "bench,test")
    session.run("python", "-P", "benchmarks/regress.py", *session.posargs)


@nox.session(python=PYTHON)
def mutate(session: nox.Session) -> None:
    """One-line mutations of behaviours that matter, each judged by the fast tier on the pure twin
    (tools/mutate.py; ``nox -s mutate -- --independent`` without the twin-agreement tests)."""
    _install(session)
    session.install("pytest-xdist>=3")
    session.run("python", "tools/mutate.py", *session.posargs, "--", "-n", "auto")


@nox.session(python=False)
def wheels(session: nox.Session) -> None:
    session.run("tools/build_wheels.sh", *session.posargs, external=True)


@nox.session(python=False)
def full(session: nox.Session) -> None:
    session.run("tools/test.sh", external=True)
