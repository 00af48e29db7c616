"""What differs between the servers whose streams the core reads: SGLang, Dynamo and vLLM.

Dynamo's native ``/generate`` passes SGLang's incremental events through, so its events take
SGLang's path; only its end rules and its request differ. vLLM's token-in/token-out
``/inference/v1/generate`` writes its own chunks (OpenAI-like ``choices``): ``read_chunk`` reads
one into the same ``ParsedEvent`` and ``Event`` record that SGLang's events fill, so the rules in
fastaccum._py.lengths and the twins' ``_commit`` do not change. Runs once per request, or on the
orjson path (the compiled twin's scanner reads vLLM's ordinary chunks: src_cython/scan_chunk.pyx).
The servers' facts are in docs/dialects.md.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from fastaccum._core.messages import (
    bad_count,
    bad_npy,
    bad_option,
    bad_token_id,
    broken,
    not_an_object,
    npy_shape,
    server_error,
    text_logprobs,
    wrong_dialect,
    wrong_type,
)
from fastaccum._core.policy import (
    ABSENT,
    ARRAY_KEYS,
    COUNT_LIMIT,
    DIALECTS,
    ParsedEvent,
    decode_b64,
    load_json,
    top_p_answer,
)

__all__ = (
    "SGLANG",
    "DYNAMO",
    "VLLM",
    "DialectRequest",
    "check_dialect",
    "request_for",
    "vllm_abort_ids",
    "TOKEN_IDS",
    "read_chunk",
    "chunk_meta",
    "chunk_fields",
    "chunk_counts",
    "chunk_text",
    "read_chunk_logprobs",
    "route_hint",
    "answers_several",
    "chunk_arrays",
    "npy_array",
)

SGLANG, DYNAMO, VLLM = DIALECTS
TOKEN_ID_LIMIT = 2**31


# ---- the request (transports) -----------------------------------------------------------------


class DialectRequest(NamedTuple):
    """What a transport sends for one streaming request to a server of a dialect."""

    path: str  # the default path
    rid: str | None  # the request's id (None: a batch's list, which cannot be aborted alone)
    body: Mapping[str, Any]  # the JSON body, "stream" included
    drains: bool  # the server may have a per-request abort to read on after (tried, not assumed)
    abort_ids: tuple[str, ...]  # what the server's abort knows the request by (none: it cannot be named)
    streams: bool = True  # False: the payload asked for one non-streaming answer ("stream": false)


_PATHS = {SGLANG: "/generate", DYNAMO: "/generate", VLLM: "/inference/v1/generate"}
_ID_KEYS = {SGLANG: "rid", DYNAMO: "rid", VLLM: "request_id"}


def answers_several(dialect: str, payload: Mapping[str, Any]) -> bool:
    """The payload asks for several answers in one body: SGLang's batch (``input_ids`` a list of
    lists, ``text`` or ``sampling_params`` a list) or ``n > 1`` (either server)."""
    params = payload.get("sampling_params")
    if isinstance(params, list):
        return True
    n = params.get("n", 1) if isinstance(params, Mapping) else 1
    if isinstance(n, int) and n > 1:
        return True
    if dialect == VLLM:
        return False
    ids, text = payload.get("input_ids"), payload.get("text")
    return (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)) or isinstance(text, list)


def route_hint(dialect: str, status: int) -> str:
    """What a 404 or 405 from the generate route usually means: a server of another dialect ("" for
    any other status), to append to the error's message."""
    if status not in (404, 405):
        return ""
    return (
        f" (dialect={dialect!r} asks for {_PATHS[dialect]}; SGLang and Dynamo serve /generate, vLLM "
        "/inference/v1/generate: is the dialect the server's? docs/dialects.md)"
    )


def check_dialect(dialect: object) -> None:
    if dialect not in DIALECTS:
        raise bad_option("dialect", dialect)


