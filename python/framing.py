"""SSE framing on raw bytes: lines end at CR, LF or CRLF only; a blank line dispatches an event."""

from __future__ import annotations

from collections.abc import Callable

from fastaccum._core.messages import too_large

__all__ = ("SseFramer",)

_CR = 0x0D
_LF = 0x0A
_SPACE = 0x20
_BOM = b"\xef\xbb\xbf"
_DATA = b"data:"

# Line states: the field name is still unknown (at most 5 bytes, plus a BOM, are held to decide);
# a data line right after its colon (one space may follow); inside a data value; a line to ignore.
_HEAD = 0
_DATA_SPACE = 1
_DATA_VALUE = 2
_SKIP = 3


class SseFramer:
    """Splits a byte stream into SSE events and hands each event's joined data to ``dispatch(data,
    index)`` (the accumulator).

    Data bytes are appended once to ``data`` as they arrive (no re-scan, no per-piece re-copy);
    other lines (comments, ``event:``, ``id:``, unknown fields) are never buffered.
    """

    def __init__(self, max_event_bytes: int | None, dispatch: Callable[[bytearray, int], None]) -> None:
        self.max_event_bytes = max_event_bytes
        self.data = bytearray()  # the joined data of the event being read
        self.has_data = False  # at least one data line in the event being read
        self.events = 0  # data events dispatched so far
        self._head = bytearray()
        self._state = _HEAD
        self._after_cr = False  # the previous piece ended with CR: a leading LF is part of it
        self._at_start = True  # a BOM may still come
        self._dispatch = dispatch

    def feed(self, buf: bytes, pos: int, n: int) -> int:
        """Frame ``buf[pos:n]``; dispatch each completed event; return their count."""
        count = 0
        if self._after_cr and pos < n:
            self._after_cr = False
            if buf[pos] == _LF:
                pos += 1
        while pos < n:
            lf = buf.find(b"\n", pos, n)
            cr = buf.find(b"\r", pos, lf if lf >= 0 else n)
            end = cr if cr >= 0 else lf
            if end < 0:
                self._take(buf, pos, n)
                break
            self._take(buf, pos, end)
            pos = end + 1
            if buf[end] == _CR:
                if pos < n:
                    if buf[pos] == _LF:
                        pos += 1
                else:
                    self._after_cr = True
            count += self._end_line()
        return count

    @property
    def mid_event(self) -> bool:
        """Input so far stops inside an event (data seen but no blank line yet)."""
        return self.has_data or self._state in (_DATA_SPACE, _DATA_VALUE)

    # ---- lines ------------------------------------------------------------------------------

    def _take(self, buf: bytes, start: int, end: int) -> None:
        while start < end:
            state = self._state
            if state == _HEAD:
                start = self._take_head(buf, start, end)
            elif state == _DATA_SPACE:
                if buf[start] == _SPACE:
                    start += 1
                self._state = _DATA_VALUE
            elif state == _DATA_VALUE:
                self.data += buf[start:end]
                self._check_size()
                return
            else:
                return

    def _take_head(self, buf: bytes, start: int, end: int) -> int:
        """Collect the line's first bytes until its field is known; return where the value starts."""
        head = self._head
        while start < end:
            head.append(buf[start])
            start += 1
            if self._at_start:
                if len(head) <= 3 and _BOM.startswith(head):
                    if len(head) == 3:
                        head.clear()
                        self._at_start = False
                    continue
                self._at_start = False
            if head == _DATA:
                head.clear()
                self._begin_data_line()
                self._state = _DATA_SPACE
                return start
            if not _DATA.startswith(head):
                head.clear()
                self._state = _SKIP
                return end
        return start

    def _begin_data_line(self) -> None:
        if self.has_data:
            self.data.append(_LF)  # several data lines of one event join with LF
            self._check_size()
        self.has_data = True

    def _check_size(self) -> None:
        limit = self.max_event_bytes
        if limit is not None and len(self.data) > limit:
            raise too_large(self.events, limit)

    def _end_line(self) -> int:
        state = self._state
        self._state = _HEAD
        self._at_start = False
        if state != _HEAD:
            return 0
        head = self._head
        if head == b"data":  # a bare "data" field: an empty value
            head.clear()
            self._begin_data_line()
            return 0
        if head:  # an unknown field without a colon, such as "dat"
            head.clear()
            return 0
        if not self.has_data:  # a blank line with no data dispatches nothing
            return 0
        data = self.data
        index = self.events
        self.data = bytearray()
        self.has_data = False
        self.events = index + 1
        self._dispatch(data, index)
        return 1
