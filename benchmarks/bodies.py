"""A non-streaming answer read by ``fastaccum.parse_response`` against the two ways frameworks read
it today.

SGLang's ``/generate`` answer for 1k, 8k and 32k tokens after a 1,000-token prompt, with and
without routed experts of 48 layers x top-8 (the 32k one with them is a 71 MB body, 66 MB of it
base64). Each variant runs in a fresh process, the body read from a file first and handed over in
256 KiB pieces as a transport reads it:

- ``json``: ``json.loads`` of the whole body, ``pybase64.b64decode`` of the routed experts,
  ``np.frombuffer``, ids and log-probs as lists (AReaL's and Miles' path; ``json-base64`` with the
  standard library's ``base64``);
- ``cut``: the base64 value cut out of the body's bytes, ``json.loads`` of the rest, then
  ``pybase64`` (prime-rl's path);
- ``_cy`` / ``_py``: ``fastaccum.parse_response`` on the compiled or the pure twin.

Per variant: the best of ``--repeat`` processes' CPU per read (user and system apart,
``getrusage`` over several reads, since some kernels count it in scheduler ticks), and the peak
RSS growth during a process's first read (VmHWM reset through /proc/self/clear_refs) as a
multiple of the arrays it produced. Goal: at 32k tokens with routed experts, the compiled twin at most 0.1x the
``json`` path's CPU with a peak at most 1.1x the arrays.

    python -P benchmarks/bodies.py [--repeat 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
import gc
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from typing import Any

import numpy as np
import pybase64

PROMPT = 1000
SHAPE = (48, 8)
SIZES = (1000, 8000, 32000)
VARIANTS = ("json", "json-base64", "cut", "_cy", "_py")
PIECE = 262144
LOOPS = {1000: 60, 8000: 12, 32000: 4}  # reads timed per process (about 0.1 s of the json path)


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def _framework(body: bytes, decode: Any) -> tuple[Any, ...]:
    obj = json.loads(body)
    meta = obj["meta_info"]
    ids = [item[1] for item in meta["output_token_logprobs"]]
    logprobs = [item[0] for item in meta["output_token_logprobs"]]
    raw = meta.get("routed_experts")
    routed = None if raw is None else np.frombuffer(decode(raw), dtype=np.int32).reshape(-1, *SHAPE)
    return ids, logprobs, routed


def _cut(body: bytes) -> tuple[Any, ...]:
    key = b'"routed_experts":"'
    at = body.find(key)
    if at < 0:
        return _framework(body, pybase64.b64decode)
    start = at + len(key)
    end = body.index(b'"', start)
    encoded = body[start:end]
    obj = json.loads(body[:start] + body[end:])  # the value emptied: "routed_experts":""
    meta = obj["meta_info"]
    ids = [item[1] for item in meta["output_token_logprobs"]]
    logprobs = [item[0] for item in meta["output_token_logprobs"]]
    routed = np.frombuffer(pybase64.b64decode(encoded), dtype=np.int32).reshape(-1, *SHAPE)
    return ids, logprobs, routed


def measure(variant: str, path: str, experts: bool, loops: int) -> dict[str, Any]:
    with open(path, "rb") as f:
        body = f.read()
    pieces = [body[i : i + PIECE] for i in range(0, len(body), PIECE)]
    twin = importlib.import_module(f"fastaccum.{variant}") if variant.startswith("_") else None
    if twin is not None:
        import fastaccum.transport.body as reader

        reader.StreamAccumulator = twin.StreamAccumulator  # type: ignore[misc]

    def read() -> list[Any]:
        if twin is not None:
            result = reader.parse_response(pieces, expert_shape=SHAPE if experts else None)
            return [result.token_ids, result.logprobs, result.routed_experts]
        whole = b"".join(pieces)  # a framework reads the whole body first
        if variant == "cut":
            ids, logprobs, routed = _cut(whole)
        else:
            decode = pybase64.b64decode if variant == "json" else base64.b64decode
            ids, logprobs, routed = _framework(whole, decode)
        return [np.asarray(ids, dtype=np.int32), np.asarray(logprobs), routed]

    gc.collect()
    gc.freeze()  # what was alive before does not slow the collector during the timed reads
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak (VmHWM) starts again at the current RSS
    base = _status("VmRSS")
    arrays = read()
    peak = _status("VmHWM") - base
    nbytes = sum(a.nbytes for a in arrays if a is not None)
    del arrays
    # CPU over several reads: getrusage counts in scheduler ticks on some kernels.
    before = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(loops):
        read()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "user_s": (after.ru_utime - before.ru_utime) / loops,
        "system_s": (after.ru_stime - before.ru_stime) / loops,
        "arrays_bytes": nbytes,
        "peak_over_arrays": peak / nbytes,
        "body_bytes": len(body),
    }


def _body(n: int, experts: bool) -> bytes:
    import orjson

    from fastaccum.emulator.writer import WireOptions, normal_event, synthetic_generation

    gen = synthetic_generation("body", n, prompt_tokens=PROMPT, expert_shape=SHAPE if experts else None)
    gen = gen.__class__(**{**gen.__dict__, "finish_reason": {"type": "length", "length": n}})
    event = normal_event(gen, WireOptions(), 0, n, terminal=True, finish_reason=gen.finish_reason, first=True)
    return orjson.dumps(event)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--measure", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        variant, path, experts, loops = args.measure
        print(json.dumps(measure(variant, path, experts == "1", int(loops))))
        return
    report: dict[str, Any] = {}
    print("| tokens | routed experts | body | variant | user + system ms | × json | peak / arrays |")
    print("|---|---|---|---|---|---|---|")
    for n in SIZES:
        for experts in (False, True):
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                f.write(_body(n, experts))
            best: dict[str, dict[str, Any]] = {}
            try:
                for _ in range(args.repeat):  # interleaved: noise spreads over every variant
                    for variant in VARIANTS:
                        loops = str(LOOPS[n])
                        command = [
                            sys.executable,
                            "-P",
                            __file__,
                            "--measure",
                            variant,
                            f.name,
                            str(int(experts)),
                            loops,
                        ]
                        out = subprocess.run(command, capture_output=True, text=True)
                        if out.returncode:
                            raise RuntimeError(out.stderr[-2000:])
                        run = json.loads(out.stdout)
                        cpu = run["user_s"] + run["system_s"]
                        if variant not in best or cpu < best[variant]["user_s"] + best[variant]["system_s"]:
                            best[variant] = run
            finally:
                os.unlink(f.name)
            key = f"{n}-{'experts' if experts else 'plain'}"
            report[key] = best
            base = best["json"]["user_s"] + best["json"]["system_s"]
            for variant in VARIANTS:
                r = best[variant]
                cpu = r["user_s"] + r["system_s"]
                print(
                    f"| {n:,} | {'48 x 8' if experts else 'none'} | {r['body_bytes'] / 1e6:.1f} MB | {variant} | "
                    f"{r['user_s'] * 1e3:.1f} + {r['system_s'] * 1e3:.1f} | {cpu / base:.3f} | "
                    f"{r['peak_over_arrays']:.2f} |"
                )
    if args.json:
        with open(args.json, "w") as out_file:
            json.dump(report, out_file, indent=2)


if __name__ == "__main__":
    main()
