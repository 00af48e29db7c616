"""SGLang /generate SSE writer: events exactly as SGLang serializes them, for the emulator and tests.

Follows docs/wire-format.md: orjson, compact, ``data: <json>\\n\\n``, the 0.5.23
``meta_info`` key order, cumulative or incremental lists, terminal-only routed experts and top-p,
abort echo chunks (0.5.23 and 0.5.15 flavours) and error events. A deterministic token source,
``synthetic_generation``, makes every token a pure function of (seed, rid, position) so a test can
check a whole stream end to end.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pybase64

__all__ = (
    "DONE",
    "Generation",
    "WireOptions",
    "synthetic_generation",
    "emission_points",
    "normal_event",
    "echo_event",
    "error_event",
    "weight_version_spans",
    "coalesce",
    "encode_int32",
    "sse",
    "stream_events",
    "stream_bytes",
    "split_pieces",
    "chunk_encode",
    "TEXT_PIECES",
    "PLAIN_TEXT_PIECES",
)

DONE = b"data: [DONE]\n\n"

# Pieces a synthetic token decodes to: multi-byte UTF-8, emoji, U+2028/U+2029/U+0085 (which
# orjson writes raw), JSON escapes, special-token text and empty strings all occur.
TEXT_PIECES: tuple[str, ...] = (
    "The",
    " answer",
    " is",
    " 4",
    ".",
    " 日本",
    "語",
    " 🙂",
    "\u2028",
    " é",
    "\n",
    '"q"',
    "\\",
    "\t",
    "",
    " ok",
    "<|im_end|>",
    "\u2029",
    "\x85",
    "\r\n",
    " 中文",
    "\x0b\x0c",
    " Ω",
    "/",
)
# The same without the characters str.splitlines() also breaks lines at (U+2028, U+2029, U+0085;
# orjson escapes the others): streams that line readers such as httpx aiter_lines() survive.
PLAIN_TEXT_PIECES: tuple[str, ...] = tuple(t for t in TEXT_PIECES if not any(c in t for c in "\u2028\u2029\x85"))
_SLICED_KEYS = ("output_token_logprobs",)


@dataclass(frozen=True)
class Generation:
    """Everything the server would produce for one request, position by position."""

    rid: str
    prompt_tokens: int
    token_ids: Sequence[int]
    logprobs: Sequence[float | None]
    token_texts: Sequence[str]
    finish_reason: dict[str, Any] | None = None
    top_p_rows: Sequence[Sequence[int]] | None = None
    routed_experts: npt.NDArray[np.int32] | None = None  # (prompt + n - 1 - routed_start, layers, topk)
    indexer_topk: npt.NDArray[np.int32] | None = None  # (prompt + n - 1, indexer layers, index_topk)
    routed_start: int = 0  # the request's routed_experts_start_len
    # The label every event carries (SGLang's tokenizer-side weight_version).
    weight_version: str = "default"
    # The engine's record: (first token, version) per change, each token under the version in
    # force when it was committed; the finishing event's spans. Empty: every token under
    # weight_version.
    weight_versions: tuple[tuple[int, str], ...] = ()
    num_retractions: int = 0
    # Which weights computed what: (first output index, weights) for the tokens and (first
    # sequence position, weights) for the replay rows, prompt included; "" is the base weights.
    token_weights: tuple[tuple[int, str], ...] = ()
    row_weights: tuple[tuple[int, str], ...] = ()

    def replay_rows(self, end: int, *, start: int = 0) -> int:
        """Rows of a replay array once ``end`` tokens are out: a row per position but the last."""
        return max(self.prompt_tokens + end - 1 - start, 0)

    def text(self, start: int, end: int) -> str:
        return "".join(self.token_texts[start:end])


@dataclass(frozen=True)
class WireOptions:
    """Server and request switches that change the bytes on the wire."""

    incremental: bool = False  # --incremental-streaming-output
    return_logprob: bool = True
    logprob_text: bool = False  # return_text_in_logprobs
    skip_tokenizer_init: bool = False  # no "text" key at all
    version: str = "0.5.23"  # or "0.5.15"
    # indexer_topk_num_layers beside the indexer top-k: SGLang forks (sglang-miles) write it,
    # SGLang itself (0.5.15, 0.5.23) does not.
    indexer_topk_num_layers: bool = False
    extra_meta: dict[str, Any] = field(default_factory=dict)


def _hash_u64(seed: int, rid: str, salt: int, positions: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64 of (seed, rid, salt, position): stable across runs and prefix-stable in n."""
    digest = hashlib.blake2b(f"{seed}/{rid}/{salt}".encode(), digest_size=8).digest()
    with np.errstate(over="ignore"):
        z = positions * np.uint64(0x9E3779B97F4A7C15) + np.uint64(int.from_bytes(digest, "little"))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


