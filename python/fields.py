"""Field readers: token ids, logprob triples and counts from a parsed event, and the base64
values cut out of the event bytes before parsing (so no Python str is built for them)."""

from __future__ import annotations

import math

from fastaccum._messages import (
    LOGPROBS,
    bad_logprob_entry,
    bad_token_id,
    wrong_type,
)
from fastaccum._policy import B64_KEYS

__all__ = ("read_id_list", "read_logprob_list", "read_uint_at", "cut_b64_spans", "reappears")

_TOKEN_ID_LIMIT = 2**31


# ---- token ids and logprobs -------------------------------------------------------------------


def read_id_list(index: int, where: str, value: object) -> list[int]:
    if type(value) is not list:
        raise wrong_type(index, where, "an array", value)
    for i, token in enumerate(value):
        if type(token) is not int or not 0 <= token < _TOKEN_ID_LIMIT:
            raise bad_token_id(index, f"{where}[{i}]", token)
    return value


def read_logprob_list(index: int, value: object) -> tuple[list[int], list[float]]:
    """Split ``[[logprob|null, id, text|null], ...]`` into ids and logprobs (null becomes NaN)."""
    if type(value) is not list:
        raise wrong_type(index, LOGPROBS, "an array", value)
    ids: list[int] = []
    logprobs: list[float] = []
    for i, entry in enumerate(value):
        if type(entry) is not list or not 2 <= len(entry) <= 3:
            raise bad_logprob_entry(index, i)
        logprob = entry[0]
        if logprob is None:
            logprobs.append(math.nan)
        elif type(logprob) is float:
            logprobs.append(logprob)
        elif type(logprob) is int:
            logprobs.append(float(logprob))
        else:
            raise bad_logprob_entry(index, i, 0, logprob)
        token = entry[1]
        if type(token) is not int or not 0 <= token < _TOKEN_ID_LIMIT:
            raise bad_token_id(index, f"{LOGPROBS}[{i}][1]", token)
        ids.append(token)
        if len(entry) == 3 and entry[2] is not None and type(entry[2]) is not str:
            raise bad_logprob_entry(index, i, 2, entry[2])
    return ids, logprobs


def read_uint_at(data: bytearray, pos: int) -> int:
    """The unsigned integer literal at ``pos`` (1-18 digits, then ',' or '}'), or -1."""
    end = pos
    limit = min(len(data), pos + 19)
    while end < limit and 0x30 <= data[end] <= 0x39:
        end += 1
    if end == pos or end - pos > 18 or end >= len(data) or data[end] not in b",}":
        return -1
    return int(data[pos:end])


# ---- base64 values ----------------------------------------------------------------------------

_QUOTED: tuple[bytes, ...] = tuple(b'"' + key.encode() for key in B64_KEYS)


def cut_b64_spans(data: bytearray) -> tuple[bytes | bytearray, dict[str, tuple[int, int]]]:
    """Find each base64 value in the event bytes and return the JSON with those values emptied.

    One forward scan for ``":"`` (a key followed by a string value) that jumps over each value it
    takes, so a gigabyte of base64 is read once (by memchr) and absent keys cost nothing extra.
    A JSON string never contains an unescaped quote, so a match is a real key, or, in hostile
    input, something the caller's check of the parsed placeholders rejects. A value holding a
    backslash (an escape orjson never writes) is left for orjson to parse.
    Returns (json bytes, {key: (start, end) of the value inside ``data``}).
    """
    if data.find(b'_experts":"') < 0 and data.find(b'"top_p_') < 0:
        return data, {}
    spans: dict[str, tuple[int, int]] = {}
    pos = 0
    while len(spans) < len(B64_KEYS):
        at = data.find(b'":"', pos)
        if at < 0:
            break
        key = _key_before(data, at, spans)
        if key is None:
            pos = at + 1
            continue
        start = at + 3
        end = data.find(b'"', start)
        if end < 0:
            break
        if data.find(b"\\", start, end) < 0:
            spans[key] = (start, end)
        pos = end
    if not spans or reappears(data, spans):
        return data, {}
    parts: list[bytes | bytearray] = []
    pos = 0
    for start, end in sorted(spans.values()):
        parts.append(data[pos:start])
        pos = end
    parts.append(data[pos:])
    return b"".join(parts), spans


def reappears(data: bytes | bytearray, spans: dict[str, tuple[int, int]]) -> bool:
    """A cut key occurs again after its value (hostile input): orjson's reading must decide."""
    return any(data.find(b'"' + key.encode() + b'":', end) >= 0 for key, (_, end) in spans.items())


def _key_before(data: bytearray, at: int, spans: dict[str, tuple[int, int]]) -> str | None:
    """The base64 key (not yet taken) whose quoted name ends at ``at``, or None."""
    for key, quoted in zip(B64_KEYS, _QUOTED):
        begin = at - len(quoted)
        if begin >= 0 and key not in spans and data[begin:at] == quoted:
            return key
    return None
