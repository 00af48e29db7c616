"""Streamed base64 (compiled twin only): a large event's base64 values taken while it arrives.

The replay values of a terminal event (routed_experts, indexer_topk) can be hundreds of MB of
base64 in one line. Once an event grows past the framer's streaming threshold, the framer runs
the span scan of fastaccum._core.spans.cut_b64_spans while the bytes arrive; inside a replay value it
decodes whole base64 quanta of each piece into a Block instead of holding the line. Anything
unusual (a backslash, padding before the end, a bad character, the line ending inside the
value) puts the exact original bytes back into the event ("de-streaming") and the event takes
the ordinary path, so results and errors stay identical to the pure twin's. There is no such
path in fastaccum._py.
"""

from cpython.buffer cimport PyBUF_READ
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.memoryview cimport PyMemoryView_FromMemory
from libc.string cimport memchr, memcmp, memcpy

from fastaccum._cy.fa_base64 cimport fa_b64_decode, fa_b64_decode_plain, fa_b64_setup, fa_b64_simd
from fastaccum._cy.fa_bytes cimport fa_find_bytes, fa_rfind_bytes
from fastaccum._cy.fa_mman cimport fa_advise_huge, fa_map, fa_remap, fa_unmap

from fastaccum._cy.buffers cimport export_bytes
from fastaccum._cy.fields cimport read_uint_at
from fastaccum._cy.framing cimport ValueStream

import pybase64

from fastaccum._core.policy import B64_KEYS

# Whole unpadded quanta are decoded straight into a Block by fa_base64.h's AVX2 loop where the CPU
# has it: a routed-experts value arrives as hundreds of MB of base64, and decoding into a new bytes
# object first (pybase64's only output) costs one more write and read of every decoded byte.
# Without AVX2 a plain table loop would be slower than pybase64's own vector code, so there
# pybase64 decodes everything.
fa_b64_setup()


cdef bint simd_decoder() noexcept:
    # fa_b64_simd is static in fa_base64.h: only this module's copy was set up.
    return fa_b64_simd


cdef Py_ssize_t ROUTED_KEY = B64_KEYS.index("routed_experts")
cdef Py_ssize_t INDEXER_KEY = B64_KEYS.index("indexer_topk")
cdef Py_ssize_t BLOCK_MIN_BYTES = 16 << 20


cdef class Block:
    """Decoded bytes in an anonymous mapping (huge pages where the kernel allows: a 100 MB
    array faults 50 times, not 25,000). Exports a writable byte buffer once complete."""

    def __dealloc__(self):
        if self.ptr != NULL:
            fa_unmap(self.ptr, self.capacity)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t needed = self.size + extra
        cdef Py_ssize_t grown
        cdef void* memory
        if needed <= self.capacity:
            return 0
        grown = max(needed, 2 * self.capacity, BLOCK_MIN_BYTES)
        memory = NULL
        if self.ptr != NULL:
            memory = fa_remap(self.ptr, self.capacity, grown)  # Linux: moves pages, copies nothing
        if memory == NULL:
            memory = fa_map(grown)
            if memory == NULL:
                raise MemoryError()
            if self.ptr != NULL:
                memcpy(memory, self.ptr, self.size)
                fa_unmap(self.ptr, self.capacity)
        fa_advise_huge(memory, grown)
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


cdef tuple _QUOTED = tuple(b'"' + key.encode() for key in B64_KEYS)


cdef Py_ssize_t _key_before(const char* buf, Py_ssize_t at, dict spans) except -2:
    """Index in B64_KEYS of the key (not yet taken) whose quoted name ends at ``at``, or -1."""
    cdef Py_ssize_t k, m
    cdef bytes quoted
    for k in range(len(_QUOTED)):
        quoted = <bytes>_QUOTED[k]
        m = len(quoted)
        if at - m >= 0 and memcmp(buf + at - m, <const char*>quoted, m) == 0 and B64_KEYS[k] not in spans:
            return k
    return -1


