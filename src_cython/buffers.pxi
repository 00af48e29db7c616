# ---- buffers ----------------------------------------------------------------------------------
# Growable storage with explicit size and capacity, as fastaccum._py.buffers: to_array() hands out
# copies, take_array() the storage itself (for a final result).

from cpython.buffer cimport PyBUF_FORMAT, PyBUF_ND
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.stdint cimport int32_t

import numpy as np

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
