"""Event scanner (compiled twin only): an ordinary event read straight from its bytes.

Ordinary SGLang events (finish_reason null, no base64 arrays) read straight from the bytes:
ids and logprobs go into the staging buffers without a Python object per token, and the rest
of meta_info is kept as bytes, parsed by orjson only when a result is built. The scanner
accepts only what orjson would parse to the same values (compact JSON, valid UTF-8, JSON escapes
without surrogates, plain non-negative ints for ids and counts); anything else, or any doubt,
returns 0 and the event takes the orjson path, which then gives the canonical result or error.
There is no such path in fastaccum._py.
"""

from cpython.object cimport PyObject
from libc.math cimport NAN, isinf, isnan
from libc.stdint cimport INT32_MAX, int32_t, uint64_t
from libc.string cimport memcmp

from fastaccum._cy.buffers cimport Buffer, float64s, int32s
from fastaccum._cy.fa_bytes cimport fa_find_bytes
from fastaccum._cy.fields cimport Event
from fastaccum._cy.fa_scan cimport (
    FA_NUMBER_BAD,
    FA_NUMBER_OK,
    FA_Q_MAX,
    FA_Q_MIN,
    FA_SWAR,
    fa_digit_run,
    fa_digits_value,
    fa_is_digit,
    fa_load8,
    fa_number,
    fa_set_pow5,
    fa_string_stop,
)

cdef extern from "Python.h":
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow_exception) except? -1.0


cdef int _fill_pow5_table() except -1:
    """5**q truncated to 64 significant bits, from exact integers (for fa_scale)."""
    for q in range(<object>FA_Q_MIN, <object>FA_Q_MAX + 1):  # Python ints: 5**348 is exact
        if q >= 0:
            v = 5 ** q
            s = 64 - v.bit_length()
            t = v << s if s >= 0 else v >> -s
        else:
            d = 5 ** -q
            s = 63 + d.bit_length()
            t = (1 << s) // d
        fa_set_pow5(q, t, s)
    return 0


_fill_pow5_table()


cdef enum:
    SCAN_MAX_DEPTH = 64  # deeper values go to orjson (which has its own limit)

cdef const unsigned char* skip_string(const unsigned char* p, const unsigned char* end,
                                      bint* escaped) noexcept nogil:
    """p at the opening quote; the position after the closing quote, or NULL. Strict UTF-8,
    no raw controls, escapes as JSON defines them but no \\u surrogates (orjson's business)."""
    cdef unsigned char c
    cdef unsigned int code
    cdef int k, extra, stop
    p += 1
    while p < end:
        # Plain ASCII runs (keys, most text) eight bytes at a time; the byte loop below takes
        # the byte that stopped the run.
        while FA_SWAR and end - p >= 8:
            stop = fa_string_stop(fa_load8(p))
            p += stop
            if stop < 8:
                break
        if p >= end:
            return NULL
        c = p[0]
        if c == 34:
            return p + 1
        if c == 92:
            escaped[0] = True
            if p + 1 >= end:
                return NULL
            c = p[1]
            if c == 117:  # \uXXXX
                if p + 6 > end:
                    return NULL
                code = 0
                for k in range(2, 6):
                    c = p[k]
                    if fa_is_digit(c):
                        code = code * 16 + (c - 48)
                    elif 97 <= c <= 102:
                        code = code * 16 + (c - 87)
                    elif 65 <= c <= 70:
                        code = code * 16 + (c - 55)
                    else:
                        return NULL
                if 0xD800 <= code <= 0xDFFF:
                    return NULL
                p += 6
            elif c == 34 or c == 92 or c == 47 or c == 98 or c == 102 or c == 110 or c == 114 or c == 116:
                p += 2
            else:
                return NULL
        elif c < 0x20:
            return NULL
        elif c < 0x80:
            p += 1
        else:
            # Multi-byte UTF-8: no overlong forms, no encoded surrogates, nothing past U+10FFFF.
            if 0xC2 <= c <= 0xDF:
                extra = 1
                code = c & 0x1F
            elif 0xE0 <= c <= 0xEF:
                extra = 2
                code = c & 0x0F
            elif 0xF0 <= c <= 0xF4:
                extra = 3
                code = c & 0x07
            else:
                return NULL
            if p + extra >= end:
                return NULL
            for k in range(1, extra + 1):
                if (p[k] & 0xC0) != 0x80:
                    return NULL
                code = (code << 6) | (p[k] & 0x3F)
            if (extra == 2 and (code < 0x800 or 0xD800 <= code <= 0xDFFF)) or (
                extra == 3 and (code < 0x10000 or code > 0x10FFFF)
            ):
                return NULL
            p += extra + 1
    return NULL


