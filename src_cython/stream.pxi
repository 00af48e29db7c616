# ---- streamed base64 ------------------------------------------------------------------------
# The routed-experts value of a terminal event can be hundreds of MB of base64 in one line.
# Once an event grows past STREAM_AFTER_BYTES, the framer runs the span scan of cut_b64_spans
# while the bytes arrive; inside the routed_experts value it decodes whole base64 quanta of each
# piece into a Block instead of holding the line. Anything unusual (a backslash, padding before
# the end, a bad character, the line ending inside the value) puts the exact original bytes back
# into the event ("de-streaming") and the event takes the ordinary path, so results and errors
# stay identical to the pure twin's. There is no such path in fastaccum._py.

from cpython.memoryview cimport PyMemoryView_FromMemory
from posix.mman cimport MAP_ANONYMOUS, MAP_FAILED, MAP_PRIVATE, PROT_READ, PROT_WRITE, mmap, munmap

cdef extern from *:
    """
    #include <sys/mman.h>
    #ifndef MADV_HUGEPAGE
    #define MADV_HUGEPAGE MADV_NORMAL
    #endif
    static void *fa_remap(void *old, size_t old_size, size_t new_size) {
    #ifdef MREMAP_MAYMOVE
        return mremap(old, old_size, new_size, MREMAP_MAYMOVE);
    #else
        (void)old; (void)old_size; (void)new_size;
        return MAP_FAILED;
    #endif
    }
    """
    void* fa_remap(void* old, size_t old_size, size_t new_size) nogil
    int madvise(void *addr, size_t length, int advice) nogil
    int MADV_HUGEPAGE

