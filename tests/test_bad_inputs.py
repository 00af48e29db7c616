"""The bad-input catalogue (docs/bad-inputs.md): each hostile input, its exact error class, and the
prefix snapshot() keeps: the state before the bad event, with nothing lost and nothing half-applied.

Every case is a stream prefix that is valid, then the bad bytes. The test feeds the prefix to one
accumulator and prefix + bad bytes to another, with no snapshot() in between (a snapshot applies a
light-checked cumulative event), and requires the second accumulator's snapshot() after the error
to equal the first one's, and both to equal the generation's true prefix. The error must also be
kept: feed() and finish() raise it again.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np
import orjson
import pytest

from fastaccum.emulator.writer import (
    DONE,
    WireOptions,
    echo_event,
    encode_int32,
    error_event,
    normal_event,
    synthetic_generation,
)
from fastaccum.errors import (
    ServerError,
    StreamError,
    StreamFormatError,
    StreamLengthError,
    StreamLimitError,
    StreamTruncatedError,
)

FORMAT, LENGTH, TRUNCATED, LIMIT, SERVER = (
    StreamFormatError,
    StreamLengthError,
    StreamTruncatedError,
    StreamLimitError,
    ServerError,
)
SHAPE = (2, 2)
# 8 tokens, 3 prompt tokens: the terminal event carries top-p rows and (3 + 8 - 1) x 2 x 2 experts.
GEN = synthetic_generation("catalogue", 8, prompt_tokens=3, top_p=True, expert_shape=SHAPE)
INC = WireOptions(incremental=True, logprob_text=True)
CUM = WireOptions(logprob_text=True)
PLAIN = WireOptions(incremental=True, return_logprob=False)
KIB = 1024
MIB = 1024 * KIB


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def inc(start: int, end: int, *, terminal: bool = False) -> dict[str, Any]:
    return normal_event(GEN, INC, start, end, terminal=terminal, first=start == 0)


def cum(end: int, *, terminal: bool = False) -> dict[str, Any]:
    return normal_event(GEN, CUM, 0, end, terminal=terminal, first=end == 1)


# ---- contexts: a valid prefix, the tokens it holds, the accumulator options -------------------


class Context(NamedTuple):
    prefix: bytes
    held: int
    finished: bool = False
    logprobs: bool = True


CONTEXTS: dict[str, Context] = {
    # Two incremental events: 1 token (ambiguous), then 2 (decides incremental). The bad event is 2.
    "inc": Context(sse(inc(0, 1)) + sse(inc(1, 3)), 3),
    # Four cumulative events: two parsed fully, two only light-checked (docs/core.md), so the
    # snapshot must come from the newest light-checked event.
    "cum": Context(b"".join(sse(cum(k)) for k in (1, 2, 3, 4)), 4),
    # One cumulative event (for mode mismatches).
    "cum1": Context(sse(cum(1)), 1),
    # A complete incremental stream without [DONE]; the bad bytes come after the terminal event.
    "done": Context(sse(inc(0, 1)) + sse(inc(1, 3)) + sse(inc(3, 8, terminal=True)), 8, True),
    "plain": Context(
        sse(normal_event(GEN, PLAIN, 0, 1, first=True)) + sse(normal_event(GEN, PLAIN, 1, 3)), 3, logprobs=False
    ),
    "empty": Context(b"", 0),
}


# ---- bad inputs ---------------------------------------------------------------------------------

Pieces = Callable[[], Iterator[bytes]]


class Case(NamedTuple):
    group: str
    what: str  # one line for docs/bad-inputs.md
    context: str
    bad: bytes | Pieces
    error: type[StreamError]
    fragment: str  # a regex the message must match
    at_finish: bool = False  # the error comes from finish(), not feed()
    kwargs: dict[str, Any] = {}
    bug: tuple[str, str] | None = None  # (reported core bug, twin it affects: "both"/"cython")
    marks: tuple[Any, ...] = ()


def edit(event: dict[str, Any], change: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    change(event)
    return event


def meta(**values: Any) -> Callable[[dict[str, Any]], Any]:
    return lambda e: e["meta_info"].update(values)


def drop_meta(*keys: str) -> Callable[[dict[str, Any]], Any]:
    return lambda e: [e["meta_info"].pop(k) for k in keys]


def raw_meta(key: str, literal: bytes) -> bytes:
    """The next incremental event with meta_info[key] replaced by a raw JSON literal."""
    event = inc(3, 5)
    event["meta_info"][key] = "@@PLACEHOLDER@@"
    return sse(event).replace(b'"@@PLACEHOLDER@@"', literal)


def raw_text(literal: bytes) -> bytes:
    event = inc(3, 5)
    event["text"] = "@@PLACEHOLDER@@"
    return sse(event).replace(b'"@@PLACEHOLDER@@"', literal)


def raw_logprob(literal: bytes) -> bytes:
    event = inc(3, 5)
    event["meta_info"]["output_token_logprobs"][0][0] = "@@PLACEHOLDER@@"
    return sse(event).replace(b'"@@PLACEHOLDER@@"', literal)


def utf8_cut() -> bytes:
    """The next event's bytes cut after the first byte of a 3-byte UTF-8 character in its text."""
    event = inc(3, 5)
    event["text"] = "x 日本"
    data = sse(event)
    return data[: data.index("日".encode()) + 1]