cdef const unsigned char* scan_number(const unsigned char* p, const unsigned char* end,
                                      double* out, bint convert) except? NULL:
    """A JSON number at p: its end, or NULL (not a number, or one this cannot convert exactly).
    Ints convert as float(int) does (so -0 is +0.0); floats are correctly rounded."""
    cdef const unsigned char* start = p
    cdef double value
    cdef char* stop
    cdef int status = fa_number(&p, end, convert, out)
    if status == FA_NUMBER_OK:
        return p
    if status == FA_NUMBER_BAD:
        return NULL
    # The bytes after a number in an event are never part of it (a delimiter, the line's LF or
    # the bytearray's NUL), so the C parser stops at p.
    value = PyOS_string_to_double(<const char*>start, &stop, NULL)  # correctly rounded
    if <const unsigned char*>stop != p or isinf(value) or isnan(value):
        return NULL  # orjson refuses numbers that overflow to infinity, even skipped ones
    if convert:
        out[0] = value
    return p


cdef const unsigned char* skip_value(const unsigned char* p, const unsigned char* end,
                                     int depth) except? NULL:
    """Any JSON value at p (validated, not built): its end, or NULL."""
    cdef bint escaped = False
    cdef double ignored
    if p >= end or depth > SCAN_MAX_DEPTH:
        return NULL
    if p[0] == 34:
        return skip_string(p, end, &escaped)
    if p[0] == 123 or p[0] == 91:
        return skip_container(p, end, depth)
    if p[0] == 110:
        return p + 4 if end - p >= 4 and memcmp(p, b"null", 4) == 0 else NULL
    if p[0] == 116:
        return p + 4 if end - p >= 4 and memcmp(p, b"true", 4) == 0 else NULL
    if p[0] == 102:
        return p + 5 if end - p >= 5 and memcmp(p, b"false", 5) == 0 else NULL
    return scan_number(p, end, &ignored, False)


cdef const unsigned char* skip_container(const unsigned char* p, const unsigned char* end,
                                         int depth) except? NULL:
    cdef bint is_object = p[0] == 123
    cdef unsigned char close = 125 if is_object else 93
    cdef bint escaped = False
    p += 1
    if p < end and p[0] == close:
        return p + 1
    while p < end:
        if is_object:
            if p[0] != 34:
                return NULL
            p = skip_string(p, end, &escaped)
            if p == NULL or p >= end or p[0] != 58:
                return NULL
            p += 1
        p = skip_value(p, end, depth + 1)
        if p == NULL or p >= end:
            return NULL
        if p[0] == close:
            return p + 1
        if p[0] != 44:
            return NULL
        p += 1
    return NULL


cdef int scan_event(const unsigned char* base, Py_ssize_t n, Buffer out_ids, Buffer lp_ids, Buffer lp_values,
                    Py_ssize_t skip, Event* r) except -1:
    """Read the event base[:n] into the staging buffers: 1, or 0 when the orjson path must decide.
    ``skip``: leading logprob entries whose numbers are validated but not converted (the prefix a
    cumulative event repeats). Pointers in ``r`` point into base."""
    cdef const unsigned char* end = base + n
    cdef const unsigned char* p = base
    cdef const unsigned char* key
    cdef Py_ssize_t key_len
    cdef bint has_meta = False
    cdef long long value
    r.has_text = r.has_output_ids = r.has_logprobs = False
    r.completion_tokens = r.logprobs_length = r.prompt_tokens = -1
    r.version = NULL
    if p >= end or p[0] != 123:
        return 0
    p += 1
    while True:
        p = scan_key(p, end, &key, &key_len)
        if p == NULL:
            return 0
        if key_is(key, key_len, b"text", 4):
            if r.has_text:
                return 0
            r.has_text = True
            if p[0] == 34:
                r.text = p + 1
                r.text_escaped = False
                p = skip_string(p, end, &r.text_escaped)
                if p == NULL:
                    return 0
                r.text_len = p - r.text - 1
                r.text_null = False
            elif end - p >= 4 and memcmp(p, b"null", 4) == 0:
                r.text_null = True
                p += 4
            else:
                return 0
        elif key_is(key, key_len, b"output_ids", 10):
            if r.has_output_ids:
                return 0
            r.has_output_ids = True
            p = scan_ids(p, end, out_ids)
        elif key_is(key, key_len, b"meta_info", 9):
            if has_meta or p[0] != 123:
                return 0
            has_meta = True
            r.meta = p
            p = _scan_meta(p, end, lp_ids, lp_values, skip, r)
            r.meta_len = (p - r.meta) if p != NULL else 0
        elif key_is(key, key_len, b"error", 5) or key_is(key, key_len, b"index", 5):
            return 0
        else:
            p = skip_value(p, end, 1)
        if p == NULL or p >= end:
            return 0
        if p[0] == 125:
            if p + 1 != end or not has_meta:
                return 0
            return 1
        if p[0] != 44:
            return 0
        p += 1


