"""Atheris harness for fastaccum's core: no crash, only StreamError escapes, and the twins agree.

One fuzz input is a 4-byte header and an SSE body. The header picks the accumulator options
(mode, max_event_bytes, expert_shape; the body's shape picks the dialect, vLLM's or SGLang's),
whether the body is an HTTP chunked body (fed with ``feed_chunked()``, bit 7 of the first byte),
whether the compiled twin streams every event's base64
(the threshold of its streamed decode set to 0, and its own decoder or pybase64), and a seed for
cutting the body into pieces (whole, single bytes, or random sizes up to 4 KiB). Each input runs
four times: the compiled twin on the pieces, the pure twin on the same pieces, the compiled twin
on the whole body, and the compiled twin with the token lists of every event it does not scan
whole read by its scanner ("lifted", as a large event's are). All must end the same way: the same
result, or the same error class, message and attributes, and the same snapshot() afterwards
(nothing half-applied). Any exception that is not a StreamError is a bug.

A body that starts (after whitespace) with ``{`` or ``[`` is also read as a non-streaming answer
(``fastaccum.transport.body.BodyReader``, SGLang's object or batch list, vLLM's object) on both
twins, in the same pieces: the same results, or the same error and the same answers read whole
before it.

Besides libFuzzer's byte mutations, a custom mutator edits the body as SSE and JSON: it swaps a
JSON value for a hostile one (wrong type, 2**63, nesting, surrogates), nudges numbers, corrupts
base64, drops, repeats or swaps events, changes line ends and inserts comments or BOMs.

Run (see docs/reliability.md)::

    python tests/fuzz/fuzz_core.py tests/fuzz_corpus -max_total_time=60 -rss_limit_mb=4096
    python tests/fuzz/fuzz_core.py --replay tests/fuzz_corpus     # no atheris needed

Known core bugs can be listed in ``known_bug()`` and counted instead of stopping the run, so a
bounded run keeps looking for new ones while a fix is pending; the three found so far are fixed and
every failure is fatal (``FASTACCUM_FUZZ_STRICT=0`` counts listed ones again).
"""

from __future__ import annotations

import importlib
import os
import random
import re
import sys
from types import ModuleType
from typing import Any

import numpy as np
import orjson

HEADER_BYTES = 4
_MODES = ("auto", "cumulative", "incremental", "auto")
_LIMITS = (None, None, 300, 4096)
_SHAPES = (None, (2, 2))
STRICT = os.environ.get("FASTACCUM_FUZZ_STRICT", "1") == "1"


def chunked(header: bytes) -> bool:
    """Header bit 7: the body is an HTTP/1.1 chunked body, fed with ``feed_chunked()``."""
    return bool(header and header[0] & 0x80)


class TwinMismatch(AssertionError):
    """The twins (or two cuttings of one input) ended differently."""


# ---- one input ----------------------------------------------------------------------------------


def options(header: bytes, body: bytes = b"") -> dict[str, Any]:
    """The accumulator's options: from the header, and the dialect from the body, so that vLLM's
    chunks (``"choices"`` before any ``"meta_info"``) are fuzzed through vLLM's path."""
    flags = header[0] if header else 0
    at = body.find(b'"choices"')
    vllm = at >= 0 and not 0 <= body.find(b'"meta_info"') < at
    mode = _MODES[flags & 3]
    return {
        "mode": "auto" if vllm and mode == "cumulative" else mode,
        "max_event_bytes": _LIMITS[(flags >> 2) & 3],
        "expert_shape": _SHAPES[(flags >> 4) & 1],
        "dialect": "vllm" if vllm else "sglang",
    }


def streamed_decode(header: bytes) -> tuple[bool, bool]:
    """Whether the compiled twin streams base64 from the first byte, and with its own decoder."""
    flags = header[0] if header else 0
    return bool(flags & 0x20), not flags & 0x40