_HASH_BLOCK = 1 << 16  # positions hashed at a time: the temporaries stay in the CPU's cache


def _hashed_mod(seed: int, rid: str, salt: int, count: int, modulo: int, first: int = 0) -> npt.NDArray[np.int32]:
    """``_hash_u64`` of positions ``first .. first + count - 1`` modulo ``modulo``, as int32: the same values,
    computed a cache-sized block at a time in place (a 32k-token answer's routed experts are 12
    million of them; whole-array temporaries took ten times as long)."""
    digest = hashlib.blake2b(f"{seed}/{rid}/{salt}".encode(), digest_size=8).digest()
    out = np.empty(count, dtype=np.int32)
    z = np.empty(min(count, _HASH_BLOCK), dtype=np.uint64)
    t = np.empty_like(z)
    offset, mod = np.uint64(int.from_bytes(digest, "little")), np.uint64(modulo)
    with np.errstate(over="ignore"):
        for start in range(0, count, _HASH_BLOCK):
            m = min(_HASH_BLOCK, count - start)
            zz, tt = z[:m], t[:m]
            zz[:] = np.arange(first + start, first + start + m, dtype=np.uint64)
            np.multiply(zz, np.uint64(0x9E3779B97F4A7C15), out=zz)
            np.add(zz, offset, out=zz)
            for shift, factor in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
                np.right_shift(zz, np.uint64(shift), out=tt)
                np.bitwise_xor(zz, tt, out=zz)
                np.multiply(zz, np.uint64(factor), out=zz)
            np.right_shift(zz, np.uint64(31), out=tt)
            np.bitwise_xor(zz, tt, out=zz)
            np.remainder(zz, mod, out=zz)
            out[start : start + m] = zz
    return out


