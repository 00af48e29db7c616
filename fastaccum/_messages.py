"""Every error message of the core, built once for both twins: the same input raises the same
class with the same text.

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
    "not_an_array",
    "bad_token_id",
    "bad_logprob_entry",
    "bad_logprob",
    "bad_logprob_text",
    "bad_count",
    "not_json",
    "logprobs_switched",
    "ids_disagree",
    "no_tokens",
    "lengths_disagree",
    "no_total",
    "changed_token",
    "not_whole_int32",
    "bad_mode",
    "bad_expert_shape",
    "bad_max_event_bytes",
    "not_bytes",
    "fed_after_finish",
)

LOGPROBS = "meta_info.output_token_logprobs"


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


# ---- field readers ----------------------------------------------------------------------------


def not_an_array(index: int, where: str, value: object) -> StreamFormatError:
    return bad_format(index, f"{where} must be an array, not {type_name(value)}")


def bad_token_id(index: int, where: str, token: object) -> StreamFormatError:
    """``token`` failed the id check: not an int, or outside [0, 2**31)."""
    if type(token) is not int:
        return bad_format(index, f"{where} must be a token id, not {type_name(token)}")
    return bad_format(index, f"{where} = {token} is not a token id in [0, 2**31)")


def bad_logprob_entry(index: int, i: int) -> StreamFormatError:
    return bad_format(index, f"{LOGPROBS}[{i}] must be [logprob, id, text]")


def bad_logprob(index: int, i: int, logprob: object) -> StreamFormatError:
    return bad_format(index, f"{LOGPROBS}[{i}][0] must be a number or null, not {type_name(logprob)}")


def bad_logprob_text(index: int, i: int, text: object) -> StreamFormatError:
    return bad_format(index, f"{LOGPROBS}[{i}][2] must be a string or null, not {type_name(text)}")


def bad_count(index: int, key: str, value: object) -> StreamFormatError:
    """meta_info[key] is not an integer, or is negative."""
    if type(value) is not int:
        return bad_format(index, f"meta_info.{key} must be an integer, not {type_name(value)}")
    return bad_format(index, f"meta_info.{key} = {value} is negative")


def not_json(index: int, exc: Exception) -> StreamFormatError:
    return bad_format(index, f"data is not valid JSON ({exc})")


def not_whole_int32(index: int, key: str, size: int) -> StreamFormatError:
    return bad_format(index, f"meta_info.{key} decodes to {size} bytes, not whole int32 values")


# ---- events -----------------------------------------------------------------------------------


def logprobs_switched(index: int, has_logprobs: bool) -> StreamFormatError:
    what = "appeared" if has_logprobs else "disappeared"
    return bad_format(index, f"output_token_logprobs {what} mid-stream")


def ids_disagree(index: int) -> StreamFormatError:
    return bad_format(index, "output_ids disagree with the ids in output_token_logprobs")


def no_tokens(index: int) -> StreamFormatError:
    return bad_format(index, "the event has neither output_ids nor output_token_logprobs")


def lengths_disagree(index: int, mode: str, lp_length: int, completion: int) -> StreamLengthError:
    return bad_length(
        index, mode,
        f"output_token_logprobs_length {lp_length} differs from completion_tokens {completion}",
        completion, lp_length,
    )


def no_total(index: int) -> StreamFormatError:
    return bad_format(index, "meta_info has no completion_tokens")


def changed_token(index: int, at: int, held: int, new: int) -> StreamFormatError:
    return bad_format(index, f"token {at} changed from {held} to {new}")


# ---- stream -----------------------------------------------------------------------------------


def bad_mode(mode: object) -> ValueError:
    return ValueError(f"mode must be 'auto', 'cumulative' or 'incremental', not {mode!r}")


def bad_expert_shape(expert_shape: object) -> ValueError:
    return ValueError(f"expert_shape must be (num_layers, topk) positive ints, not {expert_shape!r}")


def bad_max_event_bytes(max_event_bytes: object) -> ValueError:
    return ValueError(f"max_event_bytes must be a non-negative int or None, not {max_event_bytes!r}")


def not_bytes(data: object) -> TypeError:
    return TypeError(f"feed() takes bytes, bytearray or memoryview, not {type(data).__name__}")


def fed_after_finish() -> RuntimeError:
    return RuntimeError("feed() called after finish()")
