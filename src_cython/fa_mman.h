/* Memory for decoded routed-experts blocks (stream.pyx): anonymous mappings where the system has
   them, so a block of hundreds of MB can grow by remapping pages (Linux mremap) instead of
   copying, and can ask for transparent huge pages (Linux madvise). Elsewhere plain malloc. */
#ifndef FA_MMAN_H
#define FA_MMAN_H

#include <stddef.h>
#include <stdlib.h>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#endif
#if (defined(__unix__) || defined(__APPLE__)) && defined(MAP_ANONYMOUS)
#define FA_MMAP 1
#else
#define FA_MMAP 0
#endif
#if FA_MMAP && defined(MREMAP_MAYMOVE)
#define FA_MREMAP 1
#else
#define FA_MREMAP 0
#endif

/* n bytes of writable memory, or NULL. */
static inline void *fa_map(size_t n) {
#if FA_MMAP
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
#else
    return malloc(n);
#endif
}

static inline void fa_unmap(void *p, size_t n) {
#if FA_MMAP
    munmap(p, n);
#else
    (void)n;
    free(p);
#endif
}

/* The mapping p of old_size bytes grown to new_size, moving pages rather than bytes; NULL where
   that is not possible (p is then unchanged and the caller copies). */
static inline void *fa_remap(void *p, size_t old_size, size_t new_size) {
#if FA_MREMAP
    void *q = mremap(p, old_size, new_size, MREMAP_MAYMOVE);
    return q == MAP_FAILED ? NULL : q;
#else
    (void)p;
    (void)old_size;
    (void)new_size;
    return NULL;
#endif
}

/* Ask for transparent huge pages (a 100 MB block then faults 50 times, not 25,000); advisory,
   so failure and its absence are harmless. */
static inline void fa_advise_huge(void *p, size_t n) {
#if FA_MMAP && defined(MADV_HUGEPAGE)
    (void)madvise(p, n, MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

#endif /* FA_MMAN_H */
