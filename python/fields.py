"""Base64 int32 arrays cut out of the event bytes and decoded without building a Python str."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pybase64

from fastaccum._messages import bad_format, type_name

__all__ = ("B64_KEYS", "cut_b64_spans", "reappears", "decode_int32")

# The meta_info values that are base64 int32 arrays; routed experts alone can be gigabytes.
B64_KEYS: tuple[str, ...] = (
    "top_p_token_ids",
    "top_p_token_offsets",
    "top_p_kept_token_ids",
    "top_p_kept_token_offsets",
    "routed_experts",
)
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


def decode_int32(
    index: int, key: str, value: object, data: bytearray, span: tuple[int, int] | None
) -> npt.NDArray[np.int32]:
    """Decode one base64 int32 array, from its span in ``data`` or from the parsed str."""
    if span is None and not isinstance(value, str):
        raise bad_format(index, f"meta_info.{key} must be a base64 string, not {type_name(value)}")
    source: str | memoryview
    if span is not None:
        source = memoryview(data)[span[0] : span[1]]
    else:
        assert isinstance(value, str)  # checked above
        source = value
    try:
        raw = pybase64.b64decode_as_bytearray(source, validate=True)
    except ValueError:  # binascii.Error, or a str with non-ASCII characters
        raise bad_format(index, f"meta_info.{key} is not valid base64") from None
    if len(raw) % 4:
        raise bad_format(index, f"meta_info.{key} decodes to {len(raw)} bytes, not whole int32 values")
    return np.frombuffer(raw, dtype="<i4").astype(np.int32, copy=False)
