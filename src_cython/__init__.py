"""Compiled twin of fastaccum's core: the names, order and messages of fastaccum._py, in C loops.

Its modules mirror the pure twin's, each with a ``.pxd`` that says what the others may cimport
(framing, buffers, fields, chunked, lengths, accumulator), plus two that only this twin has: scan
(ordinary events read straight from their bytes) and stream (base64 values decoded while a large
event arrives). chunked and lengths are the pure twin's own files, compiled with the types in
``chunked.pxd`` and ``lengths.pxd``. The once-per-stream face of the class, the per-stream rules
and every message come from Python (fastaccum._core.base, fastaccum._core.policy, fastaccum._core.spans,
fastaccum._core.messages), so both twins run the same code for them. Directives are set in setup.py.
"""

from fastaccum._cy.accumulator import StreamAccumulator, accumulate

# Test and debugging hooks of the streamed decoder (the other switches are per accumulator:
# StreamAccumulator._debug()).
from fastaccum._cy.stream import B64_SIMD as B64_SIMD
from fastaccum._cy.stream import _b64_decode as _b64_decode

__all__ = ("StreamAccumulator", "accumulate")
