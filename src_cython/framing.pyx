"""SSE framing on raw bytes, as fastaccum._py.framing: lines end at CR, LF or CRLF only; a blank
line dispatches an event.

The framer hands events to an EventSink (the accumulator; the pure twin passes a callback) and,
inside a large event, bytes to a ValueStream (fastaccum._cy.stream; compiled twin only).
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from libc.string cimport memcmp, memcpy

from fastaccum._cy.fa_bytes cimport fa_find_line_end

from fastaccum._core.messages import too_large

cdef enum:
    # Line states, as in fastaccum._py.framing.
    HEAD = 0
    DATA_SPACE = 1
    DATA_VALUE = 2
    SKIP = 3

cdef const char* BOM = b"\xef\xbb\xbf"
cdef const char* DATA_FIELD = b"data:"
# Events below this size are cut after dispatch (fastaccum._core.spans); streaming is not worth it.
cdef Py_ssize_t STREAM_AFTER_BYTES = 4 << 20


cdef class ValueStream:
    """Compiled twin only: the base64 values of one large event, taken while its bytes arrive
    (SpanScan in fastaccum._cy.stream). The framer feeds it; this base does nothing."""

    cdef int advance(self, bytearray data, bint at_end=False) except -1:
        """Look at the newly arrived data."""
        return 0

    cdef Py_ssize_t take(self, bytearray data, const char* p, Py_ssize_t offset, Py_ssize_t n) except -1:
        """Take value characters from p[offset:n]; return how many."""
        return 0

    cdef Py_ssize_t destream(self, bytearray data) except -1:
        """Put what was taken back into data; stop."""
        return 0


cdef class EventSink:
    """What the framer hands each completed event to: the accumulator."""

    cdef int _dispatch(self, bytearray data, Py_ssize_t index, ValueStream scan) except -1:
        return 0

    cdef bint _event_in_place(self, const unsigned char* data, Py_ssize_t n, Py_ssize_t index) except -1:
        """Apply a whole event straight from the fed piece; False: it needs _dispatch."""
        return False

    cdef ValueStream _value_stream(self):
        """A new ValueStream for an event that grew past the framer's stream_after_bytes."""
        return ValueStream()


