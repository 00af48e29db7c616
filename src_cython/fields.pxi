# ---- arrays ---------------------------------------------------------------------------------
# Base64 int32 arrays cut out of the event bytes and decoded without building a Python str.
# Mirrors fastaccum._py.arrays.

# The meta_info values that are base64 int32 arrays; routed experts alone can be gigabytes.
B64_KEYS = (
    "top_p_token_ids",
    "top_p_token_offsets",
    "top_p_kept_token_ids",
    "top_p_kept_token_offsets",
    "routed_experts",
)
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
    if find_bytes(buf, n, b'_experts":"', 11, 0) < 0 and find_bytes(buf, n, b'"top_p_', 7, 0) < 0:
        return data, {}
    spans = {}
    pos = 0
    while len(spans) < 5:
        at = find_bytes(buf, n, b'":"', 3, pos)
        if at < 0:
            break
        k = _key_before(buf, at, spans)
        if k < 0:
            pos = at + 1
            continue
        start = at + 3
        end = find_bytes(buf, n, b'"', 1, start)
        if end < 0:
            break
        if find_bytes(buf, end, b"\\", 1, start) < 0:
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
        if find_bytes(buf, n, pattern, len(pattern), end) >= 0:
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


cdef object decode_int32(Py_ssize_t index, str key, object value, bytearray data, object span,
                         Block block=None):
    """Decode one base64 int32 array, from its span in ``data`` or from the parsed str (or take
    the Block the framer already decoded it into)."""
    if block is not None:
        if block.size % 4:
            raise bad_format(index, f"meta_info.{key} decodes to {block.size} bytes, not whole int32 values")
        return np.frombuffer(block, dtype="<i4").astype(np.int32, copy=False)
    if span is None and type(value) is not str:
        raise bad_format(index, f"meta_info.{key} must be a base64 string, not {type_name(value)}")
    source = memoryview(data)[span[0] : span[1]] if span is not None else value
    try:
        raw = pybase64.b64decode_as_bytearray(source, validate=True)
    except ValueError:  # binascii.Error, or a str with non-ASCII characters
        raise bad_format(index, f"meta_info.{key} is not valid base64") from None
    finally:
        source = None  # release the view so the event buffer can be freed
    if len(raw) % 4:
        raise bad_format(index, f"meta_info.{key} decodes to {len(raw)} bytes, not whole int32 values")
    return np.frombuffer(raw, dtype="<i4").astype(np.int32, copy=False)


# ---- field readers --------------------------------------------------------------------------

cdef str _LOGPROBS = "meta_info.output_token_logprobs"
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


cdef int check_token_id(Py_ssize_t index, str where, PyObject* token, int32_t* out) except -1:
    if _token_id(token, out):
        return 0
    if not PyLong_CheckExact(token):
        raise bad_format(index, f"{where} must be a token id, not {type_name(<object>token)}")
    raise bad_format(index, f"{where} = {<object>token} is not a token id in [0, 2**31)")


cdef int read_id_list(Py_ssize_t index, str where, object value, Int32Buffer out) except -1:
    """Validate a list of token ids into ``out`` (cleared first)."""
    cdef Py_ssize_t i, n
    cdef int32_t* dst
    cdef PyObject* item
    if type(value) is not list:
        raise bad_format(index, f"{where} must be an array, not {type_name(value)}")
    n = PyList_GET_SIZE(value)
    out.clear()
    out.reserve(n)
    dst = out._data
    for i in range(n):
        item = PyList_GET_ITEM(value, i)
        if not _token_id(item, dst + i):
            check_token_id(index, f"{where}[{i}]", item, dst + i)  # raises the exact error
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
        raise bad_format(index, f"{_LOGPROBS} must be an array, not {type_name(value)}")
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
            raise bad_format(index, f"{_LOGPROBS}[{i}] must be [logprob, id, text]")
        width = PyList_GET_SIZE(<object>entry)
        if width < 2 or width > 3:
            raise bad_format(index, f"{_LOGPROBS}[{i}] must be [logprob, id, text]")
        logprob = PyList_GET_ITEM(<object>entry, 0)
        if logprob == Py_None:
            lp_out[i] = NAN
        elif PyFloat_CheckExact(logprob):
            lp_out[i] = PyFloat_AS_DOUBLE(<object>logprob)
        elif PyLong_CheckExact(logprob):
            lp_out[i] = float(<object>logprob)
        else:
            raise bad_format(
                index, f"{_LOGPROBS}[{i}][0] must be a number or null, not {type_name(<object>logprob)}"
            )
        token = PyList_GET_ITEM(<object>entry, 1)
        if not _token_id(token, id_out + i):
            check_token_id(index, f"{_LOGPROBS}[{i}][1]", token, id_out + i)  # raises the exact error
        if width == 3:
            text = PyList_GET_ITEM(<object>entry, 2)
            if text != Py_None and not PyUnicode_CheckExact(text):
                raise bad_format(
                    index, f"{_LOGPROBS}[{i}][2] must be a string or null, not {type_name(<object>text)}"
                )
    ids.size = n
    logprobs.size = n
    return n


cdef object read_count(Py_ssize_t index, dict meta, str key):
    if key not in meta:
        return None
    value = meta[key]
    if type(value) is not int:
        raise bad_format(index, f"meta_info.{key} must be an integer, not {type_name(value)}")
    if value < 0:
        raise bad_format(index, f"meta_info.{key} = {value} is negative")
    return value


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


cdef int check_offsets(Py_ssize_t index, str key, object offsets, Py_ssize_t n_ids) except -1:
    cdef const int32_t[::1] view = offsets
    cdef Py_ssize_t i, n = view.shape[0]
    if n == 0 or view[0] != 0:
        raise bad_format(index, f"meta_info.{key} must start at 0")
    for i in range(1, n):
        if view[i] < view[i - 1]:
            raise bad_format(index, f"meta_info.{key} decreases")
    if view[n - 1] != n_ids:
        raise bad_format(index, f"meta_info.{key} ends at {view[n - 1]}, not at the {n_ids} ids")
    return 0