def request_for(
    dialect: str,
    payload: Mapping[str, Any],
    new_id: Callable[[], str] | None,
    headers: Mapping[str, str] | None = None,
) -> DialectRequest:
    """The request for ``payload`` (the server's own request keys): its id (the payload's, else
    ``new_id()`` added to it; None: none added) and the keys streaming needs. vLLM counts the
    tokens it sends only in a usage chunk, which ``stream_options.include_usage`` asks for: the
    accumulator checks it. A payload with ``"stream": false`` asks for one non-streaming answer
    and is sent so (Dynamo's frontend has none). ``headers``: the request's HTTP headers, for the
    id vLLM runs it under (an ``X-Request-Id`` replaces the body's)."""
    check_dialect(dialect)
    if dialect == VLLM and "token_ids" not in payload and ("input_ids" in payload or "text" in payload):
        given = "input_ids" if "input_ids" in payload else "text"
        raise ValueError(f"vLLM's /inference/v1/generate takes token_ids (a list of ints), not {given}")
    if dialect == DYNAMO and "input_ids" not in payload and "text" in payload:
        raise ValueError("Dynamo's /generate takes input_ids (a list of ints), not text: it has no tokenizer")
    streams = payload.get("stream", True) is not False
    if not streams and dialect == DYNAMO:
        raise ValueError("Dynamo's /generate streams only (its frontend answers 501 to stream: false)")
    key = _ID_KEYS[dialect]
    rid = payload.get(key)
    body = dict(payload)
    if rid is None and new_id is not None:
        rid = body[key] = new_id()
    body["stream"] = streams
    if dialect == VLLM and streams:
        options = body.get("stream_options")
        body["stream_options"] = {**(options if isinstance(options, Mapping) else {}), "include_usage": True}
    rid = rid if isinstance(rid, str) else None
    abort_ids: tuple[str, ...] = () if rid is None else (rid,)
    if dialect == VLLM:
        header = next((v for k, v in (headers or {}).items() if k.lower() == "x-request-id"), None)
        abort_ids = vllm_abort_ids(header if header is not None else rid)
    # Dynamo has no abort endpoint; vLLM has one from 0.32 (and with --tokens-only before).
    return DialectRequest(_PATHS[dialect], rid, body, dialect != DYNAMO, abort_ids, streams)


def vllm_abort_ids(request_id: str | None) -> tuple[str, ...]:
    """The ids vLLM's abort knows a request by: its generate handler runs it as
    ``generate-tokens-<id>`` (the id its chunks carry), where the id is the ``X-Request-Id``
    header's when the request has one, else the body's ``request_id``; the bare id too, for
    servers that keep it (an id nothing runs under is ignored)."""
    return () if request_id is None else (f"generate-tokens-{request_id}", request_id)


# ---- vLLM's chunks (both twins' orjson path) ---------------------------------------------------

# A choice's values that are not meta_info: the token-aligned ones and the arrays.
_CHOICE_DATA = frozenset(("token_ids", "logprobs", "routed_experts", "sampling_mask"))
TOKEN_IDS = "choices[0].token_ids"
CHUNK_LOGPROBS = "choices[0].logprobs"
# vLLM's finish_reason strings in SGLang's object form; its stop_reason is what matched.
_FINISH_TYPES = {"stop": "stop", "length": "length", "abort": "abort"}


def read_chunk(
    index: int,
    data: bytearray,
    json_bytes: bytes | bytearray,
    spans: dict[str, tuple[int, int]],
    original: Callable[[bytearray], bytes] | None,
    held_meta: Mapping[str, Any],
    *,
    finished: bool,
) -> ParsedEvent:
    """Parse a vLLM chunk with orjson and check its shape: a ``ParsedEvent`` whose ``obj`` is the
    choice (empty for a usage-only chunk) and whose ``meta`` is what SGLang's meta_info would hold:
    the chunk's fields but the choices, and the choice's but its tokens and arrays, with the raw
    finish_reason (a usage-only chunk adds its usage to ``held_meta``). ``finish`` is SGLang's form
    of the finish_reason; the routed experts' span, where it was cut, is kept (``spans``).
    ``finished``: the finishing chunk was read, after which only the usage chunk may come."""
    obj = load_json(index, json_bytes)
    choice = _chunk_choice(index, obj)
    for key in spans:
        if choice is None or choice.get(key) != "":
            spans = {}
            obj = load_json(index, original(data) if original is not None else data)
            choice = _chunk_choice(index, obj)
            break
    meta = chunk_meta(obj, choice)
    if choice is None:
        held = {key: value for key, value in held_meta.items() if key not in ARRAY_KEYS}
        return ParsedEvent(index, data, {}, {**held, **meta}, spans, None, False)
    if finished:
        raise broken(index, "after_terminal")
    raw = choice.get("finish_reason")
    finish: dict[str, Any] | None = None
    if raw is not None:
        if type(raw) is not str:
            raise wrong_type(index, "choices[0].finish_reason", "a string or null", raw)
        finish = {"type": _FINISH_TYPES.get(raw, raw)}
        if raw == "stop":
            finish["matched"] = choice.get("stop_reason")
    return ParsedEvent(index, data, choice, meta, spans, finish, False)