def cut(body: bytes, header: bytes) -> list[bytes]:
    """The pieces the body arrives in, decided by header bytes 1-3 (TCP may cut anywhere:
    docs/wire-format.md, "SSE framing")."""
    seed = int.from_bytes(header[1:4].ljust(3, b"\0"), "little")
    strategy = seed & 3
    if strategy == 0 or not body:
        return [body]
    if strategy == 1 and len(body) <= 4096:
        return [body[i : i + 1] for i in range(len(body))]
    rng = random.Random(seed)
    top = 64 if strategy == 2 else 4096
    pieces, pos = [], 0
    while pos < len(body):
        step = rng.randint(1, top)
        pieces.append(body[pos : pos + step])
        pos += step
    return pieces


def _array(a: np.ndarray | None) -> Any:
    return None if a is None else (a.dtype.str, a.shape, a.tobytes())


def canonical(value: Any) -> str:
    """JSON-like data as text, without recursion (meta_info may nest 1000 deep; repr and orjson
    would give up)."""
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Mark):
            out.append(item.text)
        elif isinstance(item, dict):
            out.append("{")
            stack.append(_Mark("}"))
            for k, v in reversed(list(item.items())):
                stack += [v, _Mark(repr(k) + ":")]
        elif isinstance(item, list):
            out.append("[")
            stack.append(_Mark("]"))
            for v in reversed(item):
                stack += [_Mark(","), v]
        else:
            out.append(repr(item))
    return "".join(out)


class _Mark:
    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def summary(r: Any) -> tuple[Any, ...]:
    """A StreamResult in comparable form; NaN logprobs compare by their bytes."""
    return (
        r.mode,
        _array(r.token_ids),
        _array(r.logprobs),
        r.text,
        canonical(r.finish_reason),
        canonical(r.meta_info),
        r.completion_tokens,
        _array(r.top_p_token_ids),
        _array(r.top_p_token_offsets),
        _array(r.routed_experts),
        r.events,
        r.finished,
        r.weight_version_spans,
    )


def error_key(exc: BaseException) -> tuple[Any, ...]:
    attrs = tuple(getattr(exc, a, None) for a in ("event_index", "mode", "expected", "actual", "status", "message"))
    return (type(exc).__name__, str(exc), attrs)


def check_consistent(r: Any, where: str) -> None:
    """Invariants of any result or snapshot: every per-token array covers the same tokens."""
    n = len(r.token_ids)
    if r.completion_tokens != n:
        raise AssertionError(f"{where}: completion_tokens {r.completion_tokens} != {n} ids")
    if r.logprobs is not None and len(r.logprobs) != n:
        raise AssertionError(f"{where}: {len(r.logprobs)} logprobs for {n} ids")
    if r.top_p_token_offsets is not None:
        offsets = r.top_p_token_offsets
        if len(offsets) != n + 1 or offsets[0] != 0 or offsets[-1] != len(r.top_p_token_ids):
            raise AssertionError(f"{where}: top-p CSR does not cover the {n} ids")
        if len(offsets) > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
            raise AssertionError(f"{where}: top-p offsets decrease")
    if r.text is not None and not isinstance(r.text, str):
        raise AssertionError(f"{where}: text is {type(r.text).__name__}")


def run_twin(
    impl: ModuleType,
    pieces: list[bytes],
    kwargs: dict[str, Any],
    method: str = "feed",
    debug: dict[str, Any] | None = None,
) -> tuple[Any, ...]:
    """Feed every piece, then finish(); return (outcome, snapshot, ...) in comparable form.
    ``debug``: the compiled twin's switches (``StreamAccumulator._debug``).

    A non-StreamError exception propagates: that is the crash the harness looks for.
    """
    from fastaccum.errors import StreamError

    acc = impl.StreamAccumulator(**kwargs)
    if debug:
        acc._debug(**debug)
    feed = getattr(acc, method)
    outcome: tuple[Any, ...]
    try:
        for piece in pieces:
            feed(piece)
        result = acc.finish()
    except StreamError as exc:
        outcome = ("error", error_key(exc))
        # The first error is kept: feeding or finishing again raises it again (docs/core.md).
        for again in (lambda: feed(b""), acc.finish):
            try:
                again()
            except StreamError as repeat:
                if error_key(repeat) != error_key(exc):
                    raise AssertionError(f"{impl.__name__}: a later call raised {repeat!r}, not {exc!r}") from None
            else:
                raise AssertionError(f"{impl.__name__}: the error was not kept")
    else:
        check_consistent(result, f"{impl.__name__} result")
        outcome = ("ok", summary(result))
        if acc.finish() is not result:
            raise AssertionError(f"{impl.__name__}: finish() twice built a new result")
    snap = acc.snapshot()
    check_consistent(snap, f"{impl.__name__} snapshot")
    return outcome, summary(snap), acc.mode, acc.finished, acc.tokens, acc.chunked_ended


