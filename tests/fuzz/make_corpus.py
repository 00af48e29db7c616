"""Write the committed seed corpus (tests/fuzz_corpus/) from fastaccum.emulator.writer: small, deterministic.

Each file is a fuzz input: 4 header bytes (options and piece cutting, see fuzz_core.py) and an SSE
body. Seeds cover both modes, logprobs on/off, text on/off, top-p, routed experts, echo chunks,
coalesced deltas, error events, CR/CRLF framing, comments, multi-line data, and the core bugs
reported so far (``bug-*``). Rerun after changing the wire format::

    python tests/fuzz/make_corpus.py tests/fuzz_corpus
"""

from __future__ import annotations

import os
import sys
from typing import Any

import orjson

from fastaccum.emulator import writer_vllm
from fastaccum.emulator.writer import (
    DONE,
    WireOptions,
    chunk_encode,
    coalesce,
    echo_event,
    error_event,
    normal_event,
    sse,
    stream_bytes,
    stream_events,
    synthetic_generation,
)

# Header flag bits: mode (0 auto, 1 cumulative, 2 incremental), limit (<<2), expert_shape (<<4),
# the compiled twin's streamed base64 from the first byte (<<5), and with pybase64 only (<<6).
AUTO, CUM, INC = 0, 1, 2
SHAPE = 1 << 4
LIMIT_4K = 3 << 2
STREAMED = 1 << 5
PYBASE64 = 1 << 6
CHUNKED = 1 << 7


def header(flags: int, cutting: int = 0) -> bytes:
    return bytes([flags]) + cutting.to_bytes(3, "little")


