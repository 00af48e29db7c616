"""The accumulator's per-stream rules, written once and called by both twins (docs/core.md).

What runs once per stream, on an event the compiled twin's scanner leaves to orjson, or only on
error: the guards of the constructor, ``feed()`` and ``finish()``, a parsed event's shape, the
abort echo, top-p and routed experts (a result's fields: fastaccum._core.results). Per-byte and
per-event work stays in the twins; fastaccum._core.base.AccumulatorBase is the class face that
calls these.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
import orjson
import pybase64

from fastaccum._core.messages import (
    bad_base64,
    bad_count,
    bad_offsets,
    bad_option,
    broken,
    echo_short,
    fed_after_finish,
    indexed_event,
    input_ended,
    no_routed_experts,
    not_an_object,
    not_bytes,
    not_json,
    replay_layers,
    replay_size,
    server_error,
    top_p_half,
    top_p_rows,
    wrong_dialect,
    wrong_type,
)
from fastaccum.errors import StreamError

__all__ = (
    "MODES",
    "DIALECTS",
    "ABSENT",
    "ParsedEvent",
    "B64_KEYS",
    "TOP_P_KEYS",
    "ARRAY_KEYS",
    "check_options",
    "refused_feed",
    "finish_error",
    "routed_experts_missing",
    "end_event",
    "read_event",
    "event_meta",
    "event_finish",
    "event_counts",
    "echo_start",
    "echo_text",
    "read_arrays",
    "read_top_p",
    "top_p_answer",
    "read_replay",
    "indexer_shape_of",
    "decode_b64",
    "decode_int32",
    "int32_array",
)

MODES = ("auto", "cumulative", "incremental")
# The servers whose streams the core reads (docs/dialects.md). Dynamo passes SGLang's incremental
# events through; vLLM's token-in/token-out chunks have their own shape (fastaccum._core.dialects).
DIALECTS = ("sglang", "dynamo", "vllm")
# A count the event does not carry (completion_tokens, prompt_tokens, ...): both twins use -1, the
# compiled twin's structs having no None.
ABSENT = -1
# Counts are int64 in the compiled twin's structs; orjson reads integers up to 2**64 - 1, and no
# stream has 2**63 tokens, so a larger count is malformed in both twins.
COUNT_LIMIT = 2**63
# The meta_info values that are base64 int32 arrays; routed experts alone can be gigabytes.
B64_KEYS: tuple[str, ...] = (
    "top_p_token_ids",
    "top_p_token_offsets",
    "top_p_kept_token_ids",
    "top_p_kept_token_offsets",
    "routed_experts",
    "indexer_topk",
)
# The replay arrays: collected when a request finishes, sent once, in its terminal event.
REPLAY_KEYS: tuple[str, ...] = ("routed_experts", "indexer_topk")
# The indexer's layer count, which SGLang forks (sglang-miles) write beside indexer_topk; it stays
# in meta_info. SGLang 0.5.23 sends no shape at all (docs/wire-format.md, "Indexer top-k").
INDEXER_LAYERS_KEY = "indexer_topk_num_layers"
_TOP_P_PAIRS = (
    ("top_p_token_ids", "top_p_token_offsets"),
    ("top_p_kept_token_ids", "top_p_kept_token_offsets"),
)
TOP_P_KEYS = frozenset(key for pair in _TOP_P_PAIRS for key in pair)
_Int32s = npt.NDArray[np.int32]
REPLAY_KEYS_SET = frozenset(REPLAY_KEYS)
# ... and every array an event may carry: vLLM's sampling mask too (fastaccum._core.dialects).
ARRAY_KEYS = frozenset((*B64_KEYS, "sampling_mask"))
# A light-checked cumulative event is refused (parsed in full) when its weight_version differs
# from the newest one's: the key is looked for this far past "finish_reason" (SGLang writes it a
# few keys later), so the check stays a constant cost whatever the event's size.
VERSION_KEY = b'"weight_version":'
VERSION_WINDOW = 512
# ---- stream guards ----------------------------------------------------------------------------


def check_options(
    mode: object,
    expert_shape: object,
    max_event_bytes: object,
    indexer_shape: object = None,
    routed_start: object = 0,
    dialect: object = "sglang",
    routed_dtype: object = None,
) -> str:
    """The constructor's arguments, checked in order; the first wrong one raises ValueError.
    Returns the mode the stream starts in: Dynamo and vLLM stream incremental events only."""
    if mode not in MODES:
        raise bad_option("mode", mode)
    if dialect not in DIALECTS:
        raise bad_option("dialect", dialect)
    if dialect != DIALECTS[0]:
        if mode == MODES[1]:
            raise bad_option("mode", mode, dialect)
        mode = MODES[2]
    for name, shape in (("expert_shape", expert_shape), ("indexer_shape", indexer_shape)):
        if shape is not None and (
            not isinstance(shape, tuple) or len(shape) != 2 or any(type(x) is not int or x <= 0 for x in shape)
        ):
            raise bad_option(name, shape)
    if max_event_bytes is not None and (type(max_event_bytes) is not int or max_event_bytes < 0):
        raise bad_option("max_event_bytes", max_event_bytes)
    if type(routed_start) is not int or routed_start < 0:
        raise bad_option("routed_start", routed_start)
    if routed_dtype is not None and routed_dtype != "int32":
        raise bad_option("routed_dtype", routed_dtype)
    return MODES[MODES.index(mode)]  # MODES' own str: the compiled twin compares by identity


def refused_feed(data: object, error: StreamError | None, finished: bool, method: str = "feed") -> Exception:
    """Why ``feed(data)`` (or ``method(data)``) is refused (the caller has seen that it is): not
    bytes, the kept first error, or a call after finish()."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        return not_bytes(data, method)
    if error is not None:
        return error
    assert finished
    return fed_after_finish(method)