def chunk_meta(obj: dict[str, Any], choice: dict[str, Any] | None) -> dict[str, Any]:
    """What SGLang's meta_info would hold of a chunk: its fields but the choices, and its choice's
    but the tokens; the arrays only where present, to be decoded by chunk_arrays (a result drops
    them). The compiled twin reads an ordinary chunk's from its bytes only when a result is built."""
    # Arrays count only in the choice: elsewhere they are not vLLM's, and the scanner skips them.
    meta = {key: value for key, value in obj.items() if key != "choices" and key not in ARRAY_KEYS}
    if choice is None and obj.get("choices"):
        choice = obj["choices"][0]
    for key, value in (choice or {}).items():
        if key not in _CHOICE_DATA:
            meta[key] = value
        elif key != "token_ids" and key != "logprobs" and value is not None:
            meta[key] = value
    return meta


def _chunk_choice(index: int, obj: object) -> dict[str, Any] | None:
    """The one choice of a chunk, None for a usage-only chunk (``choices: []``)."""
    if type(obj) is not dict:
        raise not_an_object(index, obj)
    if "error" in obj:
        raise server_error(index, obj["error"])
    choices = obj.get("choices")
    if type(choices) is not list:
        if "choices" in obj:
            raise wrong_type(index, "choices", "an array", choices)
        if "meta_info" in obj:
            raise wrong_dialect(index, VLLM, SGLANG)
        raise broken(index, "no_choices")
    if not choices:
        return None
    if len(choices) > 1:
        raise broken(index, "choices")
    choice = choices[0]
    if type(choice) is not dict:
        raise wrong_type(index, "choices[0]", "an object", choice)
    if choice.get("index", 0) != 0:  # with n > 1 each chunk holds one choice, any of them
        raise broken(index, "choices")
    return choice


def chunk_fields(
    index: int, parsed: ParsedEvent, *, held: int, had_logprobs: bool | None
) -> tuple[Any, list[int] | None, list[float] | None, int, int, str | None]:
    """What a chunk's ``Event`` holds: (token_ids, for the twin's field reader to check as
    ``TOKEN_IDS``; the logprobs' ids and values, or None; completion_tokens; prompt_tokens; text).
    A chunk without tokens (the abort chunk, the usage chunk) carries no logprobs: it keeps the
    stream's choice (``had_logprobs``), so neither it nor the next chunk reads as a switch."""
    choice = parsed.obj
    token_ids = choice.get("token_ids")
    if token_ids is None:
        token_ids = []
    read = read_chunk_logprobs(index, choice.get("logprobs"))
    if read is None and not token_ids and had_logprobs:
        read = [], []
    ids, logprobs = read if read is not None else (None, None)
    listed = len(token_ids) if type(token_ids) is list else 0
    completion, prompt = chunk_counts(index, parsed, held=held, listed=listed)
    return token_ids, ids, logprobs, completion, prompt, chunk_text(index, choice)


def chunk_text(index: int, choice: dict[str, Any]) -> str | None:
    """The text delta of a chunk in vLLM's ``output_mode: "text"`` (None in ``"tokens"``)."""
    text = choice.get("text")
    if text is not None and type(text) is not str:
        raise wrong_type(index, "choices[0].text", "a string", text)
    return text


