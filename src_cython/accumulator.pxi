# ---- accumulator ------------------------------------------------------------------------------
# SGLang /generate events to arrays, as fastaccum._py.accumulator, function by function: the
# extension type _Core holds the per-read and per-event work, and StreamAccumulator joins it to
# fastaccum._base.AccumulatorBase (the once-per-stream face, shared with the pure twin). The
# per-stream rules come from fastaccum._policy and the rules themselves are in docs/core.md.
# _apply_scanned (events the scanner read) is this twin's only addition.

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t
from libc.string cimport memcmp

from fa_bytes cimport fa_find_bytes, fa_rfind_bytes

import orjson

from fastaccum._base import AccumulatorBase
from fastaccum._messages import (
    broken,
    changed_token,
    length_decreased,
    lengths_disagree,
    logprobs_switched,
    mode_mismatch,
)
from fastaccum._policy import (
    ARRAY_KEYS,
    MODES,
    echo_start,
    echo_text,
    end_event,
    event_counts,
    feed_all,
    read_arrays,
    read_event,
    refused_feed,
)
from fastaccum._spans import cut_b64_spans, cut_spans, reappears
from fastaccum.errors import StreamError

# The modes are these three objects, compared by identity: an equality test of two str is a
# function call in Cython, and the mode is tested several times per event.
cdef str AUTO = MODES[0]
cdef str CUMULATIVE = MODES[1]
cdef str INCREMENTAL = MODES[2]
# Cumulative events after this many full parses are only light-checked (docs/core.md).
cdef Py_ssize_t _FULL_PARSES_BEFORE_LIGHT = 2
cdef const char* _FINISH_KEY = b'"finish_reason":'
cdef const char* _COMPLETION_KEY = b'"completion_tokens":'
_orjson_loads = orjson.loads


