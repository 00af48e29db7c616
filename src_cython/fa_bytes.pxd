# Declarations of fa_bytes.h: byte searches over caller-owned memory (no Python objects, no errors).

cdef extern from "fa_bytes.h" nogil:
    Py_ssize_t fa_find_bytes(const char* data, Py_ssize_t n, const char* pattern, Py_ssize_t m,
                             Py_ssize_t start) noexcept
    Py_ssize_t fa_rfind_bytes(const char* data, Py_ssize_t n, const char* pattern, Py_ssize_t m) noexcept
    Py_ssize_t fa_find_line_end(const unsigned char* buf, Py_ssize_t pos, Py_ssize_t n) noexcept
