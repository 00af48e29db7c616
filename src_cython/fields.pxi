# ---- field readers ----------------------------------------------------------------------------
# Token ids, logprob triples and counts from a parsed event, and the base64 values cut out of the
# event bytes before parsing, as fastaccum._py.fields; ids and logprobs go straight into buffers.

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_Clear, PyErr_Occurred
from cpython.float cimport PyFloat_AS_DOUBLE
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from libc.math cimport NAN
from libc.stdint cimport int32_t, int64_t
from libc.string cimport memcmp, memcpy

from fa_bytes cimport fa_find_bytes

from fastaccum._messages import (
    LOGPROBS,
    bad_logprob_entry,
    bad_token_id,
    wrong_type,
)
from fastaccum._policy import B64_KEYS

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

cdef int64_t _TOKEN_ID_LIMIT = 2147483648


cdef inline bint _token_id(PyObject* token, int32_t* out) noexcept:
    """The common case, without building a message: an exact int in [0, 2**31)."""
    cdef long long value
    if not PyLong_CheckExact(token):
        return False
    value = PyLong_AsLongLong(<object>token)
    if value == -1 and PyErr_Occurred():
        PyErr_Clear()  # beyond int64: out of range like any other large id
        return False
    if value < 0 or value >= _TOKEN_ID_LIMIT:
        return False
    out[0] = <int32_t>value
    return True


cdef int read_id_list(Py_ssize_t index, str where, object value, Int32Buffer out) except -1:
    """Validate a list of token ids into ``out`` (cleared first)."""
    cdef Py_ssize_t i, n
    cdef int32_t* dst
    cdef PyObject* item
    if type(value) is not list:
        raise wrong_type(index, where, "an array", value)
    n = PyList_GET_SIZE(value)
    out.clear()
    out.reserve(n)
    dst = out._data
    for i in range(n):
        item = PyList_GET_ITEM(value, i)
        if not _token_id(item, dst + i):
            raise bad_token_id(index, f"{where}[{i}]", <object>item)
    out.size = n
    return 0


cdef Py_ssize_t read_logprob_list(Py_ssize_t index, object value, Int32Buffer ids,
                                  Float64Buffer logprobs) except -1:
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
    ids.clear()
    logprobs.clear()
    ids.reserve(n)
    logprobs.reserve(n)
    id_out = ids._data
    lp_out = logprobs._data
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


# ---- base64 values ----------------------------------------------------------------------------

cdef tuple _QUOTED = tuple(b'"' + key.encode() for key in B64_KEYS)


cdef tuple cut_b64_spans(bytearray data):
    """Find each base64 value in the event bytes and return the JSON with those values emptied.

    One forward scan for ``":"`` (a key followed by a string value) that jumps over each value it
    takes, so a gigabyte of base64 is read once (by memchr) and absent keys cost nothing extra.
    A JSON string never contains an unescaped quote, so a match is a real key, or, in hostile
    input, something the caller's check of the parsed placeholders rejects. A value holding a
    backslash (an escape orjson never writes) is left for orjson to parse.
    Returns (json bytes, {key: (start, end) of the value inside ``data``}).
    """
    cdef const char* buf = PyByteArray_AS_STRING(data)
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(data)
    cdef Py_ssize_t at, start, end, pos, k
    cdef dict spans
    if fa_find_bytes(buf, n, b'_experts":"', 11, 0) < 0 and fa_find_bytes(buf, n, b'"top_p_', 7, 0) < 0:
        return data, {}
    spans = {}
    pos = 0
    while len(spans) < 5:
        at = fa_find_bytes(buf, n, b'":"', 3, pos)
        if at < 0:
            break
        k = _key_before(buf, at, spans)
        if k < 0:
            pos = at + 1
            continue
        start = at + 3
        end = fa_find_bytes(buf, n, b'"', 1, start)
        if end < 0:
            break
        if fa_find_bytes(buf, end, b"\\", 1, start) < 0:
            spans[B64_KEYS[k]] = (start, end)
        pos = end
    if reappears(data, spans):
        return data, {}
    return _cut_spans(data, spans)


cdef bint reappears(bytearray data, dict spans) except -1:
    """A cut key occurs again after its value (hostile input): orjson's reading must decide."""
    cdef const char* buf = PyByteArray_AS_STRING(data)
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(data)
    cdef bytes pattern
    for key, (start, end) in spans.items():
        pattern = b'"' + key.encode() + b'":'
        if fa_find_bytes(buf, n, pattern, len(pattern), end) >= 0:
            return True
    return False


cdef tuple _cut_spans(bytearray data, dict spans):
    """The event bytes with the given value spans emptied."""
    cdef const char* buf = PyByteArray_AS_STRING(data)
    cdef Py_ssize_t n = PyByteArray_GET_SIZE(data)
    cdef Py_ssize_t start, end, pos, total, k, count = 0
    cdef Py_ssize_t starts[5]
    cdef Py_ssize_t ends[5]
    cdef bytes out
    cdef char* dst
    if not spans:
        return data, {}
    for start, end in sorted(spans.values()):
        starts[count] = start
        ends[count] = end
        count += 1
    total = n
    for k in range(count):
        total -= ends[k] - starts[k]
    out = PyBytes_FromStringAndSize(NULL, total)
    dst = PyBytes_AS_STRING(out)
    pos = 0
    for k in range(count):
        memcpy(dst, buf + pos, starts[k] - pos)
        dst += starts[k] - pos
        pos = ends[k]
    memcpy(dst, buf + pos, n - pos)
    return out, spans


cdef Py_ssize_t _key_before(const char* buf, Py_ssize_t at, dict spans) except -2:
    """Index in B64_KEYS of the key (not yet taken) whose quoted name ends at ``at``, or -1."""
    cdef Py_ssize_t k, m
    cdef bytes quoted
    for k in range(5):
        quoted = <bytes>_QUOTED[k]
        m = len(quoted)
        if at - m >= 0 and memcmp(buf + at - m, <const char*>quoted, m) == 0 and B64_KEYS[k] not in spans:
            return k
    return -1
