"""StreamAccumulator: SGLang /generate events to arrays, validating cumulative/incremental lengths.

This module holds the per-read and per-event work; the class's once-per-stream face (constructor,
finish(), snapshot(), properties) is fastaccum._core.base.AccumulatorBase, the per-stream rules come
from fastaccum._core.policy, and the rules themselves are in docs/core.md. The compiled twin's
src_cython/accumulator.pyx mirrors it function by function.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from fastaccum._core.base import AccumulatorBase
from fastaccum._core.dialects import TOKEN_IDS, VLLM, chunk_fields, read_chunk
from fastaccum._core.messages import broken, changed_token
from fastaccum._core.policy import (
    ABSENT,
    ARRAY_KEYS,
    VERSION_KEY,
    VERSION_WINDOW,
    ParsedEvent,
    echo_start,
    end_event,
    event_counts,
    read_event,
    refused_feed,
)
from fastaccum._core.spans import cut_b64_spans
from fastaccum._py.buffers import Buffer
from fastaccum._py.chunked import ChunkedDecoder
from fastaccum._py.fields import Event, read_id_list, read_logprob_list, read_uint_at
from fastaccum._py.framing import SseFramer
from fastaccum._py.lengths import CUMULATIVE, check_logprobs, check_total, event_mode, text_after
from fastaccum.errors import StreamError
from fastaccum.result import StreamResult

__all__ = ("StreamAccumulator", "accumulate")

# Cumulative events after this many full parses are only light-checked (docs/core.md).
_FULL_PARSES_BEFORE_LIGHT = 2
_LIGHT_PREFIXES = (b'{"text":', b'{"output_ids":')
_FINISH_KEY = b'"finish_reason":'
_COMPLETION_KEY = b'"completion_tokens":'


# ---- accumulator ------------------------------------------------------------------------------


class StreamAccumulator(AccumulatorBase):
    """Feeds raw SSE bytes of one SGLang /generate stream and accumulates tokens into arrays."""

    _framer: SseFramer
    _chunks: ChunkedDecoder | None
    _ids: Buffer
    _logprobs: Buffer

    def _start(self, max_event_bytes: int | None) -> None:
        self._framer = SseFramer(max_event_bytes, self._dispatch)
        self._ids = Buffer(np.int32)
        self._logprobs = Buffer(np.float64)
        self._has_logprobs = None  # decided by the first event
        self._text_parts = None  # None: no event carried text
        self._top_p = None  # None: no event carried top-p
        self._top_p_rows = None
        self._replay = None
        self._finish_reason = None
        self._meta = {}
        self._events = 0  # JSON events applied or light-checked
        self._full_parses = 0
        self._reported = 0  # newest total the server reported
        self._pending = None
        self._pending_index = -1
        self._done = False  # [DONE] seen
        self._chunks = None  # feed_chunked()'s decoder, made on first use

    # ---- input --------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview, /) -> int:
        """Frame and apply ``data``; return the number of events it completed ([DONE] included)."""
        return self._feed(data, None, "feed")

    def feed_chunked(self, data: bytes | bytearray | memoryview, /) -> int:
        """Like ``feed()``, for the body of an HTTP/1.1 response with ``Transfer-Encoding:
        chunked``: undo the chunked framing, then frame and apply; ``chunked_ended`` tells when
        the last chunk has been read. Do not mix with ``feed()`` on one accumulator."""
        if self._chunks is None:
            self._chunks = ChunkedDecoder()
        return self._feed(data, self._chunks, "feed_chunked")

    def _feed(self, data: bytes | bytearray | memoryview, chunks: ChunkedDecoder | None, method: str) -> int:
        """One read, framed and applied (de-chunked first when ``chunks`` is given); the first
        error is kept."""
        if self._error is not None or self._result is not None or not isinstance(data, (bytes, bytearray, memoryview)):
            raise refused_feed(data, self._error, self._result is not None, method)
        buf = bytes(data)
        try:
            if chunks is None:
                return self._framer.feed(buf, 0, len(buf))
            return chunks.feed(buf, len(buf), self._framer)
        except StreamError as exc:
            self._error = exc
            raise

    # ---- events -------------------------------------------------------------------------

    def _dispatch(self, data: bytearray, index: int) -> None:
        is_done = data == b"[DONE]"
        if self._done or is_done or (self._finish_reason is not None and self._dialect is not VLLM):
            end_event(
                index, done=self._done, finished=self._finish_reason is not None, is_done=is_done, dialect=self._dialect
            )
            self._done = True
            return
        if self._mode == CUMULATIVE and self._full_parses >= _FULL_PARSES_BEFORE_LIGHT:
            if self._light_check(data, index):
                return
        if self._pending is not None:
            # The kept event is validated before the stream moves past it: an echo is reconciled
            # against every token held, and an error in the kept event is not lost.
            self._apply_pending()
        self._apply(data, index, light_checked=False)

    def _apply_pending(self) -> None:
        assert self._pending is not None
        self._apply(self._pending, self._pending_index, light_checked=True)

    def _light_check(self, data: bytearray, index: int) -> bool:
        """Accept a non-terminal cumulative event by its reported total alone (docs/core.md)."""
        if not data.startswith(_LIGHT_PREFIXES):
            return False
        at = data.find(_FINISH_KEY)
        if at < 0 or data[at + len(_FINISH_KEY) : at + len(_FINISH_KEY) + 4] != b"null":
            return False
        if self._version_changed(data, at):
            return False
        at = data.rfind(_COMPLETION_KEY)
        if at < 0:
            return False
        total = read_uint_at(data, at + len(_COMPLETION_KEY))
        if total < 0:
            return False
        check_total(index, total, self._reported)
        self._pending = data
        self._pending_index = index
        self._reported = total
        self._events += 1
        return True

    def _version_changed(self, data: bytearray, at: int) -> bool:
        """The event names a weight_version other than the newest one, or one this check cannot
        read plainly, within VERSION_WINDOW of its finish_reason key at ``at``."""
        key = data.find(VERSION_KEY, at, at + VERSION_WINDOW)
        if key < 0:
            return False
        start = key + len(VERSION_KEY) + 1
        end = data.find(b'"', start, start + VERSION_WINDOW)
        if data[start - 1 : start] != b'"' or end < 0:
            return True
        raw = data[start:end]
        return b"\\" in raw or self._version is None or raw != self._version.encode()

    def _apply(self, data: bytearray, index: int, *, light_checked: bool) -> None:
        """Parse one event and read its fields, then hand it to _commit (nothing half-applied).
        ``light_checked``: the event was counted when the light check kept it."""
        json_bytes, spans = cut_b64_spans(data)
        if self._dialect is VLLM:
            self._commit(*self._read_chunk(data, index, json_bytes, spans), light_checked=light_checked)
            return
        parsed = read_event(index, data, json_bytes, spans, dialect=self._dialect)
        obj, meta = parsed.obj, parsed.meta
        output_ids = read_id_list(index, "output_ids", obj["output_ids"]) if "output_ids" in obj else None
        logprob_ids = logprobs = None
        if "output_token_logprobs" in meta:
            logprob_ids, logprobs = read_logprob_list(index, meta["output_token_logprobs"])
        check_logprobs(index, self._has_logprobs, logprob_ids is not None)
        completion, lp_length, prompt, text = event_counts(index, obj, meta)
        event = Event(index, output_ids, logprob_ids, logprobs, completion, lp_length, prompt, text)
        self._commit(event, parsed, light_checked=light_checked)

    def _read_chunk(
        self, data: bytearray, index: int, json_bytes: bytes | bytearray, spans: dict[str, tuple[int, int]]
    ) -> tuple[Event, ParsedEvent]:
        """A vLLM chunk read into the Event record SGLang's events fill (fastaccum._core.dialects)."""
        parsed = read_chunk(index, data, json_bytes, spans, None, self._meta, finished=self._finish_reason is not None)
        token_ids, logprob_ids, logprobs, completion, prompt, text = chunk_fields(
            index, parsed, held=self._ids.size, had_logprobs=self._has_logprobs
        )
        output_ids = read_id_list(index, TOKEN_IDS, token_ids)
        check_logprobs(index, self._has_logprobs, logprob_ids is not None)
        return Event(index, output_ids, logprob_ids, logprobs, completion, ABSENT, prompt, text), parsed

    def _commit(self, event: Event, parsed: ParsedEvent, *, light_checked: bool) -> None:
        """Validate the event against the stream (lengths, text, top-p, routed experts), then
        commit it."""
        index = event.event_index
        held = self._ids.size
        new_mode = self._mode
        listed = event.logprob_ids if event.logprob_ids is not None else event.output_ids
        if parsed.echo:
            start = echo_start(
                index,
                mode=new_mode,
                held=held,
                completion=event.completion_tokens,
                logprob_ids=len(event.logprob_ids) if event.logprob_ids is not None else ABSENT,
                output_ids=len(event.output_ids) if event.output_ids is not None else ABSENT,
            )
            if start < 0:
                start = len(listed) if listed is not None else 0
            else:
                assert listed is not None  # echo_start found the tokens in it
                self._check_prefix(index, listed[start - held :])
        else:
            if listed is None:
                raise broken(index, "no_tokens")
            if event.output_ids is not None and event.output_ids != listed:
                raise broken(index, "ids_disagree")
            new_mode = event_mode(
                index, new_mode, held, len(listed), event.logprobs_length, event.completion_tokens, self._reported
            )
            start = 0
            if new_mode == CUMULATIVE:
                self._check_prefix(index, listed)
                start = held
        new_ids = listed if listed is not None else []
        new_logprobs = event.logprobs
        if start:  # the event repeats tokens held (cumulative, or an echo): slicing copies, so only then
            new_ids = new_ids[start:]
            if new_logprobs is not None:
                new_logprobs = new_logprobs[start:]

        top_p = replay = None
        if self._top_p_rows is not None or not ARRAY_KEYS.isdisjoint(parsed.meta):  # rare: skip the call
            top_p, replay = self._read_arrays(
                parsed,
                index=index,
                mode=new_mode,
                held=held,
                added=len(new_ids),
                prompt=event.prompt_tokens,
                completion=event.completion_tokens,
            )

        # ---- commit: nothing below can fail on valid input ----
        self._ids.extend(new_ids)
        if new_logprobs is not None:
            self._logprobs.extend(new_logprobs)
        self._has_logprobs = event.logprob_ids is not None
        self._text_parts = text_after(self._text_parts, new_mode, parsed.echo, event.text)
        self._commit_parsed(parsed.meta, parsed.finish, top_p, replay, held)
        self._mode = new_mode
        if not light_checked:
            self._events += 1
        self._full_parses += 1
        self._reported = max(self._reported, held + len(new_ids))
        self._pending = None

    def _check_prefix(self, index: int, full_ids: list[int]) -> None:
        at = self._ids.equals_prefix(full_ids)
        if at >= 0:
            raise changed_token(index, at, self._ids[at], full_ids[at])


def accumulate(pieces: Iterable[bytes | bytearray | memoryview], /, **kwargs: Any) -> StreamResult:
    """Feed every piece to a new StreamAccumulator(**kwargs), then finish()."""
    return StreamAccumulator(**kwargs)._feed_all(pieces)
