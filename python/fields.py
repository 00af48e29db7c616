"""Field readers: token ids, logprob triples and counts from a parsed event, and the one count
the light check reads from the raw bytes."""

from __future__ import annotations

import math
from typing import NamedTuple

from fastaccum._core.messages import (
    LOGPROBS,
    bad_logprob_entry,
    bad_token_id,
    wrong_type,
)

__all__ = ("Event", "read_id_list", "read_logprob_list", "read_uint_at")

_TOKEN_ID_LIMIT = 2**31


# ---- an event's fields ------------------------------------------------------------------------


class Event(NamedTuple):
    """What one event says, read and type-checked but not yet checked against the stream (the
    compiled twin fills a struct of the same name: src_cython/fields.pxd)."""

    event_index: int  # data events counted from 0
    output_ids: list[int] | None  # None: the event has no output_ids
    logprob_ids: list[int] | None  # the ids in output_token_logprobs; None: it has none
    logprobs: list[float] | None  # their logprobs, NaN for null
    completion_tokens: int  # -1 (fastaccum._core.policy.ABSENT) where the event does not carry it
    logprobs_length: int  # output_token_logprobs_length
    prompt_tokens: int
    text: str | None


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
