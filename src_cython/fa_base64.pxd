# Declarations of fa_base64.h: the streamed base64 decoder (plain loop; AVX2 where available).

cdef extern from "fa_base64.h" nogil:
    int FA_B64_AVX2  # 1 where the AVX2 loop is compiled in (x86-64, GCC or Clang)
    int fa_b64_simd  # set by fa_b64_setup(): the CPU runs the AVX2 loop
    void fa_b64_setup() noexcept
    int fa_b64_decode(const char* src, size_t n, char* out) noexcept
    int fa_b64_decode_plain(const unsigned char* src, size_t n, unsigned char* out) noexcept
