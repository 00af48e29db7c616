"""Pure-Python twin of fastaccum's core: the reference, the fallback and the tests' oracle."""

from fastaccum._py.accumulator import StreamAccumulator, accumulate

__all__ = ("StreamAccumulator", "accumulate")
