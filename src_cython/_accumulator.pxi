# ---- accumulator ----------------------------------------------------------------------------
# Mirrors fastaccum._py.accumulator; the rules are in docs/core.md.

# The modes are these three objects, compared by identity: an equality test of two str is a
# function call in Cython, and the mode is tested several times per event.
cdef str AUTO = "auto"
cdef str CUMULATIVE = "cumulative"
cdef str INCREMENTAL = "incremental"
_MODES = (AUTO, CUMULATIVE, INCREMENTAL)
# Cumulative events after this many full parses are only light-checked (docs/core.md).
cdef Py_ssize_t _FULL_PARSES_BEFORE_LIGHT = 2
# Token-aligned lists (sliced per event in incremental mode) and the decoded base64 arrays are
# returned as arrays, not repeated in meta_info.
_DROPPED_META = frozenset(
    (
        "output_token_logprobs",
        "output_top_logprobs",
        "output_token_ids_logprobs",
        "output_token_sampling_mask",
        "output_token_sampling_logprobs",
        *B64_KEYS,
    )
)
_TOP_P_PAIRS = (
    ("top_p_token_ids", "top_p_token_offsets"),
    ("top_p_kept_token_ids", "top_p_kept_token_offsets"),
)
cdef const char* _FINISH_KEY = b'"finish_reason":'
cdef const char* _COMPLETION_KEY = b'"completion_tokens":'
_loads = orjson.loads
_JSONDecodeError = orjson.JSONDecodeError


cdef object incremental_echo_text(str held, str echoed):
    """The whole text an incremental echo carries, or None when it cannot be told (§9.3).

    The echo repeats the whole text; a delta still queued when it was sent is coalesced in front
    of it, giving delta + held + delta.
    """
    size, odd = divmod(len(echoed) + len(held), 2)
    if not odd and size < len(echoed):
        whole = echoed[len(echoed) - size :]
        if whole.startswith(held) and whole[len(held) :] == echoed[: len(echoed) - size]:
            return whole
    if echoed.startswith(held):
        return echoed
    return None


