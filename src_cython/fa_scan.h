/* Number and string helpers of the compiled twin's event scanner (scan.pyx): pure C, no Python
   objects.

   Origins of the number conversion (fa_scale):
   - the exact case is Clinger's fast path (W. D. Clinger, "How to Read Floating Point Numbers
     Accurately", PLDI 1990): an integer significand of at most 53 bits times an exactly
     representable power of ten is one correctly rounded IEEE operation;
   - the other case multiplies a normalised 64-bit significand by a 64-bit truncated power of five
     and keeps the result only when the truncation cannot change the rounding, the approach of
     Lemire's fast_float ("Number Parsing at a Gigabyte per Second", 2021); what it cannot decide
     goes to a correctly rounded parser.
   The digit and string runs are SWAR (SIMD within a register): eight bytes in one 64-bit word. */
#ifndef FA_SCAN_H
#define FA_SCAN_H

#include <float.h>
#include <stdint.h>
#include <string.h>

/* Clinger's fast path relies on each double operation being rounded once, to double. With
   FLT_EVAL_METHOD != 0 (x87 without SSE2) intermediates carry extended precision and are rounded
   twice, so there every float takes the integer route or the correctly rounded parser. */
#if defined(FLT_EVAL_METHOD) && FLT_EVAL_METHOD == 0
#define FA_CLINGER 1
#else
#define FA_CLINGER 0
#endif

/* Count trailing / leading zero bits of a non-zero word: the builtins where the compiler has
   them, a plain loop elsewhere. */
static inline int fa_ctz64(uint64_t v) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(v);
#else
    int n = 0;
    while (!(v & 1)) {
        v >>= 1;
        n++;
    }
    return n;
#endif
}

static inline int fa_clz64(uint64_t v) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_clzll(v);
#else
    int n = 0;
    while (!(v >> 63)) {
        v <<= 1;
        n++;
    }
    return n;
#endif
}

/* Eight input bytes as one little-endian word, so that byte 0 (the first character) is the
   least significant; the digit tricks below assume it. Big-endian builds read byte by byte. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define FA_SWAR 1
#else
#define FA_SWAR 0
#endif
static inline uint64_t fa_load8(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}
/* How many of the eight bytes in v, from the first, are ASCII digits (0..8). A byte is a digit
   when its high nibble is 3 and adding 6 keeps it there; the carry out of a byte >= 0xFA can
   only reach bytes after the first non-digit, which are not counted. */
