"""Non-streaming answers read by the core that reads streams: ``parse_response`` and ``BodyReader``.

A non-streaming answer is what a stream's terminal event would hold: SGLang's ``/generate``
answers ``{"text", "output_ids", "meta_info"}`` (a JSON list of them for a batch), vLLM's
``/inference/v1/generate`` one object whose ``choices`` hold every token of each request, its
``usage`` beside them. So each request's JSON is handed to the twin's accumulator as one event
(``data: `` and the bytes, as they arrive): the same parser, the same ``StreamResult``, the same
errors, and the base64 arrays decoded from the body's bytes into their arrays (the compiled twin
decodes them while they arrive), never turned into a ``str``. Where one body answers several
requests, SGLang's list is followed here (``bytes.find`` from one structural byte to the next,
strings jumped over whole) to hand each element an accumulator of its own; vLLM's ``n > 1`` object
is rarer and read whole (``parse_response`` only). Dynamo's ``/generate`` streams only (its
frontend answers 501 otherwise): it has no body to read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import orjson

from fastaccum._core.dialects import DYNAMO, VLLM, check_dialect
from fastaccum._impl import StreamAccumulator, chunked_decoder
from fastaccum.errors import StreamError, StreamFormatError, StreamLimitError, StreamTruncatedError
from fastaccum.result import StreamResult

__all__ = ("parse_response", "BodyReader")

Buffer = bytes | bytearray | memoryview
# A twin's StreamAccumulator (fastaccum.transport.consumer names the type; it imports this module).
AccumulatorLike = Any
_WHITESPACE = b" \t\r\n"
_BETWEEN = _WHITESPACE + b","  # what may stand between the elements of a list


def parse_response(
    body: Buffer | Iterable[Buffer], *, dialect: str = "sglang", **options: Any
) -> StreamResult | list[StreamResult]:
    """A whole non-streaming answer: SGLang's ``/generate`` body, or vLLM's
    ``/inference/v1/generate`` one, as bytes (``bytes``, ``bytearray``, ``memoryview``) or an
    iterable of such pieces. Returns its ``StreamResult``, or for a batch (SGLang's JSON list,
    vLLM's ``n > 1``) one per request, in order. ``options`` are the accumulator's
    (``expert_shape``, ``indexer_shape``, ``max_event_bytes`` (here: of the whole body),
    ``routed_start``, ``routed_dtype``, ``require_routed_experts``, ``mode``); the errors are the
    stream's: ``ServerError`` for an error answer, ``StreamTruncatedError`` for a cut body,
    ``StreamLengthError`` for counts that disagree, ``StreamFormatError`` for anything that is not
    such an answer."""
    whole = body if isinstance(body, (bytes, bytearray, memoryview)) else None
    if not isinstance(body, (bytes, bytearray, memoryview)) and dialect == VLLM:
        whole = bytearray().join(body)  # its n > 1 answers are read whole: gather the pieces
    reader = BodyReader(dialect=dialect, **options)
    try:
        if whole is not None:
            reader.feed(whole)
        else:
            assert not isinstance(body, (bytes, bytearray, memoryview))
            for piece in body:
                reader.feed(piece)
        return reader.results()
    except StreamFormatError:
        if whole is None or dialect != VLLM:
            raise
        choices = _vllm_choices(whole)
        if choices is None:
            raise
    return [parse_response(choice, dialect=VLLM, **options) for choice in choices]  # type: ignore[misc]


def _vllm_choices(body: Buffer) -> list[bytes] | None:
    """vLLM's answer of ``n > 1`` choices as one answer per choice, in the order of their index,
    each with the object's other members but ``usage`` (which counts every choice); None when the
    body is not one (its error stands). Read with orjson: its base64 arrays become strings here."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, dict) for c in choices):
        return None
    others = {key: value for key, value in obj.items() if key not in ("choices", "usage")}
    ordered = sorted(choices, key=lambda choice: choice.get("index", 0))
    return [orjson.dumps({**others, "choices": [{**choice, "index": 0}]}) for choice in ordered]


class _Event:
    """One request's JSON fed to its accumulator as one SSE event, line breaks and all (a JSON
    body may break lines between its tokens; each line is a data line of the event)."""

    def __init__(self, accumulator: AccumulatorLike) -> None:
        self.accumulator = accumulator
        self.accumulator.feed(b"data: ")

    def write(self, data: Buffer) -> None:
        start = 0
        while True:
            cut = _line_break(data, start)
            if cut < 0:
                if start < len(data):
                    self.accumulator.feed(data[start:] if start else data)
                return
            self.accumulator.feed(data[start:cut])
            self.accumulator.feed(b"\ndata: ")
            start = cut + 1

    def end(self) -> StreamResult:
        self.accumulator.feed(b"\n\n")
        result: StreamResult = self.accumulator.finish()
        return result


def _line_break(data: Buffer, start: int) -> int:
    """The first CR or LF of ``data`` from ``start``, or -1; memchr over the bytes where they are
    a bytes object's or a bytearray's (a memoryview's own, found by address, without a copy)."""
    raw: Any = data
    offset = 0
    if isinstance(data, memoryview):
        base = data.obj
        if isinstance(base, (bytes, bytearray)) and data.contiguous and data.itemsize == 1 and len(data):
            offset = np.frombuffer(data, np.uint8).ctypes.data - np.frombuffer(base, np.uint8).ctypes.data
            raw = base
        else:
            raw = data.tobytes()
    end = offset + len(data)
    found = [at for at in (raw.find(b"\n", offset + start, end), raw.find(b"\r", offset + start, end)) if at >= 0]
    return min(found) - offset if found else -1


class BodyReader:
    """One non-streaming body fed in pieces, read into one ``StreamResult`` per request it
    answers; the accumulator's face (``feed``, ``feed_chunked``, ``finish``, ``snapshot``,
    progress), so that a transport reads a body as it reads a stream. ``accumulator``: what makes
    the accumulator of each request (default: the selected twin's ``StreamAccumulator``)."""

    def __init__(
        self,
        mode: str = "auto",
        *,
        dialect: str = "sglang",
        max_event_bytes: int | None = None,
        accumulator: Callable[..., AccumulatorLike] | None = None,
        **options: Any,  # the accumulator's: expert_shape, indexer_shape, routed_start, ...
    ) -> None:
        check_dialect(dialect)
        if dialect == DYNAMO:
            raise ValueError("Dynamo's /generate streams only (its frontend answers 501 otherwise): no body to read")
        self._dialect = dialect
        self._mode = mode
        self._options = options
        self._make = accumulator if accumulator is not None else StreamAccumulator
        self._new()  # the options' own checks, at once
        self._limit = max_event_bytes
        self._size = 0
        self._chunks: Any = None  # feed_chunked()'s decoder, made on first use
        self._results: list[StreamResult] = []
        self._event: _Event | None = None
        self._shape = ""  # "object" or "list" once the first byte says
        self._depth = 0  # SGLang lists: nesting inside the list
        self._in_string = False
        self._escaped = False
        self._error: StreamError | None = None
        self._ended = False

    def _new(self) -> AccumulatorLike:
        """An accumulator for one request's answer."""
        return self._make(mode=self._mode, dialect=self._dialect, **self._options)

    # ---- the accumulator's face ----------------------------------------------------------------
    @property
    def events(self) -> int:
        """Requests read whole so far."""
        return len(self._results)

    @property
    def tokens(self) -> int:
        return sum(len(r) for r in self._results)

    @property
    def completed(self) -> list[StreamResult]:
        """The answers read whole so far, in order: what a batch cut or broken after them still
        holds (the error's ``event_index`` is their count)."""
        return list(self._results)

    @property
    def finished(self) -> bool:
        return self._ended

    @property
    def chunked_ended(self) -> bool:
        return self._chunks is not None and bool(self._chunks.ended)

    def snapshot(self) -> StreamResult:
        """What a cut body kept: its first request's result once read whole, else nothing (a
        non-streaming answer has no prefix before it is complete)."""
        if self._results:
            return self._results[0]
        return self._make(mode=self._mode, dialect=self._dialect, **self._options).snapshot()

    def feed(self, data: Buffer, /) -> int:
        """Read a piece of the body; returns the requests it completed."""
        if self._error is not None:
            raise self._error
        before = len(self._results)
        try:
            self._size += len(data)
            if self._limit is not None and self._size > self._limit:
                raise StreamLimitError(f"the body exceeds max_event_bytes={self._limit}", event_index=0)
            self._read(data)
        except StreamError as exc:
            self._error = exc
            raise
        return len(self._results) - before

    def feed_chunked(self, data: Buffer, /) -> int:
        """Read a piece of an HTTP/1.1 chunked body (the chunked coding undone first)."""
        if self._chunks is None:
            self._chunks = chunked_decoder()
        before = len(self._results)
        self._chunks.feed(data, len(data), _ChunkSink(self))
        return len(self._results) - before

    def finish(self) -> StreamResult:
        """The body's one result (``results()`` for a batch)."""
        results = self.results()
        if isinstance(results, list):
            raise StreamFormatError(f"the body answers {len(results)} requests: read it with results()")
        return results

    def results(self) -> StreamResult | list[StreamResult]:
        """End of the body: its result, or for a batch one per request."""
        if self._error is not None:
            raise self._error
        if not self._ended:
            try:
                self._end()
            except StreamError as exc:
                self._error = exc
                raise
        if self._shape == "object":
            return self._results[0]
        return list(self._results)

    # ---- the body's structure --------------------------------------------------------------------
    def _read(self, data: Buffer) -> None:
        if not self._shape:
            data = self._first(data)
            if not self._shape:
                return
        if self._shape == "object":
            assert self._event is not None
            self._event.write(data)
        else:
            self._read_list(data)

    def _first(self, data: Buffer) -> Buffer:
        """Skip leading whitespace; the first byte says the body's shape."""
        view = memoryview(data)
        at = 0
        while at < len(view) and view[at] in _WHITESPACE:
            at += 1
        if at == len(view):
            return b""
        first = view[at]
        if first == 0x7B:  # {
            self._shape = "object"
            self._event = _Event(self._new())
        elif first == 0x5B and self._dialect != VLLM:  # [: SGLang's batch
            self._shape = "list"
        else:
            raise _not_an_answer(bytes(view[at : at + 80]))
        return view[at:]

    def _read_list(self, data: Buffer) -> None:
        """SGLang's batch: each element of the top-level list to an accumulator of its own."""
        raw = data if isinstance(data, (bytes, bytearray)) else bytes(data)
        pos, end = 0, len(raw)
        while pos < end:
            if self._in_string:
                stop = self._string_end(raw, pos, end)
                if self._event is not None:
                    self._event.write(raw[pos:stop])
                pos = stop
                continue
            at = _next_structure(raw, pos, end)
            if self._event is None and self._depth == 1 and raw[pos : at if at >= 0 else end].strip(_BETWEEN):
                raise _not_an_element(len(self._results))  # a value between the elements that is none
            if at < 0:
                if self._event is not None:
                    self._event.write(raw[pos:end])
                return
            byte = raw[at]
            if byte == 0x7B or byte == 0x5B:  # { [
                self._depth += 1
                if self._depth == 2:
                    if byte != 0x7B:
                        raise _not_an_element(len(self._results))
                    self._event = _Event(self._new())  # an element starts at its brace
                    pos = at
            elif byte == 0x7D or byte == 0x5D:  # } ]
                self._depth -= 1
                if self._depth == 0:  # the list's end
                    self._ended = True
                    if raw[at + 1 : end].strip(_WHITESPACE):
                        raise StreamFormatError("data after the answer's JSON", event_index=len(self._results))
                    return
            elif self._event is None:  # a string outside any element
                raise _not_an_element(len(self._results))
            else:
                self._in_string = True
            if self._event is not None:
                self._event.write(raw[pos : at + 1])
                if self._depth == 1:  # the element's closing brace: it is whole
                    self._results.append(self._event.end())
                    self._event = None
            pos = at + 1

    def _string_end(self, raw: bytes | bytearray, pos: int, end: int) -> int:
        """Past the closing quote of the string being read, or ``end``: a quote after a backslash
        does not close it."""
        while pos < end:
            if self._escaped:
                self._escaped = False
                pos += 1
                continue
            quote = raw.find(b'"', pos, end)
            slash = raw.find(b"\\", pos, end)
            if slash >= 0 and (quote < 0 or slash < quote):
                self._escaped = True
                pos = slash + 1
                continue
            if quote < 0:
                return end
            self._in_string = False
            return quote + 1
        return pos

    def _end(self) -> None:
        if not self._shape:
            raise StreamTruncatedError("the body is empty: no answer arrived", event_index=0)
        if self._shape == "object":
            assert self._event is not None
            self._results.append(self._event.end())
            self._event = None  # its buffers (the event's bytes) go now, not with the reader
        elif not self._ended:
            raise StreamTruncatedError(
                f"the body ended inside its list of answers, after {len(self._results)}", event_index=len(self._results)
            )
        self._ended = True


def _next_structure(raw: bytes | bytearray, pos: int, end: int) -> int:
    """The next of ``"[]{}`` in ``raw[pos:end]``, or -1 (a find per character: memchr speed)."""
    found = [at for at in (raw.find(c, pos, end) for c in (b'"', b"[", b"]", b"{", b"}")) if at >= 0]
    return min(found) if found else -1


def _not_an_element(index: int) -> StreamFormatError:
    return StreamFormatError(f"element {index} of the answer's list is not an object", event_index=index)


def _not_an_answer(first: bytes) -> StreamFormatError:
    text = first.lstrip()
    kind = "an HTML page" if text[:1] == b"<" else ("an event stream" if text.startswith(b"data:") else "not JSON")
    return StreamFormatError(f"the body is not a JSON answer: {kind}; it starts {text[:80]!r}", event_index=0)


class _ChunkSink:
    """What the chunked decoder hands the data of each chunk to (the framer's place in a stream)."""

    def __init__(self, reader: BodyReader) -> None:
        self._reader = reader

    @property
    def events(self) -> int:
        return self._reader.events

    def feed(self, buf: Any, start: int, end: int) -> int:
        return self._reader.feed(memoryview(buf)[start:end])
