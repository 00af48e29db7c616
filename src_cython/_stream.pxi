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
        cdef Py_ssize_t i = (4 - self.tail_len) & 3  # characters completing a partial quantum
        cdef Py_ssize_t whole = (n - offset - i) // 4 * 4
        p += offset
        n -= offset
        # Most pieces lie wholly inside the value. Decoding their whole quanta before any quote
        # search reads each piece once instead of twice; the decoder refuses the piece that holds
        # the closing quote (or anything else unusual), which then takes the search below.
        if whole > 0 and not self.tail_padded and p[i + whole - 1] != 61 and _plain_chars(p, i):
            if i:
                memcpy(self.tail + self.tail_len, p, i)
                self.tail_len = 4
                if not self.decode(self.tail, 4):
                    self.destream(data)
                    return i
                self.tail_len = 0
                self.consumed += i
            if self.decode(p + i, whole):
                self.consumed += whole
                i += whole
            return i + self._take_searched(data, p + i, n - i)
        return self._take_searched(data, p, n)

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


cdef inline bint _plain_chars(const char* p, Py_ssize_t n):
    """No quote, '=', CR or LF in p[:n] (the decoder judges the rest)."""
    cdef Py_ssize_t k
    for k in range(n):
        if p[k] == 34 or p[k] == 61 or p[k] == 10 or p[k] == 13:
            return False
    return True


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
