"""Growable storage with explicit size and capacity, as fastaccum._py.buffers: to_array() hands out
copies, take_array() the storage itself (for a final result)."""

from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_FORMAT,
    PyBUF_ND,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from libc.string cimport memcmp, memcpy

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


cdef class Buffer:
    """Growable storage of one numpy dtype (int32 ids, float64 logprobs). Grows by doubling;
    to_array() copies, so nothing is ever lent; take_array() gives the storage away (for a final
    result) and leaves the buffer empty."""

    def __cinit__(self, dtype):
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize

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
        memory = PyMem_Realloc(self._data, grown * self.itemsize)
        if memory == NULL:
            raise MemoryError()
        self._data = <char*>memory
        self.capacity = grown
        return 0

    cdef int extend(self, const void* values, Py_ssize_t n) except -1:
        if n <= 0:
            return 0
        self.reserve(n)
        memcpy(self._data + self.size * self.itemsize, values, n * self.itemsize)
        self.size += n
        return 0

    cdef Py_ssize_t equals_prefix(self, const void* values) noexcept:
        """Index of the first held item that differs from ``values`` (at least as long), or -1."""
        cdef Py_ssize_t i
        cdef Py_ssize_t width = self.itemsize
        if self.size == 0 or memcmp(self._data, values, self.size * width) == 0:
            return -1
        for i in range(self.size):
            if memcmp(self._data + i * width, <const char*>values + i * width, width) != 0:
                return i
        return -1

    cpdef object to_array(self):
        cdef object array = np.empty(self.size, dtype=self.dtype)
        cdef Py_buffer view
        if self.size:
            PyObject_GetBuffer(array, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS)
            memcpy(view.buf, self._data, self.size * self.itemsize)
            PyBuffer_Release(&view)
        return array

    cpdef object take_array(self):
        """An array that owns the buffer's memory (trimmed to its size), leaving the buffer empty;
        an empty buffer keeps its memory."""
        cdef _Storage storage
        cdef void* trimmed
        cdef Py_ssize_t nbytes = self.size * self.itemsize
        if self.size == 0:
            return np.empty(0, dtype=self.dtype)
        storage = _Storage.__new__(_Storage)
        trimmed = PyMem_Realloc(self._data, nbytes)  # shrinking: in place, or a remap
        storage._data = trimmed if trimmed != NULL else self._data
        storage._nbytes = nbytes
        self._data = NULL
        self.size = self.capacity = 0
        return np.frombuffer(storage, dtype=self.dtype)
