"""Compiled twin of fastaccum's core: the names, order and messages of fastaccum._py, in C loops.

Directives are set in setup.py. Cold paths (every error) call the shared factories in
fastaccum._messages, so both twins raise the same class with the same text.
"""

from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND, PyBUF_READ, PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_Clear, PyErr_Occurred
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.object cimport PyObject
from libc.math cimport NAN
from libc.stdint cimport int32_t, int64_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy

from _bytes cimport find_bytes, find_line_end, rfind_bytes

import numpy as np
import orjson
import pybase64

from fastaccum._messages import (
    bad_chunk,
    bad_format,
    bad_length,
    length_decreased,
    mode_mismatch,
    server_error,
    too_large,
    truncated,
    type_name,
)
from fastaccum.errors import StreamError
from fastaccum.result import StreamResult, snapshot_of

__all__ = ("StreamAccumulator", "accumulate")

cdef extern from "Python.h":
    bint PyLong_CheckExact(PyObject*)
    bint PyFloat_CheckExact(PyObject*)
    bint PyList_CheckExact(PyObject*)
    bint PyUnicode_CheckExact(PyObject*)
    # Declared without an except clause: the callers test PyErr_Occurred() themselves, so an id
    # beyond int64 becomes the same "not a token id" StreamFormatError as in the pure twin.
    long long PyLong_AsLongLong(object)
    PyObject* Py_None


# ---- framing -------------------------------------------------------------------------------

cdef enum:
    # Line states, as in fastaccum._py.framing.
    HEAD = 0
    DATA_SPACE = 1
    DATA_VALUE = 2
    SKIP = 3

cdef const char* BOM = b"\xef\xbb\xbf"
cdef const char* DATA_FIELD = b"data:"


