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
            if _in_source_checkout():
                raise ImportError(_SHADOWED) from None
            if _REQUIRE_EXTENSIONS:
                raise  # wheels and CI must never fall back without saying so
        else:
            return _cy, "cython"
    elif _REQUIRE_EXTENSIONS:
        raise ImportError("FASTACCUM_REQUIRE_EXTENSIONS=1, but the compiled core is switched off")
    from fastaccum import _py

    return _py, "python"


# A checkout links python/ and src_cython/ as fastaccum/_py and fastaccum/_cy (for editors and type
# checkers), but builds no compiled core there: run from the repository root, its fastaccum/ hides
# the installed package, and would quietly run the pure twin from the source tree.
_SHADOWED = (
    "fastaccum is imported from its source tree, which shadows the installed package; "
    "run with python -P, or from another directory"
)


def _in_source_checkout() -> bool:
    return os.path.islink(os.path.join(os.path.dirname(os.path.abspath(__file__)), "_cy"))


IMPLEMENTATION: Literal["cython", "python"]
if TYPE_CHECKING:  # checkers read the annotated twin; _cy/__init__.pyi promises the same names
    from fastaccum._py import StreamAccumulator, accumulate
else:
    _core, IMPLEMENTATION = _load_core()
    StreamAccumulator, accumulate = _core.StreamAccumulator, _core.accumulate