def finish_error(
    *, events: int, mid_event: bool, data: bytes | bytearray, finished: bool, dialect: str = "sglang"
) -> StreamError | None:
    """What end of input means: None when the stream is complete (``data``: the unfinished
    event's bytes, which may still be a prefix of [DONE])."""
    if not finished:
        return input_ended(events, mid_event, dialect)
    if mid_event and not b"[DONE]".startswith(data):
        return broken(events, "after_terminal")
    return None


def routed_experts_missing(finish: dict[str, Any] | None, replay: dict[str, Any] | None, dialect: str) -> Any:
    """``require_routed_experts``: a stream that finished by itself (stop, length) without them
    (an abort's terminal event may lawfully have none: a request that never ran)."""
    missing = not (replay and "routed_experts" in replay) and (finish or {}).get("type") != "abort"
    return no_routed_experts(dialect) if missing else None


def end_event(index: int, *, done: bool, finished: bool, is_done: bool, dialect: str = "sglang") -> None:
    """An event at the end of the stream (after [DONE], after the terminal event, or [DONE]
    itself): raise unless it is the [DONE] that follows the terminal event."""
    if done:
        raise broken(index, "after_done")
    if is_done:
        if not finished:
            raise input_ended(index, None, dialect)
        return
    raise broken(index, "after_terminal")


# ---- a parsed event ---------------------------------------------------------------------------


class ParsedEvent(NamedTuple):
    """An event parsed by orjson and checked for shape (``read_event``), with what only the orjson
    path has: its bytes, the objects, and the spans of the base64 values cut out of it."""

    event_index: int
    data: bytearray  # the event's bytes (base64 values at ``spans`` still in place)
    obj: dict[str, Any]
    meta: dict[str, Any]
    spans: dict[str, tuple[int, int]]
    finish: dict[str, Any] | None  # a terminal event's finish_reason
    echo: bool  # an abort echo (docs/core.md, "Abort echo chunks")


def read_event(
    index: int,
    data: bytearray,
    json_bytes: bytes | bytearray,
    spans: dict[str, tuple[int, int]],
    original: Callable[[bytearray], bytes] | None = None,
    dialect: str = "sglang",
) -> ParsedEvent:
    """Parse an event with orjson and check its shape.

    ``json_bytes`` is ``data`` with the base64 values at ``spans`` emptied (fastaccum._core.spans). If
    a cut landed outside meta_info (not SGLang's shape), the whole event is parsed again and the
    spans come back empty; ``original(data)`` gives its bytes when ``data`` no longer holds them
    (the compiled twin's streamed routed experts)."""
    obj = load_json(index, json_bytes)
    meta = event_meta(index, obj, dialect)
    for key in spans:
        if meta.get(key) != "":
            spans = {}
            obj = load_json(index, original(data) if original is not None else data)
            meta = obj["meta_info"]
            break
    finish, echo = event_finish(index, meta)
    return ParsedEvent(index, data, obj, meta, spans, finish, echo)