cdef class SpanScan(ValueStream):
    """fastaccum._core.spans.cut_b64_spans' forward scan, run while an event's bytes arrive (state of one event); it
    streams the replay values (``streaming``: one now), and ``off`` means de-streamed."""

    def __cinit__(self, expert_shape=None, indexer_shape=None, bint own_decoder=True):
        self.spans = {}
        self.blocks = {}
        self.starts = {}
        self.expert_shape = expert_shape
        self.indexer_shape = indexer_shape
        self.own_decoder = own_decoder and fa_b64_simd

    cdef int advance(self, bytearray data, bint at_end=False) except -1:
        """Scan the newly arrived data; start streaming at an open replay value (not
        ``at_end``: then the event is complete and an open value simply ends the scan)."""
        cdef const char* buf = PyByteArray_AS_STRING(data)
        cdef Py_ssize_t n = PyByteArray_GET_SIZE(data)
        cdef Py_ssize_t at, start, end, k
        while not self.off and not self.streaming:
            at = fa_find_bytes(buf, n, b'":"', 3, self.pos)
            if at < 0:
                self.pos = max(self.pos, n - 2)  # a match may straddle the next piece
                return 0
            k = _key_before(buf, at, self.spans)
            if k < 0:
                self.pos = at + 1
                continue
            start = at + 3
            end = fa_find_bytes(buf, n, b'"', 1, start)
            if end < 0:
                if at_end:
                    return 0
                if k != ROUTED_KEY and k != INDEXER_KEY:
                    self.pos = at  # look again when the value is complete
                    return 0
                self.value_start = start
                self.key = k
                self.streaming = True
                self.block = Block()
                self.block.reserve(_expected_bytes(buf, start, self.expert_shape if k == ROUTED_KEY else self.indexer_shape))
                rest = PyBytes_FromStringAndSize(buf + start, n - start)
                PyByteArray_Resize(data, start)
                used = self.take(data, rest, 0, len(rest))
                if used < len(rest):  # de-streamed: the rest goes back as it came
                    _bytearray_extend(data, rest[used:])
                return 0
            if fa_find_bytes(buf, end, b"\\", 1, start) < 0:
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
        key = B64_KEYS[self.key]
        self.spans[key] = (self.value_start, self.value_start)
        self.blocks[key] = self.block
        self.starts[key] = self.value_start
        self.block = None
        self.pos = self.value_start
        return m

    cdef bint decode(self, const char* p, Py_ssize_t n) except -1:
        """Append the decoding of n characters (whole quanta); False if they are not valid."""
        cdef Block block = self.block
        if self.own_decoder and p[n - 1] != 61:
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
        """Put the exact original characters back (the value being streamed at the end of data,
        the values streamed whole where they were); stop streaming."""
        cdef bytes original
        if self.block is not None and self.block.size:
            # Whole unpadded quanta re-encode to exactly the characters they came from.
            original = pybase64.b64encode(memoryview(self.block)[: self.block.size])
            _bytearray_extend(data, original)
        if self.tail_len:
            _bytearray_extend(data, PyBytes_FromStringAndSize(self.tail, self.tail_len))
        self._restore(data)
        for key in self.blocks:
            del self.spans[key]
        self.blocks.clear()
        self.starts.clear()
        self.consumed = 0
        self.tail_len = 0
        self.block = None
        self.streaming = False
        self.off = True
        return 0

    cdef int _restore(self, bytearray data) except -1:
        """The values streamed whole, re-encoded into data where they were (the last first, so the
        earlier positions still hold)."""
        cdef Block block
        for key, at in sorted(self.starts.items(), key=lambda item: item[1], reverse=True):
            block = <Block>self.blocks[key]
            data[at:at] = pybase64.b64encode(memoryview(block)[: block.size])
        return 0

    def original(self, bytearray data):
        """The event bytes as received (rare: the placeholder check failed)."""
        restored = bytearray(data)
        self._restore(restored)
        return bytes(restored)


cdef int _bytearray_extend(bytearray data, bytes more) except -1:
    cdef Py_ssize_t old = PyByteArray_GET_SIZE(data)
    cdef Py_ssize_t n = len(more)
    PyByteArray_Resize(data, old + n)
    memcpy(PyByteArray_AS_STRING(data) + old, PyBytes_AS_STRING(more), n)
    return 0


cdef Py_ssize_t _expected_bytes(const char* buf, Py_ssize_t n, object expert_shape) except -1:
    """The decoded size of a replay value of rows x ``expert_shape`` (layers, topk), from the
    prompt_tokens and completion_tokens that SGLang writes before it, or 0 when unknown: the Block
    then grows as it goes. (A routed_experts_start_len only makes it smaller.)"""
    cdef Py_ssize_t at, prompt, completion
    if expert_shape is None:
        return 0
    at = fa_rfind_bytes(buf, n, b'"prompt_tokens":', 16)
    prompt = read_uint_at(buf, n, at + 16) if at >= 0 else -1
    at = fa_rfind_bytes(buf, n, b'"completion_tokens":', 20)
    completion = read_uint_at(buf, n, at + 20) if at >= 0 else -1
    if prompt < 0 or completion < 0 or prompt + completion < 1:
        return 0
    size = (prompt + completion - 1) * expert_shape[0] * expert_shape[1] * 4  # Python ints: no overflow
    return size if size <= (1 << 32) else 0  # larger (or hostile) sizes grow as they arrive


def _b64_decode(bytes text not None, bint simd=True):
    """Test hook: the streamed decoder on whole quanta (None where it refuses). simd=False runs
    the plain loop; B64_SIMD says whether simd=True reaches the AVX2 loop on this CPU."""
    cdef Py_ssize_t n = len(text)
    if n % 4:
        raise ValueError("whole quanta only")
    out = PyBytes_FromStringAndSize(NULL, n // 4 * 3)
    cdef const unsigned char* src = <const unsigned char*>PyBytes_AS_STRING(text)
    if simd:
        ok = fa_b64_decode(<const char*>src, n, PyBytes_AS_STRING(out))
    else:
        ok = fa_b64_decode_plain(src, n, <unsigned char*>PyBytes_AS_STRING(out))
    return out if ok else None


B64_SIMD = bool(fa_b64_simd)
