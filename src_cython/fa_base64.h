/* The base64 decoder of streamed routed-experts values (stream.pyx): whole unpadded quanta
   straight into the caller's memory, so hundreds of MB of base64 are not first decoded into a
   bytes object and copied. It accepts exactly the 64 characters of the standard alphabet and
   refuses everything else (padding included); the caller then hands the characters to pybase64,
   so this never decides an outcome pybase64 would not.

   fa_b64_decode_plain is the textbook table loop. fa_b64_decode_avx2 follows the vectorised
   decoding of W. Mula and D. Lemire, "Faster Base64 Encoding and Decoding Using AVX2
   Instructions", ACM Transactions on the Web 12(3), 2018: nibble-indexed lookups classify and
   translate 32 characters at once, and two multiply-adds pack them. It is compiled only for
   x86-64 with GCC or Clang (target attribute, no -mavx2 for the rest of the file) and chosen at
   run time by fa_b64_setup. */
#ifndef FA_BASE64_H
#define FA_BASE64_H

#include <stdint.h>
#include <string.h>

static signed char fa_b64_value[256];

static inline void fa_b64_init(void) {
    const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    memset(fa_b64_value, -1, sizeof fa_b64_value);
    for (int i = 0; i < 64; i++)
        fa_b64_value[(unsigned char)alphabet[i]] = (signed char)i;
}

/* n is a multiple of 4; writes n / 4 * 3 bytes; 0 if a character is outside the alphabet. */
static inline int fa_b64_decode_plain(const unsigned char *src, size_t n, unsigned char *out) {
    for (size_t i = 0; i < n; i += 4, out += 3) {
        int a = fa_b64_value[src[i]], b = fa_b64_value[src[i + 1]];
        int c = fa_b64_value[src[i + 2]], d = fa_b64_value[src[i + 3]];
        if ((a | b | c | d) < 0)
            return 0;
        uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
        out[0] = (unsigned char)(v >> 16);
        out[1] = (unsigned char)(v >> 8);
        out[2] = (unsigned char)v;
    }
    return 1;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define FA_B64_AVX2 1
#include <immintrin.h>

/* 32 characters per step. Validity: a byte is in the alphabet iff the class bits of its low
   nibble and of its high nibble share no bit (one class bit per high-nibble row of the ASCII
   table). Value: the byte plus an offset chosen by its high nibble ('/' moved to row 1). The
   four 6-bit values of each dword are merged by two multiply-adds and the three bytes of every
   dword gathered to the front. Each step stores 32 bytes for 24 decoded, so it runs only while
   that store stays inside the output (44 characters left); the plain loop does the rest. */
static inline __attribute__((target("avx2"))) int fa_b64_decode_avx2(const unsigned char *src, size_t n,
                                                                     unsigned char *out) {
    // clang-format off
    const __m256i lo_classes = _mm256_setr_epi8(
        0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a,
        0x15, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x13, 0x1a, 0x1b, 0x1b, 0x1b, 0x1a);
    const __m256i hi_classes = _mm256_setr_epi8(
        0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10,
        0x10, 0x10, 0x01, 0x02, 0x04, 0x08, 0x04, 0x08, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x10);
    const __m256i offsets = _mm256_setr_epi8(
        0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0,
        0, 16, 19, 4, -65, -65, -71, -71, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m256i gather = _mm256_setr_epi8(
        2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1,
        2, 1, 0, 6, 5, 4, 10, 9, 8, 14, 13, 12, -1, -1, -1, -1);
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
    // clang-format on
    const __m256i nibble = _mm256_set1_epi8(0x0f);
    const __m256i slash = _mm256_set1_epi8('/');
    __m256i bad = _mm256_setzero_si256();
    size_t i = 0;
    for (; i + 44 <= n; i += 32, out += 24) {
        __m256i s = _mm256_loadu_si256((const __m256i *)(src + i));
        __m256i hi = _mm256_and_si256(_mm256_srli_epi32(s, 4), nibble);
        __m256i lo = _mm256_and_si256(s, nibble);
        bad = _mm256_or_si256(
            bad, _mm256_and_si256(_mm256_shuffle_epi8(lo_classes, lo), _mm256_shuffle_epi8(hi_classes, hi)));
        __m256i row = _mm256_add_epi8(hi, _mm256_cmpeq_epi8(s, slash));
        __m256i v = _mm256_add_epi8(s, _mm256_shuffle_epi8(offsets, row));
        v = _mm256_maddubs_epi16(v, _mm256_set1_epi32(0x01400140));
        v = _mm256_madd_epi16(v, _mm256_set1_epi32(0x00011000));
        v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, gather), lanes);
        _mm256_storeu_si256((__m256i *)out, v);
    }
    if (!_mm256_testz_si256(bad, bad))
        return 0;
    return fa_b64_decode_plain(src + i, n - i, out);
}

static int fa_b64_simd = 0;

static inline void fa_b64_setup(void) {
    fa_b64_init();
    __builtin_cpu_init();
    fa_b64_simd = __builtin_cpu_supports("avx2");
}

/* Only called where fa_b64_simd is set (the test hook aside). */
static inline int fa_b64_decode(const char *src, size_t n, char *out) {
    return fa_b64_simd ? fa_b64_decode_avx2((const unsigned char *)src, n, (unsigned char *)out)
                       : fa_b64_decode_plain((const unsigned char *)src, n, (unsigned char *)out);
}
#else
#define FA_B64_AVX2 0
static int fa_b64_simd = 0;
static inline void fa_b64_setup(void) { fa_b64_init(); }
static inline int fa_b64_decode(const char *src, size_t n, char *out) {
    return fa_b64_decode_plain((const unsigned char *)src, n, (unsigned char *)out);
}
#endif

#endif /* FA_BASE64_H */