def load_json(index: int, data: bytes | bytearray) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise not_json(index, exc) from None


def event_meta(index: int, obj: object, dialect: str = "sglang") -> dict[str, Any]:
    """The meta_info of a parsed event, once the event is known to be a single request's."""
    if type(obj) is not dict:
        raise not_an_object(index, obj)
    if "error" in obj:
        raise server_error(index, obj["error"])
    meta = obj.get("meta_info")
    if "index" in obj:
        raise indexed_event(index, meta)
    if type(meta) is not dict:
        if "meta_info" not in obj:
            if "choices" in obj:
                raise wrong_dialect(index, dialect, DIALECTS[2])
            raise broken(index, "no_meta")
        raise wrong_type(index, "meta_info", "an object", meta)
    return meta


def event_finish(index: int, meta: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """(finish_reason or None, whether the event is an abort echo). A 4xx abort is SGLang refusing a
    streamed request (its one token a dummy): a ``ServerError``; a 5xx one keeps its prefix."""
    finish = meta.get("finish_reason")
    if finish is not None and type(finish) is not dict:
        raise wrong_type(index, "meta_info.finish_reason", "an object or null", finish)
    if finish is not None and finish.get("type") == "abort":
        status = finish.get("status_code")
        if type(status) is int and 400 <= status < 500:
            raise server_error(index, {"message": finish.get("message"), "code": status})
    echo = finish is not None and finish.get("type") == "abort" and "prompt_tokens" not in meta
    return finish, echo


def _count(index: int, meta: dict[str, Any], key: str) -> int:
    if key not in meta:
        return ABSENT
    value = meta[key]
    if type(value) is not int or not 0 <= value < COUNT_LIMIT:
        raise bad_count(index, key, value)
    return value


def event_counts(index: int, obj: dict[str, Any], meta: dict[str, Any]) -> tuple[int, int, int, str | None]:
    """(completion_tokens, output_token_logprobs_length, prompt_tokens, text); ABSENT or None
    where the event does not carry them."""
    completion = _count(index, meta, "completion_tokens")
    lp_length = _count(index, meta, "output_token_logprobs_length")
    prompt = _count(index, meta, "prompt_tokens")
    text = obj.get("text")
    if text is not None and type(text) is not str:
        raise wrong_type(index, "text", "a string", text)
    return completion, lp_length, prompt, text


# ---- abort echo -------------------------------------------------------------------------------


def echo_start(index: int, *, mode: str, held: int, completion: int, logprob_ids: int, output_ids: int) -> int:
    """Where the tokens an abort echo adds start in its list (``logprob_ids``: the length of the
    ids in output_token_logprobs, ABSENT without them; ``output_ids`` likewise), or -1 for none.

    The list holds the full list at its tail (a coalesced delta may precede it); the caller checks
    the full list's first ``held`` ids against the held ones."""
    if completion == ABSENT:
        raise broken(index, "echo_no_total")
    if completion < held:
        raise echo_short(index, mode, completion, held, carried=True)
    if completion == held:
        return -1
    if logprob_ids != ABSENT and logprob_ids >= completion:
        return logprob_ids - completion + held
    if logprob_ids == ABSENT and mode == "cumulative" and output_ids == completion:
        return held
    raise echo_short(index, mode, completion, held, carried=False)


def echo_text(mode: str, held: list[str] | None, echoed: str | None) -> str | None:
    """The text an abort echo replaces the held text with, or None to keep it.

    The echo repeats the whole text. In incremental mode a delta still queued when it was sent is
    coalesced in front of it (delta + held + delta), so the whole text is the tail that starts
    with the held text; when neither shape fits, the held text stays. Undecided auto ignores it."""
    if held is None or echoed is None or mode == "auto":
        return None
    if mode == "cumulative":
        return echoed
    text = "".join(held)
    size, odd = divmod(len(echoed) + len(text), 2)
    if not odd and size < len(echoed):
        whole = echoed[len(echoed) - size :]
        if whole.startswith(text) and whole[len(text) :] == echoed[: len(echoed) - size]:
            return whole
    if echoed.startswith(text):
        return echoed
    return None


# ---- base64 arrays ----------------------------------------------------------------------------


def int32_array(index: int, key: str, raw: Any) -> npt.NDArray[np.int32]:
    """Decoded bytes (any buffer) as little-endian int32 values."""
    size = memoryview(raw).nbytes
    if size % 4:
        raise bad_base64(index, key, size)
    return np.frombuffer(raw, dtype="<i4").astype(np.int32, copy=False)


def decode_b64(
    index: int,
    key: str,
    value: object,
    data: bytes | bytearray,
    span: tuple[int, int] | None,
    where: str = "meta_info.",
) -> bytearray:
    """Decode one base64 value, from its span in ``data`` or from the parsed str (``where``: the
    object holding ``key``, for messages)."""
    if span is None and type(value) is not str:
        raise wrong_type(index, f"{where}{key}", "a base64 string", value)
    source: str | memoryview = memoryview(data)[span[0] : span[1]] if span is not None else str(value)
    try:
        return pybase64.b64decode_as_bytearray(source, validate=True)
    except ValueError:  # binascii.Error, or a str with non-ASCII characters
        raise bad_base64(index, key) from None
    finally:
        del source  # release the view so the event buffer can be freed or resized


def decode_int32(
    index: int, key: str, value: object, data: bytes | bytearray, span: tuple[int, int] | None
) -> npt.NDArray[np.int32]:
    """Decode one base64 int32 array, from its span in ``data`` or from the parsed str."""
    return int32_array(index, key, decode_b64(index, key, value, data, span))


# ---- top-p replay -----------------------------------------------------------------------------


def _check_offsets(index: int, key: str, offsets: npt.NDArray[np.int32], n_ids: int) -> None:
    if offsets.shape[0] == 0 or offsets[0] != 0:
        raise bad_offsets(index, key, -1)
    if offsets.shape[0] > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
        raise bad_offsets(index, key, None)
    if offsets[-1] != n_ids:
        raise bad_offsets(index, key, int(offsets[-1]), n_ids)


def read_top_p(
    parsed: ParsedEvent | None, *, index: int, mode: str, held: int, added: int, rows_held: int | None
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], bool] | None:
    """This event's top-p CSR, decoded and validated, and whether it replaces (True) or extends
    the rows held; None without one. ``parsed`` None: an event without base64 arrays (the compiled
    twin's scanner read it); ``rows_held``: None while the stream has carried no top-p."""
    meta = parsed.meta if parsed is not None else None
    for ids_key, offsets_key in _TOP_P_PAIRS:
        if meta is not None and (ids_key in meta or offsets_key in meta):
            break
    else:
        return top_p_answer(None, index=index, mode=mode, held=held, added=added, rows_held=rows_held)
    assert parsed is not None and meta is not None
    if ids_key not in meta or offsets_key not in meta:
        present, missing = (ids_key, offsets_key) if ids_key in meta else (offsets_key, ids_key)
        raise top_p_half(index, present, missing)
    ids = decode_int32(index, ids_key, meta[ids_key], parsed.data, parsed.spans.get(ids_key))
    offsets = decode_int32(index, offsets_key, meta[offsets_key], parsed.data, parsed.spans.get(offsets_key))
    _check_offsets(index, offsets_key, offsets, ids.shape[0])
    return top_p_answer((ids, offsets), index=index, mode=mode, held=held, added=added, rows_held=rows_held)