static inline int fa_digit_run(uint64_t v) {
    uint64_t bad = ((v & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL)
                   | (((v + 0x0606060606060606ULL) & 0xF0F0F0F0F0F0F0F0ULL) ^ 0x3030303030303030ULL);
    return bad ? fa_ctz64(bad) >> 3 : 8;
}
/* The value of the first n (1..8) digits in v: shifted to the top so the dropped bytes become
   leading zeros, then pairs, quads and the whole summed in three multiplications. */
static inline uint64_t fa_digits_value(uint64_t v, int n) {
    v = (v & 0x0F0F0F0F0F0F0F0FULL) << (8 * (8 - n));
    v = (v * 2561) >> 8;
    v = ((v & 0x00FF00FF00FF00FFULL) * 6553601) >> 16;
    return ((v & 0x0000FFFF0000FFFFULL) * 42949672960001ULL) >> 32;
}
/* Index (0..8) of the first byte in v that a plain string cannot hold as is: a quote, a
   backslash, a control character or a non-ASCII byte. Each has-zero test below can flag
   false bytes only above its first true one, so the lowest flag is exact. */
static inline int fa_string_stop(uint64_t v) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    uint64_t quote = v ^ (ones * 0x22), backslash = v ^ (ones * 0x5C);
    uint64_t special =
        (((quote - ones) & ~quote) | ((backslash - ones) & ~backslash) | ((v - ones * 0x20) & ~v) | v)
        & highs;
    return special ? fa_ctz64(special) >> 3 : 8;
}
static const uint64_t fa_pow10_u[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
// clang-format off
static const double fa_pow10_d[23] = {
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
    1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
// clang-format on
/* 5**q for q in [FA_Q_MIN, FA_Q_MAX] as t * 2**-s with t the 64-bit significand truncated
   (2**63 <= t < 2**64); filled once at import from exact integers (fa_set_pow5). */
#define FA_Q_MIN (-348)
#define FA_Q_MAX 308
static uint64_t fa_pow5_t[FA_Q_MAX - FA_Q_MIN + 1];
static int fa_pow5_s[FA_Q_MAX - FA_Q_MIN + 1];
static inline void fa_set_pow5(int q, uint64_t t, int s) {
    fa_pow5_t[q - FA_Q_MIN] = t;
    fa_pow5_s[q - FA_Q_MIN] = s;
}
/* w * 10**q correctly rounded to a double, or 0 with *ok = 0 when this cannot tell (the caller then
   uses a correctly rounded parser).
   Clinger's exact case first, where FA_CLINGER allows it. Otherwise, with w normalised (top bit
   set), the 128-bit product A = w * t falls short of the exact X = w * 5**q * 2**s by less than
   2**64 (t is truncated), so only A's low 64 bits are uncertain. Rounding A's top 53 bits is then
   right unless the bits below them lie within 2**64 under the halfway point, or exactly on it:
   those rare cases are refused. */
static inline double fa_scale(uint64_t w, int q, int *ok) {
    *ok = 1;
    if (FA_CLINGER && w <= 9007199254740992ULL && q >= -22 && q <= 22) {
        double d = (double)w;
        return q < 0 ? d / fa_pow10_d[-q] : d * fa_pow10_d[q];
    }
    if (w == 0)
        return 0.0;
    *ok = 0;
#ifndef __SIZEOF_INT128__
    return 0.0; /* no 128-bit product here: the correctly rounded parser decides */
#else
    if (q < FA_Q_MIN || q > FA_Q_MAX)
        return 0.0;
    int lz = fa_clz64(w);
    unsigned __int128 a = (unsigned __int128)(w << lz) * fa_pow5_t[q - FA_Q_MIN];
    uint64_t hi = (uint64_t)(a >> 64), lo = (uint64_t)a;
    int shift = (hi >> 63) ? 11 : 10; /* bits of hi below the 53 kept */
    uint64_t m = hi >> shift;
    uint64_t dropped = hi & ((1ULL << shift) - 1), half = 1ULL << (shift - 1);
    if (dropped == half - 1 || (dropped == half && lo == 0))
        return 0.0;
    if (dropped >= half) {
        m += 1;
        if (m >> 53) {
            m >>= 1;
            shift += 1;
        }
    }
    /* value = m * 2**(shift + 64) * 2**(q - s - lz); m's top bit is bit 52 */
    int biased = shift + 64 + q - fa_pow5_s[q - FA_Q_MIN] - lz + 52 + 1023;
    if (biased < 1 || biased > 2046)
        return 0.0; /* subnormal or overflow: the slow path decides */
    uint64_t bits = ((uint64_t)biased << 52) | (m & ((1ULL << 52) - 1));
    double out;
    memcpy(&out, &bits, 8);
    *ok = 1;
    return out;
#endif
}
/* What fa_number found. */
enum { FA_NUMBER_BAD = 0, FA_NUMBER_OK = 1, FA_NUMBER_SLOW = 2 };
static inline int fa_is_digit(unsigned char c) { return (unsigned)(c - '0') <= 9; }
/* The JSON number at *pp: FA_NUMBER_BAD when there is none, or one the scanner leaves to
   orjson (an integer whose float() is not exact here); else *pp moves past it and the result
   is FA_NUMBER_OK (with *out set when convert) or FA_NUMBER_SLOW: the value needs a correctly
   rounded parser, or (not converted) might overflow, which orjson refuses even unused.
   19 significant digits are kept; the rest only moves the exponent (and marks truncation). */
static inline int fa_number(const unsigned char **pp, const unsigned char *end, int convert, double *out) {
    const unsigned char *p = *pp;
    uint64_t w = 0;
    int sig = 0, e10 = 0, exp_sign = 1, exp_value = 0, negative = 0, is_float = 0, truncated = 0;
    if (p < end && *p == '-') {
        negative = 1;
        p++;
    }
    if (p >= end || !fa_is_digit(*p))
        return FA_NUMBER_BAD;
    if (*p == '0') {
        p++;
        if (p < end && fa_is_digit(*p))
            return FA_NUMBER_BAD; /* a leading zero is not JSON */
    } else {
        do {
            if (sig < 19) {
                w = w * 10 + (uint64_t)(*p - '0');
                sig++;
            } else {
                e10++;
                truncated = 1;
            }
            p++;
        } while (p < end && fa_is_digit(*p));
    }
    if (p < end && *p == '.') {
        is_float = 1;
        p++;
        if (p >= end || !fa_is_digit(*p))
            return FA_NUMBER_BAD;
        if (w == 0) {
            while (p < end && *p == '0') { /* leading zeros only move the exponent */
                e10--;
                p++;
            }
        }
#if FA_SWAR
        /* Up to sixteen digits a step while they fit in the 19 kept: two words are read and
           measured independently, so the second does not wait for the first. The byte loop
           takes the rest, and the buffer's last bytes. */
        while (end - p >= 16) {
            uint64_t v1 = fa_load8(p), v2 = fa_load8(p + 8);
            int run1 = fa_digit_run(v1), run2 = fa_digit_run(v2);
            if (run1 < 8) {
                if (run1 == 0 || sig + run1 > 19)
                    break;
                w = w * fa_pow10_u[run1] + fa_digits_value(v1, run1);
                sig += run1;
                e10 -= run1;
                p += run1;
                break;
            }
            if (sig + 8 + run2 > 19)
                break;
            w = w * 100000000 + fa_digits_value(v1, 8);
            if (run2)
                w = w * fa_pow10_u[run2] + fa_digits_value(v2, run2);
            sig += 8 + run2;
            e10 -= 8 + run2;
            p += 8 + run2;
            if (run2 < 8)
                break;
        }
#endif
        while (p < end && fa_is_digit(*p)) {
            if (sig < 19) {
                w = w * 10 + (uint64_t)(*p - '0');
                sig++;
                e10--;
            } else {
                truncated = 1;
            }
            p++;
        }
    }
    if (p < end && (*p | 0x20) == 'e') {
        is_float = 1;
        p++;
        if (p < end && (*p == '+' || *p == '-')) {
            exp_sign = *p == '-' ? -1 : 1;
            p++;
        }
        if (p >= end || !fa_is_digit(*p))
            return FA_NUMBER_BAD;
        do {
            if (exp_value < 100000)
                exp_value = exp_value * 10 + (*p - '0');
            p++;
        } while (p < end && fa_is_digit(*p));
        e10 += exp_sign * exp_value;
    }
    *pp = p;
    if (!convert)
        return sig + e10 <= 300 || (exp_sign < 0 && exp_value >= 100000) ? FA_NUMBER_OK : FA_NUMBER_SLOW;
    if (!is_float) {
        if (truncated || w > 9007199254740992ULL)
            return FA_NUMBER_BAD;
        *out = negative && w != 0 ? -(double)w : (double)w;
        return FA_NUMBER_OK;
    }
    if (!truncated && exp_value < 100000) {
        int ok;
        double value = fa_scale(w, e10, &ok);
        if (ok) {
            *out = negative ? -value : value;
            return FA_NUMBER_OK;
        }
    }
    return FA_NUMBER_SLOW;
}

#endif /* FA_SCAN_H */
