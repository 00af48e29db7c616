# Declarations of fastaccum._cy.framing: the SSE framer and the two interfaces it hands bytes to.

cdef class ValueStream:
    cdef bint streaming  # inside a value being decoded: the framer hands the bytes here first
    cdef bint off  # given up: the event takes the ordinary path
    cdef readonly Py_ssize_t consumed  # characters taken out of the event data

    cdef int advance(self, bytearray data, bint at_end=*) except -1
    cdef Py_ssize_t take(self, bytearray data, const char* p, Py_ssize_t offset, Py_ssize_t n) except -1
    cdef Py_ssize_t destream(self, bytearray data) except -1


cdef class EventSink:
    cdef int _dispatch(self, bytearray data, Py_ssize_t index, ValueStream scan) except -1
    cdef bint _event_in_place(self, const unsigned char* data, Py_ssize_t n, Py_ssize_t index) except -1
    cdef ValueStream _value_stream(self)


cdef class SseFramer:
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
    cdef EventSink _owner  # the dispatch target (a callback in the pure twin)
    cdef ValueStream _scan  # the streamed base64 values of a large event (compiled twin only)
    cdef public Py_ssize_t stream_after_bytes  # an event this large is scanned while it arrives

    cdef Py_ssize_t feed(self, const unsigned char* buf, Py_ssize_t pos, Py_ssize_t n) except -1
    cdef Py_ssize_t _event_in_place(self, const unsigned char* buf, Py_ssize_t pos, Py_ssize_t n) except -1
    cdef int _take(self, const unsigned char* buf, Py_ssize_t start, Py_ssize_t end) except -1
    cdef Py_ssize_t _take_head(self, const unsigned char* buf, Py_ssize_t start, Py_ssize_t end) except -1
    cdef int _begin_data_line(self) except -1
    cdef int _append(self, const unsigned char* src, Py_ssize_t n) except -1
    cdef int _check_size(self) except -1
    cdef Py_ssize_t _end_line(self) except -1
