# Types for python/chunked.py, compiled as fastaccum._cy.chunked (the pure twin runs the same file
# as fastaccum._py.chunked). Without the typed locals the compiled loop is about 10x slower.

import cython
from libc.stdint cimport int64_t

from fastaccum._cy.framing cimport SseFramer

cdef int _CR, _LF, _SEMICOLON, _EQUALS, _QUOTE, _BACKSLASH, _SPACE, _TAB
cdef int _SIZE_START, _SIZE, _SIZE_SPACE, _EXT_NAME_START, _SIZE_LF, _DATA, _DATA_CR, _DATA_LF
cdef int _TRAILER_START, _TRAILER, _TRAILER_LF, _END_LF, _DONE
cdef int _EXT_NAME, _EXT_AFTER_NAME, _EXT_VALUE_START, _EXT_TOKEN, _EXT_QUOTED, _EXT_QUOTED_PAIR, _EXT_AFTER_VALUE
cdef Py_ssize_t _LINE_LIMIT
cdef int64_t _SIZE_SHIFT_LIMIT

cdef int _hex_value(unsigned char byte) noexcept
cdef bint _is_token(unsigned char byte) noexcept
cdef bint _is_quoted_text(unsigned char byte) noexcept


cdef class ChunkedDecoder:
    cdef int state
    cdef int64_t remaining
    cdef Py_ssize_t line
    cdef readonly bint ended

    @cython.locals(pos=Py_ssize_t, count=Py_ssize_t, take=Py_ssize_t, state=int, byte=cython.uchar, digit=int)
    cdef Py_ssize_t feed(self, const unsigned char* buf, Py_ssize_t n, SseFramer framer) except -1
    cdef int _after_size(self, unsigned char byte, SseFramer framer) except -1
    @cython.locals(state=int, space=bint)
    cdef int _extension(self, unsigned char byte, SseFramer framer) except -1
    cdef int _count_line(self, SseFramer framer) except -1
