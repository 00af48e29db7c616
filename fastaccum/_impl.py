"""The one selector between the compiled twin (fastaccum._cy) and the pure twin (fastaccum._py)."""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Literal

__all__ = ("IMPLEMENTATION", "StreamAccumulator", "accumulate")

_NO_EXTENSIONS = os.environ.get("FASTACCUM_NO_EXTENSIONS", "") not in ("", "0")
_REQUIRE_EXTENSIONS = os.environ.get("FASTACCUM_REQUIRE_EXTENSIONS") == "1"


def _load_core() -> tuple[ModuleType, Literal["cython", "python"]]:
    if not _NO_EXTENSIONS and sys.implementation.name == "cpython":
        try:
            from fastaccum import _cy
        except ImportError:
            if _REQUIRE_EXTENSIONS:
                if _in_source_checkout():
                    raise ImportError(_SHADOWED) from None
                raise  # wheels and CI must never fall back without saying so
        else:
            return _cy, "cython"
    elif _REQUIRE_EXTENSIONS:
        raise ImportError("FASTACCUM_REQUIRE_EXTENSIONS=1, but the compiled core is switched off")
    try:
        from fastaccum import _py
    except ImportError:
        if _in_source_checkout():
            raise ImportError(_SHADOWED) from None
        raise
    return _py, "python"


# The pure twin is installed as fastaccum._py from python/ (package_dir), so a checkout's own
# fastaccum/ never has it: run from the repository root, it hides the installed package.
_SHADOWED = (
    "fastaccum is imported from its source tree, which shadows the installed package; "
    "run with python -P, or from another directory"
)


def _in_source_checkout() -> bool:
    package = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(package)
    return (
        not os.path.isdir(os.path.join(package, "_py"))
        and os.path.isfile(os.path.join(root, "setup.py"))
        and os.path.isdir(os.path.join(root, "python"))
    )


IMPLEMENTATION: Literal["cython", "python"]
if TYPE_CHECKING:  # checkers read the annotated twin; _cy.pyi promises the same names
    from fastaccum._py import StreamAccumulator, accumulate
else:
    _core, IMPLEMENTATION = _load_core()
    StreamAccumulator, accumulate = _core.StreamAccumulator, _core.accumulate
