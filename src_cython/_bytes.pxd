# Inline byte-search helpers for _cy.pyx: pure C, no Python objects, cannot fail.

from libc.string cimport memchr, memcmp


cdef extern from "string.h" nogil:
    # GNU extensions; Python.h defines _GNU_SOURCE before string.h is included.
    void *memmem(const void *haystack, size_t haystacklen, const void *needle, size_t needlelen)
    void *memrchr(const void *s, int c, size_t n)


cdef inline Py_ssize_t find_bytes(const char* data, Py_ssize_t n, const char* pattern,
                                  Py_ssize_t m, Py_ssize_t start) noexcept nogil:
    """First index >= start of pattern in data[:n], or -1 (bytes.find)."""
    cdef const char* hit
    if start > n - m:
        return -1
    hit = <const char*>memmem(data + start, <size_t>(n - start), pattern, <size_t>m)
    return hit - data if hit != NULL else -1


cdef inline Py_ssize_t rfind_bytes(const char* data, Py_ssize_t n, const char* pattern,
                                   Py_ssize_t m) noexcept nogil:
    """Last index of pattern in data[:n], or -1 (bytes.rfind); scans backwards, so a key near
    the end of a long event is found without reading the rest."""
    cdef Py_ssize_t end = n - m + 1  # candidates start below end
    cdef const char* hit
    if m <= 0 or end <= 0:
        return -1
    while end > 0:
        hit = <const char*>memrchr(data, pattern[0], <size_t>end)
        if hit == NULL:
            return -1
        if memcmp(hit, pattern, <size_t>m) == 0:
            return hit - data
        end = hit - data
    return -1


cdef inline Py_ssize_t find_line_end(const unsigned char* buf, Py_ssize_t pos,
                                     Py_ssize_t n) noexcept nogil:
    """Index of the first CR or LF at or after pos, or -1. Two SIMD memchr passes beat one
    byte loop; the CR pass stops at the LF."""
    cdef const unsigned char* lf = <const unsigned char*>memchr(buf + pos, 10, <size_t>(n - pos))
    cdef Py_ssize_t stop = (lf - buf) if lf != NULL else n
    cdef const unsigned char* cr = <const unsigned char*>memchr(buf + pos, 13, <size_t>(stop - pos))
    if cr != NULL:
        return cr - buf
    return stop if lf != NULL else -1