def known_bug(exc: BaseException) -> str | None:
    """The reported, not yet fixed core bug this exception is a symptom of, or None.

    B1-B3 (docs/reliability.md) are fixed, so nothing is recognised now; list new ones here while
    their fix is pending.
    """
    return None


def check_input(data: bytes, twins: tuple[ModuleType, ModuleType] | None = None) -> None:
    """The harness's one test: raise on a crash, a non-StreamError, or any disagreement."""
    cy, py = twins or load_twins()
    header, body = data[:HEADER_BYTES], data[HEADER_BYTES:]
    kwargs = options(header, body)
    pieces = cut(body, header)
    stream_all, own_decoder = streamed_decode(header)
    debug = {"decode_in_place": own_decoder, **({"stream_after_bytes": 0} if stream_all else {})}
    method = "feed_chunked" if chunked(header) else "feed"
    outcomes = [
        run_twin(py, pieces, kwargs, method),
        run_twin(cy, pieces, kwargs, method, debug),
        run_twin(cy, [body], kwargs, method, debug),
        run_twin(cy, pieces, kwargs, method, {**debug, "lift_after_bytes": 0}),
    ]
    labels = ("compiled twin", "compiled twin, one piece", "compiled twin, lists lifted")
    for label, other in zip(labels, outcomes[1:]):
        _agree(label, outcomes[0], other)
    if body.lstrip(b" \t\r\n")[:1] in (b"{", b"[") and method == "feed":
        answer = run_body(py, pieces, kwargs)
        _agree("compiled twin, the body as a non-streaming answer", answer, run_body(cy, pieces, kwargs, debug))
        lifted = run_body(cy, pieces, kwargs, {**debug, "lift_after_bytes": 0})
        _agree("compiled twin, the body as a non-streaming answer, lists lifted", answer, lifted)


def _agree(label: str, reference: Any, other: Any) -> None:
    if other != reference:
        raise TwinMismatch(f"{label} disagrees with the pure twin:\n  py: {_short(reference)}\n  cy: {_short(other)}")


def run_body(impl: ModuleType, pieces: list[bytes], kwargs: dict[str, Any], debug: dict[str, Any] | None = None) -> Any:
    """The pieces read as one non-streaming answer on ``impl``: its results (or the error and the
    answers read whole before it), in comparable form."""
    from fastaccum.errors import StreamError
    from fastaccum.transport.body import BodyReader

    def accumulator(**options: Any) -> Any:
        acc = impl.StreamAccumulator(**options)
        return acc._debug(**debug) if debug else acc

    options = {k: v for k, v in kwargs.items() if k != "dialect"}
    try:
        reader = BodyReader(dialect=kwargs["dialect"], accumulator=accumulator, **options)
        for piece in pieces:
            reader.feed(piece)
        results = reader.results()
    except StreamError as exc:
        done = reader.completed if "reader" in locals() else []
        return ("error", error_key(exc), [summary(r) for r in done])
    for r in results if isinstance(results, list) else [results]:
        check_consistent(r, f"{impl.__name__} answer")
    return ("ok", [summary(r) for r in results] if isinstance(results, list) else summary(results))


def _short(outcome: tuple[Any, ...]) -> str:
    text = repr(outcome)
    return text if len(text) < 2000 else text[:2000] + "..."


_TWINS: tuple[ModuleType, ModuleType] | None = None


def load_twins() -> tuple[ModuleType, ModuleType]:
    global _TWINS
    if _TWINS is None:
        _TWINS = (importlib.import_module("fastaccum._cy"), importlib.import_module("fastaccum._py"))
    return _TWINS


