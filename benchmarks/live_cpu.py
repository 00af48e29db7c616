"""Client CPU per token against live engines: real SGLang 0.5.23 and vLLM 0.32 on the CPU.

    python benchmarks/live_cpu.py                          # both engines, 1, 4 and 16 streams
    python benchmarks/live_cpu.py --engines vllm --streams 16 --tokens 512 --repeat 3

Each engine runs alone, pinned to one core (tools/live/engines.py; SGLang with
--incremental-streaming-output, as RL rollouts run it); each client runs in a fresh process on the
other and reports its CPU from getrusage, user and system apart, per token received. The clients
take turns ``--repeat`` times against one server; the best run of each counts (noise only adds).
The baseline is measured in the same run: an httpx ``aiter_lines`` reader with ``json.loads`` per
event (benchmarks/paced.py, ``httpx-lines``). A live engine decodes at its own pace (about 150
tokens/s for one stream here), so these are the costs at a real decode rate, not a throughput test.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tools" / "live"))
import engines  # noqa: E402
import paced  # noqa: E402

PATHS = {"sglang": "/generate", "vllm": "/inference/v1/generate"}
CLIENTS = ("httpx-lines", "client")


def payloads(engine: str, streams: int, tokens: int) -> list[dict[str, Any]]:
    """Greedy requests that run their whole length (ignore_eos: the tiny model may end early)."""
    out: list[dict[str, Any]] = []
    # Fresh ids every run: SGLang aborts a streamed rid two seconds after its response ended if the
    # rid is live again by then (docs/live.md), so the next run must not reuse it.
    run = uuid.uuid4().hex[:8]
    for i in range(streams):
        prompt = [11 + i, 12 + i, 13 + i, 14 + i, 15 + i, 16 + i, 17 + i, 18 + i]
        if engine == "vllm":
            params = {"max_tokens": tokens, "temperature": 0, "logprobs": 1, "ignore_eos": True}
            out.append(
                {
                    "model": engines.MODEL_NAME,
                    "token_ids": prompt,
                    "request_id": f"cpu-{run}-{i}",
                    "sampling_params": params,
                }
            )
        else:
            params = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
            out.append(
                {"input_ids": prompt, "rid": f"cpu-{run}-{i}", "return_logprob": True, "sampling_params": params}
            )
    return out


def client_child(kind: str, engine: str, url: str, streams: int, tokens: int) -> dict[str, Any]:
    bodies = payloads(engine, streams, tokens)
    if kind == "httpx-lines":
        importlib.import_module("httpx")
        coro = paced._httpx(url, bodies, PATHS[engine])
    else:
        for module in ("fastaccum", "fastaccum.transport.client"):
            importlib.import_module(module)
        coro = paced._client(url, bodies, dialect="vllm" if engine == "vllm" else "sglang")
    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    counts, _ = asyncio.run(coro)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall
    if counts != [tokens] * streams:
        raise AssertionError(f"{kind}: token counts {counts} differ from {tokens}")
    n = streams * tokens
    return {
        "user_us_per_token": (after.ru_utime - before.ru_utime) / n * 1e6,
        "sys_us_per_token": (after.ru_stime - before.ru_stime) / n * 1e6,
        "wall_s": wall,
        "tokens_per_s": n / wall,
    }


def measure(engine: str, stream_counts: list[int], tokens: int, repeat: int) -> dict[str, Any]:
    report: dict[str, Any] = {}
    with engines.Server(engine, incremental=engine == "sglang") as server:
        report["server_start_s"] = server.start_s
        # The first requests after a start are slow (vLLM: ~2.5 s); none of them is measured.
        for kind in CLIENTS:
            command = [sys.executable, "-P", __file__, "--client", kind, engine, server.url, "1", "16"]
            subprocess.run(command, capture_output=True, check=True)
        for streams in stream_counts:
            runs: dict[str, list[dict[str, Any]]] = {c: [] for c in CLIENTS}
            for _ in range(repeat):
                for kind in CLIENTS:
                    command = [
                        sys.executable,
                        "-P",
                        __file__,
                        "--client",
                        kind,
                        engine,
                        server.url,
                        str(streams),
                        str(tokens),
                    ]
                    done = subprocess.run(command, capture_output=True, text=True, check=False)
                    if done.returncode:
                        raise RuntimeError(f"{kind}: {done.stderr.strip()[-2000:]}")
                    runs[kind].append(json.loads(done.stdout.strip().splitlines()[-1]))
            row: dict[str, Any] = {}
            for kind, rs in runs.items():
                best = min(rs, key=lambda r: r["user_us_per_token"] + r["sys_us_per_token"])
                row[kind] = {
                    **best,
                    "total_us_per_token": best["user_us_per_token"] + best["sys_us_per_token"],
                    "runs": rs,
                }
            base = row["httpx-lines"]["total_us_per_token"]
            row["client"]["total_over_httpx"] = row["client"]["total_us_per_token"] / base
            report[f"{streams} streams"] = row
    return report


def table(report: dict[str, Any]) -> str:
    lines = [
        "| engine | streams | client | user µs/tok | sys µs/tok | total | ×httpx | tokens/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for engine, rows in report.items():
        for key, row in rows.items():
            if not key.endswith("streams"):
                continue
            for kind in CLIENTS:
                m = row[kind]
                ratio = f"{m['total_over_httpx']:.3f}" if "total_over_httpx" in m else "1"
                user, system = m["user_us_per_token"], m["sys_us_per_token"]
                lines.append(
                    f"| {engine} | {key.split()[0]} | {kind} | {user:.1f} | {system:.1f} "
                    f"| {m['total_us_per_token']:.1f} | {ratio} | {m['tokens_per_s']:.0f} |"
                )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="sglang,vllm")
    parser.add_argument("--streams", default="1,4,16")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default=str(HERE / "results" / "live_cpu.json"))
    parser.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        kind, engine, url, streams, tokens = args.client
        print(json.dumps(client_child(kind, engine, url, int(streams), int(tokens))))
        return 0
    counts = [int(n) for n in args.streams.split(",")]
    report = {engine: measure(engine, counts, args.tokens, args.repeat) for engine in args.engines.split(",")}
    print(table(report))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {"machine": {"cpus": os.cpu_count(), "python": sys.version}, "tokens": args.tokens, "engines": report},
            f,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