class _Positions(Sequence[Any]):
    """One column of a generation's per-position values, computed a block at a time on first read:
    a request for a million tokens that is aborted after twenty costs twenty (token i never
    depends on n, so a block is the same whoever asks first)."""

    BLOCK = 4096

    def __init__(self, n: int, blocks: dict[int, tuple[list[Any], ...]], make: Any, column: int) -> None:
        self._n, self._blocks, self._make, self._column = n, blocks, make, column

    def __len__(self) -> int:
        return self._n

    def _block(self, b: int) -> list[Any]:
        columns = self._blocks.get(b)
        if columns is None:  # shared by the columns: one hash per position for all of them
            start = b * self.BLOCK
            columns = self._blocks[b] = self._make(start, min(start + self.BLOCK, self._n))
        return columns[self._column]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._n)
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            out: list[Any] = []
            while start < stop:
                b, offset = divmod(start, self.BLOCK)
                values = self._block(b)[offset : offset + stop - start]
                out += values
                start += len(values)
            return out
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError("generation position out of range")
        b, offset = divmod(index, self.BLOCK)
        return self._block(b)[offset]

    def __iter__(self) -> Iterator[Any]:
        for b in range(-(-self._n // self.BLOCK)):
            yield from self._block(b)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and len(other) == self._n and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


def synthetic_generation(
    rid: str,
    n: int,
    *,
    seed: int = 0,
    prompt_tokens: int = 16,
    vocab: int = 151_000,
    finish_reason: dict[str, Any] | None = None,
    top_p: bool = False,
    expert_shape: tuple[int, int] | None = None,
    num_experts: int = 128,
    routed_start: int = 0,
    indexer_shape: tuple[int, int] | None = None,
    null_logprob_every: int = 0,
    text_pieces: Sequence[str] = TEXT_PIECES,
    first_position: int = 0,
    token_weights: Sequence[tuple[int, str]] = (),
    row_weights: Sequence[tuple[int, str]] = (),
) -> Generation:
    """A deterministic generation of ``n`` tokens for ``rid``; token i never depends on ``n``.
    Tokens, log-probs, texts and top-p rows are computed on first read, a block at a time.
    ``first_position``: where token 0 falls in the hashed sequence; the emulator's greedy mode
    passes the prompt's length, so that a request for prompt + k tokens continues the first one
    (the replay rows are hashed by position in the sequence, prompt included, whatever it is).

    ``token_weights`` and ``row_weights`` say which weights computed what: ``(first output index,
    weights)`` and ``(first sequence position, weights)`` per change, ``""`` the base weights
    (before a schedule's first entry too). A value under other weights is hashed with the key
    ``weights_key(rid, weights)``, so it is the same whichever request asks for that position
    under those weights: a greedy request for prompt + k tokens under new weights continues one
    that switched to them at token k."""

    def hashed(salt: int, start: int, stop: int) -> npt.NDArray[np.uint64]:
        at = first_position
        parts = [
            _hash_u64(seed, weights_key(rid, w), salt, np.arange(at + a, at + b, dtype=np.uint64))
            for a, b, w in _runs(start, stop, token_weights)
        ]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def block(start: int, stop: int) -> tuple[list[Any], ...]:
        h = hashed(1, start, stop)
        ids = (h % np.uint64(vocab)).astype(np.int64)
        # float32 logprobs widened to double, as SGLang's .tolist() does: 17-digit reprs, e-notation.
        scale = ((h >> np.uint64(20)) % np.uint64(1_000_000)).astype(np.float64) / 1e6
        exponent = ((h >> np.uint64(40)) % np.uint64(9)).astype(np.float64)
        lp32 = (-(scale * 10.0**-exponent)).astype(np.float32)
        logprobs: list[float | None] = [float(x) for x in lp32.astype(np.float64)]
        if null_logprob_every:
            for i in range(-start % null_logprob_every, stop - start, null_logprob_every):
                logprobs[i] = None
        texts = [text_pieces[int(t) % len(text_pieces)] for t in ids]
        rows = []
        if top_p:
            h2 = hashed(2, start, stop)
            for i in range(stop - start):
                width = int(h2[i] % np.uint64(4))
                extra = [int((h2[i] >> np.uint64(8 + 12 * j)) % np.uint64(vocab)) for j in range(width)]
                rows.append(sorted({int(ids[i]), *extra}))
        return [int(t) for t in ids], logprobs, texts, rows

    blocks: dict[int, tuple[list[Any], ...]] = {}
    token_ids, logprobs, texts, rows = (_Positions(n, blocks, block, column) for column in range(4))
    count = max(prompt_tokens + n - 1, 0)  # replay rows: a row per position but the last
    routed = None
    if expert_shape is not None:
        layers, topk = expert_shape
        per = layers * topk
        parts = [
            _hashed_mod(seed, weights_key(rid, w), 3, (b - a) * per, num_experts, first=a * per)
            for a, b, w in _runs(routed_start, count, row_weights)
        ]
        routed = _joined(parts, np.int32).reshape(-1, layers, topk)
    indexer = None
    if indexer_shape is not None:
        layers, topk = indexer_shape
        per = layers * topk
        h4 = _joined(
            [
                _hash_u64(seed, weights_key(rid, w), 4, np.arange(a * per, b * per, dtype=np.uint64))
                for a, b, w in _runs(0, count, row_weights)
            ],
            np.uint64,
        ).reshape(count, layers, topk)
        # KV positions the row's token attends to: 0 .. its own position.
        positions = np.arange(1, count + 1, dtype=np.uint64).reshape(count, 1, 1)
        indexer = (h4 % positions).astype(np.int32)
    if finish_reason is None:
        finish_reason = {"type": "stop", "matched": token_ids[-1]} if n else {"type": "length", "length": 0}
    return Generation(
        rid=rid,
        prompt_tokens=prompt_tokens,
        token_ids=token_ids,
        logprobs=logprobs,
        token_texts=texts,
        finish_reason=finish_reason,
        top_p_rows=rows if top_p else None,
        routed_experts=routed,
        indexer_topk=indexer,
        routed_start=routed_start,
        token_weights=tuple(token_weights),
        row_weights=tuple(row_weights),
    )


def weights_key(rid: str, weights: str) -> str:
    """The key ``rid``'s values are hashed with under ``weights`` (``""``: the base weights, the
    rid alone, so a generation without a schedule is what it always was)."""
    return f"{rid}@{weights}" if weights else rid


def _runs(start: int, stop: int, schedule: Sequence[tuple[int, str]]) -> Iterator[tuple[int, int, str]]:
    """``[start, stop)`` cut where ``schedule`` ((first index, weights) per change) changes weights."""
    if not schedule or schedule[0][0] > 0:
        schedule = ((0, ""), *schedule)
    for i, (first, weights) in enumerate(schedule):
        end = schedule[i + 1][0] if i + 1 < len(schedule) else stop
        lo, hi = max(start, first), min(stop, end)
        if lo < hi:
            yield lo, hi, weights


def _joined(parts: list[npt.NDArray[Any]], dtype: Any) -> npt.NDArray[Any]:
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)


def emission_points(n: int, interval: int, version: str = "0.5.23") -> list[int]:
    """Token counts at which events go out for single-token decode steps (the last one terminal).

    0.5.23 sends the first id at once, then whenever >= interval ids are unsent; 0.5.15 sends when
    len(output_ids) % interval == 1. With one id per step both give 1, 1+N, 1+2N, ...
    """
    if n <= 0:
        return [0]
    if version == "0.5.15" and interval > 1:
        points = [k for k in range(1, n + 1) if k % interval == 1]
    else:
        points = list(range(1, n + 1, max(interval, 1)))
    if points[-1] != n:
        points.append(n)
    return points


def encode_int32(values: npt.ArrayLike) -> str:
    """Standard padded base64 of little-endian int32 bytes, C order."""
    return pybase64.b64encode(np.ascontiguousarray(values, dtype="<i4").tobytes()).decode("ascii")


def _top_p_fields(rows: Sequence[Sequence[int]]) -> dict[str, str]:
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(r) for r in rows])
    flat = [t for r in rows for t in r]
    return {"top_p_token_ids": encode_int32(flat), "top_p_token_offsets": encode_int32(offsets)}


