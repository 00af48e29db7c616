"""StreamAccumulator's once-per-stream face, written once: both twins' classes derive from it.

The constructor and its guards, the progress properties, ``finish()``, ``snapshot()``, the repr
and the building of a result live here; a twin supplies the per-read and per-event work
(``feed()``, ``feed_chunked()``, framing, parsing, validation) and the state this class reads.
The compiled twin's class is a Python subclass of its extension type and of this class, so its
hot calls stay C calls while these run as the same Python code in both. The rules are in
docs/core.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import numpy.typing as npt

from fastaccum._core.dialects import VLLM, chunk_arrays
from fastaccum._core.policy import (
    ARRAY_KEYS,
    DIALECTS,
    ParsedEvent,
    check_options,
    finish_error,
    read_arrays,
    routed_experts_missing,
)
from fastaccum._core.results import build_result
from fastaccum.errors import StreamError
from fastaccum.result import StreamResult, snapshot_of

__all__ = ("AccumulatorBase", "STATE", "STATE_WRITTEN")


class _Framer(Protocol):
    """Where a twin's framer stopped: what finish() needs to tell a truncation from the end."""

    @property
    def events(self) -> int: ...
    @property
    def mid_event(self) -> bool: ...
    @property
    def data(self) -> bytearray: ...


class _Chunks(Protocol):
    @property
    def ended(self) -> bool: ...


class _Buffer(Protocol):
    @property
    def size(self) -> int: ...
    def to_array(self) -> npt.NDArray[Any]: ...
    def take_array(self) -> npt.NDArray[Any]: ...