cdef object lift_lists(object json_bytes, Buffer out_ids, Buffer lp_ids, Buffer lp_values, int* lifted):
    """A large event's ``output_ids`` and ``output_token_logprobs`` read straight into the staging
    buffers, and the event's bytes with each value read replaced by ``[]``, for orjson to parse the
    rest without a Python object per token; ``lifted`` says which were read (LIFTED_IDS,
    LIFTED_LOGPROBS). A key found twice or not right after ``{`` or ``,`` (not compact JSON), or
    a value the scanner does not read, stays for orjson. The caller checks that each ``[]`` landed
    where the key belongs (a key nested elsewhere would not) and parses the original otherwise."""
    cdef const unsigned char[::1] view = json_bytes
    cdef const unsigned char* base = &view[0] if view.shape[0] else NULL
    cdef Py_ssize_t n = view.shape[0]
    cdef Py_ssize_t at_ids = -1, at_lp = -1, end_ids = 0, end_lp = 0
    cdef const unsigned char* q
    lifted[0] = 0
    if n == 0:
        return json_bytes
    at_lp = _only_key(base, n, b'"output_token_logprobs":', 24)
    if at_lp >= 0:
        q = _scan_logprobs(base + at_lp, base + n, lp_ids, lp_values, 0)
        if q != NULL:
            end_lp = q - base
            lifted[0] |= LIFTED_LOGPROBS
    at_ids = _only_key(base, n, b'"output_ids":', 13)
    if at_ids >= 0:
        q = scan_ids(base + at_ids, base + n, out_ids)
        if q != NULL:
            end_ids = q - base
            lifted[0] |= LIFTED_IDS
    if not lifted[0]:
        return json_bytes
    cuts = sorted(
        [(at, end) for at, end, flag in ((at_lp, end_lp, LIFTED_LOGPROBS), (at_ids, end_ids, LIFTED_IDS))
         if lifted[0] & flag]
    )
    parts = []
    start = 0
    for at, end in cuts:
        parts.append(json_bytes[start:at])
        parts.append(b"[]")
        start = end
    parts.append(json_bytes[start:])
    return b"".join(parts)


cdef Py_ssize_t _only_key(const unsigned char* base, Py_ssize_t n, const char* key, Py_ssize_t m) noexcept:
    """Where the value of ``key`` (quoted, with its colon) starts when it is a list and the key
    occurs once, right after ``{`` or ``,``; else -1. Inside a JSON string every quote follows a
    backslash, so the quoted key followed by its colon is never a string's content."""
    cdef Py_ssize_t at = fa_find_bytes(<const char*>base, n, key, m, 0)
    if at <= 0 or at + m >= n or fa_find_bytes(<const char*>base, n, key, m, at + 1) >= 0:
        return -1
    if (base[at - 1] != 123 and base[at - 1] != 44) or base[at + m] != 91:
        return -1
    return at + m


cdef const unsigned char* scan_ids(const unsigned char* p, const unsigned char* end,
                                    Buffer out) except? NULL:
    cdef long long value
    out.size = 0
    if p >= end or p[0] != 91:
        return NULL
    p += 1
    if p < end and p[0] == 93:
        return p + 1
    while True:
        p = scan_uint(p, end, &value)
        if p == NULL or value > INT32_MAX or p >= end:
            return NULL
        if out.size == out.capacity:
            out.reserve(1)
        int32s(out)[out.size] = <int32_t>value
        out.size += 1
        if p[0] == 93:
            return p + 1
        if p[0] != 44:
            return NULL
        p += 1