# ---- structure-aware mutations ------------------------------------------------------------------

_HOSTILE: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**31 - 1,
    2**63,
    2**64 - 1,
    1.5,
    -0.0,
    1e300,
    "",
    "x",
    "AAAA",
    "AAA",
    "\u2028",
    "\ud83d\ude42",
    [],
    [[]],
    [0],
    [[0.0, 1, None]],
    {},
    {"type": "abort"},
    {"type": "stop", "matched": 1},
    {"message": "m", "code": 500},
)
_LINE_ENDS = (b"\n", b"\r", b"\r\n")
_INSERTS = (
    b": ping\n",
    b"event: x\n",
    b"id: 1\n",
    b"retry: 5\n",
    b"data\n",
    b"\xef\xbb\xbf",
    b"\n",
    b"\r",
    b"data: [DONE]\n\n",
    b'data: {"error":"e"}\n\n',
    b"dat\n",
    b"data:",
    b"\x00",
)
_B64 = re.compile(rb'":"([A-Za-z0-9+/=]{2,})"')
_NUMBER = re.compile(rb"-?\d+(\.\d+)?([eE][-+]?\d+)?")


def _paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if len(path) > 12:  # do not walk nesting bombs
        return out
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node[:8]):
            out += _paths(v, (*path, i))
    return out


def _set(root: Any, path: tuple[Any, ...], value: Any, delete: bool) -> Any:
    if not path:
        return value
    node = root
    for step in path[:-1]:
        node = node[step]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return root


def _hostile(rng: random.Random) -> Any:
    choice = rng.randrange(len(_HOSTILE) + 3)
    if choice < len(_HOSTILE):
        return _HOSTILE[choice]
    if choice == len(_HOSTILE):
        depth = rng.choice((10, 600, 1100))
        return orjson.Fragment(b"[" * depth + b"]" * depth)
    if choice == len(_HOSTILE) + 1:
        return orjson.Fragment(
            rng.choice((b"NaN", b"Infinity", b"1e999", b'"\\ud800"', b'"\\u0000"', b"18446744073709551616"))
        )
    return rng.randrange(-3, 300)


def _mutate_json(event: bytes, rng: random.Random) -> bytes:
    prefix = b"data: " if event.startswith(b"data: ") else b""
    if not prefix and event.lstrip()[:1] not in (b"{", b"["):  # neither an event nor a whole answer
        return event
    try:
        obj = orjson.loads(event[len(prefix) :])
    except orjson.JSONDecodeError:
        return event
    paths = _paths(obj)
    path = rng.choice(paths)
    delete = bool(path) and rng.random() < 0.25
    try:
        obj = _set(obj, path, _hostile(rng), delete)
        if rng.random() < 0.1 and isinstance(obj, dict):
            obj[rng.choice(("index", "error", "top_p_token_ids", "routed_experts", "text"))] = _hostile(rng)
        body = orjson.dumps(obj)
    except (TypeError, orjson.JSONEncodeError, KeyError, IndexError):
        return event
    if prefix and rng.random() < 0.1:
        # Several data lines of one event, joined by LF on the way in.
        body = orjson.dumps(obj, option=orjson.OPT_INDENT_2).replace(b"\n", b"\ndata:")
    return prefix + body


def _mutate_number(event: bytes, rng: random.Random) -> bytes:
    hits = list(_NUMBER.finditer(event))
    if not hits:
        return event
    m = rng.choice(hits)
    try:
        value = int(m.group())
        new = str(rng.choice((value + 1, value - 1, 0, value * 2, 2**63, -value))).encode()
    except ValueError:
        new = rng.choice((b"1e5", b"-0", b"1.0", b"NaN"))
    return event[: m.start()] + new + event[m.end() :]