class AccumulatorBase:
    """What runs once per stream (or on demand) for StreamAccumulator, over the twin's state."""

    if not TYPE_CHECKING:
        # No __dict__ for the compiled twin's subclass; a checker would read the empty slots as
        # forbidding the twin's attributes that this class sets.
        __slots__ = ()

    # The twin's state read here: STATE below lists it, and the compiled twin's extension type
    # declares each name (``public`` where STATE_WRITTEN says this class sets it, else
    # ``readonly``); tests/test_impl_selection.py holds both twins to the list.
    _framer: _Framer
    _chunks: _Chunks | None  # feed_chunked()'s decoder, None until first used
    _mode: str
    _dialect: str  # DIALECTS' own str (fastaccum._core.policy)
    _expert_shape: tuple[int, int] | None
    _indexer_shape: tuple[int, int] | None
    _routed_start: int
    _routed_dtype: str | None  # "int32": vLLM's narrower routed experts widened
    _require_routed: bool  # finish() refuses a finished stream without routed experts
    _ids: _Buffer  # int32 token ids
    _logprobs: _Buffer  # float64
    _has_logprobs: bool | None
    _text_parts: list[str] | None
    _top_p: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]] | None  # (ids, offsets) per event
    _top_p_rows: int | None  # rows held; None: no event carried top-p
    _replay: dict[str, npt.NDArray[np.int32]] | None  # routed_experts, indexer_topk
    _finish_reason: dict[str, Any] | None
    _meta: dict[str, Any]
    _versions: list[tuple[int, str]]  # (first token, weight_version) per change, in order
    _version: str | None  # the newest event's weight_version
    _events: int
    _reported: int
    _pending: bytearray | None  # the newest light-checked cumulative event, not yet validated
    _error: StreamError | None  # the first error: every later call raises it
    _result: StreamResult | None

    def __init__(
        self,
        mode: str = "auto",
        *,
        expert_shape: tuple[int, int] | None = None,
        max_event_bytes: int | None = None,
        indexer_shape: tuple[int, int] | None = None,
        routed_start: int = 0,
        dialect: str = "sglang",
        routed_dtype: str | None = None,
        require_routed_experts: bool = False,
    ) -> None:
        # The modes and dialects are MODES' and DIALECTS' own str objects: the compiled twin
        # compares them by identity.
        self._mode = check_options(
            mode, expert_shape, max_event_bytes, indexer_shape, routed_start, dialect, routed_dtype
        )
        self._routed_dtype = routed_dtype
        self._require_routed = bool(require_routed_experts)
        self._dialect = DIALECTS[DIALECTS.index(dialect)]
        self._expert_shape = expert_shape
        self._indexer_shape = indexer_shape
        self._routed_start = routed_start
        self._error = None
        self._result = None
        self._versions = []
        self._version = None
        self._start(max_event_bytes)

    def _start(self, max_event_bytes: int | None) -> None:
        """The twin's framer, buffers and per-event state."""
        raise NotImplementedError

    def _apply_pending(self) -> None:
        """Validate and apply the newest light-checked event (``_pending``)."""
        raise NotImplementedError

    def _meta_dict(self) -> dict[str, Any]:
        """The newest applied event's meta_info."""
        return self._meta

    def _read_arrays(
        self,
        parsed: ParsedEvent | None,
        *,
        index: int,
        mode: str,
        held: int,
        added: int,
        prompt: int,
        completion: int,
        streamed: Any = None,
    ) -> tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], bool] | None, dict[str, Any] | None]:
        """An event's top-p rows and replay arrays, decoded and checked (fastaccum._core.policy
        .read_arrays; ``parsed`` None: an event the compiled twin's scanner read), or (None, None)
        when neither the event nor the stream carries any. Validation only: nothing is kept."""
        if self._top_p_rows is None and (parsed is None or ARRAY_KEYS.isdisjoint(parsed.meta)):
            return None, None
        if self._dialect is VLLM:
            return chunk_arrays(
                parsed,
                index=index,
                mode=mode,
                held=held,
                added=added,
                rows_held=self._top_p_rows,
                expert_shape=self._expert_shape,
                streamed=streamed,
                widen=self._routed_dtype is not None,
            )
        return read_arrays(
            parsed,
            index=index,
            mode=mode,
            held=held,
            added=added,
            rows_held=self._top_p_rows,
            expert_shape=self._expert_shape,
            prompt=prompt,
            completion=completion,
            indexer_shape=self._indexer_shape,
            routed_start=self._routed_start,
            streamed=streamed,
        )

    def _note_version(self, held: int, version: object) -> None:
        """An event's ``weight_version``: its tokens (from ``held`` on) ran under it. One entry
        per change; anything but a str is not a version."""
        if type(version) is str and version != self._version:
            self._version = version
            self._versions.append((held, version))

    def _commit_parsed(
        self,
        meta: dict[str, Any],
        finish: dict[str, Any] | None,
        top_p: tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], bool] | None,
        replay: dict[str, npt.NDArray[np.int32]] | None,
        held: int,
    ) -> None:
        """The last step of a twin's commit of an event parsed by orjson (every event in the pure
        twin; terminal and unusual ones in the compiled twin): what only such an event carries.
        ``top_p``: read_top_p's answer; ``replay``: read_arrays' replay arrays; ``held``: the
        tokens before the event's. Cannot fail."""
        self._note_version(held, meta.get("weight_version"))
        if top_p is not None:
            ids, offsets, replace = top_p
            if replace or self._top_p is None or self._top_p_rows is None:
                self._top_p, self._top_p_rows = [], 0
            self._top_p.append((ids, offsets))  # joined once, when a result is built
            self._top_p_rows += offsets.shape[0] - 1
        if replay:
            self._replay = replay if self._replay is None else {**self._replay, **replay}
        if finish is not None:
            self._finish_reason = finish
        self._meta = meta  # filtered once, when a result is built

    # ---- progress -----------------------------------------------------------------------

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

    @property
    def chunked_ended(self) -> bool:
        """``feed_chunked()`` has read the last chunk and the trailer section: the body is complete."""
        return self._chunks is not None and bool(self._chunks.ended)

    # ---- results ------------------------------------------------------------------------

    if TYPE_CHECKING:  # each twin's own, the per-event path

        def feed(self, data: bytes | bytearray | memoryview, /) -> int: ...

    def _feed_all(self, pieces: Iterable[bytes | bytearray | memoryview]) -> StreamResult:
        """accumulate(): feed every piece, then finish()."""
        for piece in pieces:
            self.feed(piece)
        return self.finish()

    def finish(self) -> StreamResult:
        """End of input: the final result, or StreamTruncatedError without a terminal event."""
        if self._result is not None:
            return self._result
        if self._error is None:
            framer = self._framer
            self._error = finish_error(
                events=framer.events,
                mid_event=framer.mid_event,
                data=framer.data,
                finished=self._finish_reason is not None,
                dialect=self._dialect,
            )
            if self._error is None and self._require_routed:
                self._error = routed_experts_missing(self._finish_reason, self._replay, self._dialect)
        if self._error is not None:
            raise self._error
        self._result = self._build(final=True)
        return self._result

    def snapshot(self) -> StreamResult:
        """The observed prefix, consistent across tokens, logprobs, text and top-p; never raises."""
        if self._result is not None:
            return snapshot_of(self._result)
        if self._pending is not None:
            try:
                self._apply_pending()
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

    def _build(self, final: bool = False) -> StreamResult:
        """The result so far; ``final``: the buffers' storage goes to it (finish(), no copies)."""
        result = build_result(
            final=final,
            mode=self._mode,
            ids=self._ids,
            logprobs=self._logprobs if self._has_logprobs else None,
            text_parts=self._text_parts,
            finish_reason=self._finish_reason,
            meta=self._meta_dict(),
            top_p=self._top_p,
            replay=self._replay,
            events=self._events,
            versions=self._versions,
        )
        if result.text is not None:
            self._text_parts = [result.text]  # join once; later deltas append to the joined text
        return result


# The state a twin keeps for this class, in the order annotated above; the names this class
# assigns must be writable from Python in the compiled twin too.
STATE: tuple[str, ...] = tuple(AccumulatorBase.__annotations__)
STATE_WRITTEN: tuple[str, ...] = (
    "_require_routed",
    "_mode",
    "_dialect",
    "_expert_shape",
    "_indexer_shape",
    "_routed_start",
    "_routed_dtype",
    "_text_parts",
    "_top_p",
    "_top_p_rows",
    "_replay",
    "_finish_reason",
    "_meta",
    "_versions",
    "_version",
    "_error",
    "_result",
)
