"""Compiled twin of fastaccum's core: the names, order and messages of fastaccum._py, in C loops.

The parts are included in data-flow order, and each uses only the parts before it: three that
mirror the pure twin's modules of the same names (framing, buffers, fields), the two that only
this twin has (stream, scan), the chunked decoder that sits in front of the framer, then the
accumulator that joins them. The once-per-stream face of the class, the per-stream rules and
every message come from Python (fastaccum._base, fastaccum._policy, fastaccum._spans,
fastaccum._messages), so both twins run the same code for them. Directives are set in setup.py.
"""

__all__ = ("StreamAccumulator", "accumulate")

include "framing.pxi"      # fastaccum._py.framing: SSE lines to events
include "buffers.pxi"      # fastaccum._py.buffers: growable int32/float64 storage
include "fields.pxi"       # fastaccum._py.fields: ids, logprobs and counts
include "stream.pxi"       # compiled only: base64 values decoded while a large event arrives
include "scan.pxi"         # compiled only: ordinary events read straight from their bytes
include "chunked.pxi"      # fastaccum._py.chunked: HTTP/1.1 chunked bodies undone before framing
include "accumulator.pxi"  # fastaccum._py.accumulator: events to arrays
