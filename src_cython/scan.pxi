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
    #include <stdint.h>
    /* Eight input bytes as one little-endian word, so that byte 0 (the first character) is the
       least significant; the digit tricks below assume it. Big-endian builds read byte by byte. */
    #if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    #define FA_SWAR 1
    #else
    #define FA_SWAR 0
    #endif
    static inline uint64_t fa_load8(const unsigned char *p) {
        uint64_t v;
        memcpy(&v, p, 8);
        return v;
    }
    /* How many of the eight bytes in v, from the first, are ASCII digits (0..8). A byte is a digit
       when its high nibble is 3 and adding 6 keeps it there; the carry out of a byte >= 0xFA can
       only reach bytes after the first non-digit, which are not counted. */
    static inline int fa_digit_run(uint64_t v) {
        uint64_t bad = ((v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL)
                     | (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL);
        return bad ? __builtin_ctzll(bad) >> 3 : 8;
    }
    /* The value of the first n (1..8) digits in v: shifted to the top so the dropped bytes become
       leading zeros, then pairs, quads and the whole summed in three multiplications. */
    static inline uint64_t fa_digits_value(uint64_t v, int n) {
        v = (v & 0x0F0F0F0F0F0F0F0FULL) << (8 * (8 - n));
        v = (v * 2561) >> 8;
        v = ((v & 0x00FF00FF00FF00FFULL) * 6553601) >> 16;
        return ((v & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32;
    }
    /* Index (0..8) of the first byte in v that a plain string cannot hold as is: a quote, a
       backslash, a control character or a non-ASCII byte. Each has-zero test below can flag
       false bytes only above its first true one, so the lowest flag is exact. */
    static inline int fa_string_stop(uint64_t v) {
        const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
        uint64_t quote = v ^ (ones * 0x22), backslash = v ^ (ones * 0x5C);
        uint64_t special = (((quote - ones) & ~quote) | ((backslash - ones) & ~backslash)
                            | ((v - ones * 0x20) & ~v) | v) & highs;
        return special ? __builtin_ctzll(special) >> 3 : 8;
    }
    static const uint64_t fa_pow10_u[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
    static const double fa_pow10_d[23] = {
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
        1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
    /* 5**q for q in [FA_Q_MIN, FA_Q_MAX] as t * 2**-s with t the 64-bit significand truncated
       (2**63 <= t < 2**64); filled once at import from exact integers (fa_set_pow5). */
    #define FA_Q_MIN (-348)
    #define FA_Q_MAX 308
    static uint64_t fa_pow5_t[FA_Q_MAX - FA_Q_MIN + 1];
    static int fa_pow5_s[FA_Q_MAX - FA_Q_MIN + 1];
    static void fa_set_pow5(int q, uint64_t t, int s) {
        fa_pow5_t[q - FA_Q_MIN] = t;
        fa_pow5_s[q - FA_Q_MIN] = s;
    }
    /* w * 10**q correctly rounded to a double, or 0 with *ok = 0 when this cannot tell (the
       caller then uses a correctly rounded parser).
       Clinger's exact case first. Otherwise, with w normalised (top bit set), the 128-bit product
       A = w * t falls short of the exact X = w * 5**q * 2**s by less than 2**64 (t is truncated),
       so only A's low 64 bits are uncertain. Rounding A's top 53 bits is then right unless the
       bits below them lie within 2**64 under the halfway point, or exactly on it: those rare
       cases are refused. */
    static double fa_scale(uint64_t w, int q, int *ok) {
        *ok = 1;
        if (w <= 9007199254740992ULL && q >= -22 && q <= 22) {
            double d = (double)w;
            return q < 0 ? d / fa_pow10_d[-q] : d * fa_pow10_d[q];
        }
        if (w == 0)
            return 0.0;
        *ok = 0;
    #ifndef __SIZEOF_INT128__
        return 0.0;  /* no 128-bit product here: the correctly rounded parser decides */
    #else
        if (q < FA_Q_MIN || q > FA_Q_MAX)
            return 0.0;
        int lz = __builtin_clzll(w);
        unsigned __int128 a = (unsigned __int128)(w << lz) * fa_pow5_t[q - FA_Q_MIN];
        uint64_t hi = (uint64_t)(a >> 64), lo = (uint64_t)a;
        int shift = (hi >> 63) ? 11 : 10;  /* bits of hi below the 53 kept */
        uint64_t m = hi >> shift;
        uint64_t dropped = hi & ((1ULL << shift) - 1), half = 1ULL << (shift - 1);
        if (dropped == half - 1 || (dropped == half && lo == 0))
            return 0.0;
        if (dropped >= half) {
            m += 1;
            if (m >> 53) {
                m >>= 1;
                shift += 1;
            }
        }
        /* value = m * 2**(shift + 64) * 2**(q - s - lz); m's top bit is bit 52 */
        int biased = shift + 64 + q - fa_pow5_s[q - FA_Q_MIN] - lz + 52 + 1023;
        if (biased < 1 || biased > 2046)
            return 0.0;  /* subnormal or overflow: the slow path decides */
        uint64_t bits = ((uint64_t)biased << 52) | (m & ((1ULL << 52) - 1));
        double out;
        memcpy(&out, &bits, 8);
        *ok = 1;
        return out;
    #endif
    }
    /* What fa_number found. */
    enum { FA_NUMBER_BAD = 0, FA_NUMBER_OK = 1, FA_NUMBER_SLOW = 2 };
    static inline int fa_is_digit(unsigned char c) { return (unsigned)(c - '0') <= 9; }
    /* The JSON number at *pp: FA_NUMBER_BAD when there is none, or one the scanner leaves to
       orjson (an integer whose float() is not exact here); else *pp moves past it and the result
       is FA_NUMBER_OK (with *out set when convert) or FA_NUMBER_SLOW: the value needs a correctly
       rounded parser, or (not converted) might overflow, which orjson refuses even unused.
       19 significant digits are kept; the rest only moves the exponent (and marks truncation). */
    static int fa_number(const unsigned char **pp, const unsigned char *end, int convert, double *out) {
        const unsigned char *p = *pp;
        uint64_t w = 0;
        int sig = 0, e10 = 0, exp_sign = 1, exp_value = 0, negative = 0, is_float = 0, truncated = 0;
        if (p < end && *p == '-') {
            negative = 1;
            p++;
        }
        if (p >= end || !fa_is_digit(*p))
            return FA_NUMBER_BAD;
        if (*p == '0') {
            p++;
            if (p < end && fa_is_digit(*p))
                return FA_NUMBER_BAD;  /* a leading zero is not JSON */
        } else {
            do {
                if (sig < 19) {
                    w = w * 10 + (uint64_t)(*p - '0');
                    sig++;
                } else {
                    e10++;
                    truncated = 1;
                }
                p++;
            } while (p < end && fa_is_digit(*p));
        }
        if (p < end && *p == '.') {
            is_float = 1;
            p++;
            if (p >= end || !fa_is_digit(*p))
                return FA_NUMBER_BAD;
            if (w == 0) {
                while (p < end && *p == '0') {  /* leading zeros only move the exponent */
                    e10--;
                    p++;
                }
            }
    #if FA_SWAR
            /* Up to sixteen digits a step while they fit in the 19 kept: two words are read and
               measured independently, so the second does not wait for the first. The byte loop
               takes the rest, and the buffer's last bytes. */
            while (end - p >= 16) {
                uint64_t v1 = fa_load8(p), v2 = fa_load8(p + 8);
                int run1 = fa_digit_run(v1), run2 = fa_digit_run(v2);
                if (run1 < 8) {
                    if (run1 == 0 || sig + run1 > 19)
                        break;
                    w = w * fa_pow10_u[run1] + fa_digits_value(v1, run1);
                    sig += run1;
                    e10 -= run1;
                    p += run1;
                    break;
                }
                if (sig + 8 + run2 > 19)
                    break;
                w = w * 100000000 + fa_digits_value(v1, 8);
                if (run2)
                    w = w * fa_pow10_u[run2] + fa_digits_value(v2, run2);
                sig += 8 + run2;
                e10 -= 8 + run2;
                p += 8 + run2;
                if (run2 < 8)
                    break;
            }
    #endif
            while (p < end && fa_is_digit(*p)) {
                if (sig < 19) {
                    w = w * 10 + (uint64_t)(*p - '0');
                    sig++;
                    e10--;
                } else {
                    truncated = 1;
                }
                p++;
            }
        }
        if (p < end && (*p | 0x20) == 'e') {
            is_float = 1;
            p++;
            if (p < end && (*p == '+' || *p == '-')) {
                exp_sign = *p == '-' ? -1 : 1;
                p++;
            }
            if (p >= end || !fa_is_digit(*p))
                return FA_NUMBER_BAD;
            do {
                if (exp_value < 100000)
                    exp_value = exp_value * 10 + (*p - '0');
                p++;
            } while (p < end && fa_is_digit(*p));
            e10 += exp_sign * exp_value;
        }
        *pp = p;
        if (!convert)
            return sig + e10 <= 300 || (exp_sign < 0 && exp_value >= 100000) ? FA_NUMBER_OK : FA_NUMBER_SLOW;
        if (!is_float) {
            if (truncated || w > 9007199254740992ULL)
                return FA_NUMBER_BAD;
            *out = negative && w != 0 ? -(double)w : (double)w;
            return FA_NUMBER_OK;
        }
        if (!truncated && exp_value < 100000) {
            int ok;
            double value = fa_scale(w, e10, &ok);
            if (ok) {
                *out = negative ? -value : value;
                return FA_NUMBER_OK;
            }
        }
        return FA_NUMBER_SLOW;
    }
    """
    int FA_SWAR
    int FA_Q_MIN
    int FA_Q_MAX
    uint64_t fa_load8(const unsigned char* p) nogil
    int fa_digit_run(uint64_t v) nogil
    int fa_string_stop(uint64_t v) nogil
    uint64_t fa_digits_value(uint64_t v, int n) nogil
    const uint64_t* fa_pow10_u
    void fa_set_pow5(int q, uint64_t t, int s) nogil
    double fa_scale(uint64_t w, int e10, int* ok) nogil
    enum:
        FA_NUMBER_BAD
        FA_NUMBER_OK
        FA_NUMBER_SLOW
    int fa_number(const unsigned char** pp, const unsigned char* end, int convert, double* out) nogil
    bint fa_is_digit(unsigned char c) nogil
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


cdef inline const unsigned char* scan_uint(const unsigned char* p, const unsigned char* end,
                                    long long* out) noexcept nogil:
    """A plain non-negative JSON integer of at most 18 digits, or NULL."""
    cdef long long value = 0
    cdef int digits = 0
    cdef uint64_t v
    if FA_SWAR and end - p >= 8:
        # Ids and counts are short: one load finds and converts them whole.
        v = fa_load8(p)
        digits = fa_digit_run(v)
        if 0 < digits < 8:
            if p[0] == 48 and digits > 1:
                return NULL
            p += digits
            if p[0] == 46 or p[0] == 101 or p[0] == 69:
                return NULL
            out[0] = <long long>fa_digits_value(v, digits)
            return p
        digits = 0
    if p >= end or not fa_is_digit(p[0]):
        return NULL
    if p[0] == 48 and p + 1 < end and fa_is_digit(p[1]):
        return NULL
    while p < end and fa_is_digit(p[0]):
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
    const unsigned char* meta  # the meta_info object's bytes, for a lazy orjson parse
    Py_ssize_t meta_len


cdef int scan_event(const unsigned char* base, Py_ssize_t n, Int32Buffer out_ids, Int32Buffer lp_ids,
                    Float64Buffer lp_values, Py_ssize_t skip, ScanResult* r) except -1:
    """Read the event base[:n] into the staging buffers: 1, or 0 when the orjson path must decide.
    ``skip``: leading logprob entries whose numbers are validated but not converted (the prefix a
    cumulative event repeats). Pointers in ``r`` point into base."""
    cdef const unsigned char* end = base + n
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
            r.meta = p
            p = _scan_meta(p, end, lp_ids, lp_values, skip, r)
            r.meta_len = (p - r.meta) if p != NULL else 0
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
