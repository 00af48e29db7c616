"""Error factories shared by both twins, so the same input raises the same class with the same text.

Only cold paths come here: each function builds (never raises) one exception.
"""

from __future__ import annotations

from fastaccum.errors import (
    ServerError,
    StreamFormatError,
    StreamLengthError,
    StreamLimitError,
    StreamTruncatedError,
)

__all__ = (
    "bad_format",
    "too_large",
    "server_error",
    "mode_mismatch",
    "length_decreased",
    "bad_length",
    "truncated",
    "type_name",
    "bad_chunk",
)


def type_name(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def bad_format(index: int, what: str) -> StreamFormatError:
    return StreamFormatError(f"event {index}: {what}", event_index=index)


def too_large(index: int, limit: int) -> StreamLimitError:
    return StreamLimitError(f"event {index}: data exceeds max_event_bytes={limit}", event_index=index)


def server_error(index: int, error: object) -> ServerError:
    # Never str() an arbitrary JSON value: a hostile one nested a thousand deep would recurse.
    if isinstance(error, dict):
        message = error.get("message")
        code = error.get("code")
        status = code if isinstance(code, int) and not isinstance(code, bool) else None
        text = message if isinstance(message, str) else "an error object without a message"
    else:
        status = None
        text = error if isinstance(error, str) else f"an error value of type {type_name(error)}"
    prefix = f"event {index}: server error" + (f" {status}" if status is not None else "")
    return ServerError(f"{prefix}: {text}", event_index=index, status=status, server_message=text)


def mode_mismatch(index: int, mode: str, held: int, listed: int, reported: int) -> StreamLengthError:
    """The event fits neither the configured mode nor (for auto) any mode; say which reading holds."""
    cumulative_fits = listed == reported and reported >= held
    incremental_fits = held + listed == reported
    numbers = f"{listed} tokens listed, {reported} reported in total, {held} held before"
    if mode == "cumulative":
        hint = (
            "; the incremental reading holds (is the server started with --incremental-streaming-output?)"
            if incremental_fits
            else "; the incremental reading does not hold either"
        )
        message = f"event {index}: not a cumulative event ({numbers}){hint}"
        actual = listed
    elif mode == "incremental":
        hint = (
            "; the cumulative reading holds (is the server missing --incremental-streaming-output?)"
            if cumulative_fits
            else "; the cumulative reading does not hold either"
        )
        message = f"event {index}: not an incremental event ({numbers}){hint}"
        actual = held + listed
    else:
        message = f"event {index}: fits neither the cumulative nor the incremental reading ({numbers})"
        actual = listed
    return StreamLengthError(message, event_index=index, mode=mode, expected=reported, actual=actual)


def length_decreased(index: int, previous: int, reported: int) -> StreamLengthError:
    return StreamLengthError(
        f"event {index}: cumulative total went down from {previous} to {reported} "
        "(the incremental reading does not apply to a cumulative stream)",
        event_index=index,
        mode="cumulative",
        expected=previous,
        actual=reported,
    )


def bad_length(index: int, mode: str, what: str, expected: int, actual: int) -> StreamLengthError:
    return StreamLengthError(
        f"event {index}: {what}", event_index=index, mode=mode, expected=expected, actual=actual
    )


def truncated(index: int, what: str) -> StreamTruncatedError:
    return StreamTruncatedError(f"event {index}: {what}", event_index=index)


# Chunked-body states, numbered alike in both twins' chunked decoders.
_CHUNK_PLACES = (
    "where a chunk size was expected",
    "in the chunk size (expected a hex digit, ';' or CRLF)",
    "after the chunk size (expected ';' or CRLF)",
    "in a chunk extension (expected CRLF)",
    "after CR (expected LF)",
    "in chunk data",
    "after chunk data (expected CRLF)",
    "after CR (expected LF)",
    "at the start of a trailer line",
    "in a trailer line (expected CRLF)",
    "after CR (expected LF)",
    "after CR (expected LF)",
    "after the end of the chunked body",
)


def bad_chunk(index: int, state: int, byte: int) -> StreamFormatError:
    """Malformed ``Transfer-Encoding: chunked`` framing: ``byte`` was not allowed in ``state``;
    ``byte`` -1 is a chunk size of 2**60 or more, -2 a size or trailer line over the length cap."""
    if byte == -1:
        what = "chunk size of 2**60 bytes or more"
    elif byte == -2:
        what = "chunk-size or trailer line longer than 8192 bytes"
    else:
        what = f"{bytes((byte,))!r} {_CHUNK_PLACES[state]}"
    return StreamFormatError(f"event {index}: malformed chunked body: {what}", event_index=index)
