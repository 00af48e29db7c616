"""``python -m fastaccum``: the same command as the ``fastaccum`` entry point."""

from __future__ import annotations

import sys

from fastaccum.cli import main

__all__ = ()

if __name__ == "__main__":
    sys.exit(main())
