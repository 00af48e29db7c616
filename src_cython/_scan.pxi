# ---- event scanner --------------------------------------------------------------------------
# Ordinary SGLang events (finish_reason null, no base64 arrays) read straight from the bytes:
# ids and logprobs go into the staging buffers without a Python object per token, and the rest
# of meta_info is kept as bytes, parsed by orjson only when a result is built. The scanner
# accepts only what orjson would parse to the same values (compact JSON, valid UTF-8, JSON escapes
# without surrogates, plain non-negative ints for ids and counts); anything else, or any doubt,
# returns 0 and the event takes the orjson path, which then gives the canonical result or error.
# There is no such path in fastaccum._py.

from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.math cimport isinf, isnan

cdef extern from *:
    """
    #include <float.h>
    /* x87 extended precision: a 64-bit significand holds any 19-digit integer exactly. */
    #if defined(__x86_64__) && LDBL_MANT_DIG == 64
    #define FA_X87 1
    #else
    #define FA_X87 0
    #endif
    static const double fa_pow10_d[23] = {
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
        1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    #if FA_X87
    static const long double fa_pow10_l[28] = {
        1e0L, 1e1L, 1e2L, 1e3L, 1e4L, 1e5L, 1e6L, 1e7L, 1e8L, 1e9L, 1e10L, 1e11L, 1e12L, 1e13L,
        1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L, 1e23L, 1e24L, 1e25L,
        1e26L, 1e27L};
    #endif
    /* w * 10^e10 correctly rounded, or 0 with *ok = 0 when this cannot tell (the caller then
       uses a correctly rounded parser). Clinger's exact case first; then one x87 operation whose
       64-bit result is rounded to 53 bits unless its 11 dropped bits lie next to a halfway point. */
    static double fa_scale(unsigned long long w, int e10, int *ok) {
        *ok = 1;
        if (w <= 9007199254740992ULL && e10 >= -22 && e10 <= 22) {
            double d = (double)w;
            return e10 < 0 ? d / fa_pow10_d[-e10] : d * fa_pow10_d[e10];
        }
    #if FA_X87
        if (e10 >= -27 && e10 <= 27 && w != 0) {
            long double r = (long double)w;
            r = e10 < 0 ? r / fa_pow10_l[-e10] : r * fa_pow10_l[e10];
            unsigned long long bits;
            memcpy(&bits, &r, 8);          /* the explicit 64-bit significand */
            unsigned low = (unsigned)(bits & 0x7FF);
            if (low < 0x3FF || low > 0x401) return (double)r;
        }
    #endif
        *ok = 0;
        return 0.0;
    }
    /* Eight ASCII digits at p (read as little-endian), or -1 when they are not all digits:
       the usual SWAR reduction, pairs, then quads, then the whole. */
    static long long fa_eight_digits(const unsigned char *p) {
        unsigned long long v;
        memcpy(&v, p, 8);
        if ((((v & 0xF0F0F0F0F0F0F0F0ULL) | (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) >> 4))
             != 0x3333333333333333ULL))
            return -1;
        v = ((v & 0x0F0F0F0F0F0F0F0FULL) * 2561) >> 8;
        v = ((v & 0x00FF00FF00FF00FFULL) * 6553601) >> 16;
        return (long long)(((v & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32);
    }
    """
    double fa_scale(unsigned long long w, int e10, int* ok) nogil
    long long fa_eight_digits(const unsigned char* p) nogil
    double PyOS_string_to_double(const char* s, char** endptr, PyObject* overflow_exception) except? -1.0

cdef enum:
    SCAN_MAX_DEPTH = 64  # deeper values go to orjson (which has its own limit)

# Whether ordinary events use the scanner (tests and debugging can force the orjson path).
cdef bint FAST_SCAN = True


# Events the scanner has read since the last _scanned_events() call (tests check it is used).
cdef Py_ssize_t SCANNED_EVENTS = 0


def _fast_scan(enabled=None):
    """Test and debugging hook: use (True) or bypass (False) the native event scanner; returns
    the old setting."""
    global FAST_SCAN
    old = FAST_SCAN
    if enabled is not None:
        FAST_SCAN = bool(enabled)
    return old


def _scanned_events():
    """Test hook: how many events the scanner read since the previous call."""
    global SCANNED_EVENTS
    count = SCANNED_EVENTS
    SCANNED_EVENTS = 0
    return count


cdef inline bint _is_digit(unsigned char c) noexcept nogil:
    return 48 <= c <= 57


