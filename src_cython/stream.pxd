# Declarations of fastaccum._cy.stream: a large event's base64 values, decoded while it arrives.

from fastaccum._cy.framing cimport ValueStream


cdef class Block:
    cdef char* ptr
    cdef readonly Py_ssize_t size
    cdef Py_ssize_t capacity

    cdef int reserve(self, Py_ssize_t extra) except -1
    cdef int append(self, bytes chunk) except -1


cdef class SpanScan(ValueStream):
    cdef Py_ssize_t pos  # where the next '":"' search starts
    cdef dict spans  # key -> (start, end) of the value in the event data
    cdef Block block  # the replay value being streamed, decoded so far
    cdef Py_ssize_t key  # its index in B64_KEYS
    cdef dict blocks  # key -> Block of each replay value streamed whole; its span in data is empty
    cdef dict starts  # key -> where that value was in the event data
    cdef object expert_shape  # size a Block up front when the counts come first
    cdef object indexer_shape
    cdef Py_ssize_t value_start
    cdef char tail[4]  # base64 characters not yet forming a whole quantum (or the padded last one)
    cdef int tail_len
    cdef bint tail_padded
    cdef bint own_decoder  # whole quanta go through fa_base64.h's AVX2 loop, not pybase64

    cdef Py_ssize_t _take_searched(self, bytearray data, const char* p, Py_ssize_t n) except -1
    cdef int _restore(self, bytearray data) except -1
    cdef bint decode(self, const char* p, Py_ssize_t n) except -1


cdef bint simd_decoder() noexcept  # this CPU runs fastaccum's AVX2 base64 loop (set up at import)