def chunk_counts(index: int, parsed: ParsedEvent, *, held: int, listed: int) -> tuple[int, int]:
    """(completion_tokens, prompt_tokens) of a chunk: its usage's, where it carries one (the
    usage chunk that ``stream_options.include_usage`` asks for, or every chunk's with
    ``continuous_usage_stats``), else the tokens held with this chunk's, which the rules then
    accept (vLLM counts nothing else)."""
    usage = parsed.meta.get("usage")
    if usage is None:
        return held + listed, ABSENT
    if type(usage) is not dict:
        raise wrong_type(index, "usage", "an object or null", usage)
    counts = []
    for key in ("completion_tokens", "prompt_tokens"):
        value = usage.get(key, ABSENT)
        if value != ABSENT and (type(value) is not int or not 0 <= value < COUNT_LIMIT):
            raise bad_count(index, f"usage.{key}", value)
        counts.append(value)
    completion, prompt = counts
    return (held + listed if completion == ABSENT else completion), prompt


def chunk_arrays(
    parsed: ParsedEvent | None,
    *,
    index: int,
    mode: str,
    held: int,
    added: int,
    rows_held: int | None,
    expert_shape: tuple[int, int] | None,
    streamed: Mapping[str, Any] | None = None,
    widen: bool = False,
) -> tuple[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32], bool] | None, dict[str, npt.NDArray[Any]] | None]:
    """A chunk's sampling mask as top-p rows (read_top_p's answer: one row of kept token ids per
    token, the rows of this chunk's tokens) and its routed experts (``{"routed_experts": array}``,
    the ``.npy`` decoded by ``npy_array``, in its wire dtype or, ``widen``, as int32); None for what
    it does not carry. ``streamed``: as fastaccum._core.policy.read_arrays."""
    meta = parsed.meta if parsed is not None else {}
    mask = meta.get("sampling_mask")
    rows = _mask_rows(index, mask) if mask is not None else None
    top_p = top_p_answer(rows, index=index, mode=mode, held=held, added=added, rows_held=rows_held)
    replay = None
    if parsed is not None and meta.get("routed_experts") is not None:
        value = meta["routed_experts"]
        if streamed is not None and "routed_experts" in streamed:
            raw: Any = streamed["routed_experts"]
        else:
            span = parsed.spans.get("routed_experts")
            raw = decode_b64(index, "routed_experts", value, parsed.data, span, "choices[0].")
        experts = npy_array(index, mode, raw, expert_shape)
        replay = {"routed_experts": experts.astype(np.int32, copy=False) if widen else experts}
    return top_p, replay


def _mask_rows(index: int, mask: object) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """``[[kept token id, ...], ...]`` (a row per token) as CSR: ids, and offsets into them."""
    if type(mask) is not list:
        raise wrong_type(index, "choices[0].sampling_mask", "an array of arrays", mask)
    offsets = np.zeros(len(mask) + 1, dtype=np.int32)
    for i, row in enumerate(mask):
        if type(row) is not list:
            raise wrong_type(index, f"choices[0].sampling_mask[{i}]", "an array", row)
        offsets[i + 1] = offsets[i] + len(row)
    ids = np.empty(int(offsets[-1]), dtype=np.int32)
    for i, row in enumerate(mask):
        for j, token in enumerate(row):
            if type(token) is not int or not 0 <= token < TOKEN_ID_LIMIT:
                raise bad_token_id(index, f"choices[0].sampling_mask[{i}][{j}]", token)
        ids[offsets[i] : offsets[i + 1]] = row
    return ids, offsets


# The dtypes a .npy of routed experts may hold: vLLM writes the narrowest of these that fits.
_NPY_DTYPES = {"|u1": np.uint8, "<u2": np.uint16, "<i4": np.int32}
_NPY_MAGIC = b"\x93NUMPY"
_NPY_HEADER_LIMIT = 1 << 16  # a header is a short dict literal; numpy's own bound


