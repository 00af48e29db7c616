"""StreamAccumulator: SGLang /generate events to arrays, as fastaccum._py.accumulator, function by
function.

The extension type _CompiledAccumulator holds the per-read and per-event work, and
StreamAccumulator joins it to fastaccum._core.base.AccumulatorBase (the once-per-stream face,
shared with the pure twin). The per-stream rules come from fastaccum._core.policy and the rules
themselves are in docs/core.md.
_apply_scanned (events the scanner read) is this twin's only addition.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t
from libc.string cimport memchr, memcmp

from fastaccum._cy.buffers cimport Buffer, float64s, int32s
from fastaccum._cy.chunked cimport ChunkedDecoder
from fastaccum._cy.fa_bytes cimport fa_find_bytes, fa_rfind_bytes
from fastaccum._cy.fields cimport Event, read_id_list, read_logprob_list, read_uint_at
from fastaccum._cy.framing cimport EventSink, SseFramer, ValueStream
from fastaccum._cy.lengths cimport check_logprobs, check_total, event_mode, text_after
from fastaccum._cy.scan cimport LIFTED_IDS, LIFTED_LOGPROBS, lift_lists, scan_event
from fastaccum._cy.scan_chunk cimport scan_chunk
from fastaccum._cy.stream cimport SpanScan, simd_decoder

import orjson

from fastaccum._core.base import AccumulatorBase
from fastaccum._core.dialects import TOKEN_IDS, chunk_fields, chunk_meta, read_chunk
from fastaccum._core.messages import broken, changed_token
from fastaccum._core.policy import (
    ABSENT,
    VERSION_KEY,
    VERSION_WINDOW,
    DIALECTS,
    MODES,
    echo_start,
    end_event,
    event_counts,
    read_event,
    refused_feed,
)
from fastaccum._core.spans import cut_b64_spans, cut_spans, reappears
from fastaccum.errors import StreamError

import numpy as np

# The mode is MODES' own str object (fastaccum._core.base sets it), compared by identity: an equality
# test of two str is a function call in Cython.
cdef str CUMULATIVE = MODES[1]
cdef str VLLM = DIALECTS[2]
# Cumulative events after this many full parses are only light-checked (docs/core.md).
cdef Py_ssize_t _FULL_PARSES_BEFORE_LIGHT = 2
# Events whose JSON (base64 cut out) is this large have their token lists read by the scanner
# (a non-streaming answer, a cumulative terminal event): orjson would build objects per token.
cdef Py_ssize_t _LIFT_AFTER_BYTES = 64 << 10
cdef const char* _FINISH_KEY = b'"finish_reason":'
cdef const char* _COMPLETION_KEY = b'"completion_tokens":'
cdef const char* _VERSION_KEY = VERSION_KEY
cdef Py_ssize_t _VERSION_WINDOW = VERSION_WINDOW
_orjson_loads = orjson.loads


cdef class _CompiledAccumulator(EventSink):
    """StreamAccumulator's state and its per-read and per-event work (fastaccum._py.accumulator's
    methods of the same names); the class below adds the once-per-stream face."""

    # Read by fastaccum._core.base.AccumulatorBase, which also sets the public ones.
    cdef readonly SseFramer _framer
    cdef public str _mode
    cdef public str _dialect
    cdef public object _expert_shape
    cdef public object _indexer_shape
    cdef public object _routed_start
    cdef public object _routed_dtype
    cdef public bint _require_routed
    cdef readonly Buffer _ids
    cdef readonly Buffer _logprobs
    cdef readonly object _has_logprobs  # None until the first event decides it
    cdef public list _text_parts  # None: no event carried text
    cdef public list _top_p  # None: no event carried top-p
    cdef public object _top_p_rows
    cdef public dict _replay  # None: no event carried a replay array
    cdef public dict _finish_reason
    cdef public dict _meta
    cdef public list _versions
    cdef public object _version
    cdef bytes _version_raw  # the newest scanned weight_version's bytes: a change is one memcmp
    cdef readonly bytes _lazy_meta  # a scanned event's meta_info, parsed only when a result is built
    # ... or, while feed() runs, still in the fed piece: copied once when feed() returns, not
    # once per event.
    cdef const unsigned char* _meta_in_piece
    cdef Py_ssize_t _meta_in_piece_len
    cdef readonly Py_ssize_t _events  # JSON events applied or light-checked
    cdef Py_ssize_t _full_parses
    cdef readonly Py_ssize_t _reported  # newest total the server reported
    cdef readonly bytearray _pending  # newest light-checked cumulative event
    cdef SpanScan _pending_scan  # its streamed base64 values, if any
    cdef Py_ssize_t _pending_index
    cdef bint _done  # [DONE] seen
    cdef public object _error
    cdef public object _result
    # Staging areas: an event is read into these, validated, then committed (never half-applied).
    cdef Buffer _lp_ids
    cdef Buffer _lp_values
    cdef Buffer _out_ids
    cdef readonly ChunkedDecoder _chunks  # feed_chunked()'s decoder, made on first use
    # Debugging switches, per accumulator (_debug()): the fast paths change speed, never results.
    cdef bint _fast_scan  # ordinary events go to the scanner, large ones' token lists too
    cdef Py_ssize_t _lift_after_bytes  # from this JSON size on, an event's token lists are lifted
    cdef readonly Py_ssize_t _lifted_events  # events whose token lists were lifted (tests look)
    cdef readonly bint _own_decoder  # streamed base64 goes through fastaccum's AVX2 loop

    def _start(self, max_event_bytes):
        # Every other field starts as None, 0 or False, as a new extension object's do.
        self._framer = SseFramer(max_event_bytes, self)
        self._ids = Buffer(np.int32)
        self._logprobs = Buffer(np.float64)
        self._meta = {}
        self._lp_ids = Buffer(np.int32)
        self._lp_values = Buffer(np.float64)
        self._out_ids = Buffer(np.int32)
        self._fast_scan = True
        self._lift_after_bytes = _LIFT_AFTER_BYTES
        self._own_decoder = simd_decoder()  # where the CPU has AVX2

    def _debug(self, *, fast_scan=None, stream_after_bytes=None, decode_in_place=None, lift_after_bytes=None):
        """Debugging and test hook: send every event to the orjson path whole (``fast_scan=False``),
        stream events from ``stream_after_bytes`` on (a huge value turns streaming off, 0 streams
        every event), lift the token lists of events from ``lift_after_bytes`` of JSON on (0: of
        every event the scanner does not read), or decode streamed base64 with pybase64 alone
        (``decode_in_place=False``; never on without AVX2). Returns the accumulator."""
        if fast_scan is not None:
            self._fast_scan = fast_scan
        if lift_after_bytes is not None:
            self._lift_after_bytes = lift_after_bytes
        if stream_after_bytes is not None:
            self._framer.stream_after_bytes = stream_after_bytes
        if decode_in_place is not None:
            self._own_decoder = decode_in_place and simd_decoder()
        return self

    # ---- input --------------------------------------------------------------------------

    def feed(self, data, /):
        """Frame and apply ``data``; return the number of events it completed ([DONE] included)."""
        return self._feed(data, None, "feed")

    def feed_chunked(self, data, /):
        """Like ``feed()``, for the body of an HTTP/1.1 response with ``Transfer-Encoding:
        chunked``: undo the chunked framing, then frame and apply; ``chunked_ended`` tells when
        the last chunk has been read. Do not mix with ``feed()`` on one accumulator."""
        if self._chunks is None:
            self._chunks = ChunkedDecoder()
        return self._feed(data, self._chunks, "feed_chunked")

    cdef Py_ssize_t _feed(self, object data, ChunkedDecoder chunks, str method) except -1:
        """One read, framed and applied (de-chunked first when ``chunks`` is given); the first
        error is kept."""
        cdef Py_buffer view
        if self._error is not None or self._result is not None or not isinstance(data, (bytes, bytearray, memoryview)):
            raise refused_feed(data, self._error, self._result is not None, method)
        if isinstance(data, memoryview) and not data.c_contiguous:
            data = bytes(data)
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if chunks is None:
                return self._framer.feed(<const unsigned char*>view.buf, 0, view.len)
            return chunks.feed(<const unsigned char*>view.buf, view.len, self._framer)
        except StreamError as exc:
            self._error = exc
            raise
        finally:
            if self._meta_in_piece != NULL:  # events (of one or several chunks) point into this read
                self._lazy_meta = PyBytes_FromStringAndSize(<const char*>self._meta_in_piece,
                                                            self._meta_in_piece_len)
                self._meta_in_piece = NULL
            PyBuffer_Release(&view)

    # ---- events -------------------------------------------------------------------------

    cdef int _dispatch(self, bytearray data, Py_ssize_t index, ValueStream scan) except -1:
        cdef bint is_done = (
            PyByteArray_GET_SIZE(data) == 6 and memcmp(PyByteArray_AS_STRING(data), b"[DONE]", 6) == 0
        )
        if self._done or is_done or (self._finish_reason is not None and self._dialect is not VLLM):
            end_event(
                index, done=self._done, finished=self._finish_reason is not None, is_done=is_done, dialect=self._dialect
            )
            self._done = True
            return 0
        if self._mode is CUMULATIVE and self._full_parses >= _FULL_PARSES_BEFORE_LIGHT:
            if self._light_check(data, index):
                self._pending_scan = <SpanScan>scan
                return 0
        if self._pending is not None:
            # The kept event is validated before the stream moves past it: an echo is reconciled
            # against every token held, and an error in the kept event is not lost.
            self._apply(self._pending, self._pending_index, True, self._pending_scan)
        self._apply(data, index, False, <SpanScan>scan)
        return 0

    def _apply_pending(self):
        self._apply(self._pending, self._pending_index, True, self._pending_scan)

    cdef ValueStream _value_stream(self):
        return SpanScan(self._expert_shape, self._indexer_shape, self._own_decoder)

    cdef bint _event_in_place(self, const unsigned char* data, Py_ssize_t n, Py_ssize_t index) except -1:
        """Apply an ordinary event straight from the caller's bytes, as _dispatch would apply a
        copy of them; False (nothing done) when the event needs _dispatch's other routes."""
        if (
            not self._fast_scan
            or self._done
            or self._finish_reason is not None
            or self._pending is not None
            or (self._mode is CUMULATIVE and self._full_parses >= _FULL_PARSES_BEFORE_LIGHT)
        ):
            return False
        return self._apply_if_scanned(data, n, index, False, True)

    cdef bint _apply_if_scanned(self, const unsigned char* data, Py_ssize_t n, Py_ssize_t index,
                                bint light_checked, bint in_piece) except -1:
        """Apply the event if the scanner reads it; False (nothing done) if orjson must."""
        cdef Event event
        if self._dialect is VLLM:
            if self._finish_reason is not None or not scan_chunk(data, n, self._out_ids, self._lp_ids, self._lp_values, &event):
                return False
            # vLLM counts nothing in an ordinary chunk: the total is what it brings (fastaccum._core.dialects.chunk_counts).
            event.completion_tokens = self._ids.size + (self._lp_ids.size if event.has_logprobs else self._out_ids.size)
        elif not scan_event(data, n, self._out_ids, self._lp_ids, self._lp_values,
                            self._ids.size if self._mode is CUMULATIVE else 0, &event):
            return False
        event.event_index = index
        self._apply_scanned(&event, light_checked, in_piece)
        return True

    cdef bint _light_check(self, bytearray data, Py_ssize_t index) except -1:
        """Accept a non-terminal cumulative event by its reported total alone (docs/core.md)."""
        cdef const char* buf = PyByteArray_AS_STRING(data)
        cdef Py_ssize_t n = PyByteArray_GET_SIZE(data)
        cdef Py_ssize_t at, total
        if not (
            (n >= 8 and memcmp(buf, b'{"text":', 8) == 0)
            or (n >= 14 and memcmp(buf, b'{"output_ids":', 14) == 0)
        ):
            return False
        at = fa_find_bytes(buf, n, _FINISH_KEY, 16, 0)
        if at < 0 or at + 20 > n or memcmp(buf + at + 16, b"null", 4) != 0:
            return False
        if self._version_changed(buf, n, at):
            return False
        at = fa_rfind_bytes(buf, n, _COMPLETION_KEY, 20)
        if at < 0:
            return False
        total = read_uint_at(buf, n, at + 20)
        if total < 0:
            return False
        check_total(index, total, self._reported)
        self._pending = data
        self._pending_index = index
        self._reported = total
        self._events += 1
        return True

    cdef bint _version_changed(self, const char* buf, Py_ssize_t n, Py_ssize_t at) except -1:
        """The event names a weight_version other than the newest one, or one this check cannot
        read plainly, within VERSION_WINDOW of its finish_reason key at ``at``."""
        cdef Py_ssize_t key, start, end, size
        cdef const char* current
        key = fa_find_bytes(buf, min(n, at + _VERSION_WINDOW), _VERSION_KEY, 17, at)
        if key < 0:
            return False
        start = key + 18
        if start > n or buf[start - 1] != 34:
            return True
        end = fa_find_bytes(buf, min(n, start + _VERSION_WINDOW), b'"', 1, start)
        if end < 0 or memchr(buf + start, 92, end - start) != NULL:
            return True
        if self._version is None:
            return True
        current = PyUnicode_AsUTF8AndSize(self._version, &size)
        return size != end - start or memcmp(buf + start, current, size) != 0

    cdef int _apply(self, bytearray data, Py_ssize_t index, bint light_checked, SpanScan scan) except -1:
        """Parse one event and read its fields, then hand it to _commit (nothing half-applied).
        ``light_checked``: the event was counted when the light check kept it."""
        cdef Event event
        cdef dict streamed = None  # replay values decoded while the event arrived
        cdef int lifted = 0
        if self._fast_scan and scan is None and self._apply_if_scanned(
            <const unsigned char*>PyByteArray_AS_STRING(data), PyByteArray_GET_SIZE(data), index, light_checked,
            False
        ):
            return 0
        if scan is not None and not scan.off:
            scan.advance(data, True)  # finish the scan over the complete event
            if reappears(data, scan.spans):
                json_bytes, spans = (scan.original(data) if scan.blocks else data), {}
            else:
                json_bytes, spans = cut_spans(data, scan.spans)
                streamed = scan.blocks or None
        else:
            json_bytes, spans = cut_b64_spans(data)
        if self._dialect is VLLM:
            return self._apply_chunk(data, index, json_bytes, spans, streamed, scan, light_checked)
        original = scan.original if streamed is not None else None
        if self._fast_scan and len(json_bytes) >= self._lift_after_bytes:
            rest = lift_lists(json_bytes, self._out_ids, self._lp_ids, self._lp_values, &lifted)
        if lifted:
            try:
                parsed = read_event(index, data, rest, spans, original, self._dialect)
            except StreamError:
                lifted = 0  # the original's error, as the orjson path words it
            else:
                lifted = lifted if _landed(parsed.obj, parsed.meta, lifted) else 0
                self._lifted_events += lifted != 0
        if not lifted:
            parsed = read_event(index, data, json_bytes, spans, original, self._dialect)
        if not parsed.spans:
            streamed = None  # parsed whole, from the original bytes
        obj = parsed.obj
        meta = parsed.meta
        event.event_index = index
        event.has_output_ids = "output_ids" in obj
        if event.has_output_ids and not lifted & LIFTED_IDS:
            read_id_list(index, "output_ids", obj["output_ids"], self._out_ids)
        event.has_logprobs = "output_token_logprobs" in meta
        if event.has_logprobs and not lifted & LIFTED_LOGPROBS:
            read_logprob_list(index, meta["output_token_logprobs"], self._lp_ids, self._lp_values)
        check_logprobs(index, self._has_logprobs, event.has_logprobs)
        event.completion_tokens, event.logprobs_length, event.prompt_tokens, text = event_counts(index, obj, meta)
        return self._commit(&event, parsed, text, streamed, light_checked)

    cdef int _apply_chunk(self, bytearray data, Py_ssize_t index, object json_bytes, dict spans, dict streamed,
                          SpanScan scan, bint light_checked) except -1:
        """The rest of _apply for a vLLM chunk: read into the Event record SGLang's events fill
        (fastaccum._core.dialects)."""
        cdef Event event
        if self._meta_in_piece != NULL:  # a usage chunk adds to the held meta_info, which may be
            # a chunk read in place earlier in this feed(): keep it before it is read
            self._lazy_meta = PyBytes_FromStringAndSize(<const char*>self._meta_in_piece, self._meta_in_piece_len)
            self._meta_in_piece = NULL
        parsed = read_chunk(index, data, json_bytes, spans, scan.original if streamed is not None else None,
                            self._meta_dict(), finished=self._finish_reason is not None)
        if not parsed.spans:
            streamed = None  # parsed whole, from the original bytes
        token_ids, logprob_ids, logprobs, event.completion_tokens, event.prompt_tokens, text = chunk_fields(
            index, parsed, held=self._ids.size, had_logprobs=self._has_logprobs
        )
        event.event_index = index
        event.has_output_ids = True
        read_id_list(index, TOKEN_IDS, token_ids, self._out_ids)
        event.has_logprobs = logprob_ids is not None
        self._lp_ids.size = self._lp_values.size = 0
        if event.has_logprobs:
            read_id_list(index, TOKEN_IDS, logprob_ids, self._lp_ids)
            _fill_float64(self._lp_values, logprobs)
        check_logprobs(index, self._has_logprobs, event.has_logprobs)
        event.logprobs_length = ABSENT
        return self._commit(&event, parsed, text, streamed, light_checked)

    cdef int _apply_scanned(self, Event* event, bint light_checked, bint in_piece) except -1:
        """The rest of _apply for an event the scanner read (no finish_reason, no base64 arrays);
        ``in_piece``: its bytes are the fed piece's, valid until feed() returns."""
        cdef Py_ssize_t held = self._ids.size
        check_logprobs(event.event_index, self._has_logprobs, event.has_logprobs)
        text = None
        if event.has_text and not event.text_null:
            if event.text_escaped:
                text = _orjson_loads(PyBytes_FromStringAndSize(<const char*>event.text - 1, event.text_len + 2))
            else:
                text = PyUnicode_DecodeUTF8(<const char*>event.text, event.text_len, NULL)
        self._commit(event, None, text, None, light_checked)
        if event.version != NULL:
            self._scanned_version(event, held)
        if in_piece:
            self._meta_in_piece = event.meta
            self._meta_in_piece_len = event.meta_len
        else:
            self._lazy_meta = PyBytes_FromStringAndSize(<const char*>event.meta, event.meta_len)
        return 0

    cdef int _scanned_version(self, Event* event, Py_ssize_t held) except -1:
        """A scanned event's weight_version, decoded only when its bytes differ from the newest
        one's (a version changes a few times a run, events come per token)."""
        cdef bytes raw = self._version_raw
        if raw is not None and PyBytes_GET_SIZE(raw) == event.version_len and memcmp(
            PyBytes_AS_STRING(raw), event.version, event.version_len
        ) == 0:
            return 0
        self._version_raw = PyBytes_FromStringAndSize(<const char*>event.version, event.version_len)
        if event.version_escaped:
            version = _orjson_loads(PyBytes_FromStringAndSize(<const char*>event.version - 1, event.version_len + 2))
        else:
            version = PyUnicode_DecodeUTF8(<const char*>event.version, event.version_len, NULL)
        self._note_version(held, version)
        return 0

    cdef int _commit(self, Event* event, object parsed, object text, dict streamed,
                     bint light_checked) except -1:
        """Validate the event against the stream (lengths, text, top-p, routed experts), then
        commit it. ``parsed``: the orjson path's ParsedEvent, None for an event the scanner read."""
        cdef Py_ssize_t index = event.event_index
        cdef Py_ssize_t held = self._ids.size
        cdef Py_ssize_t listed_n = 0, start, added
        cdef const int32_t* listed = NULL
        cdef bint echo = parsed is not None and parsed.echo
        cdef Buffer out_ids = self._out_ids
        cdef Buffer lp_ids = self._lp_ids
        cdef str new_mode = self._mode
        if event.has_logprobs:
            listed = int32s(lp_ids)
            listed_n = lp_ids.size
        elif event.has_output_ids:
            listed = int32s(out_ids)
            listed_n = out_ids.size
        if echo:
            start = echo_start(
                index,
                mode=new_mode,
                held=held,
                completion=event.completion_tokens,
                logprob_ids=lp_ids.size if event.has_logprobs else ABSENT,
                output_ids=out_ids.size if event.has_output_ids else ABSENT,
            )
            if start < 0:
                start = listed_n
            else:
                self._check_prefix(index, listed + start - held)
        else:
            if not event.has_logprobs and not event.has_output_ids:
                raise broken(index, "no_tokens")
            if event.has_logprobs and event.has_output_ids and (
                out_ids.size != listed_n
                or (listed_n and memcmp(int32s(out_ids), listed, listed_n * sizeof(int32_t)) != 0)
            ):
                raise broken(index, "ids_disagree")
            new_mode = event_mode(
                index, new_mode, held, listed_n, event.logprobs_length, event.completion_tokens, self._reported
            )
            start = 0
            if new_mode is CUMULATIVE:
                self._check_prefix(index, listed)
                start = held
        added = listed_n - start

        top_p = replay = None
        if self._top_p_rows is not None or parsed is not None:  # a scanned event carries no arrays
            top_p, replay = self._read_arrays(
                parsed,
                index=index,
                mode=new_mode,
                held=held,
                added=added,
                prompt=event.prompt_tokens,
                completion=event.completion_tokens,
                streamed=streamed,
            )

        # ---- commit: nothing below can fail on valid input ----
        if added:
            self._ids.extend(listed + start, added)
            if event.has_logprobs:
                self._logprobs.extend(float64s(self._lp_values) + start, added)
        self._has_logprobs = event.has_logprobs
        self._text_parts = text_after(self._text_parts, new_mode, echo, text)
        if parsed is not None:
            self._commit_parsed(parsed.meta, parsed.finish, top_p, replay, held)
        self._lazy_meta = None  # a scanned event's meta_info: _apply_scanned keeps it as bytes
        self._meta_in_piece = NULL
        self._mode = new_mode
        if not light_checked:
            self._events += 1
        self._full_parses += 1
        self._reported = max(self._reported, held + added)
        self._pending = None
        self._pending_scan = None
        return 0

    cdef int _check_prefix(self, Py_ssize_t index, const int32_t* full_ids) except -1:
        cdef Py_ssize_t at = self._ids.equals_prefix(full_ids)
        if at >= 0:
            raise changed_token(index, at, int32s(self._ids)[at], full_ids[at])
        return 0

    def _meta_dict(self):
        if self._lazy_meta is not None:
            self._meta = _orjson_loads(self._lazy_meta)
            if self._dialect is VLLM:  # the whole chunk: scan_chunk
                self._meta = chunk_meta(self._meta, None)
            self._lazy_meta = None
        return self._meta


cdef int _fill_float64(Buffer out, list values) except -1:
    cdef Py_ssize_t i, n = len(values)
    out.size = 0
    out.reserve(n)
    cdef double* dst = float64s(out)
    for i in range(n):
        dst[i] = values[i]
    out.size = n
    return 0


class StreamAccumulator(_CompiledAccumulator, AccumulatorBase):
    """Feeds raw SSE bytes of one SGLang /generate stream and accumulates tokens into arrays."""

    __slots__ = ()


def accumulate(pieces, /, **kwargs):
    """Feed every piece to a new StreamAccumulator(**kwargs), then finish()."""
    return StreamAccumulator(**kwargs)._feed_all(pieces)


cdef bint _landed(object obj, object meta, int lifted) except -1:
    """Each lifted list's ``[]`` is where its key belongs (output_ids in the event, the log-probs
    in meta_info): a key found nested elsewhere leaves the real one unread."""
    if lifted & LIFTED_IDS:
        value = obj.get("output_ids")
        if type(value) is not list or len(<list>value):
            return False
    if lifted & LIFTED_LOGPROBS:
        value = meta.get("output_token_logprobs")
        if type(value) is not list or len(<list>value):
            return False
    return True