cdef class _Core(EventSink):
    """StreamAccumulator's state and its per-read and per-event work (fastaccum._py.accumulator's
    methods of the same names); the class below adds the once-per-stream face."""

    # Read by fastaccum._base.AccumulatorBase, which also sets the public ones.
    cdef readonly SseFramer _framer
    cdef public str _mode
    cdef public object _expert_shape
    cdef readonly Int32Buffer _ids
    cdef readonly Float64Buffer _logprobs
    cdef readonly object _has_logprobs  # None until the first event decides it
    cdef public list _text_parts  # None: no event carried text
    cdef public list _top_p  # None: no event carried top-p
    cdef public object _top_p_rows
    cdef public object _routed
    cdef public dict _finish_reason
    cdef public dict _meta
    cdef bytes _lazy_meta  # a scanned event's meta_info, parsed only when a result is built
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
    cdef Int32Buffer _lp_ids
    cdef Float64Buffer _lp_values
    cdef Int32Buffer _out_ids
    cdef readonly ChunkedDecoder _chunks  # feed_chunked()'s decoder, made on first use

    def _start(self, max_event_bytes):
        # Every other field starts as None, 0 or False, as a new extension object's do.
        self._framer = SseFramer(max_event_bytes, self)
        self._ids = Int32Buffer()
        self._logprobs = Float64Buffer()
        self._meta = {}
        self._lp_ids = Int32Buffer()
        self._lp_values = Float64Buffer()
        self._out_ids = Int32Buffer()

    # ---- input --------------------------------------------------------------------------

    def feed(self, data, /):
        """Frame and apply ``data``; return the number of events it completed ([DONE] included)."""
        if self._error is not None or self._result is not None or not isinstance(data, (bytes, bytearray, memoryview)):
            raise refused_feed(data, self._error, self._result is not None)
        return self._feed(data, None)

    def feed_chunked(self, data, /):
        """Like ``feed()``, for the body of an HTTP/1.1 response with ``Transfer-Encoding:
        chunked``: undo the chunked framing, then frame and apply; ``chunked_ended`` tells when
        the last chunk has been read. Do not mix with ``feed()`` on one accumulator."""
        if self._error is not None or self._result is not None or not isinstance(data, (bytes, bytearray, memoryview)):
            raise refused_feed(data, self._error, self._result is not None, "feed_chunked")
        if self._chunks is None:
            self._chunks = ChunkedDecoder()
        return self._feed(data, self._chunks)

    cdef Py_ssize_t _feed(self, object data, ChunkedDecoder chunks) except -1:
        """One read, framed and applied (de-chunked first when ``chunks`` is given); the first
        error is kept."""
        cdef Py_buffer view
        if isinstance(data, memoryview) and not data.c_contiguous:
            data = bytes(data)
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            if chunks is None:
                return self._framer.feed(<const unsigned char*>view.buf, view.len)
            return chunks.feed(self._framer, <const unsigned char*>view.buf, view.len)
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
        if self._done or self._finish_reason is not None or is_done:
            end_event(index, self._done, self._finish_reason is not None, is_done)
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
        return SpanScan(self._expert_shape)

    cdef bint _event_in_place(self, const unsigned char* data, Py_ssize_t n, Py_ssize_t index) except -1:
        """Apply an ordinary event straight from the caller's bytes, as _dispatch would apply a
        copy of them; False (nothing done) when the event needs _dispatch's other routes."""
        if (
            not FAST_SCAN
            or self._done
            or self._finish_reason is not None
            or self._pending is not None
            or (self._mode is CUMULATIVE and self._full_parses >= _FULL_PARSES_BEFORE_LIGHT)
        ):
            return False
        return self._apply_if_scanned(data, n, index, False, True)

    cdef bint _apply_if_scanned(self, const unsigned char* data, Py_ssize_t n, Py_ssize_t index, bint counted,
                                bint in_piece) except -1:
        """Apply the event if the scanner reads it; False (nothing done) if orjson must."""
        cdef ScanResult scanned
        if not scan_event(data, n, self._out_ids, self._lp_ids, self._lp_values,
                          self._ids.size if self._mode is CUMULATIVE else 0, &scanned):
            return False
        self._apply_scanned(index, counted, &scanned, in_piece)
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
        at = fa_rfind_bytes(buf, n, _COMPLETION_KEY, 20)
        if at < 0:
            return False
        total = read_uint_at(buf, n, at + 20)
        if total < 0:
            return False
        if total < self._reported:
            raise length_decreased(index, self._reported, total)
        self._pending = data
        self._pending_index = index
        self._reported = total
        self._events += 1
        return True

    cdef int _apply(self, bytearray data, Py_ssize_t index, bint counted, SpanScan scan) except -1:
        """Parse one event and read its fields, then hand it to _commit (nothing half-applied)."""
        cdef dict meta
        cdef bint echo, has_output_ids, has_logprobs
        cdef Block routed_block = None
        if FAST_SCAN and scan is None and self._apply_if_scanned(
            <const unsigned char*>PyByteArray_AS_STRING(data), PyByteArray_GET_SIZE(data), index, counted, False
        ):
            return 0
        if scan is not None and not scan.off:
            scan.advance(data, True)  # finish the scan over the complete event
            if reappears(data, scan.spans):
                json_bytes, spans = (scan.original(data) if scan.block is not None else data), {}
            else:
                json_bytes, spans = cut_spans(data, scan.spans)
                routed_block = scan.block
        else:
            json_bytes, spans = cut_b64_spans(data)
        obj, meta, spans, finish, echo = read_event(
            index, data, json_bytes, spans, scan.original if routed_block is not None else None
        )
        if not spans:
            routed_block = None  # parsed whole, from the original bytes
        has_output_ids = "output_ids" in obj
        if has_output_ids:
            read_id_list(index, "output_ids", obj["output_ids"], self._out_ids)
        has_logprobs = "output_token_logprobs" in meta
        if has_logprobs:
            read_logprob_list(index, meta["output_token_logprobs"], self._lp_ids, self._lp_values)
        if self._has_logprobs is not None and has_logprobs != self._has_logprobs:
            raise logprobs_switched(index, has_logprobs)
        completion, lp_length, prompt, text = event_counts(index, obj, meta)
        return self._commit(index, counted, data, spans, routed_block, meta, finish, echo,
                            has_output_ids, has_logprobs, completion, lp_length, prompt, text)

    cdef int _apply_scanned(self, Py_ssize_t index, bint counted, ScanResult* r, bint in_piece) except -1:
        """The rest of _apply for an event the scanner read (no finish_reason, no base64 arrays);
        ``in_piece``: its bytes are the fed piece's, valid until feed() returns."""
        if self._has_logprobs is not None and r.has_logprobs != self._has_logprobs:
            raise logprobs_switched(index, r.has_logprobs)
        text = None
        if r.has_text and not r.text_null:
            if r.text_escaped:
                text = _orjson_loads(PyBytes_FromStringAndSize(<const char*>r.text - 1, r.text_len + 2))
            else:
                text = PyUnicode_DecodeUTF8(<const char*>r.text, r.text_len, NULL)
        self._commit(
            index, counted, None, None, None, None, None, False, r.has_output_ids, r.has_logprobs,
            r.completion if r.completion >= 0 else None,
            r.lp_length if r.lp_length >= 0 else None,
            r.prompt if r.prompt >= 0 else None,
            text,
        )
        if in_piece:
            self._meta_in_piece = r.meta
            self._meta_in_piece_len = r.meta_len
        else:
            self._lazy_meta = PyBytes_FromStringAndSize(<const char*>r.meta, r.meta_len)
        return 0

    cdef int _commit(self, Py_ssize_t index, bint counted, bytearray data, dict spans, Block routed_block,
                     dict meta, object finish, bint echo, bint has_output_ids,
                     bint has_logprobs, object completion, object lp_length, object prompt,
                     object text) except -1:
        """Validate the event's lengths, text, top-p and routed experts, then commit it."""
        cdef Py_ssize_t held, listed_n, total, new_n, start
        cdef bint cumulative_fits, incremental_fits, fits
        cdef const int32_t* listed
        cdef const int32_t* new_ids = NULL
        cdef const double* new_logprobs = NULL
        cdef Int32Buffer out_ids = self._out_ids
        cdef Int32Buffer lp_ids = self._lp_ids
        cdef Float64Buffer lp_values = self._lp_values
        cdef str mode, new_mode
        held = self._ids.size
        mode = self._mode
        new_mode = mode
        if echo:
            listed = lp_ids._data if has_logprobs else out_ids._data
            start = echo_start(
                index, mode, held, completion,
                lp_ids.size if has_logprobs else None, out_ids.size if has_output_ids else None,
            )
            if start < 0:
                new_n = 0
            else:
                self._check_prefix(index, listed + start - held)
                new_ids = listed + start
                new_n = (lp_ids.size if has_logprobs else out_ids.size) - start
                if has_logprobs:
                    new_logprobs = lp_values._data + start
        else:
            if has_logprobs:
                listed = lp_ids._data
                listed_n = lp_ids.size
                if has_output_ids and (
                    out_ids.size != listed_n
                    or (listed_n and memcmp(out_ids._data, listed, listed_n * sizeof(int32_t)) != 0)
                ):
                    raise broken(index, "ids_disagree")
            elif has_output_ids:
                listed = out_ids._data
                listed_n = out_ids.size
            else:
                raise broken(index, "no_tokens")
            if lp_length is not None and completion is not None and lp_length != completion:
                raise lengths_disagree(index, mode, lp_length, completion)
            reported_obj = lp_length if lp_length is not None else completion
            if reported_obj is None:
                raise broken(index, "no_total")
            reported = reported_obj
            cumulative_fits = listed_n == reported and reported >= held
            incremental_fits = held + listed_n == reported
            if mode is CUMULATIVE:
                fits = cumulative_fits
            elif mode is INCREMENTAL:
                fits = incremental_fits
            else:
                fits = cumulative_fits or incremental_fits
            if not fits:
                raise mode_mismatch(index, mode, held, listed_n, reported_obj)
            if mode is AUTO and cumulative_fits != incremental_fits:
                new_mode = CUMULATIVE if cumulative_fits else INCREMENTAL
            if new_mode is CUMULATIVE:
                if reported < self._reported:
                    raise length_decreased(index, self._reported, reported_obj)
                self._check_prefix(index, listed)
                new_ids = listed + held
                new_n = listed_n - held
                if has_logprobs:
                    new_logprobs = lp_values._data + held
            else:
                new_ids = listed
                new_n = listed_n
                if has_logprobs:
                    new_logprobs = lp_values._data
        total = held + new_n

        # Text: cumulative replaces, incremental (and undecided auto) appends; an echo's text is
        # the whole text, which the policy reconciles with the text held.
        if echo:
            text_update = echo_text(new_mode, self._text_parts, text)
            text_replaces = True
        else:
            text_update = text
            text_replaces = new_mode is CUMULATIVE

        top_p = routed = None
        if self._top_p_rows is not None or (meta is not None and not ARRAY_KEYS.isdisjoint(meta)):
            top_p, routed = read_arrays(index, meta, data, spans, routed_block, new_mode, held, new_n,
                                        self._top_p_rows, self._expert_shape, prompt, completion)

        # ---- commit: nothing below can fail on valid input ----
        self._ids.extend(new_ids, new_n)
        if new_logprobs != NULL:
            self._logprobs.extend(new_logprobs, new_n)
        self._has_logprobs = has_logprobs
        if text_update is not None:
            if text_replaces or self._text_parts is None:
                self._text_parts = [text_update]
            else:
                self._text_parts.append(text_update)  # joined once, when a result is built
        if meta is not None:
            self._commit_parsed(meta, finish, top_p, routed)
        self._lazy_meta = None  # a scanned event's meta_info: _apply_scanned keeps it as bytes
        self._meta_in_piece = NULL
        self._mode = new_mode
        if not counted:
            self._events += 1
        self._full_parses += 1
        self._reported = max(self._reported, total)
        self._pending = None
        self._pending_scan = None
        return 0

    cdef int _check_prefix(self, Py_ssize_t index, const int32_t* full_ids) except -1:
        cdef Py_ssize_t at = self._ids.equals_prefix(full_ids)
        if at >= 0:
            raise changed_token(index, at, self._ids._data[at], full_ids[at])
        return 0

    def _meta_dict(self):
        if self._lazy_meta is not None:
            self._meta = _orjson_loads(self._lazy_meta)
            self._lazy_meta = None
        return self._meta


class StreamAccumulator(_Core, AccumulatorBase):
    """Feeds raw SSE bytes of one SGLang /generate stream and accumulates tokens into arrays."""

    __slots__ = ()


def accumulate(pieces, /, **kwargs):
    """Feed every piece to a new StreamAccumulator(**kwargs), then finish()."""
    return feed_all(StreamAccumulator(**kwargs), pieces)