def _logprob_triples(gen: Generation, opts: WireOptions, start: int, end: int) -> list[list[Any]]:
    texts = gen.token_texts if opts.logprob_text and not opts.skip_tokenizer_init else None
    return [[gen.logprobs[i], gen.token_ids[i], texts[i] if texts is not None else None] for i in range(start, end)]


def normal_event(
    gen: Generation,
    opts: WireOptions,
    start: int,
    end: int,
    *,
    terminal: bool = False,
    finish_reason: dict[str, Any] | None = None,
    first: bool = False,
    routed_rows: int | None = None,
) -> dict[str, Any]:
    """The event SGLang sends when ids ``[start, end)`` are new (start is ignored in cumulative mode).

    ``finish_reason`` overrides ``gen.finish_reason`` on the terminal event (e.g. an abort).
    """
    lo = start if opts.incremental else 0
    out: dict[str, Any] = {}
    if not opts.skip_tokenizer_init:
        out["text"] = gen.text(lo, end)
    out["output_ids"] = list(gen.token_ids[lo:end])
    reason = (finish_reason or gen.finish_reason) if terminal else None
    meta: dict[str, Any] = {
        "id": gen.rid,
        "finish_reason": reason,
        "prompt_tokens": gen.prompt_tokens,
        "weight_version": gen.weight_version,
        "num_retractions": gen.num_retractions,
    }
    if opts.return_logprob:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = _logprob_triples(gen, opts, lo, end)
        meta["output_token_logprobs_length"] = end
        if terminal and gen.top_p_rows is not None:
            meta.update(_top_p_fields(gen.top_p_rows[:end]))
    meta["reasoning_tokens"] = 0
    meta["completion_tokens"] = end
    meta["cached_tokens"] = 0
    if terminal and opts.version != "0.5.15":
        # SGLang's tokenizer overwrites the event's label with its record's last version.
        meta["weight_versions"] = weight_version_spans(gen, end)
        meta["weight_version"] = meta["weight_versions"][-1]["version"]
    meta["cached_tokens_details"] = None
    if terminal and gen.routed_experts is not None:
        rows = gen.replay_rows(end, start=gen.routed_start) if routed_rows is None else routed_rows
        meta["routed_experts"] = encode_int32(gen.routed_experts[: max(rows, 0)])
    if terminal and gen.indexer_topk is not None:
        meta["indexer_topk"] = encode_int32(gen.indexer_topk[: gen.replay_rows(end)])
        if opts.indexer_topk_num_layers:
            meta["indexer_topk_num_layers"] = int(gen.indexer_topk.shape[1])
    meta["dp_rank"] = None
    if terminal:
        meta["e2e_latency"] = 0.1874
    if first:
        meta["response_sent_to_client_ts"] = 1767225600.0433
    meta.update(opts.extra_meta)
    out["meta_info"] = meta
    return out


