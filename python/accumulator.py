"""StreamAccumulator: SGLang /generate events to arrays, validating cumulative/incremental lengths.

The rules are in docs/core.md; the compiled twin (src_cython/_cy.pyx) mirrors this module
section by section.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from fastaccum._messages import (
    bad_format,
    bad_length,
    length_decreased,
    mode_mismatch,
    server_error,
    truncated,
    type_name,
)
from fastaccum._py.arrays import B64_KEYS, cut_b64_spans, decode_int32
from fastaccum._py.buffers import Float64Buffer, Int32Buffer
from fastaccum._py.chunked import ChunkedDecoder
from fastaccum._py.framing import SseFramer
from fastaccum.errors import StreamError
from fastaccum.result import StreamResult, snapshot_of

__all__ = ("StreamAccumulator", "accumulate")

_MODES = ("auto", "cumulative", "incremental")
# Cumulative events after this many full parses are only light-checked (docs/core.md).
_FULL_PARSES_BEFORE_LIGHT = 2
_TOKEN_ID_LIMIT = 2**31
_LOGPROBS = "meta_info.output_token_logprobs"
# Token-aligned lists (sliced per event in incremental mode) and the decoded base64 arrays are
# returned as arrays, not repeated in meta_info.
_DROPPED_META = frozenset(
    (
        "output_token_logprobs",
        "output_top_logprobs",
        "output_token_ids_logprobs",
        "output_token_sampling_mask",
        "output_token_sampling_logprobs",
        *B64_KEYS,
    )
)
_TOP_P_PAIRS = (
    ("top_p_token_ids", "top_p_token_offsets"),
    ("top_p_kept_token_ids", "top_p_kept_token_offsets"),
)
_LIGHT_PREFIXES = (b'{"text":', b'{"output_ids":')
_FINISH_KEY = b'"finish_reason":'
_COMPLETION_KEY = b'"completion_tokens":'


# ---- field readers ------------------------------------------------------------------------


def read_id_list(index: int, where: str, value: object) -> list[int]:
    if type(value) is not list:
        raise bad_format(index, f"{where} must be an array, not {type_name(value)}")
    for i, token in enumerate(value):
        check_token_id(index, f"{where}[{i}]", token)
    return value


def check_token_id(index: int, where: str, token: object) -> None:
    if type(token) is not int:
        raise bad_format(index, f"{where} must be a token id, not {type_name(token)}")
    if not 0 <= token < _TOKEN_ID_LIMIT:
        raise bad_format(index, f"{where} = {token} is not a token id in [0, 2**31)")


def read_logprob_list(index: int, value: object) -> tuple[list[int], list[float]]:
    """Split ``[[logprob|null, id, text|null], ...]`` into ids and logprobs (null becomes NaN)."""
    if type(value) is not list:
        raise bad_format(index, f"{_LOGPROBS} must be an array, not {type_name(value)}")
    ids: list[int] = []
    logprobs: list[float] = []
    for i, entry in enumerate(value):
        if type(entry) is not list or not 2 <= len(entry) <= 3:
            raise bad_format(index, f"{_LOGPROBS}[{i}] must be [logprob, id, text]")
        logprob = entry[0]
        if logprob is None:
            logprobs.append(math.nan)
        elif type(logprob) is float:
            logprobs.append(logprob)
        elif type(logprob) is int:
            logprobs.append(float(logprob))
        else:
            raise bad_format(index, f"{_LOGPROBS}[{i}][0] must be a number or null, not {type_name(logprob)}")
        token = entry[1]
        check_token_id(index, f"{_LOGPROBS}[{i}][1]", token)
        ids.append(token)
        if len(entry) == 3 and entry[2] is not None and type(entry[2]) is not str:
            raise bad_format(index, f"{_LOGPROBS}[{i}][2] must be a string or null, not {type_name(entry[2])}")
    return ids, logprobs


def read_count(index: int, meta: dict[str, Any], key: str) -> int | None:
    if key not in meta:
        return None
    value = meta[key]
    if type(value) is not int:
        raise bad_format(index, f"meta_info.{key} must be an integer, not {type_name(value)}")
    if value < 0:
        raise bad_format(index, f"meta_info.{key} = {value} is negative")
    return value


def read_uint_at(data: bytearray, pos: int) -> int:
    """The unsigned integer literal at ``pos`` (1-18 digits, then ',' or '}'), or -1."""
    end = pos
    limit = min(len(data), pos + 19)
    while end < limit and 0x30 <= data[end] <= 0x39:
        end += 1
    if end == pos or end - pos > 18 or end >= len(data) or data[end] not in b",}":
        return -1
    return int(data[pos:end])


def incremental_echo_text(held: str, echoed: str) -> str | None:
    """The whole text an incremental echo carries, or None when it cannot be told (§9.3).

    The echo repeats the whole text; a delta still queued when it was sent is coalesced in front
    of it, giving delta + held + delta.
    """
    size, odd = divmod(len(echoed) + len(held), 2)
    if not odd and size < len(echoed):
        whole = echoed[len(echoed) - size :]
        if whole.startswith(held) and whole[len(held) :] == echoed[: len(echoed) - size]:
            return whole
    if echoed.startswith(held):
        return echoed
    return None


def check_offsets(index: int, key: str, offsets: npt.NDArray[np.int32], n_ids: int) -> None:
    if offsets.shape[0] == 0 or offsets[0] != 0:
        raise bad_format(index, f"meta_info.{key} must start at 0")
    if offsets.shape[0] > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
        raise bad_format(index, f"meta_info.{key} decreases")
    if offsets[-1] != n_ids:
        raise bad_format(index, f"meta_info.{key} ends at {int(offsets[-1])}, not at the {n_ids} ids")


# ---- accumulator --------------------------------------------------------------------------


class StreamAccumulator:
    """Feeds raw SSE bytes of one SGLang /generate stream and accumulates tokens into arrays."""

    def __init__(
        self,
        mode: str = "auto",
        *,
        expert_shape: tuple[int, int] | None = None,
        max_event_bytes: int | None = None,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be 'auto', 'cumulative' or 'incremental', not {mode!r}")
        if expert_shape is not None:
            if (
                not isinstance(expert_shape, tuple)
                or len(expert_shape) != 2
                or any(type(x) is not int or x <= 0 for x in expert_shape)
            ):
                raise ValueError(f"expert_shape must be (num_layers, topk) positive ints, not {expert_shape!r}")
        if max_event_bytes is not None and (type(max_event_bytes) is not int or max_event_bytes < 0):
            raise ValueError(f"max_event_bytes must be a non-negative int or None, not {max_event_bytes!r}")
        self._framer = SseFramer(max_event_bytes)
        self._mode = mode
        self._expert_shape = expert_shape
        self._ids = Int32Buffer()
        self._logprobs = Float64Buffer()
        self._has_logprobs: bool | None = None  # decided by the first event
        self._text_parts: list[str] | None = None  # None: no event carried text
        self._top_p_ids: Int32Buffer | None = None
        self._top_p_offsets: Int32Buffer | None = None
        self._routed: npt.NDArray[np.int32] | None = None
        self._finish_reason: dict[str, Any] | None = None
        self._meta: dict[str, Any] = {}
        self._events = 0  # JSON events applied or light-checked
        self._full_parses = 0
        self._reported = 0  # newest total the server reported
        self._pending: bytearray | None = None  # newest light-checked cumulative event
        self._pending_index = -1
        self._done = False  # [DONE] seen
        self._error: StreamError | None = None
        self._result: StreamResult | None = None
        self._chunks: ChunkedDecoder | None = None  # feed_chunked()'s decoder, made on first use

    # ---- public API ---------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """The resolved mode: "auto" until an event decides it."""
        return self._mode

    @property
    def finished(self) -> bool:
        """A terminal finish_reason has been seen."""
        return self._finish_reason is not None

    @property
    def events(self) -> int:
        """JSON events seen so far (progress)."""
        return self._events

    @property
    def tokens(self) -> int:
        """Newest token total the stream reported (progress; light-checked events included)."""
        return max(self._reported, self._ids.size)

    def feed(self, data: bytes | bytearray | memoryview, /) -> int:
        """Frame and apply ``data``; return the number of events it completed ([DONE] included)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"feed() takes bytes, bytearray or memoryview, not {type(data).__name__}")
        if self._error is not None:
            raise self._error
        if self._result is not None:
            raise RuntimeError("feed() called after finish()")
        try:
            return self._framer.feed(bytes(data), self._dispatch)
        except StreamError as exc:
            self._error = exc
            raise

    def feed_chunked(self, data: bytes | bytearray | memoryview, /) -> int:
        """Like ``feed()``, for the body of an HTTP/1.1 response with ``Transfer-Encoding:
        chunked``: undo the chunked framing, then frame and apply; ``chunked_ended`` tells when
        the last chunk has been read. Do not mix with ``feed()`` on one accumulator."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"feed_chunked() takes bytes, bytearray or memoryview, not {type(data).__name__}")
        if self._error is not None:
            raise self._error
        if self._result is not None:
            raise RuntimeError("feed_chunked() called after finish()")
        if self._chunks is None:
            self._chunks = ChunkedDecoder()
        try:
            return self._chunks.feed(bytes(data), self._framer, self._dispatch)
        except StreamError as exc:
            self._error = exc
            raise

    @property
    def chunked_ended(self) -> bool:
        """``feed_chunked()`` has read the last chunk and the trailer section: the body is complete."""
        return self._chunks is not None and self._chunks.ended

    def finish(self) -> StreamResult:
        """End of input: the final result, or StreamTruncatedError without a terminal event."""
        if self._result is not None:
            return self._result
        if self._error is not None:
            raise self._error
        framer = self._framer
        try:
            if self._finish_reason is None:
                if framer.mid_event:
                    raise truncated(framer.events, "input ended inside an event, before a terminal finish_reason")
                raise truncated(framer.events, "input ended before a terminal finish_reason")
            if framer.mid_event and not b"[DONE]".startswith(framer.data):
                raise bad_format(framer.events, "data after the terminal event")
        except StreamError as exc:
            self._error = exc
            raise
        self._result = self._build(final=True)
        return self._result

    def snapshot(self) -> StreamResult:
        """The observed prefix, consistent across tokens, logprobs, text and top-p; never raises."""
        if self._result is not None:
            return snapshot_of(self._result)
        if self._pending is not None:
            try:
                self._apply(self._pending, self._pending_index, counted=True)
            except StreamError:
                # The newest light-checked event does not validate: show the verified state; the
                # kept event stays, so the error still surfaces when the stream moves past it.
                pass
        return self._build()

    def __repr__(self) -> str:
        return (
            f"<StreamAccumulator mode={self._mode!r} events={self._events} "
            f"tokens={self.tokens} finished={self.finished}>"
        )

    # ---- events -------------------------------------------------------------------------

    def _dispatch(self, data: bytearray, index: int) -> None:
        if self._done:
            raise bad_format(index, "data after [DONE]")
        if data == b"[DONE]":
            if self._finish_reason is None:
                raise truncated(index, "[DONE] before a terminal finish_reason")
            self._done = True
            return
        if self._finish_reason is not None:
            raise bad_format(index, "data after the terminal event")
        if self._mode == "cumulative" and self._full_parses >= _FULL_PARSES_BEFORE_LIGHT:
            if self._light_check(data, index):
                return
        if self._pending is not None:
            # The kept event is validated before the stream moves past it: an echo is reconciled
            # against every token held, and an error in the kept event is not lost.
            self._apply(self._pending, self._pending_index, counted=True)
        self._apply(data, index, counted=False)

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
        """Parse and validate one event completely, then commit it (nothing half-applied)."""
        json_bytes, spans = cut_b64_spans(data)
        try:
            obj = orjson.loads(json_bytes)
        except orjson.JSONDecodeError as exc:
            raise bad_format(index, f"data is not valid JSON ({exc})") from None
        if type(obj) is not dict:
            raise bad_format(index, f"data is a JSON {type_name(obj)}, not an object")
        if "error" in obj:
            raise server_error(index, obj["error"])
        if "index" in obj:
            raise bad_format(index, 'a batch stream (top-level "index") is not one request')
        meta = obj.get("meta_info")
        if type(meta) is not dict:
            if "meta_info" not in obj:
                raise bad_format(index, "meta_info is missing")
            raise bad_format(index, f"meta_info must be an object, not {type_name(meta)}")
        for key in spans:
            if meta.get(key) != "":
                # The cut landed outside meta_info (not SGLang's shape): parse the whole event.
                spans = {}
                try:
                    obj = orjson.loads(data)
                except orjson.JSONDecodeError as exc:
                    raise bad_format(index, f"data is not valid JSON ({exc})") from None
                meta = obj["meta_info"]
                break

        finish = meta.get("finish_reason")
        if finish is not None and type(finish) is not dict:
            raise bad_format(index, f"meta_info.finish_reason must be an object or null, not {type_name(finish)}")
        echo = finish is not None and finish.get("type") == "abort" and "prompt_tokens" not in meta
        ids_field = read_id_list(index, "output_ids", obj["output_ids"]) if "output_ids" in obj else None
        has_logprobs = "output_token_logprobs" in meta
        lp_ids: list[int] | None = None
        lp_values: list[float] | None = None
        if has_logprobs:
            lp_ids, lp_values = read_logprob_list(index, meta["output_token_logprobs"])
        if self._has_logprobs is not None and has_logprobs != self._has_logprobs:
            what = "appeared" if has_logprobs else "disappeared"
            raise bad_format(index, f"output_token_logprobs {what} mid-stream")
        completion = read_count(index, meta, "completion_tokens")
        lp_length = read_count(index, meta, "output_token_logprobs_length")
        prompt = read_count(index, meta, "prompt_tokens")
        text: str | None = None
        if "text" in obj:
            text = obj["text"]
            if text is not None and type(text) is not str:
                raise bad_format(index, f"text must be a string, not {type_name(text)}")

        held = self._ids.size
        mode = self._mode
        new_mode = mode
        new_ids: list[int]
        new_logprobs: list[float] | None
        if echo:
            new_ids, new_logprobs = self._reconcile_echo(index, completion, ids_field, lp_ids, lp_values)
        else:
            if lp_ids is not None:
                listed = lp_ids
                if ids_field is not None and ids_field != lp_ids:
                    raise bad_format(index, "output_ids disagree with the ids in output_token_logprobs")
            elif ids_field is not None:
                listed = ids_field
            else:
                raise bad_format(index, "the event has neither output_ids nor output_token_logprobs")
            if lp_length is not None and completion is not None and lp_length != completion:
                raise bad_length(
                    index, mode,
                    f"output_token_logprobs_length {lp_length} differs from completion_tokens {completion}",
                    completion, lp_length,
                )
            reported = lp_length if lp_length is not None else completion
            if reported is None:
                raise bad_format(index, "meta_info has no completion_tokens")
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

        # Text: cumulative replaces, incremental (and undecided auto) appends. An echo's text is the
        # whole text (behind a coalesced delta in incremental mode, §9.3); undecided auto ignores it.
        text_update = None
        text_replaces = False
        if echo:
            if self._text_parts is not None and text is not None:
                if new_mode == "cumulative":
                    text_update = text
                elif new_mode == "incremental":
                    text_update = incremental_echo_text("".join(self._text_parts), text)
                text_replaces = True
        elif text is not None:
            text_update = text
            text_replaces = new_mode == "cumulative"

        top_p = self._read_top_p(index, meta, data, spans, new_mode, held, len(new_ids))
        routed = self._routed
        if "routed_experts" in meta:
            routed = self._read_routed(index, meta, data, spans, new_mode, prompt, completion, total)

        # ---- commit: nothing below can fail on valid input ----
        self._ids.extend(new_ids)
        if new_logprobs is not None:
            self._logprobs.extend(new_logprobs)
        self._has_logprobs = has_logprobs
        if text_update is not None:
            if text_replaces or self._text_parts is None:
                self._text_parts = [text_update]
            else:
                self._text_parts.append(text_update)  # joined once, when a result is built
        if top_p is not None:
            tp_ids, tp_offsets, replace = top_p
            self._commit_top_p(tp_ids, tp_offsets, replace)
        self._routed = routed
        if finish is not None:
            self._finish_reason = finish
        self._meta = meta  # filtered once, when a result is built
        self._mode = new_mode
        if not counted:
            self._events += 1
        self._full_parses += 1
        self._reported = max(self._reported, total)
        self._pending = None

    def _reconcile_echo(
        self,
        index: int,
        completion: int | None,
        ids_field: list[int] | None,
        lp_ids: list[int] | None,
        lp_values: list[float] | None,
    ) -> tuple[list[int], list[float] | None]:
        """The tokens an abort echo adds: none, or the tail it recovers from its full lists (§9.3)."""
        held = self._ids.size
        mode = self._mode
        if completion is None:
            raise bad_format(index, "abort echo without completion_tokens")
        if completion < held:
            raise bad_length(
                index, mode, f"abort echo reports {completion} tokens, fewer than the {held} held", held, completion
            )
        if completion == held:
            return [], ([] if lp_values is not None else None)
        full_logprobs: list[float] | None = None
        if lp_ids is not None and lp_values is not None and len(lp_ids) >= completion:
            # A coalesced delta may precede the full list: the full list is the tail.
            full_ids = lp_ids[len(lp_ids) - completion :]
            full_logprobs = lp_values[len(lp_values) - completion :]
        elif lp_ids is None and mode == "cumulative" and ids_field is not None and len(ids_field) == completion:
            full_ids = ids_field
        else:
            raise bad_length(
                index, mode,
                f"abort echo reports {completion} tokens, {held} held, and does not carry the missing ones",
                completion, held,
            )
        self._check_prefix(index, full_ids)
        return full_ids[held:], (full_logprobs[held:] if full_logprobs is not None else None)

    def _check_prefix(self, index: int, full_ids: list[int]) -> None:
        at = self._ids.equals_prefix(full_ids)
        if at >= 0:
            raise bad_format(index, f"token {at} changed from {self._ids[at]} to {full_ids[at]}")

    def _read_top_p(
        self,
        index: int,
        meta: dict[str, Any],
        data: bytearray,
        spans: dict[str, tuple[int, int]],
        mode: str,
        held: int,
        added: int,
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], bool] | None:
        """Decode and validate this event's top-p CSR; say whether it replaces or appends."""
        for ids_key, offsets_key in _TOP_P_PAIRS:
            if ids_key in meta or offsets_key in meta:
                break
        else:
            if self._top_p_offsets is not None and added > 0:
                raise bad_format(index, f"top-p rows missing for the {added} new tokens")
            return None
        if ids_key not in meta or offsets_key not in meta:
            present, missing = (ids_key, offsets_key) if ids_key in meta else (offsets_key, ids_key)
            raise bad_format(index, f"meta_info.{present} without meta_info.{missing}")
        ids = decode_int32(index, ids_key, meta[ids_key], data, spans.get(ids_key))
        offsets = decode_int32(index, offsets_key, meta[offsets_key], data, spans.get(offsets_key))
        check_offsets(index, offsets_key, offsets, ids.shape[0])
        rows = offsets.shape[0] - 1
        total = held + added
        have = self._top_p_offsets.size - 1 if self._top_p_offsets is not None else 0
        if rows == total:
            return ids, offsets, True
        if rows == added and have == held:
            return ids, offsets, False
        raise bad_length(
            index, mode,
            f"top-p has {rows} rows; expected {added} (this event's new tokens) or {total} (all tokens)",
            total, rows,
        )

    def _commit_top_p(self, ids: npt.NDArray[np.int32], offsets: npt.NDArray[np.int32], replace: bool) -> None:
        if self._top_p_ids is None or self._top_p_offsets is None or replace:
            self._top_p_ids = Int32Buffer()
            self._top_p_offsets = Int32Buffer()
            self._top_p_offsets.extend([0])
        base = self._top_p_ids.size
        self._top_p_ids.extend(ids)
        self._top_p_offsets.extend(offsets[1:] + base)

    def _read_routed(
        self,
        index: int,
        meta: dict[str, Any],
        data: bytearray,
        spans: dict[str, tuple[int, int]],
        mode: str,
        prompt: int | None,
        completion: int | None,
        total: int,
    ) -> npt.NDArray[np.int32]:
        routed = decode_int32(index, "routed_experts", meta["routed_experts"], data, spans.get("routed_experts"))
        if self._expert_shape is None:
            return routed
        if prompt is None:
            raise bad_format(index, "routed_experts without prompt_tokens cannot be checked against expert_shape")
        layers, topk = self._expert_shape
        done = completion if completion is not None else total
        rows = prompt + done - 1
        expected = max(rows, 0) * layers * topk
        if rows < 0 or routed.shape[0] != expected:
            raise bad_length(
                index, mode,
                f"routed_experts has {routed.shape[0]} values; expected "
                f"({prompt} + {done} - 1) x {layers} x {topk} = {expected}",
                expected, routed.shape[0],
            )
        return routed.reshape(rows, layers, topk)

    def _build(self, final: bool = False) -> StreamResult:
        """The result so far; ``final``: the buffers' storage goes to it (finish(), no copies)."""
        parts = self._text_parts
        text: str | None = None
        if parts is not None:
            text = parts[0] if len(parts) == 1 else "".join(parts)
            self._text_parts = [text]  # join once; later deltas append to the joined text
        top_p_ids = top_p_offsets = None
        if self._top_p_ids is not None and self._top_p_offsets is not None:
            top_p_ids = self._top_p_ids.take_array() if final else self._top_p_ids.to_array()
            top_p_offsets = self._top_p_offsets.take_array() if final else self._top_p_offsets.to_array()
        completion_tokens = self._ids.size
        return StreamResult(
            mode=self._mode,
            token_ids=self._ids.take_array() if final else self._ids.to_array(),
            logprobs=(self._logprobs.take_array() if final else self._logprobs.to_array()) if self._has_logprobs else None,
            text=text,
            finish_reason=dict(self._finish_reason) if self._finish_reason is not None else None,
            meta_info={k: v for k, v in self._meta.items() if k not in _DROPPED_META},
            completion_tokens=completion_tokens,
            top_p_token_ids=top_p_ids,
            top_p_token_offsets=top_p_offsets,
            routed_experts=self._routed,
            events=self._events,
        )


def accumulate(pieces: Iterable[bytes | bytearray | memoryview], /, **kwargs: Any) -> StreamResult:
    """Feed every piece to a new StreamAccumulator(**kwargs), then finish()."""
    accumulator = StreamAccumulator(**kwargs)
    for piece in pieces:
        accumulator.feed(piece)
    return accumulator.finish()
