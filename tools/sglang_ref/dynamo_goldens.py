"""Dynamo goldens: SGLang's own incremental events, as NVIDIA Dynamo's native ``/generate`` serves them.

Dynamo's SGLang-native route (``DYN_SGLANG_ENABLE_GENERATE=1`` on the frontend) runs SGLang with
``incremental_streaming_output`` forced on, hands each object ``TokenizerManager.generate_request``
yields to its Rust frontend, and the frontend writes it as one SSE event. This script takes the
incremental goldens SGLang's real code wrote (``tests/golden/<sglang version>/inc_*.sse``, byte-checked
by the live tier) and applies only what Dynamo does to them (each fact's source in Dynamo's code:
tools/sglang_ref/README.md, "Dynamo goldens"):

* ``meta_info.id`` is the public request id (the body's ``rid``, else the ``x-request-id`` header,
  else a generated UUID); the SGLang run's rid stands in for the internal ``uuid4().hex`` Dynamo
  1.6 submits to SGLang. Every other key, and every key's position, is kept.
* Each object is written by serde_json (``preserve_order``; compact; non-ASCII raw; floats in
  ryu's shortest form) inside axum's SSE framing: ``data: <json>\\n\\n``. No ``event:``/``id:``.
* Ends: a source that ends normally gets ``data: [DONE]\\n\\n``; a backend error mid-stream becomes
  ``data: {"error":{"message":"Internal server error"}}\\n\\n`` + ``data: [DONE]\\n\\n`` (SGLang's own
  error event never reaches the client); a killed request (client disconnect, backend inactivity
  timeout) ends after the last event sent, without ``[DONE]``; a graceful stop
  (``stop_generating``) drops the rest of SGLang's output, so ``[DONE]`` follows an event without
  a finish reason. Keep-alive (only with ``DYN_HTTP_SSE_KEEP_ALIVE_INTERVAL_MS``) is ``:\\n\\n``.

Standard library only; deterministic (no clock, no randomness). Usage::

    python tools/sglang_ref/dynamo_goldens.py --out tests/golden [--check]

``--check`` writes nothing and fails if the committed files differ from a fresh run.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DYNAMO_VERSION = "1.6.1"  # also checked against 1.5.1's Python handler and wheel strings (same rules)
SGLANG_SOURCE = "0.5.23"  # the incremental goldens transformed (Dynamo 1.6.1 pins sglang 0.5.21)

DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b":\n\n"  # axum Event::DEFAULT_KEEP_ALIVE
INTERNAL_ERROR = "Internal server error"  # SanitizedError::Internal


# ---- serde_json's writer (serde_json::Value::to_string with preserve_order) --------------------
def _ryu(value: float) -> str:
    """A finite f64 as serde_json writes it: the shortest round-trip digits (Python's repr finds the
    same digits) in ryu's layout: ``12.5``, ``1e16``, ``1.5e-7``, ``0.0001``, ``-0.0``."""
    if value == 0.0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    mantissa, _, exp_text = repr(abs(value)).partition("e")
    int_part, _, frac_part = mantissa.partition(".")
    digits = int_part + frac_part
    exponent = (int(exp_text) if exp_text else 0) - len(frac_part)
    digits = digits.lstrip("0")  # value = int(digits) * 10**exponent
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    length = len(digits)
    kk = length + exponent  # 10^(kk-1) <= |value| < 10^kk
    sign = "-" if value < 0 else ""
    if 0 <= exponent and kk <= 16:
        body = digits + "0" * exponent + ".0"
    elif 0 < kk <= 16:
        body = digits[:kk] + "." + digits[kk:]
    elif -5 < kk <= 0:
        body = "0." + "0" * (-kk) + digits
    elif length == 1:
        body = f"{digits}e{kk - 1:+d}"
    else:
        body = f"{digits[0]}.{digits[1:]}e{kk - 1:+d}"
    return sign + body