def echo_event(
    gen: Generation,
    opts: WireOptions,
    held: int,
    *,
    message: str = "Abort in waiting queue",
    first: bool = False,
) -> dict[str, Any]:
    """The abort echo chunk for a queued or retracted request holding ``held`` ids (no new tokens).

    ``first``: the echo is the first event of the stream, which SGLang stamps with
    ``response_sent_to_client_ts`` as the last key (seen in the reference goldens).
    """
    out: dict[str, Any] = {}
    out["text"] = "" if opts.skip_tokenizer_init else gen.text(0, held)
    if opts.version == "0.5.15" or opts.incremental:
        out["output_ids"] = list(gen.token_ids[held - 1 : held]) if held else []
    else:
        out["output_ids"] = list(gen.token_ids[:held])
    meta: dict[str, Any] = {
        "id": gen.rid,
        "finish_reason": {"type": "abort", "message": message},
        "weight_version": gen.weight_version,
        "e2e_latency": 3.5171,
    }
    if opts.version != "0.5.15":
        meta["weight_versions"] = weight_version_spans(gen, held)
        meta["weight_version"] = meta["weight_versions"][-1]["version"]
    if opts.return_logprob:
        meta["input_token_logprobs"] = []
        meta["output_token_logprobs"] = _logprob_triples(gen, opts, 0, held)
        meta["output_token_logprobs_length"] = held
        if gen.top_p_rows is not None:
            meta.update(_top_p_fields(gen.top_p_rows[:held]))
    meta["completion_tokens"] = held
    if first:
        meta["response_sent_to_client_ts"] = 1767225600.0433
    out["meta_info"] = meta
    return out


