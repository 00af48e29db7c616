# Declarations of fastaccum._cy.fields: token ids and logprob triples into buffers, and the one
# count the light check reads from raw bytes.

from fastaccum._cy.buffers cimport Buffer


# What one event says, read and type-checked but not yet checked against the stream (the pure
# twin's Event). Its ids and logprobs are in the accumulator's staging buffers; a scanned event's
# text and meta_info are spans of its bytes, valid while those bytes are.
cdef struct Event:
    Py_ssize_t event_index  # data events counted from 0
    bint has_output_ids  # ids in the accumulator's _out_ids
    bint has_logprobs  # ids and logprobs of output_token_logprobs in _lp_ids and _lp_values
    long long completion_tokens  # -1 (fastaccum._core.policy.ABSENT) where the event does not carry it
    long long logprobs_length  # output_token_logprobs_length
    long long prompt_tokens
    # the scanner's reading (an event it read; the orjson path leaves these unset)
    bint has_text
    bint text_null
    bint text_escaped
    const unsigned char* text
    Py_ssize_t text_len
    const unsigned char* meta  # the meta_info object's bytes, for a lazy orjson parse
    Py_ssize_t meta_len
    const unsigned char* version  # meta_info.weight_version's string (after its quote), or NULL
    Py_ssize_t version_len
    bint version_escaped

cdef int read_id_list(Py_ssize_t index, str where, object value, Buffer out) except -1
cdef Py_ssize_t read_logprob_list(Py_ssize_t index, object value, Buffer ids, Buffer logprobs) except -1
cdef Py_ssize_t read_uint_at(const char* data, Py_ssize_t n, Py_ssize_t pos) noexcept