# The decoder of whole unpadded quanta, straight into a Block: a routed-experts value arrives as
# hundreds of MB of base64, and decoding into a new bytes object first (pybase64's only output)
# costs one more write and read of every decoded byte. It accepts exactly the 64 characters of
# the standard alphabet; anything else (padding included) is refused, and the caller then hands
# the characters to pybase64 or de-streams, so it never decides an outcome pybase64 would not.
# AVX2 only, chosen at run time; elsewhere pybase64 does all the decoding.
cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>

    static signed char fa_b64_value[256];

    static void fa_b64_init(void) {
        const char *alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        memset(fa_b64_value, -1, sizeof fa_b64_value);
        for (int i = 0; i < 64; i++) fa_b64_value[(unsigned char)alphabet[i]] = (signed char)i;
    }

    /* n is a multiple of 4; writes n / 4 * 3 bytes; 0 if a character is outside the alphabet. */
    static int fa_b64_decode_plain(const unsigned char *src, size_t n, unsigned char *out) {
        for (size_t i = 0; i < n; i += 4, out += 3) {
            int a = fa_b64_value[src[i]], b = fa_b64_value[src[i + 1]];
            int c = fa_b64_value[src[i + 2]], d = fa_b64_value[src[i + 3]];
            if ((a | b | c | d) < 0) return 0;
            uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | (uint32_t)d;
            out[0] = (unsigned char)(v >> 16);
            out[1] = (unsigned char)(v >> 8);
            out[2] = (unsigned char)v;
        }
        return 1;
    }

    #if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    #include <immintrin.h>

    /* 32 characters per step. Validity: a byte is in the alphabet iff the class bits of its low
       nibble and of its high nibble share no bit (one class bit per high-nibble row of the ASCII
       table). Value: the byte plus an offset chosen by its high nibble ('/' moved to row 1). The
       four 6-bit values of each dword are merged by two multiply-adds and the three bytes of every
       dword gathered to the front. Each step stores 32 bytes for 24 decoded, so it runs only while
       that store stays inside the output (44 characters left); the plain loop does the rest. */
    __attribute__((target("avx2")))
    static int fa_b64_decode_avx2(const unsigned char *src, size_t n, unsigned char *out) {
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
        const __m256i nibble = _mm256_set1_epi8(0x0f);
        const __m256i slash = _mm256_set1_epi8('/');
        __m256i bad = _mm256_setzero_si256();
        size_t i = 0;
        for (; i + 44 <= n; i += 32, out += 24) {
            __m256i s = _mm256_loadu_si256((const __m256i *)(src + i));
            __m256i hi = _mm256_and_si256(_mm256_srli_epi32(s, 4), nibble);
            __m256i lo = _mm256_and_si256(s, nibble);
            bad = _mm256_or_si256(bad, _mm256_and_si256(_mm256_shuffle_epi8(lo_classes, lo),
                                                        _mm256_shuffle_epi8(hi_classes, hi)));
            __m256i row = _mm256_add_epi8(hi, _mm256_cmpeq_epi8(s, slash));
            __m256i v = _mm256_add_epi8(s, _mm256_shuffle_epi8(offsets, row));
            v = _mm256_maddubs_epi16(v, _mm256_set1_epi32(0x01400140));
            v = _mm256_madd_epi16(v, _mm256_set1_epi32(0x00011000));
            v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(v, gather), lanes);
            _mm256_storeu_si256((__m256i *)out, v);
        }
        if (!_mm256_testz_si256(bad, bad)) return 0;
        return fa_b64_decode_plain(src + i, n - i, out);
    }

    static int fa_b64_simd = 0;

    static void fa_b64_setup(void) {
        fa_b64_init();
        __builtin_cpu_init();
        fa_b64_simd = __builtin_cpu_supports("avx2");
    }

    /* Only called where fa_b64_simd is set (the test hook aside). */
    static int fa_b64_decode(const char *src, size_t n, char *out) {
        return fa_b64_simd ? fa_b64_decode_avx2((const unsigned char *)src, n, (unsigned char *)out)
                           : fa_b64_decode_plain((const unsigned char *)src, n, (unsigned char *)out);
    }
    #else
    static int fa_b64_simd = 0;
    static void fa_b64_setup(void) { fa_b64_init(); }
    static int fa_b64_decode(const char *src, size_t n, char *out) {
        return fa_b64_decode_plain((const unsigned char *)src, n, (unsigned char *)out);
    }
    #endif
    """
    int fa_b64_simd
    void fa_b64_setup()
    int fa_b64_decode(const char* src, size_t n, char* out) nogil
    int fa_b64_decode_plain(const unsigned char* src, size_t n, unsigned char* out) nogil

fa_b64_setup()
cdef bint DECODE_IN_PLACE = fa_b64_simd


# Events below this size are cut after dispatch (cut_b64_spans); the scan is not worth it.
cdef Py_ssize_t STREAM_AFTER_BYTES = 4 << 20
cdef Py_ssize_t ROUTED_KEY = 4  # index of "routed_experts" in B64_KEYS
cdef Py_ssize_t BLOCK_MIN_BYTES = 16 << 20


cdef class Block:
    """Decoded bytes in an anonymous mapping (huge pages where the kernel allows: a 100 MB
    array faults 50 times, not 25,000). Exports a writable byte buffer once complete."""

    cdef char* ptr
    cdef readonly Py_ssize_t size
    cdef Py_ssize_t capacity

    def __dealloc__(self):
        if self.ptr != NULL:
            munmap(self.ptr, self.capacity)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t needed = self.size + extra
        cdef Py_ssize_t grown
        cdef void* memory
        if needed <= self.capacity:
            return 0
        grown = max(needed, 2 * self.capacity, BLOCK_MIN_BYTES)
        memory = MAP_FAILED
        if self.ptr != NULL:
            memory = fa_remap(self.ptr, self.capacity, grown)  # Linux: moves pages, copies nothing
        if memory == MAP_FAILED:
            memory = mmap(NULL, grown, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
            if memory == MAP_FAILED:
                raise MemoryError()
            if self.ptr != NULL:
                memcpy(memory, self.ptr, self.size)
                munmap(self.ptr, self.capacity)
        madvise(memory, grown, MADV_HUGEPAGE)  # advisory; failure is harmless
        self.ptr = <char*>memory
        self.capacity = grown
        return 0

    cdef int append(self, bytes chunk) except -1:
        cdef Py_ssize_t n = len(chunk)
        self.reserve(n)
        memcpy(self.ptr + self.size, PyBytes_AS_STRING(chunk), n)
        self.size += n
        return 0

    def __getbuffer__(self, Py_buffer* view, int flags):
        export_bytes(view, self, self.ptr, &self.size, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass


cdef class SpanScan:
    """cut_b64_spans' forward scan, run while an event's bytes arrive (state of one event)."""

    cdef Py_ssize_t pos  # where the next '":"' search starts
    cdef dict spans  # key -> (start, end) of the value in the event data
    cdef Block block  # the routed_experts value, decoded; its span in data is empty
    cdef bint streaming  # inside the routed_experts value
    cdef bint off  # de-streamed: the event takes the ordinary path
    cdef Py_ssize_t value_start
    cdef char tail[4]  # base64 characters not yet forming a whole quantum (or the padded last one)
    cdef int tail_len
    cdef bint tail_padded
    cdef readonly Py_ssize_t consumed  # base64 characters taken out of the data

    def __cinit__(self):
        self.spans = {}

    cdef int advance(self, bytearray data, object expert_shape, bint at_end=False) except -1:
        """Scan the newly arrived data; start streaming at an open routed_experts value (not
        ``at_end``: then the event is complete and an open value simply ends the scan)."""
        cdef const char* buf = PyByteArray_AS_STRING(data)
        cdef Py_ssize_t n = PyByteArray_GET_SIZE(data)
        cdef Py_ssize_t at, start, end, k
        while not self.off and not self.streaming:
            at = find_bytes(buf, n, b'":"', 3, self.pos)
            if at < 0:
                self.pos = max(self.pos, n - 2)  # a match may straddle the next piece
                return 0
            k = _key_before(buf, at, self.spans)
            if k < 0:
                self.pos = at + 1
                continue
            start = at + 3
            end = find_bytes(buf, n, b'"', 1, start)
            if end < 0:
                if at_end:
                    return 0
                if k != ROUTED_KEY:
                    self.pos = at  # look again when the value is complete
                    return 0
                self.value_start = start
                self.streaming = True
                self.block = Block()
                self.block.reserve(_expected_bytes(buf, start, expert_shape))
                rest = PyBytes_FromStringAndSize(buf + start, n - start)
                PyByteArray_Resize(data, start)
                used = self.take(data, rest, 0, len(rest))
                if used < len(rest):  # de-streamed: the rest goes back as it came
                    _bytearray_extend(data, rest[used:])
                return 0
            if find_bytes(buf, end, b"\\", 1, start) < 0:
                self.spans[B64_KEYS[k]] = (start, end)
            self.pos = end
        return 0

    cdef Py_ssize_t take(self, bytearray data, const char* p, Py_ssize_t offset, Py_ssize_t n) except -1:
        """Decode the value characters in p[offset:n]; return how many were consumed (up to the
        closing quote, or fewer after de-streaming: the caller appends the rest to data).

        p may run past the end of the line: whole quanta are validated by the decoder, which
        refuses a CR or LF (and a backslash, a quote or a misplaced '='), and the few characters
        of a partial quantum are checked here, so a line end is never consumed."""
        cdef Py_ssize_t taken, whole
        cdef Py_ssize_t i = min((4 - self.tail_len) & 3, n - offset)  # closing an open quantum
        p += offset
        n -= offset
        # The characters that close the quantum the previous piece left open are taken the usual
        # way. After them most pieces lie wholly inside the value: decoding their whole quanta
        # before any quote search reads each piece once instead of twice; the decoder refuses the
        # piece that holds the closing quote (or anything else unusual), which the search takes.
        taken = self._take_searched(data, p, i) if i else 0
        if self.streaming and self.tail_len == 0:
            whole = (n - taken) // 4 * 4
            if whole and p[taken + whole - 1] != 61 and self.decode(p + taken, whole):
                self.consumed += whole
                taken += whole
        if self.streaming and taken < n:
            taken += self._take_searched(data, p + taken, n - taken)
        return taken

    cdef Py_ssize_t _take_searched(self, bytearray data, const char* p, Py_ssize_t n) except -1:
        """take() of p[:n], finding the closing quote first."""
        cdef const char* q
        cdef Py_ssize_t m, i, k, whole, rest
        cdef bint padded = False
        q = <const char*>memchr(p, 34, n)
        m = (q - p) if q != NULL else n
        if self.tail_padded and m > 0:
            return self.destream(data)
        i = 0
        while 0 < self.tail_len < 4 and i < m and p[i] != 61:
            if p[i] == 10 or p[i] == 13:
                self.destream(data)  # writes the tail back, p[:i] included
                return i
            self.tail[self.tail_len] = p[i]
            self.tail_len += 1
            i += 1
        if self.tail_len == 4:
            if not self.decode(self.tail, 4):
                self.destream(data)
                return i
            self.tail_len = 0
        if self.tail_len == 0:
            whole = (m - i) // 4 * 4
            if whole and p[i + whole - 1] == 61:
                whole -= 4  # a padded quantum waits until the value is known to end with it
            if whole:
                if not self.decode(p + i, whole):
                    self.destream(data)
                    return i
                i += whole
        rest = m - i
        if self.tail_len + rest > 4:
            self.destream(data)
            return i
        for k in range(i, m):
            if p[k] == 10 or p[k] == 13:
                self.destream(data)
                return i
            padded = padded or p[k] == 61
        memcpy(self.tail + self.tail_len, p + i, rest)
        self.tail_len += rest
        self.tail_padded = padded
        self.consumed += m
        if q == NULL:
            return n
        # The closing quote: the value is complete.
        if self.tail_len:
            if self.tail_len != 4 or not self.decode(self.tail, 4):
                self.destream(data)
                return m
            self.tail_len = 0
        self.streaming = False
        self.spans[B64_KEYS[ROUTED_KEY]] = (self.value_start, self.value_start)
        self.pos = self.value_start
        return m

    cdef bint decode(self, const char* p, Py_ssize_t n) except -1:
        """Append the decoding of n characters (whole quanta); False if they are not valid."""
        cdef Block block = self.block
        if DECODE_IN_PLACE and p[n - 1] != 61:
            block.reserve(n // 4 * 3)
            if fa_b64_decode(p, n, block.ptr + block.size):
                block.size += n // 4 * 3
                return True
        try:
            # A view of the caller's bytes, valid for this call: no copy before decoding.
            chunk = pybase64.b64decode(PyMemoryView_FromMemory(<char*>p, n, PyBUF_READ), validate=True)
        except ValueError:
            return False
        self.block.append(chunk)
        return True

    cdef Py_ssize_t destream(self, bytearray data) except -1:
        """Put the exact original characters back at the end of data; stop streaming."""
        cdef bytes original
        if self.block is not None and self.block.size:
            # Whole unpadded quanta re-encode to exactly the characters they came from.
            original = pybase64.b64encode(memoryview(self.block)[: self.block.size])
            _bytearray_extend(data, original)
        if self.tail_len:
            _bytearray_extend(data, PyBytes_FromStringAndSize(self.tail, self.tail_len))
        self.consumed = 0
        self.tail_len = 0
        self.block = None
        self.streaming = False
        self.off = True
        return 0

    cdef bytes original(self, bytearray data):
        """The event bytes as received (rare: the placeholder check failed)."""
        cdef Py_ssize_t at = self.value_start
        encoded = pybase64.b64encode(memoryview(self.block)[: self.block.size])
        return bytes(data[:at]) + encoded + bytes(data[at:])


cdef int _bytearray_extend(bytearray data, bytes more) except -1:
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(data)
    cdef Py_ssize_t n = len(more)
    PyByteArray_Resize(data, old + n)
    memcpy(PyByteArray_AS_STRING(data) + old, PyBytes_AS_STRING(more), n)
    return 0


cdef Py_ssize_t _expected_bytes(const char* buf, Py_ssize_t n, object expert_shape) except -1:
    """The decoded routed-experts size, from the prompt_tokens and completion_tokens that SGLang
    writes before it, or 0 when unknown: the Block then grows as it goes."""
    cdef Py_ssize_t at, prompt, completion
    if expert_shape is None:
        return 0
    at = rfind_bytes(buf, n, b'"prompt_tokens":', 16)
    prompt = read_uint_at(buf, n, at + 16) if at >= 0 else -1
    at = rfind_bytes(buf, n, b'"completion_tokens":', 20)
    completion = read_uint_at(buf, n, at + 20) if at >= 0 else -1
    if prompt < 0 or completion < 0 or prompt + completion < 1:
        return 0
    size = (prompt + completion - 1) * expert_shape[0] * expert_shape[1] * 4  # Python ints: no overflow
    return size if size <= (1 << 32) else 0  # larger (or hostile) sizes grow as they arrive


def _stream_after_bytes(n=None):
    """Test and debugging hook: the event size at which the streamed scan starts (returns the old
    value; a huge n turns streaming off, a small one makes every event take it)."""
    global STREAM_AFTER_BYTES
    old = STREAM_AFTER_BYTES
    if n is not None:
        STREAM_AFTER_BYTES = n
    return old


def _decode_in_place(on=None):
    """Test and debugging hook: whether whole quanta go through fastaccum's AVX2 loop (the default
    where the CPU has AVX2) rather than pybase64 (returns the old value; never on without AVX2)."""
    global DECODE_IN_PLACE
    old = DECODE_IN_PLACE
    if on is not None:
        DECODE_IN_PLACE = bool(on) and fa_b64_simd
    return old


def _b64_decode(const unsigned char[::1] text not None, bint simd=True):
    """Test hook: the streamed decoder on whole quanta (None where it refuses). simd=False runs
    the plain loop; B64_SIMD says whether simd=True reaches the AVX2 loop on this CPU."""
    cdef Py_ssize_t n = text.shape[0]
    if n % 4:
        raise ValueError("whole quanta only")
    out = PyBytes_FromStringAndSize(NULL, n // 4 * 3)
    cdef const unsigned char* src = &text[0] if n else <const unsigned char*>b""
    if simd:
        ok = fa_b64_decode(<const char*>src, n, PyBytes_AS_STRING(out))
    else:
        ok = fa_b64_decode_plain(src, n, <unsigned char*>PyBytes_AS_STRING(out))
    return out if ok else None


B64_SIMD = bool(fa_b64_simd)
