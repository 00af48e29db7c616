"""HTTP/1.1 chunked transfer decoding in front of the SSE framer: one call per socket read.

Written once for both twins: the pure twin runs this file as it is; the compiled twin compiles it
(as ``fastaccum._cy.chunked``) with ``src_cython/chunked.pxd``, which types the state, the fields
and the loop's locals, so the loop runs over a ``const unsigned char*`` in C with no Python call
per byte or per chunk. Keep it to integer arithmetic on ``buf[pos]`` and calls the ``.pxd``
declares: anything else would compile to Python calls in the loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastaccum._core.messages import bad_chunk

if TYPE_CHECKING:
    from fastaccum._py.framing import SseFramer as Framer

__all__ = ("ChunkedDecoder",)

_CR = 0x0D
_LF = 0x0A
_SEMICOLON = 0x3B
_EQUALS = 0x3D
_QUOTE = 0x22
_BACKSLASH = 0x5C
_SPACE = 0x20
_TAB = 0x09

# States (fastaccum._core.messages.bad_chunk names each, by number).
_SIZE_START = 0
_SIZE = 1
_SIZE_SPACE = 2  # whitespace after the size: only more of it, ';' or CR may follow
_EXT_NAME_START = 3  # after ';': whitespace, then a name
_SIZE_LF = 4
_DATA = 5
_DATA_CR = 6
_DATA_LF = 7
_TRAILER_START = 8
_TRAILER = 9
_TRAILER_LF = 10
_END_LF = 11
_DONE = 12
_EXT_NAME = 13
_EXT_AFTER_NAME = 14  # whitespace after a name: '=', ';' or CR may follow
_EXT_VALUE_START = 15  # after '=': whitespace, then a token or a quoted string
_EXT_TOKEN = 16
_EXT_QUOTED = 17
_EXT_QUOTED_PAIR = 18  # after a backslash inside the quotes
_EXT_AFTER_VALUE = 19

# Extensions and trailers are skipped, never buffered; the cap only stops a peer that never ends
# a line from holding the stream open while sending bytes.
_LINE_LIMIT = 8192
# 2**60 at most: far beyond any real chunk, and int64 arithmetic cannot overflow.
_SIZE_SHIFT_LIMIT = 1 << 56


def _hex_value(byte: int) -> int:
    if 0x30 <= byte <= 0x39:
        return byte - 0x30
    if 0x61 <= byte <= 0x66:
        return byte - 0x61 + 10
    if 0x41 <= byte <= 0x46:
        return byte - 0x41 + 10
    return -1


def _is_token(byte: int) -> bool:
    """A tchar of RFC 9110 (the characters of a token: chunk-extension names and plain values)."""
    return (
        0x30 <= byte <= 0x39
        or 0x41 <= byte <= 0x5A
        or 0x61 <= byte <= 0x7A
        or byte in b"!#$%&'*+-.^_`|~"  # compiled: a switch, not a search
    )


def _is_quoted_text(byte: int) -> bool:
    """qdtext: what a quoted string holds unescaped (no control character, quote or backslash)."""
    return byte == _TAB or 0x20 <= byte <= 0x7E and byte != _QUOTE and byte != _BACKSLASH or byte >= 0x80


class ChunkedDecoder:
    """Undoes ``Transfer-Encoding: chunked`` (RFC 9112, section 7.1) incrementally and hands each
    span of chunk data to the SSE framer as it arrives: chunk boundaries need not match events.

    Chunk extensions (``;name``, ``;name=token`` or ``;name="quoted"``, with whitespace around
    ``;`` and ``=``) are checked against their grammar and ignored; trailer fields are checked for
    line structure and ignored. Any byte the grammar does not allow raises ``StreamFormatError``
    at once; so do bytes after the last chunk.
    """

    def __init__(self) -> None:
        self.state = _SIZE_START
        self.remaining = 0  # data bytes left in the current chunk
        self.line = 0  # bytes of the current size or trailer line
        self.ended = False  # the last chunk and the trailer section have been read

    def feed(self, buf: bytes, n: int, framer: Framer) -> int:
        """Decode ``buf[:n]``; frame its chunk data; return the number of events that completed."""
        pos = 0
        count = 0
        while pos < n:
            state = self.state
            if state == _DATA:
                take = min(self.remaining, n - pos)
                self.remaining -= take
                if self.remaining == 0:
                    self.state = _DATA_CR
                count += framer.feed(buf, pos, pos + take)
                pos += take
                continue
            byte = buf[pos]
            pos += 1
            if state == _SIZE_START or state == _SIZE:
                digit = _hex_value(byte)
                if digit >= 0:
                    if self.remaining >= _SIZE_SHIFT_LIMIT:
                        raise bad_chunk(framer.events, state, -1)
                    self.remaining = self.remaining * 16 + digit
                    self.state = _SIZE
                elif state == _SIZE_START:
                    raise bad_chunk(framer.events, state, byte)
                else:
                    self._after_size(byte, framer)
                self._count_line(framer)
            elif state == _SIZE_SPACE:
                self._after_size(byte, framer)
                self._count_line(framer)
            elif state == _TRAILER:
                if byte == _CR:
                    self.state = _TRAILER_LF
                elif byte == _LF:
                    raise bad_chunk(framer.events, state, byte)
                else:
                    self._count_line(framer)
            elif state >= _EXT_NAME or state == _EXT_NAME_START:
                self._extension(byte, framer)
                self._count_line(framer)
            elif state == _SIZE_LF:
                if byte != _LF:
                    raise bad_chunk(framer.events, state, byte)
                self.line = 0
                self.state = _DATA if self.remaining else _TRAILER_START
            elif state == _DATA_CR:
                if byte != _CR:
                    raise bad_chunk(framer.events, state, byte)
                self.state = _DATA_LF
            elif state == _DATA_LF:
                if byte != _LF:
                    raise bad_chunk(framer.events, state, byte)
                self.state = _SIZE_START
            elif state == _TRAILER_START:
                if byte == _CR:
                    self.state = _END_LF
                elif byte == _LF:
                    raise bad_chunk(framer.events, state, byte)
                else:
                    self.state = _TRAILER
                    self._count_line(framer)
            elif state == _TRAILER_LF:
                if byte != _LF:
                    raise bad_chunk(framer.events, state, byte)
                self.line = 0
                self.state = _TRAILER_START
            elif state == _END_LF:
                if byte != _LF:
                    raise bad_chunk(framer.events, state, byte)
                self.state = _DONE
                self.ended = True
            else:
                raise bad_chunk(framer.events, state, byte)
        return count

    def _after_size(self, byte: int, framer: Framer) -> int:
        if byte == _SEMICOLON:
            self.state = _EXT_NAME_START
        elif byte == _CR:
            self.state = _SIZE_LF
        elif byte == _SPACE or byte == _TAB:
            self.state = _SIZE_SPACE
        else:
            raise bad_chunk(framer.events, self.state, byte)
        return 0

    def _extension(self, byte: int, framer: Framer) -> int:
        """One byte of the chunk extensions (RFC 9112, section 7.1.1): ``;`` name, then optionally
        ``=`` and a token or a quoted string, repeated; whitespace may surround ``;`` and ``=``."""
        state = self.state
        space = byte == _SPACE or byte == _TAB
        if state == _EXT_QUOTED:
            if byte == _QUOTE:
                self.state = _EXT_AFTER_VALUE
            elif byte == _BACKSLASH:
                self.state = _EXT_QUOTED_PAIR
            elif not _is_quoted_text(byte):  # a CR or LF here: the quote never closed
                raise bad_chunk(framer.events, state, byte)
            return 0
        if state == _EXT_QUOTED_PAIR:
            if not (space or 0x21 <= byte <= 0x7E or byte >= 0x80):
                raise bad_chunk(framer.events, state, byte)
            self.state = _EXT_QUOTED
            return 0
        if space:
            if state == _EXT_NAME:
                self.state = _EXT_AFTER_NAME
            elif state == _EXT_TOKEN:
                self.state = _EXT_AFTER_VALUE
            return 0
        if state == _EXT_NAME_START or state == _EXT_VALUE_START:
            if _is_token(byte):
                self.state = _EXT_NAME if state == _EXT_NAME_START else _EXT_TOKEN
            elif byte == _QUOTE and state == _EXT_VALUE_START:
                self.state = _EXT_QUOTED
            else:  # a bare ';' or '=' (CR included), or a character no token holds
                raise bad_chunk(framer.events, state, byte)
        elif (state == _EXT_NAME or state == _EXT_TOKEN) and _is_token(byte):
            pass
        elif byte == _EQUALS and (state == _EXT_NAME or state == _EXT_AFTER_NAME):
            self.state = _EXT_VALUE_START
        elif byte == _SEMICOLON:
            self.state = _EXT_NAME_START
        elif byte == _CR:
            self.state = _SIZE_LF
        else:
            raise bad_chunk(framer.events, state, byte)
        return 0

    def _count_line(self, framer: Framer) -> int:
        self.line += 1
        if self.line > _LINE_LIMIT:
            raise bad_chunk(framer.events, self.state, -2)
        return 0