def _mutate_b64(event: bytes, rng: random.Random) -> bytes:
    hits = list(_B64.finditer(event))
    if not hits:
        return event
    m = rng.choice(hits)
    value = bytearray(m.group(1))
    op = rng.randrange(5)
    if op == 0:
        value[rng.randrange(len(value))] = rng.choice(b"@-_=*\xff ")
    elif op == 1:
        value = value.rstrip(b"=")
    elif op == 2:
        value += rng.choice((b"A", b"AA==", b"AAAA", b"AAAAAAAA"))
    elif op == 3:
        value = value[: rng.randrange(len(value))]
    else:
        value = bytearray(b"AAAA") * rng.randrange(0, 8)
    return event[: m.start(1)] + bytes(value) + event[m.end(1) :]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One SSE/JSON-aware edit of a fuzz input."""
    header, body = bytearray(data[:HEADER_BYTES].ljust(HEADER_BYTES, b"\0")), data[HEADER_BYTES:]
    events = body.split(b"\n\n")
    op = rng.randrange(10)
    k = rng.randrange(len(events))
    if op <= 2:
        events[k] = _mutate_json(events[k], rng)
    elif op == 3:
        events[k] = _mutate_number(events[k], rng)
    elif op == 4:
        events[k] = _mutate_b64(events[k], rng)
    elif op == 5:
        j = rng.randrange(len(events))
        kind = rng.randrange(3)
        if kind == 0:
            events.insert(j, events[k])
        elif kind == 1 and len(events) > 1:
            del events[k]
        else:
            events[k], events[j] = events[j], events[k]
    elif op == 6:
        eol = rng.choice(_LINE_ENDS)
        joined = b"\n\n".join(events)
        return bytes(header) + joined.replace(b"\n", eol, rng.randint(1, 8))
    elif op == 7:
        joined = b"\n\n".join(events)
        at = rng.randint(0, len(joined))
        return bytes(header) + joined[:at] + rng.choice(_INSERTS) + joined[at:]
    elif op == 8:
        joined = b"\n\n".join(events)
        return bytes(header) + joined[: rng.randint(0, len(joined))]
    else:
        header[rng.randrange(HEADER_BYTES)] = rng.randrange(256)
    return bytes(header) + b"\n\n".join(events)


# ---- atheris entry points -----------------------------------------------------------------------

_known_seen: dict[str, int] = {}


def test_one_input(data: bytes) -> None:
    try:
        check_input(data)
    except Exception as exc:
        bug = known_bug(exc)
        if bug is None or STRICT:
            raise
        count = _known_seen[bug] = _known_seen.get(bug, 0) + 1
        if count & (count - 1) == 0:  # 1, 2, 4, ...: libFuzzer exits without Python's atexit
            print(f"\n#known x{count} {bug}: {exc!r}"[:300], file=sys.stderr, flush=True)


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    import atheris

    rng = random.Random(seed)
    if rng.random() < 0.5 or len(data) <= HEADER_BYTES:
        out = atheris.Mutate(data, max_size)
    else:
        out = data
        for _ in range(rng.randint(1, 3)):
            out = mutate(out, rng)
    return out[:max_size]


def replay(paths: list[str]) -> int:
    """Run every corpus file once (no atheris); print failures; return how many failed."""
    files = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, f) for f in os.listdir(path) if not f.startswith("."))
        else:
            files.append(path)
    failed = 0
    for name in files:
        with open(name, "rb") as f:
            data = f.read()
        try:
            check_input(data)
        except Exception as exc:
            failed += 1
            print(f"FAIL {name}: {known_bug(exc) or 'NEW'}: {exc!r}"[:500])
    print(f"replayed {len(files)} inputs, {failed} failed")
    return failed


def main(argv: list[str]) -> None:
    if len(argv) > 1 and argv[1] == "--replay":
        sys.exit(1 if replay(argv[2:]) else 0)
    import atheris

    with atheris.instrument_imports():
        import fastaccum._py  # noqa: F401  (coverage of the pure twin guides the compiled one)
    load_twins()
    atheris.Setup(argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()


# Imported by tests/test_fuzz_corpus.py; atheris itself is only needed by main().
__all__ = ("check_input", "chunked", "cut", "options", "mutate", "known_bug", "replay", "HEADER_BYTES")

if __name__ == "__main__":
    main(sys.argv)