def weight_version_spans(gen: Generation, end: int) -> list[dict[str, Any]]:
    """The finishing event's ``weight_versions`` for the first ``end`` tokens: ``gen``'s record
    (every token under ``gen.weight_version`` without one) as spans, end exclusive, adjacent
    equal versions merged, clamped to ``end``; a span that would start at or past ``end`` is left
    out unless it is the first (SGLang writes ``{"start": 0, "end": 0}`` for no tokens)."""
    record = gen.weight_versions or ((0, gen.weight_version),)
    spans: list[dict[str, Any]] = []
    for i, (start, version) in enumerate(record):
        stop = min(record[i + 1][0] if i + 1 < len(record) else end, end)
        if spans and (start >= end or stop <= spans[-1]["end"]):
            continue
        if spans and spans[-1]["version"] == version:
            spans[-1]["end"] = stop
        else:
            spans.append({"version": version, "start": spans[-1]["end"] if spans else 0, "end": max(stop, 0)})
    return spans


def error_event(message: str, code: int = 400) -> dict[str, Any]:
    return {"error": {"message": message, "type": "invalid_request_error", "code": code, "retryable": False}}


def coalesce(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge queued incremental chunks as SGLang's tokenizer manager does.

    ``output_ids``, ``text`` and the sliced logprob lists are concatenated; every other field comes
    from the newest chunk.
    """
    merged = dict(events[-1])
    meta = dict(merged["meta_info"])
    merged["output_ids"] = [t for e in events for t in e["output_ids"]]
    if "text" in merged:
        merged["text"] = "".join(e.get("text", "") for e in events)
    for key in _SLICED_KEYS:
        if key in meta:
            meta[key] = [x for e in events for x in e["meta_info"].get(key, [])]
    merged["meta_info"] = meta
    # Keep the key order of the newest chunk, as a dict update in SGLang does.
    return {k: merged[k] for k in events[-1]}


def sse(obj: dict[str, Any]) -> bytes:
    """One SSE event as SGLang's http_server writes it."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def stream_events(
    gen: Generation,
    opts: WireOptions,
    *,
    interval: int = 1,
    points: Sequence[int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Every event of a normal stream, one per emission point; the last one is terminal."""
    n = len(gen.token_ids)
    pts = list(points) if points is not None else emission_points(n, interval, opts.version)
    prev = 0
    for k, end in enumerate(pts):
        yield normal_event(gen, opts, prev, end, terminal=k == len(pts) - 1, first=k == 0)
        prev = end


def stream_bytes(events: Iterable[dict[str, Any]], *, done: bool = True) -> bytes:
    body = b"".join(sse(e) for e in events)
    return body + DONE if done else body


def split_pieces(data: bytes, sizes: Iterable[int]) -> list[bytes]:
    """Cut ``data`` into consecutive pieces of the given sizes (cycled), the way TCP might."""
    pieces: list[bytes] = []
    sizes = list(sizes) or [len(data) or 1]
    pos = k = 0
    while pos < len(data):
        step = max(1, sizes[k % len(sizes)])
        pieces.append(data[pos : pos + step])
        pos += step
        k += 1
    return pieces


def chunk_encode(data: bytes, sizes: Iterable[int] = (), *, extension: bytes = b"", trailers: bytes = b"") -> bytes:
    """``data`` as an HTTP/1.1 chunked body: chunks of the given sizes (the rest in one chunk;
    sizes of 0 are skipped, since a 0-size chunk ends the body), each size line followed by
    ``extension`` (such as ``b";name=value"``), then the last chunk and ``trailers`` (whole
    ``Field: value\r\n`` lines)."""
    out = bytearray()
    pos = 0
    for size in [*sizes, len(data)]:
        piece = data[pos : pos + size]
        if not piece:
            continue
        out += b"%x%s\r\n%s\r\n" % (len(piece), extension, piece)
        pos += len(piece)
        if pos >= len(data):
            break
    return bytes(out) + b"0%s\r\n%s\r\n" % (extension, trailers)
