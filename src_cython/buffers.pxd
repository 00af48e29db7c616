# Declarations of fastaccum._cy.buffers: growable typed storage and the owners of handed-out memory.

from libc.stdint cimport int32_t


cdef int export_bytes(Py_buffer* view, object owner, void* data, Py_ssize_t* size, int flags) except -1


cdef class Buffer:
    cdef char* _data
    cdef readonly Py_ssize_t size  # items in use
    cdef readonly Py_ssize_t capacity  # items allocated
    cdef readonly Py_ssize_t itemsize
    cdef readonly object dtype

    cdef int reserve(self, Py_ssize_t extra) except -1
    cdef int extend(self, const void* values, Py_ssize_t n) except -1
    cdef Py_ssize_t equals_prefix(self, const void* values) noexcept
    cpdef object to_array(self)
    cpdef object take_array(self)


# Typed views of a buffer's items, for the loops that fill or compare them in place.
cdef inline int32_t* int32s(Buffer buffer) noexcept:
    return <int32_t*>buffer._data

cdef inline double* float64s(Buffer buffer) noexcept:
    return <double*>buffer._data