def seeds() -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    inc = WireOptions(incremental=True, logprob_text=True)
    cum = WireOptions(logprob_text=True)
    plain_inc = WireOptions(incremental=True, return_logprob=False)
    plain_cum = WireOptions(return_logprob=False)
    skip = WireOptions(incremental=True, skip_tokenizer_init=True)
    g = synthetic_generation("fz", 7, prompt_tokens=3, top_p=True, expert_shape=(2, 2), null_logprob_every=3)
    small = synthetic_generation("fz-s", 4, prompt_tokens=2)

    for name, opts in (
        ("inc", inc),
        ("cum", cum),
        ("inc-plain", plain_inc),
        ("cum-plain", plain_cum),
        ("inc-skip-tokenizer", skip),
    ):
        out[f"valid-{name}"] = header(AUTO) + stream_bytes(stream_events(small, opts))
    out["valid-inc-top-p-routed"] = header(INC | SHAPE, 2) + stream_bytes(stream_events(g, inc, interval=3))
    out["valid-cum-top-p-routed"] = header(CUM | SHAPE, 3) + stream_bytes(stream_events(g, cum, interval=2))
    out["streamed-inc-top-p-routed"] = header(INC | SHAPE | STREAMED, 2) + stream_bytes(
        stream_events(g, inc, interval=3)
    )
    out["streamed-cum-top-p-routed-pybase64"] = header(CUM | SHAPE | STREAMED | PYBASE64, 3) + stream_bytes(
        stream_events(g, cum, interval=2)
    )
    out["valid-cum-light-checked"] = header(CUM, 1) + stream_bytes(stream_events(small, cum))
    out["valid-cum-0.5.15"] = header(AUTO) + stream_bytes(
        stream_events(small, WireOptions(version="0.5.15")), done=False
    )
    out["valid-limit"] = header(AUTO | LIMIT_4K, 2) + stream_bytes(stream_events(small, inc))

    # Framing variants of one valid stream.
    body = stream_bytes(stream_events(small, inc))
    out["frame-crlf"] = header(AUTO, 1) + body.replace(b"\n", b"\r\n")
    out["frame-cr"] = header(AUTO, 2) + body.replace(b"\n", b"\r")
    out["frame-comments-bom"] = (
        header(AUTO) + b"\xef\xbb\xbf: hi\nevent: x\nid: 1\n" + body.replace(b"\n\n", b"\n: ping\nretry: 1\n\n")
    )
    out["frame-multiline"] = (
        header(AUTO, 2)
        + b"".join(
            b"data: " + orjson.dumps(e, option=orjson.OPT_INDENT_2).replace(b"\n", b"\ndata:") + b"\n\n"
            for e in stream_events(small, inc)
        )
        + DONE
    )
    out["frame-no-space"] = header(AUTO) + body.replace(b"data: ", b"data:")

    # Echo chunks and coalescing (docs/wire-format.md, "The abort echo" and "Stream interval and
    # coalescing").
    for version in ("0.5.23", "0.5.15"):
        for label, opts in (
            ("inc", WireOptions(incremental=True, version=version)),
            ("cum", WireOptions(version=version)),
        ):
            events = [normal_event(small, opts, 0, 1, first=True), echo_event(small, opts, 3)]
            out[f"echo-{label}-{version}"] = header(AUTO) + stream_bytes(events)
    inc_plain = WireOptions(incremental=True)
    deltas = [normal_event(small, inc_plain, 1, 2), echo_event(small, inc_plain, 2)]
    out["echo-coalesced"] = header(AUTO) + stream_bytes(
        [normal_event(small, inc_plain, 0, 1, first=True), coalesce(deltas)]
    )
    out["coalesced-deltas"] = header(INC, 2) + stream_bytes(
        [
            coalesce([normal_event(small, inc, 0, 1, first=True), normal_event(small, inc, 1, 3)]),
            normal_event(small, inc, 3, 4, terminal=True),
        ]
    )
    out["zero-token-terminal"] = header(AUTO) + stream_bytes(
        [normal_event(small, inc, 0, 4, first=True), normal_event(small, inc, 4, 4, terminal=True)]
    )

    # Errors the core must report.
    first = sse(normal_event(small, inc, 0, 1, first=True))
    out["error-event"] = header(AUTO) + first + sse(error_event("context too long", 400)) + DONE
    out["error-string"] = header(AUTO) + b'data: {"error":"rid exists"}\n\n' + DONE
    out["early-done"] = header(AUTO) + first + DONE
    out["cut-mid-event"] = header(AUTO, 2) + first + sse(normal_event(small, inc, 1, 2))[:40]
    out["not-json"] = header(AUTO) + first + b'data: {"text":\n\n'
    out["mode-mismatch"] = header(INC) + stream_bytes(stream_events(small, cum))
    out["length-decreases"] = header(CUM) + stream_bytes(list(stream_events(small, cum))[::-1])
    out["top-p-bad-offsets"] = header(AUTO) + _edit_meta(
        normal_event(g, inc, 0, 7, terminal=True, first=True), top_p_token_offsets="AQAAAA=="
    )
    out["routed-wrong-size"] = header(AUTO | SHAPE) + _edit_meta(
        normal_event(g, inc, 0, 7, terminal=True, first=True), routed_experts="AAAAAAAAAAA="
    )
    out["streamed-routed-bad-char"] = header(AUTO | SHAPE | STREAMED) + _edit_meta(
        normal_event(g, inc, 0, 7, terminal=True, first=True), routed_experts="A" * 100 + "*" + "A" * 91
    )
    out["oversized"] = header(AUTO | LIMIT_4K) + b"data: " + b"x" * 5000 + b"\n\n"
    out["nesting"] = header(AUTO) + b"data: " + b"[" * 1100 + b"]" * 1100 + b"\n\n"
    out["surrogate"] = header(AUTO) + b'data: {"text":"\\ud800","output_ids":[],"meta_info":{}}\n\n'

    # HTTP chunked bodies (feed_chunked): one chunk per event as uvicorn writes, chunks cutting
    # events, extensions and trailers, and broken framing.
    per_event = b"".join(chunk_encode(sse(e))[:-5] for e in stream_events(small, inc)) + chunk_encode(DONE)
    out["chunked-per-event"] = header(AUTO | CHUNKED, 2) + per_event
    out["chunked-cum-ext-trailers"] = header(CUM | CHUNKED, 1) + chunk_encode(
        stream_bytes(stream_events(small, cum)), [5, 17, 1, 40], extension=b";n=v", trailers=b"X-T: 1\r\n"
    )
    out["chunked-bad-size"] = header(AUTO | CHUNKED) + chunk_encode(first)[:-5] + b"1g\r\n"
    out["chunked-data-after-end"] = header(AUTO | CHUNKED) + per_event + b"5\r\n"

    # vLLM's chunks (the dialect follows the body): both shapes, routed experts as .npy, the
    # sampling mask, the abort chunk, a pre-0.32 abort, an error object.
    gv = synthetic_generation("fz-v", 6, prompt_tokens=3, top_p=True, expert_shape=(2, 2))
    for shape in writer_vllm.SHAPES:
        out[f"vllm-{shape}"] = header(AUTO, 2) + writer_vllm.stream_bytes(
            writer_vllm.stream_chunks(gv, shape=shape, routed=True, sampling_mask=shape == "0.32", interval=2)
        )
    out["vllm-abort-chunk"] = header(AUTO) + writer_vllm.stream_bytes(
        [writer_vllm.chunk(gv, 0, 2), writer_vllm.chunk(gv, 2, 2, finish="abort"), writer_vllm.usage_chunk(gv, 2)]
    )
    out["vllm-error"] = (
        header(AUTO) + writer_vllm.sse(writer_vllm.chunk(gv, 0, 1)) + writer_vllm.error_chunk("boom") + DONE
    )

    # Non-streaming answers (a body that starts with { or [ is also read as one): SGLang's, with
    # its arrays; a batch of two; vLLM's; an error body.
    whole = normal_event(g, cum, 0, 7, terminal=True, finish_reason=g.finish_reason, first=True)
    out["body-sglang"] = header(AUTO | SHAPE, 2) + orjson.dumps(whole)
    out["body-sglang-batch"] = header(CUM, 1) + b"[" + orjson.dumps(whole) + b", " + orjson.dumps(whole) + b"]"
    out["body-vllm"] = header(AUTO | SHAPE, 2) + orjson.dumps(
        writer_vllm.chunk(gv, 0, 6, finish="length", routed=True, shape="0.32")
    )
    out["body-error"] = header(AUTO) + b'{"error": {"message": "prompt too long", "code": 400}}'

    # Reported core bugs (docs/reliability.md); test_fuzz_corpus.py expects these to fail until fixed.
    out["bug-B1-nested-error"] = header(AUTO) + b'data: {"error":' + b"[" * 1000 + b"]" * 1000 + b"}\n\n"
    out["bug-B2-b64-outside-meta"] = header(AUTO) + b'data: {"routed_experts":"\x01","meta_info":{}}\n\n'
    echo = echo_event(small, WireOptions(), 1)
    echo["meta_info"]["completion_tokens"] = 2**64 - 1
    out["bug-B3-echo-huge-total"] = header(AUTO) + stream_bytes(
        [normal_event(small, WireOptions(), 0, 1, first=True), echo]
    )
    return out


def _edit_meta(event: dict[str, Any], **changes: Any) -> bytes:
    event["meta_info"].update(changes)
    return sse(event) + DONE


def main(argv: list[str]) -> None:
    target = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fuzz_corpus")
    os.makedirs(target, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(target, name), "wb") as f:
            f.write(data)
    print(f"wrote {len(seeds())} seeds to {target}")


if __name__ == "__main__":
    main(sys.argv)
