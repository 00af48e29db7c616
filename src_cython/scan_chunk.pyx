"""vLLM chunk scanner (compiled twin only): an ordinary ``/inference/v1/generate`` chunk read
straight from its bytes, as fastaccum._cy.scan reads SGLang's events, with the same JSON readers
and the same rule: anything unusual, or any doubt, returns 0 and the chunk takes the orjson path
(fastaccum._core.dialects.read_chunk), which gives the canonical result or error. There is no such
path in fastaccum._py.
"""

from libc.math cimport NAN
from libc.stdint cimport INT32_MAX, int32_t
from libc.string cimport memcmp

from fastaccum._cy.buffers cimport Buffer, float64s, int32s
from fastaccum._cy.fields cimport Event
from fastaccum._cy.scan cimport key_is, scan_ids, scan_key, scan_number, scan_uint, skip_value


cdef int scan_chunk(const unsigned char* base, Py_ssize_t n, Buffer out_ids, Buffer lp_ids, Buffer lp_values,
                    Event* r) except -1:
    """Read an ordinary vLLM chunk (one choice with tokens, finish_reason null, no usage, no arrays,
    no text) from base[:n] into the staging buffers, as scan_event does SGLang's events: 1, or 0
    when the orjson path must decide (fastaccum._core.dialects.read_chunk). ``r.meta`` spans the whole
    chunk: its meta_info is read from it only when a result is built."""
    cdef const unsigned char* end = base + n
    cdef const unsigned char* p = base
    cdef const unsigned char* key
    cdef Py_ssize_t key_len
    cdef bint has_choice = False
    r.has_text = r.has_output_ids = r.has_logprobs = False
    r.completion_tokens = r.logprobs_length = r.prompt_tokens = -1
    r.version = NULL  # vLLM's versions come as spans on the finishing chunk (orjson's)
    if p >= end or p[0] != 123:
        return 0
    p += 1
    while True:
        p = scan_key(p, end, &key, &key_len)
        if p == NULL:
            return 0
        if key_is(key, key_len, b"choices", 7):
            # exactly one choice: [{...}]
            if has_choice or p[0] != 91 or end - p < 2 or p[1] != 123:
                return 0
            has_choice = True
            p = _scan_choice(p + 1, end, out_ids, lp_ids, lp_values, r)
            if p == NULL or p >= end or p[0] != 93:
                return 0
            p += 1
        elif key_is(key, key_len, b"usage", 5):
            # a count to check: the orjson path's
            if end - p < 4 or memcmp(p, b"null", 4) != 0:
                return 0
            p += 4
        elif key_is(key, key_len, b"error", 5) or key_is(key, key_len, b"meta_info", 9):
            return 0
        else:
            p = skip_value(p, end, 1)
        if p == NULL or p >= end:
            return 0
        if p[0] == 125:
            if p + 1 != end or not has_choice or not r.has_output_ids or out_ids.size == 0:
                return 0
            r.meta = base
            r.meta_len = n
            return 1
        if p[0] != 44:
            return 0
        p += 1


cdef inline bint _null_at(const unsigned char* p, const unsigned char* end) noexcept nogil:
    return end - p >= 4 and memcmp(p, b"null", 4) == 0


cdef const unsigned char* _scan_choice(const unsigned char* p, const unsigned char* end, Buffer out_ids,
                                       Buffer lp_ids, Buffer lp_values, Event* r) except? NULL:
    cdef const unsigned char* key
    cdef Py_ssize_t key_len
    p += 1
    while True:
        p = scan_key(p, end, &key, &key_len)
        if p == NULL:
            return NULL
        if key_is(key, key_len, b"token_ids", 9):
            if r.has_output_ids:
                return NULL
            r.has_output_ids = True
            p = scan_ids(p, end, out_ids)
        elif key_is(key, key_len, b"logprobs", 8):
            if _null_at(p, end):
                p += 4
            else:
                if r.has_logprobs:
                    return NULL
                r.has_logprobs = True
                p = _scan_chunk_logprobs(p, end, lp_ids, lp_values)
        elif (
            key_is(key, key_len, b"finish_reason", 13)
            or key_is(key, key_len, b"routed_experts", 14)
            or key_is(key, key_len, b"sampling_mask", 13)
        ):
            # The finishing chunk and the arrays take the orjson path.
            if not _null_at(p, end):
                return NULL
            p += 4
        elif key_is(key, key_len, b"text", 4):
            return NULL
        elif key_is(key, key_len, b"index", 5):
            # choice 0 only: with n > 1 each chunk holds one choice, any of them
            if p[0] != 48 or end - p < 2 or (p[1] != 44 and p[1] != 125):
                return NULL
            p += 1
        else:
            p = skip_value(p, end, 3)
        if p == NULL or p >= end:
            return NULL
        if p[0] == 125:
            return p + 1
        if p[0] != 44:
            return NULL
        p += 1


cdef const unsigned char* _scan_chunk_logprobs(const unsigned char* p, const unsigned char* end, Buffer ids,
                                               Buffer values) except? NULL:
    """``{"content": [{"token_id": id, "logprob": x, ...}, ...]}`` (vLLM 0.32 on; before, the id
    is ``"token": "token_id:<id>"``) into the staging buffers."""
    cdef const unsigned char* key
    cdef Py_ssize_t key_len
    cdef Py_ssize_t n = 0
    cdef bint has_token, has_logprob
    cdef long long token
    cdef double logprob
    ids.size = values.size = 0
    if end - p < 12 or memcmp(p, b'{"content":[', 12) != 0:
        return NULL
    p += 12
    if p < end and p[0] == 93:
        return p + 2 if p + 1 < end and p[1] == 125 else NULL
    while True:
        if p >= end or p[0] != 123:
            return NULL
        p += 1
        has_token = has_logprob = False
        if n == ids.capacity:
            ids.reserve(1)
            values.reserve(ids.capacity - values.size)
        while True:
            p = scan_key(p, end, &key, &key_len)
            if p == NULL:
                return NULL
            if key_is(key, key_len, b"token_id", 8):
                if has_token:
                    return NULL
                has_token = True
                p = scan_uint(p, end, &token)
            elif key_is(key, key_len, b"token", 5):
                if has_token or end - p < 11 or memcmp(p, b'"token_id:', 10) != 0:
                    return NULL
                has_token = True
                p = scan_uint(p + 10, end, &token)
                if p == NULL or p >= end or p[0] != 34:
                    return NULL
                p += 1
            elif key_is(key, key_len, b"logprob", 7):
                if has_logprob:
                    return NULL
                has_logprob = True
                if _null_at(p, end):
                    logprob = NAN
                    p += 4
                else:
                    p = scan_number(p, end, &logprob, True)
            else:
                p = skip_value(p, end, 6)
            if p == NULL or p >= end:
                return NULL
            if p[0] == 125:
                p += 1
                break
            if p[0] != 44:
                return NULL
            p += 1
        if not has_token or not has_logprob or token > INT32_MAX:
            return NULL
        int32s(ids)[n] = <int32_t>token
        float64s(values)[n] = logprob
        n += 1
        ids.size = values.size = n
        if p >= end:
            return NULL
        if p[0] == 93:
            return p + 2 if p + 1 < end and p[1] == 125 else NULL
        if p[0] != 44:
            return NULL
        p += 1
