# Declarations of fa_mman.h: memory of decoded blocks (anonymous mappings, malloc elsewhere).

cdef extern from "fa_mman.h" nogil:
    void* fa_map(size_t n) noexcept
    void fa_unmap(void* p, size_t n) noexcept
    void* fa_remap(void* p, size_t old_size, size_t new_size) noexcept
    void fa_advise_huge(void* p, size_t n) noexcept
