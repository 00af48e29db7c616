# HTTP/1.1 chunked transfer decoding in front of the SSE framer: one call per socket read.
# The states and messages are those of fastaccum._py.chunked; each span of chunk data goes to
# SseFramer.feed (the C-level path of feed()), so a read costs no Python call per chunk.

from libc.stdint cimport int64_t

from fastaccum._messages import bad_chunk

cdef enum:
    # Chunked-body states, numbered as in fastaccum._py.chunked.
    CH_SIZE_START = 0
    CH_SIZE = 1
    CH_SIZE_SPACE = 2
    CH_EXTENSION = 3
    CH_SIZE_LF = 4
    CH_DATA = 5
    CH_DATA_CR = 6
    CH_DATA_LF = 7
    CH_TRAILER_START = 8
    CH_TRAILER = 9
    CH_TRAILER_LF = 10
    CH_END_LF = 11
    CH_DONE = 12
    # Extensions and trailers are skipped, never buffered; the cap stops a line that never ends.
    CH_LINE_LIMIT = 8192

# 2**60 at most: int64 arithmetic cannot overflow.
cdef int64_t CH_SIZE_SHIFT_LIMIT = (<int64_t>1) << 56


cdef inline int hex_value(unsigned char byte) noexcept:
    if 48 <= byte <= 57:
        return byte - 48
    if 97 <= byte <= 102:
        return byte - 97 + 10
    if 65 <= byte <= 70:
        return byte - 65 + 10
    return -1


cdef class ChunkedDecoder:
    """Undoes ``Transfer-Encoding: chunked`` (RFC 9112, section 7.1) incrementally and hands each
    span of chunk data to the SSE framer as it arrives: chunk boundaries need not match events.

    Chunk extensions and trailer fields are checked for line structure and ignored. Any byte the
    grammar does not allow raises ``StreamFormatError``; so do bytes after the last chunk.
    """

    cdef int state
    cdef int64_t remaining  # data bytes left in the current chunk
    cdef Py_ssize_t line  # bytes of the current size or trailer line
    cdef readonly bint ended  # the last chunk and the trailer section have been read

    cdef Py_ssize_t feed(self, SseFramer framer, const unsigned char* buf, Py_ssize_t n) except -1:
        """Decode ``buf``; frame its chunk data; return the number of events that completed."""
        cdef Py_ssize_t pos = 0, count = 0, take
        cdef unsigned char byte
        cdef int state, digit
        while pos < n:
            state = self.state
            if state == CH_DATA:
                take = n - pos
                if self.remaining < take:
                    take = <Py_ssize_t>self.remaining
                self.remaining -= take
                if self.remaining == 0:
                    self.state = CH_DATA_CR
                count += framer.feed(buf + pos, take)
                pos += take
                continue
            byte = buf[pos]
            pos += 1
            if state == CH_SIZE_START or state == CH_SIZE:
                digit = hex_value(byte)
                if digit >= 0:
                    if self.remaining >= CH_SIZE_SHIFT_LIMIT:
                        raise bad_chunk(framer.events, state, -1)
                    self.remaining = self.remaining * 16 + digit
                    self.state = CH_SIZE
                elif state == CH_SIZE_START:
                    raise bad_chunk(framer.events, state, byte)
                else:
                    self._after_size(byte, framer)
                self._count_line(framer)
            elif state == CH_SIZE_SPACE:
                self._after_size(byte, framer)
                self._count_line(framer)
            elif state == CH_EXTENSION or state == CH_TRAILER:
                if byte == 13:
                    self.state = CH_SIZE_LF if state == CH_EXTENSION else CH_TRAILER_LF
                elif byte == 10:
                    raise bad_chunk(framer.events, state, byte)
                else:
                    self._count_line(framer)
            elif state == CH_SIZE_LF:
                if byte != 10:
                    raise bad_chunk(framer.events, state, byte)
                self.line = 0
                self.state = CH_DATA if self.remaining else CH_TRAILER_START
            elif state == CH_DATA_CR:
                if byte != 13:
                    raise bad_chunk(framer.events, state, byte)
                self.state = CH_DATA_LF
            elif state == CH_DATA_LF:
                if byte != 10:
                    raise bad_chunk(framer.events, state, byte)
                self.state = CH_SIZE_START
            elif state == CH_TRAILER_START:
                if byte == 13:
                    self.state = CH_END_LF
                elif byte == 10:
                    raise bad_chunk(framer.events, state, byte)
                else:
                    self.state = CH_TRAILER
                    self._count_line(framer)
            elif state == CH_TRAILER_LF:
                if byte != 10:
                    raise bad_chunk(framer.events, state, byte)
                self.line = 0
                self.state = CH_TRAILER_START
            elif state == CH_END_LF:
                if byte != 10:
                    raise bad_chunk(framer.events, state, byte)
                self.state = CH_DONE
                self.ended = True
            else:
                raise bad_chunk(framer.events, state, byte)
        return count

    cdef int _after_size(self, unsigned char byte, SseFramer framer) except -1:
        if byte == 59:  # ';'
            self.state = CH_EXTENSION
        elif byte == 13:
            self.state = CH_SIZE_LF
        elif byte == 32 or byte == 9:
            self.state = CH_SIZE_SPACE
        else:
            raise bad_chunk(framer.events, self.state, byte)
        return 0

    cdef int _count_line(self, SseFramer framer) except -1:
        self.line += 1
        if self.line > CH_LINE_LIMIT:
            raise bad_chunk(framer.events, self.state, -2)
        return 0
