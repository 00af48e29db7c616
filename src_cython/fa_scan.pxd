# Declarations of fa_scan.h: the event scanner's number and string helpers (pure C).

from libc.stdint cimport uint64_t

cdef extern from "fa_scan.h" nogil:
    int FA_SWAR
    int FA_CLINGER
    int FA_Q_MIN
    int FA_Q_MAX
    uint64_t fa_load8(const unsigned char* p) noexcept
    int fa_digit_run(uint64_t v) noexcept
    int fa_string_stop(uint64_t v) noexcept
    uint64_t fa_digits_value(uint64_t v, int n) noexcept
    void fa_set_pow5(int q, uint64_t t, int s) noexcept
    enum:
        FA_NUMBER_BAD
        FA_NUMBER_OK
        FA_NUMBER_SLOW
    int fa_number(const unsigned char** pp, const unsigned char* end, int convert, double* out) noexcept
    bint fa_is_digit(unsigned char c) noexcept
