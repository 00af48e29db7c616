"""Field readers: token ids, logprob triples and counts from a parsed event, and the one count
the light check reads from the raw bytes, as fastaccum._py.fields; ids and logprobs go straight
into buffers."""

from cpython.exc cimport PyErr_Clear, PyErr_Occurred
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from libc.math cimport NAN
from libc.stdint cimport INT32_MAX, int32_t

from fastaccum._cy.buffers cimport Buffer, float64s, int32s

from fastaccum._core.messages import (
    LOGPROBS,
    bad_logprob_entry,
    bad_token_id,
    wrong_type,
)

cdef extern from "Python.h":
    bint PyLong_CheckExact(PyObject*)
    bint PyFloat_CheckExact(PyObject*)
    bint PyList_CheckExact(PyObject*)
    bint PyUnicode_CheckExact(PyObject*)
    # Declared without an except clause: the callers test PyErr_Occurred() themselves, so an id
    # beyond int64 becomes the same "not a token id" StreamFormatError as in the pure twin.
    long long PyLong_AsLongLong(object)
    PyObject* Py_None


# ---- token ids and logprobs -------------------------------------------------------------------

cdef inline bint _token_id(PyObject* token, int32_t* out) noexcept:
    """The common case, without building a message: an exact int in [0, 2**31)."""
    cdef long long value
    if not PyLong_CheckExact(token):
        return False
    value = PyLong_AsLongLong(<object>token)
    if value == -1 and PyErr_Occurred():
        PyErr_Clear()  # beyond int64: out of range like any other large id
        return False
    if value < 0 or value > INT32_MAX:
        return False
    out[0] = <int32_t>value
    return True


cdef int read_id_list(Py_ssize_t index, str where, object value, Buffer out) except -1:
    """Validate a list of token ids into ``out`` (cleared first)."""
    cdef Py_ssize_t i, n
    cdef int32_t* dst
    cdef PyObject* item
    if type(value) is not list:
        raise wrong_type(index, where, "an array", value)
    n = PyList_GET_SIZE(value)
    out.size = 0
    out.reserve(n)
    dst = int32s(out)
    for i in range(n):
        item = PyList_GET_ITEM(value, i)
        if not _token_id(item, dst + i):
            raise bad_token_id(index, f"{where}[{i}]", <object>item)
    out.size = n
    return 0


cdef Py_ssize_t read_logprob_list(Py_ssize_t index, object value, Buffer ids, Buffer logprobs) except -1:
    """Split ``[[logprob|null, id, text|null], ...]`` into ``ids`` and ``logprobs`` (cleared
    first; null becomes NaN); return the count."""
    cdef Py_ssize_t i, n, width
    cdef PyObject* entry
    cdef PyObject* logprob
    cdef PyObject* token
    cdef PyObject* text
    cdef int32_t* id_out
    cdef double* lp_out
    if type(value) is not list:
        raise wrong_type(index, LOGPROBS, "an array", value)
    n = PyList_GET_SIZE(value)
    ids.size = logprobs.size = 0
    ids.reserve(n)
    logprobs.reserve(n)
    id_out = int32s(ids)
    lp_out = float64s(logprobs)
    for i in range(n):
        entry = PyList_GET_ITEM(value, i)
        if not PyList_CheckExact(entry):
            raise bad_logprob_entry(index, i)
        width = PyList_GET_SIZE(<object>entry)
        if width < 2 or width > 3:
            raise bad_logprob_entry(index, i)
        logprob = PyList_GET_ITEM(<object>entry, 0)
        if logprob == Py_None:
            lp_out[i] = NAN
        elif PyFloat_CheckExact(logprob):
            lp_out[i] = PyFloat_AS_DOUBLE(<object>logprob)
        elif PyLong_CheckExact(logprob):
            lp_out[i] = float(<object>logprob)
        else:
            raise bad_logprob_entry(index, i, 0, <object>logprob)
        token = PyList_GET_ITEM(<object>entry, 1)
        if not _token_id(token, id_out + i):
            raise bad_token_id(index, f"{LOGPROBS}[{i}][1]", <object>token)
        if width == 3:
            text = PyList_GET_ITEM(<object>entry, 2)
            if text != Py_None and not PyUnicode_CheckExact(text):
                raise bad_logprob_entry(index, i, 2, <object>text)
    ids.size = n
    logprobs.size = n
    return n


cdef Py_ssize_t read_uint_at(const char* data, Py_ssize_t n, Py_ssize_t pos) noexcept:
    """The unsigned integer literal at ``pos`` (1-18 digits, then ',' or '}'), or -1."""
    cdef Py_ssize_t end = pos
    cdef Py_ssize_t limit = min(n, pos + 19)
    cdef Py_ssize_t value = 0
    while end < limit and 48 <= data[end] <= 57:
        if end - pos < 18:  # a 19th digit is refused below, never accumulated (no overflow)
            value = value * 10 + (data[end] - 48)
        end += 1
    if end == pos or end - pos > 18 or end >= n or (data[end] != 44 and data[end] != 125):
        return -1
    return value