cdef class SseFramer:
    """Splits a byte stream into SSE events and hands each event's joined data to its owner.

    Data bytes are appended once to ``data`` as they arrive (no re-scan, no per-piece re-copy);
    other lines (comments, ``event:``, ``id:``, unknown fields) are never buffered.
    """

    def __cinit__(self, max_event_bytes, EventSink owner):
        self.max_event_bytes = max_event_bytes
        self._limit = -1 if max_event_bytes is None else max_event_bytes
        self.data = bytearray()
        self._state = HEAD
        self._at_start = True
        self._owner = owner
        self.stream_after_bytes = STREAM_AFTER_BYTES

    cdef Py_ssize_t feed(self, const unsigned char* buf, Py_ssize_t pos, Py_ssize_t n) except -1:
        """Frame ``buf[pos:n]``; dispatch each completed event to the owner; return their count."""
        cdef Py_ssize_t end, count = 0
        if self._after_cr and pos < n:
            self._after_cr = False
            if buf[pos] == 10:
                pos += 1
        while pos < n:
            if self._state == DATA_VALUE and self._scan is not None and self._scan.streaming:
                # Inside a streamed base64 value: the scan reads the piece before any line-end
                # search (it never consumes a line end), so most pieces are read once, not thrice.
                pos += self._scan.take(self.data, <const char*>buf, pos, n)
                self._check_size()
                if pos >= n:
                    break
            if self._state == HEAD and not self.has_data and not self._head_len and not self._at_start:
                end = self._event_in_place(buf, pos, n)
                if end > pos:
                    pos = end
                    count += 1
                    continue
            end = fa_find_line_end(buf, pos, n)
            if end < 0:
                self._take(buf, pos, n)
                break
            self._take(buf, pos, end)
            pos = end + 1
            if buf[end] == 13:
                if pos < n:
                    if buf[pos] == 10:
                        pos += 1
                else:
                    self._after_cr = True
            count += self._end_line()
        return count

    cdef Py_ssize_t _event_in_place(self, const unsigned char* buf, Py_ssize_t pos, Py_ssize_t n) except -1:
        """Dispatch a whole event at buf[pos:] ("data: ...\\n\\n") without copying it; return
        where the next line starts, or pos when the line-by-line route must take it."""
        cdef Py_ssize_t start, end, index
        if n - pos < 8 or memcmp(buf + pos, DATA_FIELD, 5) != 0:
            return pos
        start = pos + 5
        if buf[start] == 32:
            start += 1
        end = fa_find_line_end(buf, start, n)
        if (
            end < 0
            or buf[end] != 10  # a CR line end: the line-by-line route
            or end + 1 >= n
            or buf[end + 1] != 10
            or (self._limit >= 0 and end - start > self._limit)
            or end - start >= self.stream_after_bytes
        ):
            return pos
        index = self.events
        self.events = index + 1  # counted before it is applied, as in _end_line
        if not self._owner._event_in_place(buf + start, end - start, index):
            self.events = index
            return pos
        return end + 2

    @property
    def mid_event(self):
        """Input so far stops inside an event (data seen but no blank line yet)."""
        return self.has_data or self._state == DATA_SPACE or self._state == DATA_VALUE

    cdef int _take(self, const unsigned char* buf, Py_ssize_t start, Py_ssize_t end) except -1:
        while start < end:
            if self._state == HEAD:
                start = self._take_head(buf, start, end)
            elif self._state == DATA_SPACE:
                if buf[start] == 32:
                    start += 1
                self._state = DATA_VALUE
            elif self._state == DATA_VALUE:
                if self._scan is not None and self._scan.streaming:
                    start += self._scan.take(self.data, <const char*>buf, start, end)
                    self._check_size()
                    if start >= end:
                        return 0
                self._append(buf + start, end - start)
                return 0
            else:
                return 0
        return 0

    cdef Py_ssize_t _take_head(self, const unsigned char* buf, Py_ssize_t start,
                               Py_ssize_t end) except -1:
        """Collect the line's first bytes until its field is known; return where the value starts."""
        while start < end:
            self._head[self._head_len] = buf[start]
            self._head_len += 1
            start += 1
            if self._at_start:
                if self._head_len <= 3 and memcmp(self._head, BOM, self._head_len) == 0:
                    if self._head_len == 3:
                        self._head_len = 0
                        self._at_start = False
                    continue
                self._at_start = False
            if self._head_len == 5 and memcmp(self._head, DATA_FIELD, 5) == 0:
                self._head_len = 0
                self._begin_data_line()
                self._state = DATA_SPACE
                return start
            if memcmp(self._head, DATA_FIELD, self._head_len) != 0:
                self._head_len = 0
                self._state = SKIP
                return end
        return start

    cdef int _begin_data_line(self) except -1:
        cdef unsigned char lf = 10
        if self.has_data:
            if self._scan is not None and self._scan.streaming:
                # The value runs past its line: its characters go back before the joining LF,
                # in the order they came, and the ordinary path decides.
                self._scan.destream(self.data)
            self._append(&lf, 1)  # several data lines of one event join with LF
        self.has_data = True
        return 0

    cdef int _append(self, const unsigned char* src, Py_ssize_t n) except -1:
        cdef Py_ssize_t old = PyByteArray_GET_SIZE(self.data)
        # bytearray over-allocates on growth (and large blocks grow by mremap), so appending
        # 64 KiB pieces to a 1 GB event stays linear.
        PyByteArray_Resize(self.data, old + n)
        memcpy(PyByteArray_AS_STRING(self.data) + old, src, n)
        self._check_size()
        if self._scan is not None:
            if not self._scan.off and not self._scan.streaming:
                self._scan.advance(self.data)
        elif old + n >= self.stream_after_bytes:
            self._scan = self._owner._value_stream()
            self._scan.advance(self.data)
        return 0

    cdef int _check_size(self) except -1:
        cdef Py_ssize_t size = PyByteArray_GET_SIZE(self.data)
        if self._scan is not None:
            size += self._scan.consumed  # streamed characters count as the event's data
        if self._limit >= 0 and size > self._limit:
            raise too_large(self.events, self._limit)
        return 0

    cdef Py_ssize_t _end_line(self) except -1:
        cdef int state = self._state
        cdef bytearray data
        cdef Py_ssize_t index
        cdef ValueStream scan
        self._state = HEAD
        self._at_start = False
        if state != HEAD:
            return 0
        if self._head_len == 4 and memcmp(self._head, DATA_FIELD, 4) == 0:  # bare "data"
            self._head_len = 0
            self._begin_data_line()
            return 0
        if self._head_len:  # an unknown field without a colon, such as "dat"
            self._head_len = 0
            return 0
        if not self.has_data:  # a blank line with no data dispatches nothing
            return 0
        data = self.data
        index = self.events
        scan = self._scan
        self.data = bytearray()
        self.has_data = False
        self._scan = None
        self.events = index + 1
        if scan is not None and scan.streaming:
            scan.destream(data)  # the line ended inside the value: the ordinary path decides
        self._owner._dispatch(data, index, scan)
        return 1


