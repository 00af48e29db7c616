# Declarations of fastaccum._cy.scan: an ordinary event read straight from its bytes.

from libc.stdint cimport uint64_t
from libc.string cimport memcmp

from fastaccum._cy.buffers cimport Buffer
from fastaccum._cy.fa_scan cimport FA_SWAR, fa_digit_run, fa_digits_value, fa_is_digit, fa_load8
from fastaccum._cy.fields cimport Event


cdef int scan_event(const unsigned char* base, Py_ssize_t n, Buffer out_ids, Buffer lp_ids, Buffer lp_values,
                    Py_ssize_t skip, Event* r) except -1

cdef enum:
    LIFTED_IDS = 1
    LIFTED_LOGPROBS = 2

# A large event's token lists read into the staging buffers, the rest left for orjson.
cdef object lift_lists(object json_bytes, Buffer out_ids, Buffer lp_ids, Buffer lp_values, int* lifted)

# The JSON readers the scanners share (fastaccum._cy.scan_chunk reads vLLM's chunks with them).
cdef const unsigned char* skip_string(const unsigned char* p, const unsigned char* end, bint* escaped) noexcept nogil
cdef const unsigned char* scan_number(const unsigned char* p, const unsigned char* end, double* out,
                                      bint convert) except? NULL
cdef const unsigned char* skip_value(const unsigned char* p, const unsigned char* end, int depth) except? NULL
cdef const unsigned char* scan_ids(const unsigned char* p, const unsigned char* end, Buffer out) except? NULL


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


cdef inline bint key_is(const unsigned char* key, Py_ssize_t n, const char* name, Py_ssize_t m) noexcept nogil:
    return n == m and memcmp(key, name, m) == 0


cdef inline const unsigned char* scan_key(const unsigned char* p, const unsigned char* end,
                                          const unsigned char** key, Py_ssize_t* key_len) noexcept nogil:
    """An object's key (plain: no escapes) and its colon, at p: where the value starts, or NULL."""
    cdef bint escaped = False
    if p >= end or p[0] != 34:
        return NULL
    key[0] = p + 1
    p = skip_string(p, end, &escaped)
    if p == NULL or escaped or p >= end or p[0] != 58:
        return NULL
    key_len[0] = p - key[0] - 1
    p += 1
    return p if p < end else NULL