cdef class SseFramer:
    """Splits a byte stream into SSE events and hands each event's joined data to its owner.

    Data bytes are appended once to ``data`` as they arrive (no re-scan, no per-piece re-copy);
    other lines (comments, ``event:``, ``id:``, unknown fields) are never buffered.
    """

    cdef readonly object max_event_bytes
    cdef Py_ssize_t _limit  # -1: no cap
    cdef readonly bytearray data
    cdef readonly bint has_data
    cdef readonly Py_ssize_t events
    cdef unsigned char _head[8]
    cdef Py_ssize_t _head_len
    cdef int _state
    cdef bint _after_cr
    cdef bint _at_start
    cdef StreamAccumulator _owner  # the dispatch target (a callback in the pure twin)
    cdef SpanScan _scan  # the streamed base64 scan of a large event (compiled twin only)

    def __cinit__(self, max_event_bytes, StreamAccumulator owner):
        self.max_event_bytes = max_event_bytes
        self._limit = -1 if max_event_bytes is None else max_event_bytes
        self.data = bytearray()
        self._state = HEAD
        self._at_start = True
        self._owner = owner

    cdef Py_ssize_t feed(self, const unsigned char* buf, Py_ssize_t n) except -1:
        """Frame ``buf``; dispatch each completed event to the owner; return their count."""
        cdef Py_ssize_t pos = 0, end, count = 0
        if self._after_cr and n:
            self._after_cr = False
            if buf[0] == 10:
                pos = 1
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
            end = find_line_end(buf, pos, n)
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
        end = find_line_end(buf, start, n)
        if (
            end < 0
            or buf[end] != 10  # a CR line end: the line-by-line route
            or end + 1 >= n
            or buf[end + 1] != 10
            or (self._limit >= 0 and end - start > self._limit)
            or end - start >= STREAM_AFTER_BYTES
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
                self._scan.advance(self.data, self._owner._expert_shape)
        elif old + n >= STREAM_AFTER_BYTES:
            self._scan = SpanScan()
            self._scan.advance(self.data, self._owner._expert_shape)
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


# ---- buffers -------------------------------------------------------------------------------

cdef enum:
    MIN_CAPACITY = 256
cdef char* BYTE_FORMAT = b"B"


cdef int export_bytes(Py_buffer* view, object owner, void* data, Py_ssize_t* size, int flags) except -1:
    """Fill ``view`` for a writable one-dimensional byte buffer (the __getbuffer__ of the owners
    of decoded or handed-over memory)."""
    view.buf = data if data != NULL else <void*>size  # any valid address for 0 bytes
    view.obj = owner
    view.len = size[0]
    view.readonly = 0
    view.itemsize = 1
    view.format = BYTE_FORMAT if flags & PyBUF_FORMAT else NULL
    view.ndim = 1
    view.shape = size if flags & PyBUF_ND else NULL
    view.strides = NULL
    view.suboffsets = NULL
    view.internal = NULL
    return 0


cdef class _Storage:
    """The memory of a buffer that take_array() handed to a numpy array: the array's base, which
    frees it when the array goes."""

    cdef void* _data
    cdef Py_ssize_t _nbytes

    def __dealloc__(self):
        PyMem_Free(self._data)

    def __getbuffer__(self, Py_buffer* view, int flags):
        export_bytes(view, self, self._data, &self._nbytes, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass


cdef object _hand_over(void** data, Py_ssize_t* size, Py_ssize_t* capacity, size_t itemsize, object dtype):
    """take_array() of both buffers: an array of dtype that owns the buffer's memory (trimmed to
    its size), leaving the buffer empty; an empty buffer keeps its memory."""
    cdef _Storage storage
    cdef void* trimmed
    if size[0] == 0:
        return np.empty(0, dtype=dtype)
    storage = _Storage.__new__(_Storage)
    trimmed = PyMem_Realloc(data[0], size[0] * itemsize)  # shrinking: in place, or a remap
    storage._data = trimmed if trimmed != NULL else data[0]
    storage._nbytes = size[0] * itemsize
    data[0] = NULL
    size[0] = capacity[0] = 0
    return np.frombuffer(storage, dtype=dtype)


cdef class Int32Buffer:
    """Growable int32 storage. Grows by doubling; to_array() copies, so nothing is ever lent;
    take_array() gives the storage away (for a final result) and leaves the buffer empty."""

    cdef int32_t* _data
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t capacity

    def __dealloc__(self):
        PyMem_Free(self._data)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t needed = self.size + extra
        cdef Py_ssize_t grown
        cdef void* memory
        if needed <= self.capacity:
            return 0
        # Doubling: a 500k-token stream reallocates ~12 times, not once per event.
        grown = max(needed, 2 * self.capacity, MIN_CAPACITY)
        memory = PyMem_Realloc(self._data, grown * sizeof(int32_t))
        if memory == NULL:
            raise MemoryError()
        self._data = <int32_t*>memory
        self.capacity = grown
        return 0

    cdef int extend(self, const int32_t* values, Py_ssize_t n) except -1:
        if n <= 0:
            return 0
        self.reserve(n)
        memcpy(self._data + self.size, values, n * sizeof(int32_t))
        self.size += n
        return 0

    cdef inline void clear(self) noexcept:
        self.size = 0

    cpdef object to_array(self):
        cdef object array = np.empty(self.size, dtype=np.int32)
        cdef int32_t[::1] view = array
        if self.size:
            memcpy(&view[0], self._data, self.size * sizeof(int32_t))
        return array

    cpdef object take_array(self):
        return _hand_over(<void**>&self._data, &self.size, &self.capacity, sizeof(int32_t), np.int32)

    cdef Py_ssize_t equals_prefix(self, const int32_t* values) noexcept:
        """Index of the first held id that differs from ``values`` (at least as long), or -1."""
        cdef Py_ssize_t i
        if self.size == 0 or memcmp(self._data, values, self.size * sizeof(int32_t)) == 0:
            return -1
        for i in range(self.size):
            if self._data[i] != values[i]:
                return i
        return -1


cdef class Float64Buffer:
    """Growable float64 storage, same policy as Int32Buffer."""

    cdef double* _data
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t capacity

    def __dealloc__(self):
        PyMem_Free(self._data)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t needed = self.size + extra
        cdef Py_ssize_t grown
        cdef void* memory
        if needed <= self.capacity:
            return 0
        grown = max(needed, 2 * self.capacity, MIN_CAPACITY)
        memory = PyMem_Realloc(self._data, grown * sizeof(double))
        if memory == NULL:
            raise MemoryError()
        self._data = <double*>memory
        self.capacity = grown
        return 0

    cdef int extend(self, const double* values, Py_ssize_t n) except -1:
        if n <= 0:
            return 0
        self.reserve(n)
        memcpy(self._data + self.size, values, n * sizeof(double))
        self.size += n
        return 0

    cdef inline void clear(self) noexcept:
        self.size = 0

    cpdef object to_array(self):
        cdef object array = np.empty(self.size, dtype=np.float64)
        cdef double[::1] view = array
        if self.size:
            memcpy(&view[0], self._data, self.size * sizeof(double))
        return array

    cpdef object take_array(self):
        return _hand_over(<void**>&self._data, &self.size, &self.capacity, sizeof(double), np.float64)


include "_arrays.pxi"
include "_stream.pxi"
include "_scan.pxi"
include "chunked.pxi"
include "_accumulator.pxi"