cdef class StreamAccumulator:
    """Feeds raw SSE bytes of one SGLang /generate stream and accumulates tokens into arrays."""

    cdef SseFramer _framer
    cdef str _mode
    cdef object _expert_shape
    cdef Int32Buffer _ids
    cdef Float64Buffer _logprobs
    cdef object _has_logprobs  # None until the first event decides it
    cdef list _text_parts  # None: no event carried text
    cdef Int32Buffer _top_p_ids
    cdef Int32Buffer _top_p_offsets
    cdef object _routed
    cdef dict _finish_reason
    cdef dict _meta
    cdef bytes _lazy_meta  # a scanned event's meta_info, parsed only when a result is built
    # ... or, while feed() runs, still in the fed piece: copied once when feed() returns, not
    # once per event.
    cdef const unsigned char* _meta_in_piece
    cdef Py_ssize_t _meta_in_piece_len
    cdef Py_ssize_t _events  # JSON events applied or light-checked
    cdef Py_ssize_t _full_parses
    cdef Py_ssize_t _reported  # newest total the server reported
    cdef bytearray _pending  # newest light-checked cumulative event
    cdef SpanScan _pending_scan  # its streamed base64 values, if any
    cdef Py_ssize_t _pending_index
    cdef bint _done  # [DONE] seen
    cdef object _error
    cdef object _result
    # Staging areas: an event is read into these, validated, then committed (never half-applied).
    cdef Int32Buffer _lp_ids
    cdef Float64Buffer _lp_values
    cdef Int32Buffer _out_ids
    cdef ChunkedDecoder _chunks  # feed_chunked()'s decoder, made on first use

    def __init__(self, mode="auto", *, expert_shape=None, max_event_bytes=None):
        if mode not in _MODES:
            raise ValueError(f"mode must be 'auto', 'cumulative' or 'incremental', not {mode!r}")
        if expert_shape is not None:
            if (
                not isinstance(expert_shape, tuple)
                or len(expert_shape) != 2
                or any(type(x) is not int or x <= 0 for x in expert_shape)
            ):
                raise ValueError(f"expert_shape must be (num_layers, topk) positive ints, not {expert_shape!r}")
        if max_event_bytes is not None and (type(max_event_bytes) is not int or max_event_bytes < 0):
            raise ValueError(f"max_event_bytes must be a non-negative int or None, not {max_event_bytes!r}")
        self._framer = SseFramer(max_event_bytes, self)
        self._mode = _MODES[_MODES.index(mode)]
        self._expert_shape = expert_shape
        self._ids = Int32Buffer()
        self._logprobs = Float64Buffer()
        self._has_logprobs = None
        self._text_parts = None
        self._top_p_ids = None
        self._top_p_offsets = None
        self._routed = None
        self._finish_reason = None
        self._meta = {}
        self._events = 0
        self._full_parses = 0
        self._reported = 0
        self._pending = None
        self._pending_index = -1
        self._done = False
        self._error = None
        self._result = None
        self._lp_ids = Int32Buffer()
        self._lp_values = Float64Buffer()
        self._out_ids = Int32Buffer()

    # ---- public API ---------------------------------------------------------------------

    @property
    def mode(self):
        """The resolved mode: "auto" until an event decides it."""
        return self._mode

    @property
    def finished(self):
        """A terminal finish_reason has been seen."""
        return self._finish_reason is not None

    @property
    def events(self):
        """JSON events seen so far (progress)."""
        return self._events

    @property
    def tokens(self):
        """Newest token total the stream reported (progress; light-checked events included)."""
        return max(self._reported, self._ids.size)

    def feed(self, data, /):
        """Frame and apply ``data``; return the number of events it completed ([DONE] included)."""
        cdef Py_buffer view
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"feed() takes bytes, bytearray or memoryview, not {type(data).__name__}")
        if self._error is not None:
            raise self._error
        if self._result is not None:
            raise RuntimeError("feed() called after finish()")
        if isinstance(data, memoryview) and not data.c_contiguous:
            data = bytes(data)
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            return self._framer.feed(<const unsigned char*>view.buf, view.len)
        except StreamError as exc:
            self._error = exc
            raise
        finally:
            if self._meta_in_piece != NULL:
                self._lazy_meta = PyBytes_FromStringAndSize(<const char*>self._meta_in_piece,
                                                            self._meta_in_piece_len)
                self._meta_in_piece = NULL
            PyBuffer_Release(&view)

    def feed_chunked(self, data, /):
        """Like ``feed()``, for the body of an HTTP/1.1 response with ``Transfer-Encoding:
        chunked``: undo the chunked framing, then frame and apply; ``chunked_ended`` tells when
        the last chunk has been read. Do not mix with ``feed()`` on one accumulator."""
        cdef Py_buffer view
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"feed_chunked() takes bytes, bytearray or memoryview, not {type(data).__name__}")
        if self._error is not None:
            raise self._error
        if self._result is not None:
            raise RuntimeError("feed_chunked() called after finish()")
        if self._chunks is None:
            self._chunks = ChunkedDecoder()
        if isinstance(data, memoryview) and not data.c_contiguous:
            data = bytes(data)
        PyObject_GetBuffer(data, &view, PyBUF_SIMPLE)
        try:
            return self._chunks.feed(self._framer, <const unsigned char*>view.buf, view.len)
        except StreamError as exc:
            self._error = exc
            raise
        finally:
            if self._meta_in_piece != NULL:  # events of several chunks point into this one read
                self._lazy_meta = PyBytes_FromStringAndSize(<const char*>self._meta_in_piece,
                                                            self._meta_in_piece_len)
                self._meta_in_piece = NULL
            PyBuffer_Release(&view)

    @property
    def chunked_ended(self):
        """``feed_chunked()`` has read the last chunk and the trailer section: the body is complete."""
        return self._chunks is not None and self._chunks.ended

    def finish(self):
        """End of input: the final result, or StreamTruncatedError without a terminal event."""
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        framer = self._framer
        try:
            if self._finish_reason is None:
                if framer.mid_event:
                    raise truncated(framer.events, "input ended inside an event, before a terminal finish_reason")
                raise truncated(framer.events, "input ended before a terminal finish_reason")
            if framer.mid_event and not b"[DONE]".startswith(framer.data):
                raise bad_format(framer.events, "data after the terminal event")
        except StreamError as exc:
            self._error = exc
            raise
        self._result = self._build(True)
        return self._result

    def snapshot(self):
        """The observed prefix, consistent across tokens, logprobs, text and top-p; never raises."""
        if self._result is not None:
            return snapshot_of(self._result)
        if self._pending is not None:
            try:
                self._apply(self._pending, self._pending_index, True, self._pending_scan)
            except StreamError:
                # The newest light-checked event does not validate: show the verified state; the
                # kept event stays, so the error still surfaces when the stream moves past it.
                pass
        return self._build()

    def __repr__(self):
        return (
            f"<StreamAccumulator mode={self._mode!r} events={self._events} "
            f"tokens={self.tokens} finished={self.finished}>"
        )

    # ---- events -------------------------------------------------------------------------

    cdef int _dispatch(self, bytearray data, Py_ssize_t index, SpanScan scan) except -1:
        cdef Py_ssize_t n = PyByteArray_GET_SIZE(data)
        if self._done:
            raise bad_format(index, "data after [DONE]")
        if n == 6 and memcmp(PyByteArray_AS_STRING(data), b"[DONE]", 6) == 0:
            if self._finish_reason is None:
                raise truncated(index, "[DONE] before a terminal finish_reason")
            self._done = True
            return 0
        if self._finish_reason is not None:
            raise bad_format(index, "data after the terminal event")
        if self._mode is CUMULATIVE and self._full_parses >= _FULL_PARSES_BEFORE_LIGHT:
            if self._light_check(data, index):
                self._pending_scan = scan
                return 0
        if self._pending is not None:
            # The kept event is validated before the stream moves past it: an echo is reconciled
            # against every token held, and an error in the kept event is not lost.
            self._apply(self._pending, self._pending_index, True, self._pending_scan)
        self._apply(data, index, False, scan)
        return 0

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
        at = find_bytes(buf, n, _FINISH_KEY, 16, 0)
        if at < 0 or at + 20 > n or memcmp(buf + at + 16, b"null", 4) != 0:
            return False
        at = rfind_bytes(buf, n, _COMPLETION_KEY, 20)
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
        """Parse and validate one event completely, then commit it (nothing half-applied)."""
        cdef dict meta
        cdef bint echo, has_logprobs
        cdef Int32Buffer out_ids = self._out_ids
        cdef Int32Buffer lp_ids = self._lp_ids
        cdef Float64Buffer lp_values = self._lp_values
        cdef Block routed_block = None
        if FAST_SCAN and scan is None and self._apply_if_scanned(
            <const unsigned char*>PyByteArray_AS_STRING(data), PyByteArray_GET_SIZE(data), index, counted, False
        ):
            return 0
        if scan is not None and not scan.off:
            scan.advance(data, None, True)  # finish the scan over the complete event
            if reappears(data, scan.spans):
                json_bytes, spans = (scan.original(data) if scan.block is not None else data), {}
            else:
                json_bytes, spans = _cut_spans(data, scan.spans)
                routed_block = scan.block
        else:
            json_bytes, spans = cut_b64_spans(data)
        try:
            obj = _loads(json_bytes)
        except _JSONDecodeError as exc:
            raise bad_format(index, f"data is not valid JSON ({exc})") from None
        if type(obj) is not dict:
            raise bad_format(index, f"data is a JSON {type_name(obj)}, not an object")
        if "error" in obj:
            raise server_error(index, obj["error"])
        if "index" in obj:
            raise bad_format(index, 'a batch stream (top-level "index") is not one request')
        meta_obj = obj.get("meta_info")
        if type(meta_obj) is not dict:
            if "meta_info" not in obj:
                raise bad_format(index, "meta_info is missing")
            raise bad_format(index, f"meta_info must be an object, not {type_name(meta_obj)}")
        meta = meta_obj
        for key in spans:
            if meta.get(key) != "":
                # The cut landed outside meta_info (not SGLang's shape): parse the whole event.
                spans = {}
                try:
                    obj = _loads(scan.original(data) if routed_block is not None else data)
                except _JSONDecodeError as exc:
                    raise bad_format(index, f"data is not valid JSON ({exc})") from None
                meta = obj["meta_info"]
                routed_block = None
                break

        finish = meta.get("finish_reason")
        if finish is not None and type(finish) is not dict:
            raise bad_format(index, f"meta_info.finish_reason must be an object or null, not {type_name(finish)}")
        echo = finish is not None and finish.get("type") == "abort" and "prompt_tokens" not in meta
        has_output_ids = "output_ids" in obj
        if has_output_ids:
            read_id_list(index, "output_ids", obj["output_ids"], out_ids)
        has_logprobs = "output_token_logprobs" in meta
        if has_logprobs:
            read_logprob_list(index, meta["output_token_logprobs"], lp_ids, lp_values)
        if self._has_logprobs is not None and has_logprobs != self._has_logprobs:
            what = "appeared" if has_logprobs else "disappeared"
            raise bad_format(index, f"output_token_logprobs {what} mid-stream")
        completion = read_count(index, meta, "completion_tokens")
        lp_length = read_count(index, meta, "output_token_logprobs_length")
        prompt = read_count(index, meta, "prompt_tokens")
        text = None
        if "text" in obj:
            text = obj["text"]
            if text is not None and type(text) is not str:
                raise bad_format(index, f"text must be a string, not {type_name(text)}")

        return self._commit(index, counted, data, spans, routed_block, meta, finish, echo,
                            has_output_ids, has_logprobs, completion, lp_length, prompt, text)

    cdef int _apply_scanned(self, Py_ssize_t index, bint counted, ScanResult* r, bint in_piece) except -1:
        """The rest of _apply for an event the scanner read (no finish_reason, no base64 arrays);
        ``in_piece``: its bytes are the fed piece's, valid until feed() returns."""
        if self._has_logprobs is not None and r.has_logprobs != self._has_logprobs:
            what = "appeared" if r.has_logprobs else "disappeared"
            raise bad_format(index, f"output_token_logprobs {what} mid-stream")
        text = None
        if r.has_text and not r.text_null:
            if r.text_escaped:
                text = _loads(PyBytes_FromStringAndSize(<const char*>r.text - 1, r.text_len + 2))
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
            start = self._reconcile_echo(index, completion, has_output_ids, has_logprobs)
            if start < 0:
                new_n = 0
            elif has_logprobs:
                new_ids = lp_ids._data + start
                new_logprobs = lp_values._data + start
                new_n = lp_ids.size - start
            else:
                new_ids = out_ids._data + start
                new_n = out_ids.size - start
        else:
            if has_logprobs:
                listed = lp_ids._data
                listed_n = lp_ids.size
                if has_output_ids and (
                    out_ids.size != listed_n
                    or (listed_n and memcmp(out_ids._data, listed, listed_n * sizeof(int32_t)) != 0)
                ):
                    raise bad_format(index, "output_ids disagree with the ids in output_token_logprobs")
            elif has_output_ids:
                listed = out_ids._data
                listed_n = out_ids.size
            else:
                raise bad_format(index, "the event has neither output_ids nor output_token_logprobs")
            if lp_length is not None and completion is not None and lp_length != completion:
                raise bad_length(
                    index, mode,
                    f"output_token_logprobs_length {lp_length} differs from completion_tokens {completion}",
                    completion, lp_length,
                )
            reported_obj = lp_length if lp_length is not None else completion
            if reported_obj is None:
                raise bad_format(index, "meta_info has no completion_tokens")
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

        # Text: cumulative replaces, incremental (and undecided auto) appends. An echo's text is the
        # whole text (behind a coalesced delta in incremental mode, §9.3); undecided auto ignores it.
        text_update = None
        text_replaces = False
        if echo:
            if self._text_parts is not None and text is not None:
                if new_mode is CUMULATIVE:
                    text_update = text
                elif new_mode is INCREMENTAL:
                    text_update = incremental_echo_text("".join(self._text_parts), text)
                text_replaces = True
        elif text is not None:
            text_update = text
            text_replaces = new_mode is CUMULATIVE

        top_p = self._read_top_p(index, meta, data, spans, new_mode, held, new_n)
        routed = self._routed
        if meta is not None and "routed_experts" in meta:
            routed = self._read_routed(index, meta, data, spans, new_mode, prompt, completion, total, routed_block)

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
        if top_p is not None:
            tp_ids, tp_offsets, replace = top_p
            self._commit_top_p(tp_ids, tp_offsets, replace)
        self._routed = routed
        if finish is not None:
            self._finish_reason = finish
        self._meta = meta  # filtered once, when a result is built (None: a scanned event's, kept
        self._lazy_meta = None  # as bytes by _apply_scanned until then)
        self._meta_in_piece = NULL
        self._mode = new_mode
        if not counted:
            self._events += 1
        self._full_parses += 1
        self._reported = max(self._reported, total)
        self._pending = None
        self._pending_scan = None
        return 0

    cdef Py_ssize_t _reconcile_echo(self, Py_ssize_t index, object completion, bint has_output_ids,
                                    bint has_logprobs) except -2:
        """Where the tokens an abort echo adds start in the staged list, or -1 for none (§9.3)."""
        cdef Py_ssize_t held = self._ids.size
        cdef Py_ssize_t full_start
        cdef str mode = self._mode
        # completion stays a Python int until it is known to fit: a hostile count can exceed int64.
        if completion is None:
            raise bad_format(index, "abort echo without completion_tokens")
        if completion < held:
            raise bad_length(
                index, mode, f"abort echo reports {completion} tokens, fewer than the {held} held", held, completion
            )
        if completion == held:
            return -1
        if has_logprobs and self._lp_ids.size >= completion:
            # A coalesced delta may precede the full list: the full list is the tail.
            full_start = self._lp_ids.size - <Py_ssize_t>completion
            self._check_prefix(index, self._lp_ids._data + full_start)
        elif not has_logprobs and mode is CUMULATIVE and has_output_ids and self._out_ids.size == completion:
            full_start = 0
            self._check_prefix(index, self._out_ids._data)
        else:
            raise bad_length(
                index, mode,
                f"abort echo reports {completion} tokens, {held} held, and does not carry the missing ones",
                completion, held,
            )
        return full_start + held

    cdef int _check_prefix(self, Py_ssize_t index, const int32_t* full_ids) except -1:
        cdef Py_ssize_t at = self._ids.equals_prefix(full_ids)
        if at >= 0:
            raise bad_format(index, f"token {at} changed from {self._ids._data[at]} to {full_ids[at]}")
        return 0

    cdef object _read_top_p(self, Py_ssize_t index, dict meta, bytearray data, dict spans, str mode,
                            Py_ssize_t held, Py_ssize_t added):
        """Decode and validate this event's top-p CSR; say whether it replaces or appends."""
        cdef Py_ssize_t rows, total, have
        if meta is None and self._top_p_offsets is None:
            return None  # a scanned event, and no top-p so far
        for ids_key, offsets_key in _TOP_P_PAIRS:
            if meta is not None and (ids_key in meta or offsets_key in meta):
                break
        else:
            if self._top_p_offsets is not None and added > 0:
                raise bad_format(index, f"top-p rows missing for the {added} new tokens")
            return None
        if ids_key not in meta or offsets_key not in meta:
            present, missing = (ids_key, offsets_key) if ids_key in meta else (offsets_key, ids_key)
            raise bad_format(index, f"meta_info.{present} without meta_info.{missing}")
        ids = decode_int32(index, ids_key, meta[ids_key], data, spans.get(ids_key))
        offsets = decode_int32(index, offsets_key, meta[offsets_key], data, spans.get(offsets_key))
        check_offsets(index, offsets_key, offsets, ids.shape[0])
        rows = offsets.shape[0] - 1
        total = held + added
        have = self._top_p_offsets.size - 1 if self._top_p_offsets is not None else 0
        if rows == total:
            return ids, offsets, True
        if rows == added and have == held:
            return ids, offsets, False
        raise bad_length(
            index, mode,
            f"top-p has {rows} rows; expected {added} (this event's new tokens) or {total} (all tokens)",
            total, rows,
        )

    cdef int _commit_top_p(self, object ids, object offsets, bint replace) except -1:
        cdef const int32_t[::1] id_view = ids
        cdef const int32_t[::1] offset_view = offsets
        cdef int32_t zero = 0
        cdef int32_t base
        cdef Py_ssize_t i, n = offset_view.shape[0]
        if self._top_p_ids is None or self._top_p_offsets is None or replace:
            self._top_p_ids = Int32Buffer()
            self._top_p_offsets = Int32Buffer()
            self._top_p_offsets.extend(&zero, 1)
        base = <int32_t>self._top_p_ids.size
        if id_view.shape[0]:
            self._top_p_ids.extend(&id_view[0], id_view.shape[0])
        self._top_p_offsets.reserve(n - 1)
        for i in range(1, n):
            self._top_p_offsets._data[self._top_p_offsets.size] = offset_view[i] + base
            self._top_p_offsets.size += 1
        return 0

    cdef object _read_routed(self, Py_ssize_t index, dict meta, bytearray data, dict spans, str mode,
                             object prompt, object completion, Py_ssize_t total, Block block):
        routed = decode_int32(
            index, "routed_experts", meta["routed_experts"], data, spans.get("routed_experts"), block
        )
        if self._expert_shape is None:
            return routed
        if prompt is None:
            raise bad_format(index, "routed_experts without prompt_tokens cannot be checked against expert_shape")
        layers, topk = self._expert_shape
        done = completion if completion is not None else total
        rows = prompt + done - 1
        expected = max(rows, 0) * layers * topk
        if rows < 0 or routed.shape[0] != expected:
            raise bad_length(
                index, mode,
                f"routed_experts has {routed.shape[0]} values; expected "
                f"({prompt} + {done} - 1) x {layers} x {topk} = {expected}",
                expected, routed.shape[0],
            )
        return routed.reshape(rows, layers, topk)

    cdef dict _meta_dict(self):
        if self._lazy_meta is not None:
            self._meta = _loads(self._lazy_meta)
            self._lazy_meta = None
        return self._meta

    cdef object _build(self, bint final=False):
        """The result so far; ``final``: the buffers' storage goes to it (finish(), no copies)."""
        cdef list parts = self._text_parts
        text = None
        if parts is not None:
            text = parts[0] if len(parts) == 1 else "".join(parts)
            self._text_parts = [text]  # join once; later deltas append to the joined text
        top_p_ids = top_p_offsets = None
        if self._top_p_ids is not None and self._top_p_offsets is not None:
            top_p_ids = self._top_p_ids.take_array() if final else self._top_p_ids.to_array()
            top_p_offsets = self._top_p_offsets.take_array() if final else self._top_p_offsets.to_array()
        completion_tokens = self._ids.size
        return StreamResult(
            mode=self._mode,
            token_ids=self._ids.take_array() if final else self._ids.to_array(),
            logprobs=(self._logprobs.take_array() if final else self._logprobs.to_array()) if self._has_logprobs else None,
            text=text,
            finish_reason=dict(self._finish_reason) if self._finish_reason is not None else None,
            meta_info={k: v for k, v in self._meta_dict().items() if k not in _DROPPED_META},
            completion_tokens=completion_tokens,
            top_p_token_ids=top_p_ids,
            top_p_token_offsets=top_p_offsets,
            routed_experts=self._routed,
            events=self._events,
        )


def accumulate(pieces, /, **kwargs):
    """Feed every piece to a new StreamAccumulator(**kwargs), then finish()."""
    accumulator = StreamAccumulator(**kwargs)
    for piece in pieces:
        accumulator.feed(piece)
    return accumulator.finish()