def serde_json_dumps(obj: Any) -> str:
    if obj is None:
        return "null"
    if obj is True:
        return "true"
    if obj is False:
        return "false"
    if isinstance(obj, int):
        return str(obj)
    if isinstance(obj, float):
        # serde_json::Value has no NaN/inf: a non-finite Python float becomes null on the way in.
        return _ryu(obj) if math.isfinite(obj) else "null"
    if isinstance(obj, str):
        # Escapes: '"', '\\', \b \f \n \r \t, other C0 controls as \u00xx; everything else raw.
        return json.dumps(obj, ensure_ascii=False)
    if isinstance(obj, list):
        return "[" + ",".join(serde_json_dumps(v) for v in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ",".join(f"{serde_json_dumps(k)}:{serde_json_dumps(v)}" for k, v in obj.items()) + "}"
    raise TypeError(f"not JSON: {type(obj).__name__}")


def sse_data(obj: Any) -> bytes:
    """axum 0.8 ``Event::default().data(value.to_string())``: compact JSON has no newline, so one line."""
    return b"data: " + serde_json_dumps(obj).encode("utf-8") + b"\n\n"


ERROR_EVENT = sse_data({"error": {"message": INTERNAL_ERROR}})


# ---- source goldens ---------------------------------------------------------------------------
def read_source(path: Path) -> tuple[list[dict[str, Any]], bool, dict[str, Any] | None]:
    """SGLang's events, whether [DONE] ended them, and SGLang's own error event if any.

    Each payload must be exactly what serde_json would write for the same object (SGLang's orjson
    and serde_json agree on this data), else the transformation below would not be byte-faithful."""
    events: list[dict[str, Any]] = []
    done, error = False, None
    for block in path.read_bytes().split(b"\n\n"):
        if not block:
            continue
        assert block.startswith(b"data: ") and b"\n" not in block, (path, block[:80])
        payload = block[len(b"data: ") :]
        if payload == b"[DONE]":
            done = True
            continue
        obj = json.loads(payload)
        if serde_json_dumps(obj).encode("utf-8") != payload:
            raise SystemExit(f"{path}: serde_json would write this event differently:\n{payload[:300]!r}")
        if "error" in obj:
            error = obj
        else:
            events.append(obj)
    return events, done, error


def with_public_id(event: dict[str, Any], engine_rid: str, public_rid: str) -> dict[str, Any]:
    """decode_handler._process_native_generate_stream: ``{**meta_info, "id": public}`` only when the
    engine id is Dynamo's submitted id; dict-merge keeps every key's position."""
    meta = event.get("meta_info")
    if not isinstance(meta, dict) or meta.get("id") != engine_rid:
        return event
    return {**event, "meta_info": {**meta, "id": public_rid}}


# ---- scenarios --------------------------------------------------------------------------------
@dataclass(frozen=True)
class DynScenario:
    name: str
    source: str  # incremental SGLang golden it transforms
    end: str  # ok | error_event | killed | stopped
    description: str
    keep: int | None = None  # events kept before the end (killed / stopped / error); None = all
    rid: str | None = None  # body rid; None: header_rid or a generated UUID
    header_rid: str | None = None  # x-request-id header
    keep_alive: tuple[int, ...] = ()  # a ":\n\n" comment before each of these event indices


SCENARIOS = [
    DynScenario(
        "dyn_i1_text", "inc_i1_text", "ok", "text + logprobs, every step; meta_info.id = body rid", rid="dyn-i1-text"
    ),
    DynScenario(
        "dyn_skip_tokenizer",
        "inc_skip_tokenizer",
        "ok",
        "worker under --skip-tokenizer-init (no text key); no body rid: id = x-request-id header",
        header_rid="dyn-header-rid",
    ),
    DynScenario("dyn_no_logprob", "inc_no_logprob", "ok", "return_logprob false", rid="dyn-no-logprob"),
    DynScenario(
        "dyn_experts", "inc_experts", "ok", "routed experts (base64, terminal event only) + logprobs", rid="dyn-experts"
    ),
    DynScenario(
        "dyn_experts_skip_tokenizer",
        "inc_experts_skip_tokenizer",
        "ok",
        "routed experts encoded by the tokenizer manager under --skip-tokenizer-init",
        rid="dyn-experts-skip",
    ),
    DynScenario(
        "dyn_keepalive",
        "inc_i1_text",
        "ok",
        "DYN_HTTP_SSE_KEEP_ALIVE_INTERVAL_MS set: ':' comments while idle (before the first event, mid-stream)",
        rid="dyn-keepalive",
        keep_alive=(0, 5, 6),
    ),
    DynScenario(
        "dyn_error",
        "inc_error",
        "error_event",
        "backend error after 3 events: Dynamo's sanitized error event + [DONE] (SGLang's own message is not sent)",
        rid="dyn-error",
    ),
    DynScenario(
        "dyn_error_first",
        "inc_error",
        "error_event",
        "backend error before any event: HTTP 200, then the error event + [DONE]",
        keep=0,
        rid="dyn-error-first",
    ),
    DynScenario(
        "dyn_killed",
        "inc_i1_text",
        "killed",
        "engine context killed (backend inactivity timeout / client gone) after 5 events: no [DONE]",
        keep=5,
        rid="dyn-killed",
    ),
    DynScenario(
        "dyn_stopped",
        "inc_experts",
        "stopped",
        "graceful stop_generating after 6 events: later SGLang output (finish reason, routed experts) "
        "dropped, then [DONE]",
        keep=6,
        rid="dyn-stopped",
    ),
]


def build(sc: DynScenario, src_dir: Path, src_manifest: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    entry = src_manifest["scenarios"][sc.source]
    assert entry["server"]["incremental_streaming_output"], f"{sc.source} is not incremental"
    events, done, sglang_error = read_source(src_dir / entry["file"])
    engine_rid = entry["request"]["rid"]  # what SGLang stamped (Dynamo 1.6: its internal uuid4().hex)
    public_rid = sc.rid or sc.header_rid
    assert public_rid, "a deterministic public id needs a body rid or an x-request-id header"

    keep = len(events) if sc.keep is None else sc.keep
    assert keep <= len(events)
    if sc.end == "ok":
        assert done and sglang_error is None and keep == len(events), f"{sc.source} did not end normally"
    if sc.end == "error_event" and sc.keep is None:
        assert sglang_error is not None, f"{sc.source} has no error event"
    kept = [with_public_id(e, engine_rid, public_rid) for e in events[:keep]]
    if sc.end == "stopped":
        assert all(e["meta_info"].get("finish_reason") is None for e in kept), "stop must precede the finish"

    body = bytearray()
    for index, event in enumerate(kept):
        body += KEEP_ALIVE * sc.keep_alive.count(index)
        body += sse_data(event)
    if sc.end in ("ok", "stopped"):
        body += DONE
    elif sc.end == "error_event":
        body += ERROR_EVENT + DONE
    else:
        assert sc.end == "killed"

    src_expect = entry["expect"]
    prefix_tokens = sum(len(e["output_ids"]) for e in kept)
    if sc.end == "ok":
        expect = dict(src_expect)
    elif sc.end == "error_event":
        expect = {"outcome": "server_error", "status": None, "message": INTERNAL_ERROR, "prefix_tokens": prefix_tokens}
    elif sc.end == "killed":
        expect = {"outcome": "truncated", "prefix_tokens": prefix_tokens}
    else:
        # [DONE] after events without a finish reason: the stream is incomplete, as a killed one is;
        # `end` below tells the two apart.
        expect = {"outcome": "truncated", "prefix_tokens": prefix_tokens}

    request = dict(entry["request"])
    request.pop("rid", None)
    if sc.rid is not None:
        request = {"rid": sc.rid, **request}
    headers = {"content-type": "application/json"}
    if sc.header_rid is not None:
        headers["x-request-id"] = sc.header_rid
    env = {"DYN_SGLANG_ENABLE_GENERATE": "1"}
    if sc.keep_alive:
        env["DYN_HTTP_SSE_KEEP_ALIVE_INTERVAL_MS"] = "1000"

    manifest_entry = {
        "description": sc.description,
        "request": request,
        "headers": headers,
        "server": {**entry["server"], "dynamo_env": env},
        "source": entry["source"],
        "scheduler": entry["scheduler"],
        "expect": expect,
        "end": {
            "kind": sc.end,
            "done": sc.end != "killed",
            "error_message": INTERNAL_ERROR if sc.end == "error_event" else None,
            "finish_reason_sent": sc.end == "ok",
            "events": len(kept),
            "keep_alive_comments": len(sc.keep_alive),
            "public_rid": public_rid,
            "engine_rid": engine_rid,
        },
        "derived_from": f"{SGLANG_SOURCE}/{entry['file']}",
        "emulator_comparable": False,
        "file": f"{sc.name}.sse",
        "bytes": len(body),
    }
    return bytes(body), manifest_entry


def generate(golden: Path) -> dict[str, bytes]:
    src_dir = golden / SGLANG_SOURCE
    src_manifest = json.loads((src_dir / "manifest.json").read_text())
    files: dict[str, bytes] = {}
    scenarios: dict[str, Any] = {}
    for sc in SCENARIOS:
        body, entry = build(sc, src_dir, src_manifest)
        files[entry["file"]] = body
        scenarios[sc.name] = entry
    manifest = {
        # tests/test_golden.py reads goldens from tests/golden/<this value>/: the directory name.
        "sglang_version": f"dynamo-{DYNAMO_VERSION}",
        "dynamo_version": DYNAMO_VERSION,
        "sglang_source_version": SGLANG_SOURCE,
        "generator": "tools/sglang_ref/dynamo_goldens.py",
        "token_source": src_manifest["token_source"],
        "transformation": (
            "SGLang's incremental events, meta_info.id -> public request id (key order kept), "
            "serde_json compact + axum SSE 'data: ' framing; ends: [DONE] | error event "
            '{"error":{"message":"Internal server error"}} + [DONE] | killed: no [DONE] | '
            "stopped: [DONE] without a finish reason; keep-alive ':\\n\\n'"
        ),
        "scenarios": scenarios,
    }
    files["manifest.json"] = (json.dumps(manifest, indent=1, ensure_ascii=False) + "\n").encode("utf-8")
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[2] / "tests" / "golden")
    parser.add_argument("--check", action="store_true", help="compare with the committed files, write nothing")
    args = parser.parse_args(argv)
    files = generate(args.out)
    target = args.out / f"dynamo-{DYNAMO_VERSION}"
    if args.check:
        present = {p.name for p in target.iterdir()} if target.is_dir() else set()
        changed = sorted(n for n, b in files.items() if not (target / n).is_file() or (target / n).read_bytes() != b)
        extra = sorted(present - set(files))
        if changed or extra:
            print(f"differs: {changed}; not generated: {extra}", file=sys.stderr)
            return 1
        print(f"{target}: {len(files)} files identical")
        return 0
    target.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (target / name).write_bytes(data)
    print(f"wrote {len(files)} files to {target}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
