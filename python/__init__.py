"""Pure-Python twin of fastaccum's core: the reference and the fallback. The compiled twin is held
to it where their code differs (framing, scanning, decoding); what both share (fastaccum._core)
needs tests of its own, which agreement between the twins cannot replace."""

from fastaccum._py.accumulator import StreamAccumulator, accumulate

__all__ = ("StreamAccumulator", "accumulate")
