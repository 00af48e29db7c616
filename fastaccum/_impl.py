"""The one selector between the compiled twin (fastaccum._cy) and the pure twin (fastaccum._py)."""

from __future__ import annotations

import os
import sys
from types import ModuleType, TracebackType
from typing import TYPE_CHECKING, Any, Literal

__all__ = ("IMPLEMENTATION", "StreamAccumulator", "accumulate", "chunked_decoder")

_NO_EXTENSIONS = os.environ.get("FASTACCUM_NO_EXTENSIONS", "") not in ("", "0")
_REQUIRE_EXTENSIONS = os.environ.get("FASTACCUM_REQUIRE_EXTENSIONS") == "1"


def _load_core() -> tuple[ModuleType, Literal["cython", "python"]]:
    if not _NO_EXTENSIONS and sys.implementation.name == "cpython":
        try:
            from fastaccum import _cy
        except ImportError as exc:
            _refuse_if_shadowed_or_incomplete(exc)
            if _REQUIRE_EXTENSIONS:  # wheels and CI must never fall back without saying so
                raise _refusal(_no_core(exc)) from exc
        else:
            return _cy, "cython"
    elif _REQUIRE_EXTENSIONS:
        raise _refusal("FASTACCUM_REQUIRE_EXTENSIONS=1, but the compiled core is switched off")
    try:
        from fastaccum import _py
    except ImportError as exc:
        _refuse_if_shadowed_or_incomplete(exc)  # an unpacked sdist has no links to the twins' folders
        raise
    return _py, "python"


def _own_core_missing(exc: ImportError) -> bool:
    """The twin itself is not there (rather than something it imports)."""
    if exc.name == "fastaccum":  # "cannot import name '_cy' from 'fastaccum'"
        return True
    name = exc.name or ""
    return isinstance(exc, ModuleNotFoundError) and name.startswith(("fastaccum._cy", "fastaccum._py"))


def _refuse_if_shadowed_or_incomplete(exc: ImportError) -> None:
    """Two causes get a one-line message of their own, the real error chained: a source tree
    imported in place of the installed package, and a dependency that is not installed. Anything
    else is left to the caller (fall back, or refuse, or raise it as it is)."""
    if _own_core_missing(exc):
        if _in_source_tree():
            raise _refusal(_SHADOWED) from exc
    elif isinstance(exc, ModuleNotFoundError) and exc.name and not exc.name.startswith("fastaccum"):
        raise _refusal(
            f"fastaccum needs {exc.name}, which is not installed: pip install {exc.name.split('.')[0]} "
            "(or reinstall fastaccum, which installs its dependencies)"
        ) from exc


# A source tree (a checkout, an unpacked sdist) builds no compiled core in place: run from its root,
# its fastaccum/ hides the installed package. A checkout even links python/ and src_cython/ as
# fastaccum/_py and fastaccum/_cy (for editors and type checkers), so it would quietly run the pure
# twin from the source tree.
_SHADOWED = (
    "fastaccum is imported from its source tree, which shadows the installed package; "
    "run with python -P, or from another directory"
)


def _no_core(exc: ImportError) -> str:
    import platform

    python = f"CPython {sys.version_info.major}.{sys.version_info.minor} on {platform.machine()}"
    # Not found (rather than failing to load): a pure-only install, or a wheel built for another
    # Python, whose modules this interpreter's suffixes do not match.
    missing = _own_core_missing(exc)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return (
        "FASTACCUM_REQUIRE_EXTENSIONS=1, but fastaccum's compiled core "
        + ("is not installed" if missing else f"does not load ({exc})")
        + f": install the fastaccum wheel for {python} (the file tagged {tag} and {platform.machine()}), "
        "or unset FASTACCUM_REQUIRE_EXTENSIONS to accept the pure-Python fallback"
    )


def _refusal(message: str) -> ImportError:
    # The console script imports the package before any of the command's code runs, so only here
    # can the refusal become the one line it is: a traceback through the import machinery would
    # bury the advice. Only this exception, if nothing catches it, is printed that way.
    error = ImportError(message)
    previous = sys.excepthook

    def one_line(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        if value is error:
            print(f"fastaccum: error: {message}", file=sys.stderr)
        else:
            previous(kind, value, tb)

    sys.excepthook = one_line
    return error


def _in_source_tree() -> bool:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return all(os.path.exists(os.path.join(root, part)) for part in ("setup.py", "src_cython", "python"))


def chunked_decoder() -> Any:
    """The chunked decoder as the pure twin runs it (python/chunked.py, the one source both twins
    build): what reads a non-streaming body (fastaccum.transport.body) hands it a data sink of its
    own, which the compiled build's typed decoder, made for its framer, cannot take."""
    from fastaccum._py.chunked import ChunkedDecoder

    return ChunkedDecoder()


IMPLEMENTATION: Literal["cython", "python"]
if TYPE_CHECKING:  # checkers read the annotated twin; _cy/__init__.pyi promises the same names
    from fastaccum._py import StreamAccumulator, accumulate
else:
    _core, IMPLEMENTATION = _load_core()
    StreamAccumulator, accumulate = _core.StreamAccumulator, _core.accumulate