cdef const unsigned char* skip_string(const unsigned char* p, const unsigned char* end,
                                      bint* escaped) noexcept nogil:
    """p at the opening quote; the position after the closing quote, or NULL. Strict UTF-8,
    no raw controls, escapes as JSON defines them but no \\u surrogates (orjson's business)."""
    cdef unsigned char c
    cdef unsigned int code
    cdef int k, extra
    p += 1
    while p < end:
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
                    if _is_digit(c):
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
    cdef unsigned long long w = 0
    cdef int sig = 0, e10 = 0, exp_sign = 1, exp_value = 0, ok = 0, d
    cdef long long eight
    cdef bint negative = False, is_float = False, truncated = False
    cdef double value = 0.0
    cdef char* stop
    if p < end and p[0] == 45:
        negative = True
        p += 1
    if p >= end or not _is_digit(p[0]):
        return NULL
    if p[0] == 48:
        p += 1
        if p < end and _is_digit(p[0]):
            return NULL  # a leading zero is not JSON
    else:
        while p < end and _is_digit(p[0]):
            if sig < 19:
                w = w * 10 + (p[0] - 48)
                sig += 1
            else:
                e10 += 1
                truncated = True
            p += 1
    if p < end and p[0] == 46:
        is_float = True
        p += 1
        if p >= end or not _is_digit(p[0]):
            return NULL
        if w == 0:
            while p < end and p[0] == 48:  # leading zeros only move the exponent
                e10 -= 1
                p += 1
        # Eight digits at a time while they fit in the 19 significant digits kept.
        while sig <= 11 and end - p >= 8:
            eight = fa_eight_digits(p)
            if eight < 0:
                break
            w = w * 100000000 + <unsigned long long>eight
            sig += 8  # the first digit is not a leading zero (skipped above)
            e10 -= 8
            p += 8
        while p < end and _is_digit(p[0]):
            d = p[0] - 48
            if w == 0 and d == 0:
                e10 -= 1
            elif sig < 19:
                w = w * 10 + d
                sig += 1
                e10 -= 1
            else:
                truncated = True
            p += 1
    if p < end and (p[0] == 101 or p[0] == 69):
        is_float = True
        p += 1
        if p < end and (p[0] == 43 or p[0] == 45):
            exp_sign = -1 if p[0] == 45 else 1
            p += 1
        if p >= end or not _is_digit(p[0]):
            return NULL
        while p < end and _is_digit(p[0]):
            if exp_value < 100000:
                exp_value = exp_value * 10 + (p[0] - 48)
            p += 1
        e10 += exp_sign * exp_value
    if not convert:
        # orjson refuses a number that overflows to infinity even where its value is unused, so a
        # skipped number that may be that large is converted after all, just to check.
        if sig + e10 <= 300 or exp_sign < 0 and exp_value >= 100000:
            return p
        value = PyOS_string_to_double(<const char*>start, &stop, NULL)
        if <const unsigned char*>stop != p or isinf(value):
            return NULL
        return p
    if not is_float:
        # orjson returns an int, converted by float(): exact below 2**53, else left to orjson
        if truncated or w > 9007199254740992ULL:
            return NULL
        out[0] = -<double>w if negative and w != 0 else <double>w
        return p
    if not truncated and exp_value < 100000:
        value = fa_scale(w, e10, &ok)
    if not ok:
        value = PyOS_string_to_double(<const char*>start, &stop, NULL)  # correctly rounded
        if <const unsigned char*>stop != p or isinf(value) or isnan(value):
            return NULL  # orjson refuses numbers that overflow to infinity
        out[0] = value
        return p
    out[0] = -value if negative else value
    return p


cdef const unsigned char* scan_uint(const unsigned char* p, const unsigned char* end,
                                    long long* out) noexcept nogil:
    """A plain non-negative JSON integer of at most 18 digits, or NULL."""
    cdef long long value = 0
    cdef int digits = 0
    if p >= end or not _is_digit(p[0]):
        return NULL
    if p[0] == 48 and p + 1 < end and _is_digit(p[1]):
        return NULL
    while p < end and _is_digit(p[0]):
        if digits < 18:  # 18 digits always fit; more are refused below, never accumulated
            value = value * 10 + (p[0] - 48)
        digits += 1
        p += 1
    if digits > 18 or (p < end and (p[0] == 46 or p[0] == 101 or p[0] == 69)):
        return NULL
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


cdef inline bint _key_is(const unsigned char* key, Py_ssize_t n, const char* name, Py_ssize_t m) noexcept nogil:
    return n == m and memcmp(key, name, m) == 0


cdef struct ScanResult:
    bint has_text
    bint text_null
    bint text_escaped
    const unsigned char* text
    Py_ssize_t text_len
    bint has_output_ids
    bint has_logprobs
    long long completion  # -1: absent
    long long lp_length
    long long prompt
    Py_ssize_t meta_start  # the meta_info object's bytes, for a lazy orjson parse
    Py_ssize_t meta_end


