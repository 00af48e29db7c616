"""Each dialect's stream against the orjson floor of the same events, and vLLM's ``.npy`` routed
experts line against the array it holds (docs/dialects.md).

``python benchmarks/dialects.py``: for SGLang (incremental, the reference), Dynamo (SGLang's
incremental events) and vLLM (0.32 and 0.31 shapes), a 500k-token stream with logprobs at stream
interval 1 and 20, fed in 64 KiB pieces: each twin's best time over the orjson floor's (orjson.loads
of every data line, nothing else) timed in the same run. Then, in fresh processes, the peak RSS
growth of each twin reading one vLLM finishing chunk whose routed experts are a large ``.npy``,
over the array's bytes. Targets: compiled / floor ≤ 0.5 per dialect; memory ≤ 1.2× the array.
Nothing here asserts a time; ``--json`` writes the table.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_core import PIECE_BYTES, _proc_status_kib, _reset_hwm, orjson_floor, read_pieces, time_runs  # noqa: E402

from fastaccum.emulator import writer, writer_vllm  # noqa: E402

TWINS = {"compiled": "fastaccum._cy", "pure": "fastaccum._py"}
STREAMS = ("sglang", "dynamo", "vllm-0.32", "vllm-0.31")
TARGET, MEMORY_TARGET = 0.5, 1.2


def stream_body(name: str, tokens: int, interval: int) -> bytes:
    gen = writer.synthetic_generation("bench", tokens, prompt_tokens=1024)
    if name.startswith("vllm"):
        shape = name.split("-")[1]
        return writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, shape=shape, interval=interval))
    opts = writer.WireOptions(incremental=True, skip_tokenizer_init=True)
    return writer.stream_bytes(writer.stream_events(gen, opts, interval=interval))


def dialect_of(name: str) -> str:
    return name.split("-")[0]


def twin_fn(twin: str, dialect: str) -> Callable[[Sequence[bytes]], Any]:
    accumulator = importlib.import_module(TWINS[twin]).StreamAccumulator

    def run(pieces: Sequence[bytes]) -> Any:
        acc = accumulator(dialect=dialect)
        for piece in pieces:
            acc.feed(piece)
        return acc.finish()

    return run


def time_table(tokens: int, intervals: Sequence[int], rounds: int, twins: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for interval in intervals:
        for name in STREAMS:
            pieces = writer.split_pieces(stream_body(name, tokens, interval), [PIECE_BYTES])
            floor, events = time_runs(lambda pieces=pieces: orjson_floor(pieces), rounds)
            row: dict[str, Any] = {"stream": name, "interval": interval, "events": events, "floor_s": floor}
            for twin in twins:
                fn = twin_fn(twin, dialect_of(name))
                seconds, result = time_runs(lambda fn=fn, pieces=pieces: fn(pieces), rounds)
                assert len(result) == tokens, (name, twin, len(result))
                row[f"{twin}_s"] = seconds
                row[f"{twin}_over_floor"] = seconds / floor
            rows.append(row)
            print(
                f"{name:10} interval {interval:2}: floor {floor * 1e3:7.1f} ms  "
                + "  ".join(f"{t} {row[f'{t}_s'] * 1e3:7.1f} ms ({row[f'{t}_over_floor']:.3f}x)" for t in twins),
                flush=True,
            )
    return rows


def npy_line(rows: int, layers: int, topk: int, experts: int) -> tuple[bytes, int]:
    """A vLLM stream whose finishing chunk holds a rows x layers x topk routed-experts .npy."""
    gen = writer.synthetic_generation(
        "mem", 4, prompt_tokens=rows - 3, expert_shape=(layers, topk), num_experts=experts
    )
    body = writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, routed=True))
    dtype = np.uint8 if experts <= 256 else np.uint16
    return body, rows * layers * topk * np.dtype(dtype).itemsize


def memory_child(twin: str, path: str) -> dict[str, Any]:
    fn = twin_fn(twin, "vllm")
    pieces = read_pieces(path)
    gc.collect()
    _reset_hwm()
    before = _proc_status_kib()
    start = time.perf_counter()
    result = fn(pieces)
    seconds = time.perf_counter() - start
    after = _proc_status_kib()
    return {
        "twin": twin,
        "seconds": seconds,
        "rss_growth_bytes": (after["VmHWM"] - before["VmRSS"]) * 1024,
        "array_bytes": int(result.routed_experts.nbytes),
        "dtype": str(result.routed_experts.dtype),
    }


def memory_table(shapes: Sequence[tuple[int, int, int, int]], twins: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for rows_, layers, topk, experts in shapes:
        body, array_bytes = npy_line(rows_, layers, topk, experts)
        with tempfile.NamedTemporaryFile(prefix="fastaccum-npy-", suffix=".sse") as f:
            f.write(body)
            f.flush()
            del body
            for twin in twins:
                cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", twin, f.name]
                proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
                entry = json.loads(proc.stdout.strip().splitlines()[-1])
                entry["shape"] = [rows_, layers, topk]
                entry["growth_over_array"] = entry["rss_growth_bytes"] / array_bytes
                rows.append(entry)
                print(
                    f"npy {rows_}x{layers}x{topk} {entry['dtype']:6} ({array_bytes / 2**20:6.1f} MiB) {twin:8}: "
                    f"peak RSS growth {entry['growth_over_array']:.2f}x the array, {entry['seconds'] * 1e3:.0f} ms",
                    flush=True,
                )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=500_000)
    parser.add_argument("--intervals", default="1,20")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--twins", default="compiled,pure")
    parser.add_argument("--no-memory", action="store_true")
    parser.add_argument("--json", help="write the tables here")
    parser.add_argument("--memory-child", nargs=2, metavar=("TWIN", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(*args.memory_child)))
        return 0
    twins = args.twins.split(",")
    report: dict[str, Any] = {
        "time": time_table(args.tokens, [int(i) for i in args.intervals.split(",")], args.rounds, twins)
    }
    if not args.no_memory:
        # 64k and 256k-token contexts of a 48-layer top-8 model: 128 experts (uint8), 512 (uint16)
        report["memory"] = memory_table([(65_536, 48, 8, 128), (262_144, 48, 8, 128), (65_536, 48, 8, 512)], twins)
    worst = max(row["compiled_over_floor"] for row in report["time"]) if "compiled" in twins else None
    if worst is not None:
        print(f"compiled / floor, worst stream: {worst:.3f} (target <= {TARGET})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
