"""Base64 values cut out of an event's bytes before orjson parses it, written once for both twins.

A terminal event can carry top-p replay and routed experts as base64 strings, the latter up to
gigabytes; orjson would build a Python str of each. Both twins find those values here and parse
the event with each emptied (``""``), and fastaccum._core.policy decodes the bytes in place. This runs
on an event the compiled twin's scanner leaves to orjson, once per stream in practice; every
search is a ``bytes.find`` (memchr speed), so the Python around it costs a few microseconds per
event. The compiled twin's stream module runs the same forward scan while a large event arrives.
"""

from __future__ import annotations

from fastaccum._core.policy import B64_KEYS

__all__ = ("cut_b64_spans", "cut_spans", "reappears")

Spans = dict[str, tuple[int, int]]

_QUOTED: tuple[bytes, ...] = tuple(b'"' + key.encode() for key in B64_KEYS)
# The last letters of the base64 keys: a '":"' after any other letter ends another key, which is
# passed over without comparing names (most events have a few string values and no base64 key).
_KEY_ENDS = frozenset(key.encode()[-1] for key in B64_KEYS)


def cut_b64_spans(data: bytearray) -> tuple[bytes | bytearray, Spans]:
    """Find each base64 value in the event bytes and return the JSON with those values emptied.

    One forward scan for ``":"`` (a key followed by a string value) that jumps over each value it
    takes, so a gigabyte of base64 is read once (by memchr) and absent keys cost nothing extra.
    A JSON string never contains an unescaped quote, so a match is a real key, or, in hostile
    input, something the caller's check of the parsed placeholders rejects. A value holding a
    backslash (an escape orjson never writes) is left for orjson to parse.
    Returns (json bytes, {key: (start, end) of the value inside ``data``}).
    """
    spans: Spans = {}
    pos = 0
    while len(spans) < len(B64_KEYS):
        at = data.find(b'":"', pos)
        if at < 0:
            break
        key = _key_before(data, at, spans) if data[at - 1] in _KEY_ENDS else None
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
    if not spans:
        return data, {}
    if reappears(data, spans):
        return data, {}
    return cut_spans(data, spans)


def cut_spans(data: bytearray, spans: Spans) -> tuple[bytes | bytearray, Spans]:
    """The event bytes with the given value spans emptied (``data`` itself when there are none)."""
    if not spans:
        return data, {}
    parts: list[bytes | bytearray] = []
    pos = 0
    for start, end in sorted(spans.values()):
        parts.append(data[pos:start])
        pos = end
    parts.append(data[pos:])
    return b"".join(parts), spans


def reappears(data: bytes | bytearray, spans: Spans) -> bool:
    """A cut key occurs again after its value (hostile input): orjson's reading must decide.

    Only the bytes between the values are searched. A value holds no quote, so no key can start
    or end inside one, and ``bytes.find`` crawls through base64 (every character passes its
    skip filter): a routed-experts value is megabytes to gigabytes."""
    if not spans:
        return False
    bounds = sorted(spans.values())
    gaps = [(end, start) for (_, end), (start, _) in zip(bounds, bounds[1:])]
    gaps.append((bounds[-1][1], len(data)))
    for key, (_, end) in spans.items():
        pattern = b'"' + key.encode() + b'":'
        if any(data.find(pattern, low, high) >= 0 for low, high in gaps if low >= end):
            return True
    return False


def _key_before(data: bytearray, at: int, spans: Spans) -> str | None:
    """The base64 key (not yet taken) whose quoted name ends at ``at``, or None."""
    for key, quoted in zip(B64_KEYS, _QUOTED):
        begin = at - len(quoted)
        if begin >= 0 and key not in spans and data[begin:at] == quoted:
            return key
    return None
