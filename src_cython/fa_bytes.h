/* Byte searches of the compiled twin: pure C over caller-owned memory, no Python objects, no
   failure modes. The GNU/BSD extensions memmem and memrchr are used where the C library has them;
   elsewhere a memchr loop gives the same answers. */
#ifndef FA_BYTES_H
#define FA_BYTES_H

#include <stddef.h>
#include <string.h>

#if defined(__GLIBC__) && defined(_GNU_SOURCE)
#define FA_HAVE_MEMMEM 1
#define FA_HAVE_MEMRCHR 1
#elif defined(__APPLE__) || defined(__FreeBSD__) || defined(__NetBSD__) || defined(__OpenBSD__)
#define FA_HAVE_MEMMEM 1
#define FA_HAVE_MEMRCHR 0
#else
#define FA_HAVE_MEMMEM 0
#define FA_HAVE_MEMRCHR 0
#endif

/* First index >= start of pattern[:m] in data[:n], or -1 (bytes.find). */
static inline ptrdiff_t fa_find_bytes(const char *data, ptrdiff_t n, const char *pattern, ptrdiff_t m,
                                      ptrdiff_t start) {
    const char *hit;
    if (start > n - m)
        return -1;
#if FA_HAVE_MEMMEM
    hit = (const char *)memmem(data + start, (size_t)(n - start), pattern, (size_t)m);
    return hit != NULL ? hit - data : -1;
#else
    if (m == 0)
        return start;
    while (start <= n - m) {
        hit = (const char *)memchr(data + start, pattern[0], (size_t)(n - m + 1 - start));
        if (hit == NULL)
            return -1;
        if (memcmp(hit, pattern, (size_t)m) == 0)
            return hit - data;
        start = hit - data + 1;
    }
    return -1;
#endif
}

/* Last c in s[:n], or NULL (memrchr). */
static inline const char *fa_memrchr(const char *s, int c, size_t n) {
#if FA_HAVE_MEMRCHR
    return (const char *)memrchr(s, c, n);
#else
    while (n > 0) {
        n--;
        if ((unsigned char)s[n] == (unsigned char)c)
            return s + n;
    }
    return NULL;
#endif
}

/* Last index of pattern[:m] in data[:n], or -1 (bytes.rfind). Scans backwards, so a key near the
   end of a long event is found without reading the rest. */
static inline ptrdiff_t fa_rfind_bytes(const char *data, ptrdiff_t n, const char *pattern, ptrdiff_t m) {
    ptrdiff_t end = n - m + 1; /* candidates start below end */
    const char *hit;
    if (m <= 0 || end <= 0)
        return -1;
    while (end > 0) {
        hit = fa_memrchr(data, pattern[0], (size_t)end);
        if (hit == NULL)
            return -1;
        if (memcmp(hit, pattern, (size_t)m) == 0)
            return hit - data;
        end = hit - data;
    }
    return -1;
}

/* Index of the first CR or LF at or after pos, or -1. Two memchr passes (vectorised in every
   common C library) beat one byte loop; the CR pass stops at the LF. */
static inline ptrdiff_t fa_find_line_end(const unsigned char *buf, ptrdiff_t pos, ptrdiff_t n) {
    const unsigned char *lf = (const unsigned char *)memchr(buf + pos, '\n', (size_t)(n - pos));
    ptrdiff_t stop = lf != NULL ? lf - buf : n;
    const unsigned char *cr = (const unsigned char *)memchr(buf + pos, '\r', (size_t)(stop - pos));
    if (cr != NULL)
        return cr - buf;
    return lf != NULL ? stop : -1;
}

#endif /* FA_BYTES_H */