def npy_array(index: int, mode: str, raw: Any, expert_shape: tuple[int, int] | None) -> npt.NDArray[Any]:
    """A ``.npy`` (decoded bytes, any buffer) as an array over those bytes, never a copy. Only
    the header is read as data (numpy's header parser: a literal, never pickle); the dtype must
    be uint8, uint16 or int32, the order C, the shape (rows, layers, topk) and the size exact;
    ``expert_shape`` (layers, topk), when given, must match."""
    view = memoryview(raw).cast("B")
    if view.nbytes < 10 or bytes(view[:6]) != _NPY_MAGIC:
        raise bad_npy(index, "it does not start with the .npy magic")
    major = view[6]
    width = 2 if major == 1 else 4 if major in (2, 3) else 0
    if not width:
        raise bad_npy(index, f".npy format version {major} is unknown")
    length = int.from_bytes(view[8 : 8 + width], "little")
    start = 8 + width + length
    if length > _NPY_HEADER_LIMIT or start > view.nbytes:
        raise bad_npy(index, "its header is longer than the value")
    try:
        header = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = header(io.BytesIO(bytes(view[8:start])))
    except Exception:  # literal_eval's many errors, whose texts carry object addresses
        raise bad_npy(index, "its header does not parse") from None
    name = dtype.str
    if name not in _NPY_DTYPES or dtype.hasobject:
        raise bad_npy(index, f"dtype {name} is not uint8, uint16 or int32")
    if fortran:
        raise bad_npy(index, "it is in Fortran order")
    if len(shape) != 3:
        raise bad_npy(index, f"shape {shape} is not (rows, layers, topk)")
    size = shape[0] * shape[1] * shape[2] * dtype.itemsize
    if view.nbytes - start != size:
        raise bad_npy(index, f"shape {shape} of {name} needs {size} bytes after the header, not {view.nbytes - start}")
    if expert_shape is not None and tuple(shape[1:]) != tuple(expert_shape):
        raise npy_shape(index, mode, tuple(shape), expert_shape)
    return np.frombuffer(raw, dtype=_NPY_DTYPES[name], count=shape[0] * shape[1] * shape[2], offset=start).reshape(
        shape
    )


def read_chunk_logprobs(index: int, value: object) -> tuple[list[int], list[float]] | None:
    """A choice's logprobs as (ids, logprobs), None for null: ``{"content": [item, ...]}`` with
    items ``{"token_id": id, "logprob": x, ...}`` (vLLM 0.32 on) or ``{"token": "token_id:<id>",
    "logprob": x, ...}`` (before), or a bare list of such items."""
    if value is None:
        return None
    content = value.get("content") if type(value) is dict else value
    if content is None:
        return None
    if type(content) is not list:
        raise wrong_type(index, CHUNK_LOGPROBS, 'an object with a "content" array', value)
    ids: list[int] = []
    logprobs: list[float] = []
    for i, item in enumerate(content):
        if type(item) is not dict:
            raise wrong_type(index, f"{CHUNK_LOGPROBS}.content[{i}]", "an object", item)
        if "token_id" in item:
            token = item["token_id"]
        else:
            name = item.get("token")
            digits = name[9:] if type(name) is str and name.startswith("token_id:") else ""
            token = int(digits) if 0 < len(digits) <= 10 and digits.isascii() and digits.isdigit() else name
        if type(token) is not int or not 0 <= token < TOKEN_ID_LIMIT:
            if type(token) is str:
                raise text_logprobs(index, f"{CHUNK_LOGPROBS}.content[{i}].token", token)
            raise bad_token_id(index, f"{CHUNK_LOGPROBS}.content[{i}].token_id", token)
        logprob = item.get("logprob")
        if type(logprob) is float:
            logprobs.append(logprob)
        elif type(logprob) is int:
            logprobs.append(float(logprob))
        elif logprob is None:
            logprobs.append(math.nan)
        else:
            raise wrong_type(index, f"{CHUNK_LOGPROBS}.content[{i}].logprob", "a number", logprob)
        ids.append(token)
    return ids, logprobs