def top_p_answer(
    rows: tuple[_Int32s, _Int32s] | None, *, index: int, mode: str, held: int, added: int, rows_held: int | None
) -> tuple[_Int32s, _Int32s, bool] | None:
    """An event's top-p CSR (``rows``: ids, offsets) and whether it replaces the rows held (a row
    for every token) or extends them (a row for each token it adds); any other count is refused.
    ``rows`` None: the event has none, and then adds no tokens to a stream that carried them."""
    total = held + added
    if rows is None:
        if rows_held is not None and added > 0:
            raise top_p_rows(index, mode, None, added, total)
        return None
    ids, offsets = rows
    count = offsets.shape[0] - 1
    if count == total:
        return ids, offsets, True
    if count == added and (rows_held or 0) == held:
        return ids, offsets, False
    raise top_p_rows(index, mode, count, added, total)


# ---- replay arrays: routed experts, indexer top-k ----------------------------------------------


def read_replay(
    raw: npt.NDArray[np.int32],
    *,
    index: int,
    key: str,
    shape: tuple[int, int | None] | None,
    start: int,
    mode: str,
    prompt: int,
    completion: int,
    total: int,
) -> npt.NDArray[np.int32]:
    """A decoded replay array, checked against ``shape`` (layers, topk) and reshaped to (rows,
    layers, topk) when it is given (topk None: the width the size gives). SGLang's rule for both:
    a row per position but the last, from ``start`` on (routed_experts_start_len; the indexer
    top-k has none): rows = max(prompt + completion - 1 - start, 0)."""
    if shape is None:
        return raw
    if prompt == ABSENT:
        raise broken(index, "routed_no_prompt" if key == "routed_experts" else "indexer_no_prompt")
    layers, topk = shape
    done = completion if completion != ABSENT else total
    rows = max(prompt + done - 1 - start, 0)
    size = raw.shape[0]
    # topk None: the width is the size's, which must be a positive multiple of rows x layers.
    width = topk if topk is not None else (size // (rows * layers) if rows else 0)
    if size != rows * layers * width or (rows and not width):
        raise replay_size(index, mode, key, size, (prompt, done, start), shape)
    return raw.reshape(rows, layers, width)


def indexer_shape_of(
    index: int, mode: str, meta: dict[str, Any], option: tuple[int, int] | None
) -> tuple[int, int | None] | None:
    """The shape the indexer top-k is checked against: ``indexer_shape`` when given, else (layers,
    None) from meta_info.indexer_topk_num_layers, which SGLang forks (sglang-miles) send beside
    it and SGLang 0.5.23 does not; when both are there the layer counts must agree."""
    layers = meta.get(INDEXER_LAYERS_KEY)
    if layers is None:
        return option
    if type(layers) is not int or layers <= 0 or (option is not None and layers != option[0]):
        raise replay_layers(index, mode, INDEXER_LAYERS_KEY, layers, option[0] if option else 0)
    return option if option is not None else (layers, None)


# ---- both arrays -------------------------------------------------------------------------------


def read_arrays(
    parsed: ParsedEvent | None,
    *,
    index: int,
    mode: str,
    held: int,
    added: int,
    rows_held: int | None,
    expert_shape: tuple[int, int] | None,
    prompt: int,
    completion: int,
    indexer_shape: tuple[int, int] | None = None,
    routed_start: int = 0,
    streamed: Mapping[str, Any] | None = None,
) -> tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], bool] | None, dict[str, npt.NDArray[np.int32]] | None]:
    """This event's top-p (read_top_p's answer) and replay arrays (``{key: array}``, decoded and
    checked by read_replay; None without any), for an event that carries either or a stream that
    holds top-p (``parsed``, ``rows_held``: as read_top_p). ``streamed``: the replay values the
    compiled twin decoded while the event arrived (key -> decoded bytes), else None."""
    meta = parsed.meta if parsed is not None else None
    top_p = None
    if rows_held is not None or (meta is not None and not TOP_P_KEYS.isdisjoint(meta)):
        top_p = read_top_p(parsed, index=index, mode=mode, held=held, added=added, rows_held=rows_held)
    replay = None
    if parsed is not None and not REPLAY_KEYS_SET.isdisjoint(parsed.meta):
        replay = {}
        for key, start in (("routed_experts", routed_start), ("indexer_topk", 0)):
            if key not in parsed.meta:
                continue
            if key == "routed_experts":
                shape: tuple[int, int | None] | None = expert_shape
            else:
                shape = indexer_shape_of(index, mode, parsed.meta, indexer_shape)
            if streamed is not None and key in streamed:
                raw = int32_array(index, key, streamed[key])
            else:
                raw = decode_int32(index, key, parsed.meta[key], parsed.data, parsed.spans.get(key))
            replay[key] = read_replay(
                raw,
                index=index,
                key=key,
                shape=shape,
                start=start,
                mode=mode,
                prompt=prompt,
                completion=completion,
                total=held + added,
            )
    return top_p, replay
