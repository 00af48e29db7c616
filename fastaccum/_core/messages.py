"""Every error message of the core, built once for both twins: the same input raises the same
class with the same text.

Only cold paths come here: each function builds (never raises) one exception.
"""

from __future__ import annotations

from fastaccum.errors import (
    ServerError,
    StreamError,
    StreamFormatError,
    StreamLengthError,
    StreamLimitError,
    StreamTruncatedError,
)

__all__ = (
    "type_name",
    "bad_format",
    "too_large",
    "server_error",
    "mode_mismatch",
    "length_decreased",
    "bad_length",
    "truncated",
    "wrong_type",
    "bad_token_id",
    "bad_logprob_entry",
    "bad_count",
    "not_json",
    "bad_base64",
    "broken",
    "not_an_object",
    "bad_npy",
    "npy_shape",
    "input_ended",
    "no_routed_experts",
    "wrong_dialect",
    "text_logprobs",
    "indexed_event",
    "logprobs_switched",
    "lengths_disagree",
    "changed_token",
    "echo_short",
    "bad_offsets",
    "top_p_half",
    "top_p_rows",
    "replay_size",
    "replay_layers",
    "bad_option",
    "not_bytes",
    "fed_after_finish",
    "bad_chunk",
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
    return StreamLengthError(f"event {index}: {what}", event_index=index, mode=mode, expected=expected, actual=actual)


def truncated(index: int, what: str) -> StreamTruncatedError:
    return StreamTruncatedError(f"event {index}: {what}", event_index=index)


# ---- field readers ----------------------------------------------------------------------------


def wrong_type(index: int, where: str, expected: str, value: object) -> StreamFormatError:
    """``where`` holds a value of the wrong JSON type (``expected``: "an array", "a string", ...)."""
    return bad_format(index, f"{where} must be {expected}, not {type_name(value)}")


def bad_token_id(index: int, where: str, token: object) -> StreamFormatError:
    """``token`` failed the id check: not an int, or outside [0, 2**31)."""
    if type(token) is not int:
        return wrong_type(index, where, "a token id", token)
    return bad_format(index, f"{where} = {token} is not a token id in [0, 2**31)")


def bad_logprob_entry(index: int, i: int, part: int | None = None, value: object = None) -> StreamFormatError:
    """Entry ``i`` of output_token_logprobs is not a triple, or its element ``part`` (0: the
    logprob, 2: the text) has the wrong type."""
    if part is None:
        return bad_format(index, f"{LOGPROBS}[{i}] must be [logprob, id, text]")
    return wrong_type(index, f"{LOGPROBS}[{i}][{part}]", "a number or null" if part == 0 else "a string or null", value)


def bad_count(index: int, key: str, value: object) -> StreamFormatError:
    """meta_info[key] is not an integer, or is negative, or is 2**63 or more."""
    if type(value) is not int:
        return wrong_type(index, f"meta_info.{key}", "an integer", value)
    if value < 0:
        return bad_format(index, f"meta_info.{key} = {value} is negative")
    return bad_format(index, f"meta_info.{key} = {value} is not a token count (2**63 or more)")


def not_json(index: int, exc: Exception) -> StreamFormatError:
    return bad_format(index, f"data is not valid JSON ({exc})")


def bad_base64(index: int, key: str, size: int | None = None) -> StreamFormatError:
    """meta_info[key] is not valid base64 (``size`` None), or decodes to ``size`` bytes, which are
    not whole int32 values."""
    if size is None:
        return bad_format(index, f"meta_info.{key} is not valid base64")
    return bad_format(index, f"meta_info.{key} decodes to {size} bytes, not whole int32 values")


# ---- events -----------------------------------------------------------------------------------

# Format errors whose text names no value, by the rule each one breaks.
_RULES = {
    "after_done": "data after [DONE]",
    "after_terminal": "data after the terminal event",
    "no_meta": "meta_info is missing",
    "ids_disagree": "output_ids disagree with the ids in output_token_logprobs",
    "no_tokens": "the event has neither output_ids nor output_token_logprobs",
    "no_total": "meta_info has no completion_tokens",
    "echo_no_total": "abort echo without completion_tokens",
    "routed_no_prompt": "routed_experts without prompt_tokens cannot be checked against expert_shape",
    "no_choices": "choices is missing",
    "choices": "a chunk with more than one choice, or of a choice other than 0, is not one request (n > 1)",
    "indexer_no_prompt": "indexer_topk without prompt_tokens cannot be shaped (indexer_shape, indexer_topk_num_layers)",
}


def broken(index: int, rule: str) -> StreamFormatError:
    """The event breaks ``rule`` (a key of _RULES)."""
    return bad_format(index, _RULES[rule])


def bad_npy(index: int, why: str) -> StreamFormatError:
    return bad_format(index, f"choices[0].routed_experts is not a routed-experts .npy: {why}")


def npy_shape(index: int, mode: str, shape: tuple[int, ...], expert_shape: tuple[int, int]) -> StreamLengthError:
    layers, topk = expert_shape
    return bad_length(
        index,
        mode,
        f"choices[0].routed_experts has shape {shape}; expert_shape says (rows, {layers}, {topk}) "
        f"(expert_shape={tuple(shape[1:])} would fit)",
        layers * topk,
        shape[1] * shape[2],
    )


def not_an_object(index: int, value: object) -> StreamFormatError:
    return bad_format(index, f"data is a JSON {type_name(value)}, not an object")


# Why a server of each dialect ends a stream early in the way it ended (docs/dialects.md).
_ENDED_BY = {
    ("dynamo", "eof"): " (Dynamo ends a request it killed this way: a client disconnect, a backend timeout)",
    ("dynamo", "done"): " (Dynamo stopped the request: its graceful stop ends with [DONE] and no finish_reason)",
    ("vllm", "done"): " (vLLM before 0.32 ends an aborted request this way)",
}


# How each server is asked for routed experts, for the message when none came.
_ROUTED_SWITCH = {
    "sglang": "SGLang sends them when started with --enable-return-routed-experts and asked with "
    '"return_routed_experts": true (sglang-router 0.3.2 drops that key: docs/client.md)',
    "dynamo": "SGLang behind Dynamo sends them when started with --enable-return-routed-experts",
    "vllm": "vLLM sends them when started with --enable-return-routed-experts",
}


def no_routed_experts(dialect: str) -> StreamFormatError:
    return StreamFormatError(
        f"the stream finished without routed experts, which require_routed_experts asks for: {_ROUTED_SWITCH[dialect]}"
    )


def input_ended(index: int, mid_event: bool | None, dialect: str = "sglang") -> StreamTruncatedError:
    """End of input (``mid_event``: inside an event), or [DONE] (``mid_event`` None), before a
    terminal finish_reason."""
    if mid_event is None:
        return truncated(index, "[DONE] before a terminal finish_reason" + _ENDED_BY.get((dialect, "done"), ""))
    where = "inside an event, " if mid_event else ""
    why = _ENDED_BY.get((dialect, "eof"), "") if not mid_event else ""
    return truncated(index, f"input ended {where}before a terminal finish_reason{why}")


_SERVERS = {
    "sglang": "SGLang /generate",
    "dynamo": "Dynamo /generate",
    "vllm": "vLLM /inference/v1/generate",
}


def wrong_dialect(index: int, declared: str, seen: str) -> StreamFormatError:
    """The first event is another server's shape than the declared dialect's."""
    return bad_format(
        index,
        f"this event is {_SERVERS[seen]}'s shape, but the stream is read as dialect={declared!r} "
        f"({_SERVERS[declared]}); pass dialect={seen!r}",
    )


def text_logprobs(index: int, where: str, token: str) -> StreamFormatError:
    """A vLLM log-prob item names its token by text: the request asked for ``output_mode: "text"``."""
    return bad_format(
        index,
        f'{where} is the decoded token {token[:40]!r}, not an id: with output_mode "text" vLLM sends '
        'log-probs by token text, and a rollout needs the ids; send output_mode "tokens" (the default), '
        "or leave logprobs out of sampling_params to keep text mode",
    )


_GATEWAY = (
    "an sgl-model-gateway /generate stream in gRPC mode, whose text and logprobs are cumulative "
    "while its ids are deltas (run the gateway in HTTP mode, which passes SGLang's events through)"
)
_BATCH = "an SGLang batch stream, several prompts in one request (send one prompt per request)"


def indexed_event(index: int, meta: object) -> StreamFormatError:
    """An event with a top-level "index": one of two streams that are not one request's, told
    apart where the event allows. SGLang counts the log-probs it sends
    (output_token_logprobs_length) and the gateway's gRPC rendering does not; older gateways sent
    no completion_tokens either. Without log-probs the two look alike, and the message names both."""
    if type(meta) is dict:
        if "completion_tokens" not in meta or (
            "output_token_logprobs" in meta and "output_token_logprobs_length" not in meta
        ):
            return bad_format(index, f'a top-level "index": {_GATEWAY}; fastaccum reads one request per stream')
        if "output_token_logprobs_length" in meta:
            return bad_format(index, f'a top-level "index": {_BATCH}; fastaccum reads one request per stream')
    return bad_format(
        index, f'a top-level "index": either {_BATCH} or {_GATEWAY}; fastaccum reads one request per stream'
    )


def logprobs_switched(index: int, has_logprobs: bool) -> StreamFormatError:
    what = "appeared" if has_logprobs else "disappeared"
    return bad_format(index, f"output_token_logprobs {what} mid-stream")


def lengths_disagree(index: int, mode: str, lp_length: int, completion: int) -> StreamLengthError:
    return bad_length(
        index,
        mode,
        f"output_token_logprobs_length {lp_length} differs from completion_tokens {completion}",
        completion,
        lp_length,
    )


def changed_token(index: int, at: int, held: int, new: int) -> StreamFormatError:
    return bad_format(index, f"token {at} changed from {held} to {new}")


def echo_short(index: int, mode: str, completion: int, held: int, carried: bool) -> StreamLengthError:
    """An abort echo reports fewer tokens than held (``carried``), or more without carrying them."""
    if carried:
        return bad_length(
            index, mode, f"abort echo reports {completion} tokens, fewer than the {held} held", held, completion
        )
    return bad_length(
        index,
        mode,
        f"abort echo reports {completion} tokens, {held} held, and does not carry the missing ones",
        completion,
        held,
    )


# ---- top-p and routed experts -----------------------------------------------------------------


def bad_offsets(index: int, key: str, end: int | None = None, n_ids: int = 0) -> StreamFormatError:
    """Top-p offsets that do not start at 0 (``end`` -1), decrease (None) or end at ``end``, not
    at the ``n_ids`` ids."""
    if end is None:
        return bad_format(index, f"meta_info.{key} decreases")
    if end < 0:
        return bad_format(index, f"meta_info.{key} must start at 0")
    return bad_format(index, f"meta_info.{key} ends at {end}, not at the {n_ids} ids")


def top_p_half(index: int, present: str, missing: str) -> StreamFormatError:
    return bad_format(index, f"meta_info.{present} without meta_info.{missing}")


def top_p_rows(index: int, mode: str, rows: int | None, added: int, total: int) -> StreamError:
    """Top-p rows that fit neither this event's new tokens nor all tokens (``rows`` None: the
    event adds tokens without rows, once the stream has carried top-p)."""
    if rows is None:
        return bad_format(index, f"top-p rows missing for the {added} new tokens")
    return bad_length(
        index,
        mode,
        f"top-p has {rows} rows; expected {added} (this event's new tokens) or {total} (all tokens)",
        total,
        rows,
    )


def replay_size(
    index: int, mode: str, key: str, size: int, rows: tuple[int, int, int], shape: tuple[int, int | None]
) -> StreamLengthError:
    """A replay array (routed_experts, indexer_topk) whose size is not rows x layers x topk, with
    rows = prompt + completion - 1 - start (at least 0); ``shape`` (layers, None): the width comes
    from the size (indexer_topk_num_layers gives only the layers), which must be a positive
    multiple of rows x layers."""
    prompt, done, start = rows
    layers, topk = shape
    count = max(prompt + done - 1 - start, 0)
    counted = f"{prompt} + {done} - 1" + (f" - {start}" if start else "")
    if topk is None:
        what = (
            f"{key} has {size} values; expected a positive multiple of ({counted}) x {layers} (indexer_topk_num_layers)"
        )
        return bad_length(index, mode, what, count * layers, size)
    expected = count * layers * topk
    what = f"{key} has {size} values; expected ({counted}) x {layers} x {topk} = {expected}"
    return bad_length(index, mode, what + _fitting(key, size, count, layers, topk), expected, size)


def _fitting(key: str, size: int, rows: int, layers: int, topk: int) -> str:
    """What would fit ``size`` values in ``rows`` rows: the shape option keeping one of its two
    numbers, or the news that no shape does (then the row count is off)."""
    option = "expert_shape" if key == "routed_experts" else "indexer_shape"
    if not rows or size % rows:
        return f" (no {option} fits: {size} values do not divide into {rows} rows)"
    per_row = size // rows
    fits = [(per_row // topk, topk)] if per_row % topk == 0 else []
    if per_row % layers == 0 and (layers, per_row // layers) not in fits:
        fits.append((layers, per_row // layers))
    if not fits:
        return f" (each row holds {per_row}: {option} must multiply to {per_row})"
    return f" (each row holds {per_row}: {option}={' or '.join(str(f) for f in fits)} would fit)"


def replay_layers(index: int, mode: str, key: str, value: object, layers: int) -> StreamError:
    """meta_info[key] (a replay array's layer count, which some SGLang forks send) is not a
    positive int (StreamFormatError), or disagrees with the ``layers`` of the shape option."""
    if type(value) is not int:
        return wrong_type(index, f"meta_info.{key}", "a positive integer", value)
    if value <= 0:
        return bad_format(index, f"meta_info.{key} = {value} is not a layer count")
    return bad_length(index, mode, f"meta_info.{key} = {value}, but indexer_shape has {layers} layers", layers, value)


# ---- stream -----------------------------------------------------------------------------------


def bad_option(name: str, value: object, dialect: str | None = None) -> ValueError:
    """A constructor argument out of its domain (``dialect``: the mode a dialect cannot stream)."""
    if dialect is not None:
        return ValueError(
            f"mode={value!r} cannot be read as dialect={dialect!r}: that server streams incremental events"
        )
    domain = {
        "mode": "'auto', 'cumulative' or 'incremental'",
        "expert_shape": "(num_layers, topk) positive ints",
        "indexer_shape": "(num_indexer_layers, index_topk) positive ints",
        "routed_start": "a non-negative int",
        "max_event_bytes": "a non-negative int or None",
        "dialect": "'sglang', 'dynamo' or 'vllm'",
        "routed_dtype": "None (the wire's) or 'int32'",
    }[name]
    return ValueError(f"{name} must be {domain}, not {value!r}")


def not_bytes(data: object, method: str = "feed") -> TypeError:
    return TypeError(f"{method}() takes bytes, bytearray or memoryview, not {type(data).__name__}")


def fed_after_finish(method: str = "feed") -> RuntimeError:
    return RuntimeError(f"{method}() called after finish()")


# ---- chunked bodies ---------------------------------------------------------------------------

# Chunked-body states, numbered alike in both twins' chunked decoders.
_CHUNK_PLACES = (
    "where a chunk size was expected",
    "in the chunk size (expected a hex digit, ';' or CRLF)",
    "after the chunk size (expected ';' or CRLF)",
    "after ';' (expected a chunk-extension name)",
    "after CR (expected LF)",
    "in chunk data",
    "after chunk data (expected CRLF)",
    "after CR (expected LF)",
    "at the start of a trailer line",
    "in a trailer line (expected CRLF)",
    "after CR (expected LF)",
    "after CR (expected LF)",
    "after the end of the chunked body",
    "in a chunk-extension name (expected a token character, '=', ';' or CRLF)",
    "after a chunk-extension name (expected '=', ';' or CRLF)",
    "after '=' (expected a token or a quoted string)",
    "in a chunk-extension value (expected a token character, ';' or CRLF)",
    "in a quoted chunk-extension value (a control character: the quote never closed?)",
    "after a backslash in a quoted chunk-extension value",
    "after a chunk-extension value (expected ';' or CRLF)",
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