cdef int scan_event(bytearray data, Int32Buffer out_ids, Int32Buffer lp_ids, Float64Buffer lp_values,
                    Py_ssize_t skip, ScanResult* r) except -1:
    """Read an ordinary event into the staging buffers: 1, or 0 when the orjson path must decide.
    ``skip``: leading logprob entries whose numbers are validated but not converted (the prefix a
    cumulative event repeats)."""
    cdef const unsigned char* base = <const unsigned char*>PyByteArray_AS_STRING(data)
    cdef const unsigned char* end = base + PyByteArray_GET_SIZE(data)
    cdef const unsigned char* p = base
    cdef const unsigned char* key
    cdef Py_ssize_t key_len
    cdef bint escaped = False, has_meta = False
    cdef long long value
    r.has_text = r.has_output_ids = r.has_logprobs = False
    r.completion = r.lp_length = r.prompt = -1
    if p >= end or p[0] != 123:
        return 0
    p += 1
    while True:
        if p >= end or p[0] != 34:
            return 0
        key = p + 1
        p = skip_string(p, end, &escaped)
        if p == NULL or escaped or p >= end or p[0] != 58:
            return 0
        key_len = p - key - 1
        p += 1
        if p >= end:
            return 0
        if _key_is(key, key_len, b"text", 4):
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
        elif _key_is(key, key_len, b"output_ids", 10):
            if r.has_output_ids:
                return 0
            r.has_output_ids = True
            p = _scan_ids(p, end, out_ids)
        elif _key_is(key, key_len, b"meta_info", 9):
            if has_meta or p[0] != 123:
                return 0
            has_meta = True
            r.meta_start = p - base
            p = _scan_meta(p, end, lp_ids, lp_values, skip, r)
            r.meta_end = (p - base) if p != NULL else 0
        elif _key_is(key, key_len, b"error", 5) or _key_is(key, key_len, b"index", 5):
            return 0
        else:
            p = skip_value(p, end, 1)
        if p == NULL or p >= end:
            return 0
        if p[0] == 125:
            if p + 1 != end or not has_meta:
                return 0
            global SCANNED_EVENTS
            SCANNED_EVENTS += 1
            return 1
        if p[0] != 44:
            return 0
        p += 1


cdef const unsigned char* _scan_ids(const unsigned char* p, const unsigned char* end,
                                    Int32Buffer out) except? NULL:
    cdef long long value
    out.clear()
    if p >= end or p[0] != 91:
        return NULL
    p += 1
    if p < end and p[0] == 93:
        return p + 1
    while True:
        p = scan_uint(p, end, &value)
        if p == NULL or value >= _TOKEN_ID_LIMIT or p >= end:
            return NULL
        if out.size == out.capacity:
            out.reserve(1)
        out._data[out.size] = <int32_t>value
        out.size += 1
        if p[0] == 93:
            return p + 1
        if p[0] != 44:
            return NULL
        p += 1


cdef const unsigned char* _scan_meta(const unsigned char* p, const unsigned char* end, Int32Buffer lp_ids,
                                     Float64Buffer lp_values, Py_ssize_t skip, ScanResult* r) except? NULL:
    cdef const unsigned char* key
    cdef Py_ssize_t key_len
    cdef bint escaped = False, has_finish = False
    p += 1
    if p < end and p[0] == 125:
        return p + 1
    while True:
        if p >= end or p[0] != 34:
            return NULL
        key = p + 1
        p = skip_string(p, end, &escaped)
        if p == NULL or escaped or p >= end or p[0] != 58:
            return NULL
        key_len = p - key - 1
        p += 1
        if p >= end:
            return NULL
        if _key_is(key, key_len, b"finish_reason", 13):
            # Only the non-terminal shape: a terminal event is rare and takes the orjson path.
            if has_finish or end - p < 4 or memcmp(p, b"null", 4) != 0:
                return NULL
            has_finish = True
            p += 4
        elif _key_is(key, key_len, b"output_token_logprobs", 21):
            if r.has_logprobs:
                return NULL
            r.has_logprobs = True
            p = _scan_logprobs(p, end, lp_ids, lp_values, skip)
        elif _key_is(key, key_len, b"completion_tokens", 17):
            if r.completion >= 0:
                return NULL
            p = scan_uint(p, end, &r.completion)
        elif _key_is(key, key_len, b"output_token_logprobs_length", 28):
            if r.lp_length >= 0:
                return NULL
            p = scan_uint(p, end, &r.lp_length)
        elif _key_is(key, key_len, b"prompt_tokens", 13):
            if r.prompt >= 0:
                return NULL
            p = scan_uint(p, end, &r.prompt)
        elif key_len > 6 and (
            memcmp(key, b"top_p_", 6) == 0 or _key_is(key, key_len, b"routed_experts", 14)
        ):
            return NULL  # base64 arrays: the ordinary path cuts and decodes them
        else:
            p = skip_value(p, end, 2)
        if p == NULL or p >= end:
            return NULL
        if p[0] == 125:
            return p + 1
        if p[0] != 44:
            return NULL
        p += 1


cdef const unsigned char* _scan_logprobs(const unsigned char* p, const unsigned char* end, Int32Buffer ids,
                                         Float64Buffer values, Py_ssize_t skip) except? NULL:
    """``[[logprob|null, id, text|null], ...]`` into the staging buffers."""
    cdef long long token
    cdef double logprob
    cdef bint escaped = False
    cdef Py_ssize_t n = 0
    ids.clear()
    values.clear()
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
        if p == NULL or token >= _TOKEN_ID_LIMIT or p >= end:
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
        ids._data[n] = <int32_t>token
        values._data[n] = logprob
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