cdef const unsigned char* _scan_meta(const unsigned char* p, const unsigned char* end, Buffer lp_ids,
                                     Buffer lp_values, Py_ssize_t skip, Event* r) except? NULL:
    cdef const unsigned char* key
    cdef Py_ssize_t key_len
    cdef bint has_finish = False
    p += 1
    if p < end and p[0] == 125:
        return p + 1
    while True:
        p = scan_key(p, end, &key, &key_len)
        if p == NULL:
            return NULL
        if key_is(key, key_len, b"finish_reason", 13):
            # Only the non-terminal shape: a terminal event is rare and takes the orjson path.
            if has_finish or end - p < 4 or memcmp(p, b"null", 4) != 0:
                return NULL
            has_finish = True
            p += 4
        elif key_is(key, key_len, b"output_token_logprobs", 21):
            if r.has_logprobs:
                return NULL
            r.has_logprobs = True
            p = _scan_logprobs(p, end, lp_ids, lp_values, skip)
        elif key_is(key, key_len, b"completion_tokens", 17):
            if r.completion_tokens >= 0:
                return NULL
            p = scan_uint(p, end, &r.completion_tokens)
        elif key_is(key, key_len, b"output_token_logprobs_length", 28):
            if r.logprobs_length >= 0:
                return NULL
            p = scan_uint(p, end, &r.logprobs_length)
        elif key_is(key, key_len, b"prompt_tokens", 13):
            if r.prompt_tokens >= 0:
                return NULL
            p = scan_uint(p, end, &r.prompt_tokens)
        elif key_is(key, key_len, b"weight_version", 14):
            if r.version != NULL:
                return NULL  # twice: orjson keeps the last, the orjson path decides
            if p[0] == 34:
                r.version = p + 1
                r.version_escaped = False
                p = skip_string(p, end, &r.version_escaped)
                if p == NULL:
                    return NULL
                r.version_len = p - r.version - 1
            else:
                p = skip_value(p, end, 2)  # not a string: not a version
        elif key_len > 6 and (
            memcmp(key, b"top_p_", 6) == 0
            or key_is(key, key_len, b"routed_experts", 14)
            or key_is(key, key_len, b"indexer_topk", 12)
        ):
            return NULL  # base64 arrays (fastaccum._core.policy.B64_KEYS): the ordinary path cuts and decodes them
        else:
            p = skip_value(p, end, 2)
        if p == NULL or p >= end:
            return NULL
        if p[0] == 125:
            return p + 1
        if p[0] != 44:
            return NULL
        p += 1


cdef const unsigned char* _scan_logprobs(const unsigned char* p, const unsigned char* end, Buffer ids,
                                         Buffer values, Py_ssize_t skip) except? NULL:
    """``[[logprob|null, id, text|null], ...]`` into the staging buffers."""
    cdef long long token
    cdef double logprob
    cdef bint escaped = False
    cdef Py_ssize_t n = 0
    ids.size = values.size = 0
    if p >= end or p[0] != 91:
        return NULL
    p += 1
    if p < end and p[0] == 93:
        return p + 1
    while True:
        if p >= end or p[0] != 91:
            return NULL
        p += 1
        if n == ids.capacity:
            ids.reserve(1)
            values.reserve(ids.capacity - values.size)
        if p < end and p[0] == 110:
            if end - p < 4 or memcmp(p, b"null", 4) != 0:
                return NULL
            logprob = NAN
            p += 4
        else:
            p = scan_number(p, end, &logprob, n >= skip)
            if p == NULL:
                return NULL
        if p >= end or p[0] != 44:
            return NULL
        p = scan_uint(p + 1, end, &token)
        if p == NULL or token > INT32_MAX or p >= end:
            return NULL
        if p[0] == 44:  # the optional text element
            p += 1
            if p < end and p[0] == 34:
                p = skip_string(p, end, &escaped)
            elif end - p >= 4 and memcmp(p, b"null", 4) == 0:
                p += 4
            else:
                return NULL
            if p == NULL or p >= end:
                return NULL
        if p[0] != 93:
            return NULL
        int32s(ids)[n] = <int32_t>token
        float64s(values)[n] = logprob
        n += 1
        ids.size = values.size = n
        p += 1
        if p >= end:
            return NULL
        if p[0] == 93:
            return p + 1
        if p[0] != 44:
            return NULL
        p += 1