def cum_terminal(change: Callable[[dict[str, Any]], Any]) -> bytes:
    return sse(edit(cum(8, terminal=True), change))


def huge_event(total: int, tail: bytes, piece: int = 64 * KIB) -> Pieces:
    """A terminal event whose routed_experts is ``total`` bytes of base64, fed lazily in pieces."""
    head = sse(inc(3, 8, terminal=True)).split(b'"routed_experts":"')[0] + b'"routed_experts":"'

    def pieces() -> Iterator[bytes]:
        yield head
        block = b"A" * piece
        for _ in range(total // piece):
            yield block
        yield tail

    return pieces


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def ids_everywhere(value: int) -> Callable[[dict[str, Any]], Any]:
    def change(e: dict[str, Any]) -> None:
        e["output_ids"][0] = value
        e["meta_info"]["output_token_logprobs"][0][1] = value

    return change


def top_p(ids: list[int], offsets: list[int]) -> Callable[[dict[str, Any]], Any]:
    return meta(top_p_token_ids=encode_int32(ids), top_p_token_offsets=encode_int32(offsets))


ROWS = GEN.top_p_rows or []
FLAT = [t for r in ROWS for t in r]
ROUTED_ROWS = GEN.prompt_tokens + 8 - 1
ROUTED = GEN.routed_experts
assert ROUTED is not None


CASES: dict[str, Case] = {
    # ---- framing: SSE lines, line ends, UTF-8 cuts, end of input ----
    "eof-mid-json": Case(
        "framing",
        "input ends inside an event's JSON (connection cut)",
        "inc",
        sse(inc(3, 5))[:40],
        TRUNCATED,
        "inside an event",
        at_finish=True,
    ),
    "eof-inside-utf8-sequence": Case(
        "framing",
        "input ends after the first byte of a 3-byte UTF-8 character",
        "inc",
        utf8_cut(),
        TRUNCATED,
        "inside an event",
        at_finish=True,
    ),
    "utf8-sequence-cut-then-blank-line": Case(
        "framing",
        "an event whose data stops inside a UTF-8 character, then a blank line",
        "inc",
        utf8_cut() + b"\n\n",
        FORMAT,
        "not valid JSON",
    ),
    "raw-cr-inside-json": Case(
        "framing",
        "a raw CR inside a JSON string ends the line: the event is cut in two",
        "inc",
        raw_text(b'"a\rb"'),
        FORMAT,
        "not valid JSON",
    ),
    "raw-lf-inside-json": Case(
        "framing",
        "a raw LF inside a JSON string (the rest is an unknown field)",
        "inc",
        raw_text(b'"a\nb"'),
        FORMAT,
        "not valid JSON",
    ),
    "crlf-blank-line-inside-event": Case(
        "framing",
        "CRLF CRLF in the middle of an event's data: a spurious event boundary",
        "inc",
        sse(inc(3, 5))[:60] + b"\r\n\r\n" + b"data: " + sse(inc(3, 5))[60:],
        FORMAT,
        "not valid JSON",
    ),
    "cr-cr-inside-event": Case(
        "framing",
        "CR CR in the middle of an event's data (a CR-only blank line)",
        "inc",
        sse(inc(3, 5))[:60] + b"\r\r" + sse(inc(3, 5))[60:],
        FORMAT,
        "not valid JSON",
    ),
    "bom-before-mid-stream-event": Case(
        "framing",
        "a BOM before a later event's `data:`: the line is an unknown field, the event is "
        "dropped, and the next event's total exposes the gap",
        "inc",
        b"\xef\xbb\xbf" + sse(inc(3, 5)) + sse(inc(5, 8)),
        LENGTH,
        "not an incremental event|fits neither",
    ),
    "capitalised-data-field": Case(
        "framing",
        "`Data:` (field names are case-sensitive): dropped, caught by the next total",
        "inc",
        sse(inc(3, 5)).replace(b"data:", b"Data:") + sse(inc(5, 8)),
        LENGTH,
        "incremental",
    ),
    "done-without-space-before-terminal": Case(
        "framing",
        "`data:[DONE]` before any terminal event (early [DONE])",
        "inc",
        b"data:[DONE]\n\n",
        TRUNCATED,
        r"\[DONE\] before",
    ),
    "done-with-trailing-space": Case(
        "framing",
        "`data: [DONE] ` (trailing space) after the terminal event is not [DONE]",
        "done",
        b"data: [DONE] \n\n",
        FORMAT,
        "after the terminal event",
    ),
    "bare-data-after-done": Case(
        "framing",
        "a bare `data` line (an empty value) after [DONE]",
        "done",
        DONE + b": bye\n\ndata\n\n",
        FORMAT,
        r"after \[DONE\]",
    ),
    "only-comments-then-eof": Case(
        "framing",
        "a stream of comments and blank lines only, then end of input",
        "empty",
        b": ping\n\n: ping\r\n\r\nevent: x\n\n",
        TRUNCATED,
        "before a terminal",
        at_finish=True,
    ),
    "eof-after-light-checked-events": Case(
        "framing",
        "end of input after cumulative events that were only light-checked",
        "cum",
        b"",
        TRUNCATED,
        "before a terminal",
        at_finish=True,
    ),
    # ---- JSON: not an object, hostile literals, nesting ----
    "empty-object": Case("json", "`{}`", "inc", b"data: {}\n\n", FORMAT, "meta_info is missing"),
    "json-true": Case("json", "`true`", "inc", b"data: true\n\n", FORMAT, "not an object"),
    "two-objects-on-two-data-lines": Case(
        "json",
        "two JSON objects in one event (two data lines joined by LF)",
        "inc",
        sse(inc(3, 5))[:-2] + b"\n" + sse(inc(5, 8)),
        FORMAT,
        "not valid JSON",
    ),
    "nesting-bomb-100k": Case(
        "json", "100 000 nested arrays", "inc", b"data: " + nested(100_000) + b"\n\n", FORMAT, "not valid JSON"
    ),
    "nesting-bomb-in-meta-info": Case(
        "json",
        "1 100 nested arrays under an unknown meta_info key",
        "inc",
        raw_meta("extra", nested(1100)),
        FORMAT,
        "not valid JSON",
    ),
    "nan-literal-total": Case(
        "json", "`NaN` as completion_tokens", "inc", raw_meta("completion_tokens", b"NaN"), FORMAT, "not valid JSON"
    ),
    "minus-infinity-literal": Case(
        "json", "`-Infinity` as a logprob", "inc", raw_logprob(b"-Infinity"), FORMAT, "not valid JSON"
    ),
    "overflowing-exponent-total": Case(
        "json", "`1e999` as completion_tokens", "inc", raw_meta("completion_tokens", b"1e999"), FORMAT, "not valid JSON"
    ),
    "integer-beyond-u64-total": Case(
        "json",
        "`18446744073709551616` as completion_tokens (orjson reads it as a float)",
        "inc",
        raw_meta("completion_tokens", b"18446744073709551616"),
        FORMAT,
        "must be an integer, not number",
    ),
    "lone-surrogate-escape": Case(
        "json", 'text `"\\ud800"` (a lone surrogate escape)', "inc", raw_text(b'"\\ud800"'), FORMAT, "not valid JSON"
    ),
    "raw-surrogate-bytes": Case(
        "json",
        "text holding the UTF-8 bytes of U+D800 (ED A0 80)",
        "inc",
        raw_text(b'"\xed\xa0\x80"'),
        FORMAT,
        "not valid JSON",
    ),
    "raw-control-character": Case(
        "json", "a raw U+0001 inside a JSON string", "inc", raw_text(b'"a\x01"'), FORMAT, "not valid JSON"
    ),
    # ---- field types ----
    "output-ids-null": Case(
        "types",
        "`output_ids: null`",
        "inc",
        sse(edit(inc(3, 5), lambda e: e.update(output_ids=None))),
        FORMAT,
        "output_ids must be an array, not null",
    ),
    "output-ids-nested": Case(
        "types",
        "`output_ids: [[id], ...]`",
        "inc",
        sse(edit(inc(3, 5), lambda e: e.update(output_ids=[[t] for t in e["output_ids"]]))),
        FORMAT,
        r"output_ids\[0\] must be a token id, not array",
    ),
    "output-ids-beyond-int64-no-logprobs": Case(
        "types",
        "an id of 2**64-1 in `output_ids` of a stream without logprobs",
        "plain",
        sse(edit(normal_event(GEN, PLAIN, 3, 5), lambda e: e["output_ids"].__setitem__(1, 2**64 - 1))),
        FORMAT,
        "18446744073709551615 is not a token id",
    ),
    "total-beyond-int64": Case(
        "types",
        "an ordinary event whose completion_tokens is 2**63",
        "inc",
        sse(edit(inc(3, 5), meta(completion_tokens=2**63))),
        FORMAT,
        "is not a token count",
    ),
    "logprobs-null": Case(
        "types",
        "`output_token_logprobs: null`",
        "inc",
        sse(edit(inc(3, 5), meta(output_token_logprobs=None))),
        FORMAT,
        "output_token_logprobs must be an array, not null",
    ),
    "logprob-is-a-list": Case(
        "types",
        "a logprob slot holding `[-0.1]`",
        "inc",
        sse(edit(inc(3, 5), lambda e: e["meta_info"]["output_token_logprobs"][0].__setitem__(0, [-0.1]))),
        FORMAT,
        r"\[0\]\[0\] must be a number or null, not array",
    ),
    "logprob-text-boolean": Case(
        "types",
        "a triple's text slot holding `true`",
        "inc",
        sse(edit(inc(3, 5), lambda e: e["meta_info"]["output_token_logprobs"][1].__setitem__(2, True))),
        FORMAT,
        r"\[1\]\[2\] must be a string or null, not boolean",
    ),
    "id-two-pow-31-cumulative-terminal": Case(
        "types",
        "id 2**31 in the terminal event of a cumulative stream (after light-checked events)",
        "cum",
        cum_terminal(ids_everywhere(2**31)),
        FORMAT,
        "2147483648 is not a token id",
    ),
    "finish-reason-number": Case(
        "types",
        "`finish_reason: 0`",
        "inc",
        sse(edit(inc(3, 5), meta(finish_reason=0))),
        FORMAT,
        "finish_reason must be an object or null, not number",
    ),
    "finish-reason-empty-string": Case(
        "types", '`finish_reason: ""`', "inc", sse(edit(inc(3, 5), meta(finish_reason=""))), FORMAT, "not string"
    ),
    "meta-info-string": Case(
        "types",
        '`meta_info: "{}"`',
        "inc",
        sse(edit(inc(3, 5), lambda e: e.update(meta_info="{}"))),
        FORMAT,
        "meta_info must be an object, not string",
    ),
    "text-object": Case(
        "types",
        '`text: {"a": 1}`',
        "inc",
        sse(edit(inc(3, 5), lambda e: e.update(text={"a": 1}))),
        FORMAT,
        "text must be a string, not object",
    ),
    "logprobs-length-negative": Case(
        "types",
        "`output_token_logprobs_length: -5`",
        "inc",
        sse(edit(inc(3, 5), meta(output_token_logprobs_length=-5))),
        FORMAT,
        "is negative",
    ),
    "logprobs-length-float": Case(
        "types",
        "`output_token_logprobs_length: 5.0`",
        "inc",
        sse(edit(inc(3, 5), meta(output_token_logprobs_length=5.0))),
        FORMAT,
        "must be an integer, not number",
    ),
    "prompt-tokens-string": Case(
        "types",
        '`prompt_tokens: "3"`',
        "inc",
        sse(edit(inc(3, 5), meta(prompt_tokens="3"))),
        FORMAT,
        "prompt_tokens must be an integer, not string",
    ),
    "no-total": Case(
        "types",
        "neither `completion_tokens` nor `output_token_logprobs_length`",
        "inc",
        sse(edit(inc(3, 5), drop_meta("completion_tokens", "output_token_logprobs_length"))),
        FORMAT,
        "has no completion_tokens",
    ),
    "no-ids-at-all": Case(
        "types",
        "neither `output_ids` nor `output_token_logprobs` (stream without logprobs)",
        "plain",
        sse(edit(normal_event(GEN, PLAIN, 3, 5), lambda e: e.pop("output_ids"))),
        FORMAT,
        "neither output_ids nor output_token_logprobs",
    ),
    # ---- lengths and modes ----
    "incremental-total-decreases": Case(
        "lengths",
        "an incremental event whose total (2) is below the 3 tokens held",
        "inc",
        sse(edit(inc(3, 5), meta(completion_tokens=2, output_token_logprobs_length=2))),
        LENGTH,
        "not an incremental event",
    ),
    "incremental-total-skips-ahead": Case(
        "lengths",
        "an incremental event whose total counts tokens never sent (a lost event)",
        "inc",
        sse(edit(inc(3, 5), meta(completion_tokens=7, output_token_logprobs_length=7))),
        LENGTH,
        "not an incremental event|fits neither",
    ),
    "cumulative-total-decreases-light": Case(
        "lengths",
        "a light-checked cumulative event whose total goes down (4 to 2)",
        "cum",
        sse(cum(2)),
        LENGTH,
        "went down from 4 to 2",
    ),
    "cumulative-terminal-prefix-changed": Case(
        "lengths",
        "a cumulative terminal event whose token 0 differs from the held one",
        "cum",
        cum_terminal(ids_everywhere(GEN.token_ids[0] + 1)),
        FORMAT,
        "token 0 changed",
    ),
    "cumulative-terminal-totals-disagree": Case(
        "lengths",
        "a cumulative terminal event with output_token_logprobs_length != completion_tokens",
        "cum",
        cum_terminal(meta(output_token_logprobs_length=7)),
        LENGTH,
        "differs from completion_tokens",
    ),
    "cumulative-stream-mode-incremental": Case(
        "lengths",
        "a cumulative stream read with mode='incremental'",
        "cum1",
        sse(cum(2)),
        LENGTH,
        "cumulative reading holds",
        kwargs={"mode": "incremental"},
    ),
    "incremental-stream-mode-cumulative": Case(
        "lengths",
        "an incremental stream read with mode='cumulative'",
        "cum1",
        sse(inc(1, 3)),
        LENGTH,
        "incremental reading holds",
        kwargs={"mode": "cumulative"},
    ),
    "duplicated-terminal-event": Case(
        "lengths",
        "the terminal event sent twice",
        "done",
        sse(inc(3, 8, terminal=True)),
        FORMAT,
        "after the terminal event",
    ),
    # ---- abort echo chunks ----
    "echo-without-completion-tokens": Case(
        "echo",
        "an abort echo chunk without completion_tokens",
        "inc",
        sse(edit(echo_event(GEN, INC, 3), drop_meta("completion_tokens"))),
        FORMAT,
        "abort echo without completion_tokens",
    ),
    "echo-gap-without-logprobs": Case(
        "echo",
        "an echo reporting 5 tokens to a no-logprob incremental stream holding 3",
        "plain",
        sse(echo_event(GEN, PLAIN, 5)),
        LENGTH,
        "does not carry the missing ones",
    ),
    "echo-total-beyond-int64": Case(
        "echo",
        "an echo whose completion_tokens is 2**64-1",
        "inc",
        sse(edit(echo_event(GEN, INC, 3), meta(completion_tokens=2**64 - 1))),
        FORMAT,
        r"completion_tokens = 18446744073709551615 is not a token count \(2\*\*63 or more\)",
    ),
    # ---- top-p (terminal event of the cumulative context, after light-checked events) ----
    "top-p-offsets-decrease": Case(
        "top-p",
        "offsets that decrease",
        "cum",
        cum_terminal(top_p(FLAT, [0, 2, 1] + [len(FLAT)] * 6)),
        FORMAT,
        "top_p_token_offsets decreases",
    ),
    "top-p-offsets-overrun": Case(
        "top-p",
        "a last offset beyond the ids",
        "cum",
        cum_terminal(top_p(FLAT, [0] * 8 + [len(FLAT) + 1])),
        FORMAT,
        "ends at",
    ),
    "top-p-offsets-start-at-one": Case(
        "top-p",
        "offsets that start at 1",
        "cum",
        cum_terminal(top_p(FLAT, [1] * 8 + [len(FLAT)])),
        FORMAT,
        "must start at 0",
    ),
    "top-p-two-bytes": Case(
        "top-p",
        "ids that decode to 2 bytes (`AAA=`)",
        "cum",
        cum_terminal(meta(top_p_token_ids="AAA=")),
        FORMAT,
        "decodes to 2 bytes",
    ),
    "top-p-url-safe-alphabet": Case(
        "top-p",
        "ids in the URL-safe alphabet (`-_-_`)",
        "cum",
        cum_terminal(meta(top_p_token_ids="-_-_")),
        FORMAT,
        "not valid base64",
    ),
    "top-p-whitespace-inside": Case(
        "top-p",
        "ids with a space inside the base64",
        "cum",
        cum_terminal(meta(top_p_token_ids="AAAA AAAA")),
        FORMAT,
        "not valid base64",
    ),
    "top-p-mixed-alias-pair": Case(
        "top-p",
        "`top_p_kept_token_ids` beside `top_p_token_offsets` (pairs mixed)",
        "cum",
        cum_terminal(lambda e: e["meta_info"].update(top_p_kept_token_ids=e["meta_info"].pop("top_p_token_ids"))),
        FORMAT,
        "top_p_token_offsets without meta_info.top_p_token_ids",
    ),
    "top-p-rows-fit-neither": Case(
        "top-p",
        "7 rows for 8 tokens, 4 of them new",
        "cum",
        cum_terminal(top_p(FLAT, [0] * 7 + [len(FLAT)])),
        LENGTH,
        "top-p has 7 rows",
    ),
    # ---- routed experts ----
    "routed-rows-off-by-one": Case(
        "routed",
        "prompt + completion rows instead of prompt + completion - 1",
        "inc",
        sse(
            edit(
                inc(3, 8, terminal=True),
                meta(routed_experts=encode_int32(np.concatenate([ROUTED.reshape(-1), ROUTED.reshape(-1)[:4]]))),
            )
        ),
        LENGTH,
        "routed_experts has 44 values",
        kwargs={"expert_shape": SHAPE},
    ),
    "routed-without-prompt-tokens": Case(
        "routed",
        "routed_experts with expert_shape set but no prompt_tokens",
        "inc",
        sse(edit(inc(3, 8, terminal=True), drop_meta("prompt_tokens"))),
        FORMAT,
        "without prompt_tokens",
        kwargs={"expert_shape": SHAPE},
    ),
    "routed-six-bytes": Case(
        "routed",
        "routed_experts decoding to 6 bytes",
        "inc",
        sse(edit(inc(3, 8, terminal=True), meta(routed_experts="AAAAAAAA"))),
        FORMAT,
        "decodes to 6 bytes",
    ),
    "routed-non-ascii": Case(
        "routed",
        "routed_experts holding non-ASCII letters (raw UTF-8 in the cut span)",
        "inc",
        sse(edit(inc(3, 8, terminal=True), meta(routed_experts="ÀÀÀÀ"))),
        FORMAT,
        "not valid base64",
    ),
    "routed-escaped-value": Case(
        "routed",
        "routed_experts with a JSON escape (`\\u0041`): parsed by orjson, then 6 bytes",
        "inc",
        sse(inc(3, 8, terminal=True)).replace(b'"routed_experts":"', b'"routed_experts":"\\u0041AAAAAAA","x":"', 1),
        FORMAT,
        "routed_experts decodes to 6 bytes",
    ),
    "b64-key-outside-meta-with-control-byte": Case(
        "routed",
        "a top-level routed_experts holding a raw control byte (whole-event reparse)",
        "inc",
        b'data: {"routed_experts":"\x01","meta_info":{}}\n\n',
        FORMAT,
        "not valid JSON",
    ),
    # ---- size limits ----
    "event-1gib-with-limit": Case(
        "limits",
        "a 1 GiB event in 64 KiB pieces with max_event_bytes = 1 MiB (refused after ~1 MiB)",
        "inc",
        huge_event(1 << 30, b'"}}\n\n'),
        LIMIT,
        "max_event_bytes=1048576",
        kwargs={"max_event_bytes": MIB},
    ),
    "event-32mib-invalid-base64": Case(
        "limits",
        "a 32 MiB routed_experts value ending in `!`, no max_event_bytes",
        "inc",
        huge_event(32 * MIB, b'!"}}\n\n'),
        FORMAT,
        "routed_experts is not valid base64",
    ),
    "event-1gib-invalid-base64": Case(
        "limits",
        "a 1 GiB routed_experts value ending in `!`, no max_event_bytes (slow)",
        "inc",
        huge_event(1 << 30, b'!"}}\n\n'),
        FORMAT,
        "routed_experts is not valid base64",
        marks=(pytest.mark.slow,),
    ),
    # ---- server errors ----
    "error-event-on-light-checked-stream": Case(
        "server",
        "an SGLang error event after light-checked cumulative events",
        "cum",
        sse(error_event("out of memory", 503)),
        SERVER,
        "server error 503: out of memory",
    ),
    "error-key-after-text-prefix": Case(
        "server",
        '`{"text":"","error":{...}}`: starts like a normal event, still parsed fully',
        "cum",
        b'data: {"text":"","error":{"message":"boom","code":500}}\n\n',
        SERVER,
        "server error 500: boom",
    ),
    "error-null": Case(
        "server",
        '`{"error": null}`',
        "inc",
        b'data: {"error":null}\n\n',
        SERVER,
        "server error: an error value of type null",
    ),
    "error-code-boolean": Case(
        "server",
        "an error object whose code is `true` (no status)",
        "inc",
        b'data: {"error":{"message":"m","code":true}}\n\n',
        SERVER,
        "server error: m",
    ),
    "error-nested-1000": Case(
        "server",
        "an error value nested 1 000 arrays deep",
        "inc",
        b'data: {"error":' + nested(1000) + b"}\n\n",
        SERVER,
        "server error",
    ),
}


# ---- the test -----------------------------------------------------------------------------------


def _pieces(bad: bytes | Pieces) -> Iterator[bytes]:
    if isinstance(bad, bytes):
        yield bad
    else:
        yield from bad()


def _summary(r: Any) -> tuple[Any, ...]:
    def arr(a: np.ndarray | None) -> Any:
        return None if a is None else (a.dtype.str, a.shape, a.tobytes())

    return (
        r.mode,
        arr(r.token_ids),
        arr(r.logprobs),
        r.text,
        r.finish_reason,
        orjson.dumps(r.meta_info),
        r.completion_tokens,
        arr(r.top_p_token_ids),
        arr(r.top_p_token_offsets),
        arr(r.routed_experts),
        r.events,
    )


def skip_slow_unless_asked(request: pytest.FixtureRequest) -> None:
    """Plain ``pytest`` does not deselect the slow marker; run slow items only with ``-m slow``
    (or FASTACCUM_SLOW=1)."""
    if request.node.get_closest_marker("slow") is None:
        return
    if "slow" not in (request.config.getoption("markexpr") or "") and os.environ.get("FASTACCUM_SLOW") != "1":
        pytest.skip("slow: run with -m slow or FASTACCUM_SLOW=1")


def _params() -> list[Any]:
    return [pytest.param(name, id=name, marks=case.marks) for name, case in CASES.items()]


@pytest.mark.parametrize("name", _params())
def test_bad_input(impl: ModuleType, name: str, request: pytest.FixtureRequest) -> None:
    case = CASES[name]
    skip_slow_unless_asked(request)
    if case.bug is not None and (case.bug[1] == "both" or impl.__name__.endswith("_cy")):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"core bug {case.bug[0]} (docs/reliability.md)"))
    context = CONTEXTS[case.context]
    kwargs = {"expert_shape": SHAPE, **case.kwargs}

    reference = impl.StreamAccumulator(**kwargs)
    reference.feed(context.prefix)
    before = reference.snapshot()
    # The prefix itself is the truth: nothing before the bad event is lost.
    assert before.token_ids.tolist() == list(GEN.token_ids[: context.held])
    if context.logprobs and context.held:
        assert before.logprobs is not None
        assert before.logprobs.tolist() == list(GEN.logprobs[: context.held])
    assert before.finished is context.finished

    acc = impl.StreamAccumulator(**kwargs)
    acc.feed(context.prefix)
    with pytest.raises(StreamError) as info:
        for piece in _pieces(case.bad):
            acc.feed(piece)
        assert case.at_finish, "feed() accepted the bad input"
        acc.finish()
    exc = info.value
    assert type(exc) is case.error, repr(exc)
    assert re.search(case.fragment, str(exc)), str(exc)
    assert exc.event_index is not None and str(exc).startswith(f"event {exc.event_index}:")

    # Nothing half-applied: the snapshot is exactly the prefix's.
    assert _summary(acc.snapshot()) == _summary(before)
    # The first error is kept.
    for again in (lambda: acc.feed(sse(inc(3, 5))), acc.finish):
        with pytest.raises(type(exc)) as repeat:
            again()
        assert str(repeat.value) == str(exc)


def test_catalogue_has_at_least_40_distinct_inputs() -> None:
    distinct = {case.bad if isinstance(case.bad, bytes) else name for name, case in CASES.items()}
    assert len(distinct) >= 40


def test_catalogue_document_lists_every_case() -> None:
    """docs/bad-inputs.md and CASES name the same inputs with the same error classes."""
    doc = (Path(__file__).parent.parent / "docs" / "bad-inputs.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `([a-z0-9-]+)` \|.*\| `(\w+)` \|", doc, flags=re.MULTILINE))
    assert rows == {name: case.error.__name__ for name, case in CASES.items()}
