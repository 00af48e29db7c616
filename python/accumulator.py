"""StreamAccumulator: SGLang /generate events to arrays, validating cumulative/incremental lengths.

This module holds the per-read and per-event work; the class's once-per-stream face (constructor,
finish(), snapshot(), properties) is fastaccum._base.AccumulatorBase, the per-stream rules come
from fastaccum._policy, and the rules themselves are in docs/core.md. The compiled twin's
src_cython/accumulator.pxi mirrors it function by function.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fastaccum._base import AccumulatorBase
from fastaccum._messages import (
    broken,
    changed_token,
    length_decreased,
    lengths_disagree,
    logprobs_switched,
    mode_mismatch,
)
from fastaccum._policy import (
    ARRAY_KEYS,
    echo_start,
    echo_text,
    end_event,
    event_counts,
    feed_all,
    read_arrays,
    read_event,
    refused_feed,
)
from fastaccum._py.buffers import Float64Buffer, Int32Buffer
from fastaccum._py.chunked import ChunkedDecoder
from fastaccum._py.fields import read_id_list, read_logprob_list, read_uint_at
from fastaccum._py.framing import SseFramer
from fastaccum._spans import cut_b64_spans
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

    def _start(self, max_event_bytes: int | None) -> None:
        self._framer = SseFramer(max_event_bytes)
        self._ids = Int32Buffer()
        self._logprobs = Float64Buffer()
        self._has_logprobs = None  # decided by the first event
        self._text_parts = None  # None: no event carried text
        self._top_p = None  # None: no event carried top-p
        self._top_p_rows = None
        self._routed = None
        self._finish_reason = None
        self._meta = {}
        self._events = 0  # JSON events applied or light-checked
        self._full_parses = 0
        self._reported = 0  # newest total the server reported
        self._pending = None
        self._pending_index = -1
        self._done = False  # [DONE] seen
        self._chunks: ChunkedDecoder | None = None  # feed_chunked()'s decoder, made on first use

    # ---- input --------------------------------------------------------------------------

    def feed(self, data: bytes | bytearray | memoryview, /) -> int:
        """Frame and apply ``data``; return the number of events it completed ([DONE] included)."""
        if self._error is not None or self._result is not None or not isinstance(data, (bytes, bytearray, memoryview)):
            raise refused_feed(data, self._error, self._result is not None)
        return self._feed(bytes(data), None)

    def feed_chunked(self, data: bytes | bytearray | memoryview, /) -> int:
        """Like ``feed()``, for the body of an HTTP/1.1 response with ``Transfer-Encoding:
        chunked``: undo the chunked framing, then frame and apply; ``chunked_ended`` tells when
        the last chunk has been read. Do not mix with ``feed()`` on one accumulator."""
        if self._error is not None or self._result is not None or not isinstance(data, (bytes, bytearray, memoryview)):
            raise refused_feed(data, self._error, self._result is not None, "feed_chunked")
        if self._chunks is None:
            self._chunks = ChunkedDecoder()
        return self._feed(bytes(data), self._chunks)

    def _feed(self, data: bytes, chunks: ChunkedDecoder | None) -> int:
        """One read, framed and applied (de-chunked first when ``chunks`` is given); the first
        error is kept."""
        try:
            if chunks is None:
                return self._framer.feed(data, self._dispatch)
            return chunks.feed(data, self._framer, self._dispatch)
        except StreamError as exc:
            self._error = exc
            raise

    # ---- events -------------------------------------------------------------------------

    def _dispatch(self, data: bytearray, index: int) -> None:
        is_done = data == b"[DONE]"
        if self._done or self._finish_reason is not None or is_done:
            end_event(index, self._done, self._finish_reason is not None, is_done)
            self._done = True
            return
        if self._mode == "cumulative" and self._full_parses >= _FULL_PARSES_BEFORE_LIGHT:
            if self._light_check(data, index):
                return
        if self._pending is not None:
            # The kept event is validated before the stream moves past it: an echo is reconciled
            # against every token held, and an error in the kept event is not lost.
            self._apply_pending()
        self._apply(data, index, counted=False)

    def _apply_pending(self) -> None:
        assert self._pending is not None
        self._apply(self._pending, self._pending_index, counted=True)

    def _light_check(self, data: bytearray, index: int) -> bool:
        """Accept a non-terminal cumulative event by its reported total alone (docs/core.md)."""
        if not data.startswith(_LIGHT_PREFIXES):
            return False
        at = data.find(_FINISH_KEY)
        if at < 0 or data[at + len(_FINISH_KEY) : at + len(_FINISH_KEY) + 4] != b"null":
            return False
        at = data.rfind(_COMPLETION_KEY)
        if at < 0:
            return False
        total = read_uint_at(data, at + len(_COMPLETION_KEY))
        if total < 0:
            return False
        if total < self._reported:
            raise length_decreased(index, self._reported, total)
        self._pending = data
        self._pending_index = index
        self._reported = total
        self._events += 1
        return True

    def _apply(self, data: bytearray, index: int, *, counted: bool) -> None:
        """Parse one event and read its fields, then hand it to _commit (nothing half-applied)."""
        json_bytes, spans = cut_b64_spans(data)
        obj, meta, spans, finish, echo = read_event(index, data, json_bytes, spans)
        ids_field = read_id_list(index, "output_ids", obj["output_ids"]) if "output_ids" in obj else None
        has_logprobs = "output_token_logprobs" in meta
        lp_ids: list[int] | None = None
        lp_values: list[float] | None = None
        if has_logprobs:
            lp_ids, lp_values = read_logprob_list(index, meta["output_token_logprobs"])
        if self._has_logprobs is not None and has_logprobs != self._has_logprobs:
            raise logprobs_switched(index, has_logprobs)
        completion, lp_length, prompt, text = event_counts(index, obj, meta)
        self._commit(
            index,
            counted,
            data,
            spans,
            meta,
            finish,
            echo,
            ids_field,
            lp_ids,
            lp_values,
            completion,
            lp_length,
            prompt,
            text,
        )

    def _commit(
        self,
        index: int,
        counted: bool,
        data: bytearray,
        spans: dict[str, tuple[int, int]],
        meta: dict[str, Any],
        finish: dict[str, Any] | None,
        echo: bool,
        ids_field: list[int] | None,
        lp_ids: list[int] | None,
        lp_values: list[float] | None,
        completion: int | None,
        lp_length: int | None,
        prompt: int | None,
        text: str | None,
    ) -> None:
        """Validate the event's lengths, text, top-p and routed experts, then commit it."""
        held = self._ids.size
        mode = self._mode
        new_mode = mode
        new_ids: list[int]
        new_logprobs: list[float] | None
        if echo:
            listed = lp_ids if lp_ids is not None else ids_field
            start = echo_start(
                index,
                mode,
                held,
                completion,
                len(lp_ids) if lp_ids is not None else None,
                len(ids_field) if ids_field is not None else None,
            )
            if start < 0:
                new_ids, new_logprobs = [], ([] if lp_values is not None else None)
            else:
                assert listed is not None  # echo_start found the tokens in it
                self._check_prefix(index, listed[start - held :])
                new_ids = listed[start:]
                new_logprobs = lp_values[start:] if lp_values is not None else None
        else:
            if lp_ids is not None:
                listed = lp_ids
                if ids_field is not None and ids_field != lp_ids:
                    raise broken(index, "ids_disagree")
            elif ids_field is not None:
                listed = ids_field
            else:
                raise broken(index, "no_tokens")
            if lp_length is not None and completion is not None and lp_length != completion:
                raise lengths_disagree(index, mode, lp_length, completion)
            reported = lp_length if lp_length is not None else completion
            if reported is None:
                raise broken(index, "no_total")
            listed_n = len(listed)
            cumulative_fits = listed_n == reported and reported >= held
            incremental_fits = held + listed_n == reported
            if mode == "cumulative":
                fits = cumulative_fits
            elif mode == "incremental":
                fits = incremental_fits
            else:
                fits = cumulative_fits or incremental_fits
            if not fits:
                raise mode_mismatch(index, mode, held, listed_n, reported)
            if mode == "auto" and cumulative_fits != incremental_fits:
                new_mode = "cumulative" if cumulative_fits else "incremental"
            if new_mode == "cumulative":
                if reported < self._reported:
                    raise length_decreased(index, self._reported, reported)
                self._check_prefix(index, listed)
                new_ids = listed[held:]
                new_logprobs = lp_values[held:] if lp_values is not None else None
            else:
                new_ids = listed
                new_logprobs = lp_values
        total = held + len(new_ids)

        # Text: cumulative replaces, incremental (and undecided auto) appends; an echo's text is
        # the whole text, which the policy reconciles with the text held.
        if echo:
            text_update = echo_text(new_mode, self._text_parts, text)
            text_replaces = True
        else:
            text_update = text
            text_replaces = new_mode == "cumulative"

        top_p = routed = None
        if self._top_p_rows is not None or not ARRAY_KEYS.isdisjoint(meta):
            top_p, routed = read_arrays(
                index,
                meta,
                data,
                spans,
                None,
                new_mode,
                held,
                len(new_ids),
                self._top_p_rows,
                self._expert_shape,
                prompt,
                completion,
            )

        # ---- commit: nothing below can fail on valid input ----
        self._ids.extend(new_ids)
        if new_logprobs is not None:
            self._logprobs.extend(new_logprobs)
        self._has_logprobs = lp_ids is not None
        if text_update is not None:
            if text_replaces or self._text_parts is None:
                self._text_parts = [text_update]
            else:
                self._text_parts.append(text_update)  # joined once, when a result is built
        self._commit_parsed(meta, finish, top_p, routed)
        self._mode = new_mode
        if not counted:
            self._events += 1
        self._full_parses += 1
        self._reported = max(self._reported, total)
        self._pending = None

    def _check_prefix(self, index: int, full_ids: list[int]) -> None:
        at = self._ids.equals_prefix(full_ids)
        if at >= 0:
            raise changed_token(index, at, self._ids[at], full_ids[at])


def accumulate(pieces: Iterable[bytes | bytearray | memoryview], /, **kwargs: Any) -> StreamResult:
    """Feed every piece to a new StreamAccumulator(**kwargs), then finish()."""
    return feed_all(StreamAccumulator(**kwargs), pieces)
