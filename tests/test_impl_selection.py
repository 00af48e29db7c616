"""The selector: environment variables pick the twin, and CI never silently tests the fallback."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import fastaccum

ROOT = Path(__file__).resolve().parent.parent


def _implementation_in_subprocess(**env: str) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FASTACCUM_")}
    environment.update(env)
    code = "import fastaccum; print(fastaccum.IMPLEMENTATION)"
    done = subprocess.run(
        [sys.executable, "-c", code], env=environment, capture_output=True, text=True, cwd="/", check=True
    )
    return done.stdout.strip()


@pytest.mark.skipif(
    os.environ.get("FASTACCUM_REQUIRE_EXTENSIONS") != "1",
    reason="only meaningful where the extension is required (CI, wheels)",
)
def test_required_extension_is_the_one_in_use() -> None:
    assert fastaccum.IMPLEMENTATION == "cython"


@pytest.mark.c_extension
def test_default_selection_is_compiled() -> None:
    assert _implementation_in_subprocess() == "cython"


def test_no_extensions_selects_the_pure_twin() -> None:
    assert _implementation_in_subprocess(FASTACCUM_NO_EXTENSIONS="1") == "python"


def test_require_with_no_extensions_refuses_to_import() -> None:
    with pytest.raises(subprocess.CalledProcessError) as info:
        _implementation_in_subprocess(FASTACCUM_NO_EXTENSIONS="1", FASTACCUM_REQUIRE_EXTENSIONS="1")
    assert "compiled core is switched off" in info.value.stderr


@pytest.fixture(scope="module")
def pure_only_install(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding the installed package without its compiled modules, as an install built
    with FASTACCUM_NO_EXTENSIONS=1 (or a wheel for another Python) leaves it: put it first on
    PYTHONPATH."""
    import importlib.machinery
    import shutil

    root = tmp_path_factory.mktemp("pure_only")
    compiled = ["*" + suffix for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    # symlinks=False: a checkout's _cy and _py are links to src_cython/ and python/
    shutil.copytree(
        Path(fastaccum.__file__).parent,
        root / "fastaccum",
        ignore=shutil.ignore_patterns(*compiled, "__pycache__"),
        symlinks=False,
    )
    return root


def _run_pure_only(root: Path, code: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FASTACCUM_")}
    environment.update(env, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-P", *code], env=environment, capture_output=True, text=True, cwd="/")


def test_a_pure_only_install_falls_back_to_the_pure_twin(pure_only_install: Path) -> None:
    done = _run_pure_only(pure_only_install, ["-c", "import fastaccum; print(fastaccum.IMPLEMENTATION)"])
    assert (done.returncode, done.stdout) == (0, "python\n"), done.stderr


STARTS = {
    "import": ["-c", "import fastaccum"],
    # what the fastaccum console script does
    "command": ["-c", "import sys; from fastaccum.cli import main; sys.exit(main(['--version']))"],
    "module": ["-m", "fastaccum", "--version"],
}


@pytest.mark.parametrize("start", sorted(STARTS))
def test_required_core_missing_says_what_to_install_in_one_line(pure_only_install: Path, start: str) -> None:
    import platform

    done = _run_pure_only(pure_only_install, STARTS[start], FASTACCUM_REQUIRE_EXTENSIONS="1")
    assert done.returncode != 0 and done.stdout == ""
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    line = done.stderr
    assert "compiled core is not installed" in line, line
    python = f"CPython {sys.version_info.major}.{sys.version_info.minor} on {platform.machine()}"
    assert python in line and "unset FASTACCUM_REQUIRE_EXTENSIONS" in line, line


def test_twins_export_the_same_names_in_the_same_order(impl: ModuleType) -> None:
    import fastaccum._py as pure

    assert impl.__all__ == pure.__all__ == ("StreamAccumulator", "accumulate")


def test_stub_declares_the_twins_names() -> None:
    import fastaccum._py as pure

    stub = ast.parse((ROOT / "src_cython" / "__init__.pyi").read_text())
    declared = next(
        ast.literal_eval(node.value)
        for node in stub.body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__"
    )
    assert tuple(declared) == pure.__all__


def test_public_names_are_exported() -> None:
    for name in fastaccum.__all__:
        assert getattr(fastaccum, name) is not None, name


@pytest.mark.parametrize("require", ["0", "1"])
def test_import_from_the_source_tree_says_it_shadows_the_installed_package(require: str) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FASTACCUM_")}
    environment["FASTACCUM_REQUIRE_EXTENSIONS"] = require
    done = subprocess.run(
        [sys.executable, "-c", "import fastaccum"], env=environment, capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "fastaccum: error: fastaccum is imported from its source tree, which shadows the installed "
        "package; run with python -P, or from another directory"
    )


@pytest.mark.parametrize("twin", ["compiled", "pure"])
@pytest.mark.parametrize("require", ["0", "1"])
def test_a_missing_dependency_is_named_in_one_line_not_blamed_on_the_source_tree(twin: str, require: str) -> None:
    if twin == "compiled" and fastaccum.IMPLEMENTATION != "cython":
        pytest.skip("the compiled core is not installed")
    if twin == "pure" and require == "1":
        pytest.skip("the pure twin with the compiled core required is refused before any import")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("FASTACCUM_")}
    environment["FASTACCUM_REQUIRE_EXTENSIONS"] = require
    if twin == "pure":
        environment["FASTACCUM_NO_EXTENSIONS"] = "1"
    # As if pybase64 were not installed: an import of it fails as a missing module does.
    code = "import sys; sys.modules['pybase64'] = None; import fastaccum"
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, cwd="/")
    assert done.returncode != 0
    assert done.stderr.strip() == (
        "fastaccum: error: fastaccum needs pybase64, which is not installed: pip install pybase64 "
        "(or reinstall fastaccum, which installs its dependencies)"
    )


# ---- what the twins share ---------------------------------------------------------------------


@pytest.mark.c_extension
@pytest.mark.parametrize(("name", "hot"), [("chunked", "ChunkedDecoder.feed"), ("lengths", "event_mode")])
def test_a_single_source_runs_compiled_in_the_compiled_twin_and_interpreted_in_the_pure_one(
    name: str, hot: str
) -> None:
    # python/<name>.py is the pure twin's module and, compiled with src_cython/<name>.pxd, the
    # compiled twin's: built under another name, so the pure twin can never pick up the build.
    import importlib.machinery
    import inspect

    pure = importlib.import_module(f"fastaccum._py.{name}")
    compiled = importlib.import_module(f"fastaccum._cy.{name}")
    assert pure.__file__ is not None and pure.__file__.endswith(f"{name}.py")
    assert compiled.__file__ is not None and compiled.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    owner, _, attribute = hot.rpartition(".")
    # Interpreted: a Python function with bytecode. Compiled: a C function, not even visible.
    pure_owner = getattr(pure, owner) if owner else pure
    compiled_owner = getattr(compiled, owner) if owner else compiled
    assert inspect.isfunction(getattr(pure_owner, attribute))
    assert not hasattr(compiled_owner, attribute)


def test_each_twins_accumulator_uses_its_own_chunked_decoder(impl: ModuleType) -> None:
    import importlib

    acc = impl.StreamAccumulator()
    acc.feed_chunked(b"")
    twin = impl.__name__
    assert type(acc._chunks) is importlib.import_module(f"{twin}.chunked").ChunkedDecoder


def test_both_twins_keep_the_state_the_shared_base_reads(impl: ModuleType) -> None:
    from fastaccum._core.base import STATE

    acc = impl.StreamAccumulator()
    missing = [name for name in STATE if not hasattr(acc, name)]
    assert not missing, f"{impl.__name__} lacks {missing}"


@pytest.mark.c_extension
def test_the_compiled_core_lets_the_base_write_only_what_it_sets() -> None:
    from fastaccum._core.base import STATE, STATE_WRITTEN
    from fastaccum._cy import StreamAccumulator

    acc = StreamAccumulator()
    writable = set()
    for name in STATE:
        try:
            setattr(acc, name, getattr(acc, name))
        except AttributeError:
            continue
        writable.add(name)
    assert writable == set(STATE_WRITTEN)
