"""A rollout abort through ``fastaccum.Client``: drain against cut, on emulators in their own processes.

N streams with routed experts decode at ``--token-rate`` tokens/s each on ``--workers`` emulators
(behind the router given by ``--router``, else one emulator addressed directly). When every
stream holds at least ``--min-tokens`` tokens, all are aborted at once, as a rollout abort does.
Per abort mode it reports:

- replay kept: the share of streams whose result holds the terminal event, the share with routed
  experts, and of those, the share with ``prompt + kept - 1`` rows equal to the emulator's truth
  (sglang-router 0.3.2 drops ``return_routed_experts`` from the request: none come through it);
- abort to return: p50/p99/max seconds from ``abort()`` to ``run()`` returning, beside one decode
  step (1 / token rate) and a round trip (a ``GET /health``) measured in the same run;
- abort requests sent, and whether every worker is idle when the abort returns.

    python benchmarks/abort_drain.py --streams 512 --token-rate 50
    python benchmarks/abort_drain.py --streams 512 --router sglang   # the PyPI router, two workers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import fastaccum
from fastaccum.emulator import Emulator

PROMPT = [101, 102, 103, 104]
EXPERT_SHAPE = (4, 2)


def serve(token_rate: float, seed: int) -> None:
    """One emulator until stdin closes; prints its URL."""

    async def main() -> None:
        emulator = Emulator(
            enable_return_routed_experts=True, token_rate=token_rate, port=0, seed=seed, max_running_requests=4096
        )
        url = await emulator.start()
        print(url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await emulator.stop()

    asyncio.run(main())


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q)) if values else float("nan")


async def _round_trip(url: str) -> float:
    """The best of 20 GET /health exchanges on one connection."""
    reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
    best = float("inf")
    for _ in range(20):
        started = time.perf_counter()
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"\r\n\r\n")
        best = min(best, time.perf_counter() - started)
    writer.close()
    return best


async def _busy(workers: list[str]) -> int:
    busy = 0
    for url in workers:
        reader, writer = await asyncio.open_connection(*url.removeprefix("http://").split(":"))
        writer.write(b"GET /v1/loads HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = await reader.read()
        writer.close()
        loads = json.loads(data.partition(b"\r\n\r\n")[2])
        busy += loads["num_running_reqs"] + loads["num_waiting_reqs"]
    return busy


async def run_round(
    url: str, workers: list[str], streams: int, min_tokens: int, drain: float | None, truth: Emulator
) -> dict[str, Any]:
    async with fastaccum.Client(url, abort_drain_s=drain) as client:
        body = {
            "input_ids": PROMPT,
            "sampling_params": {"max_new_tokens": 5000},  # the emulator builds the whole generation up front
            "return_logprob": True,
            "return_routed_experts": True,
        }
        tag = "c" if drain is None else "d"
        live = [client.stream({**body, "rid": f"{tag}{i:06d}"}, expert_shape=EXPERT_SHAPE) for i in range(streams)]
        tasks = [asyncio.ensure_future(s.run()) for s in live]
        deadline = time.monotonic() + 60
        while any(s.tokens < min_tokens for s in live):
            if time.monotonic() > deadline:
                raise RuntimeError("streams did not reach --min-tokens within 60 s")
            await asyncio.sleep(0.01)
        returned: list[float] = []
        started = time.perf_counter()
        for task in tasks:
            task.add_done_callback(lambda _t: returned.append(time.perf_counter() - started))
        for stream in live:
            stream.abort()
        results = await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        sent = client._aborts_for("sglang").sent
    complete = [r for r in results if r.replay_complete]
    rows_ok = present = 0
    for stream, result in zip(live, results):
        if not result.replay_complete or result.routed_experts is None:
            continue
        present += 1
        gen = truth.expected(stream.rid, len(result), prompt_tokens=len(PROMPT), routed_experts=True)
        if result.routed_experts.shape[0] == len(PROMPT) + len(result) - 1 and np.array_equal(
            result.routed_experts, gen.routed_experts
        ):
            rows_ok += 1
    idle_wait = time.perf_counter()
    while await _busy(workers):
        if time.perf_counter() - idle_wait > 30:
            break
        await asyncio.sleep(0.01)
    return {
        "drain_s": drain,
        "streams": streams,
        "replay_complete": len(complete) / streams,
        "routed_experts_present": present / streams,
        "routed_rows_equal_truth": rows_ok / max(1, present),
        "return_p50_s": _quantile(returned, 0.5),
        "return_p99_s": _quantile(returned, 0.99),
        "return_max_s": max(returned),
        "all_returned_s": elapsed,
        "abort_requests": sent,
        "idle_after_s": time.perf_counter() - idle_wait,
        "busy_after": await _busy(workers),
    }


def _start_workers(n: int, token_rate: float) -> tuple[list[subprocess.Popen[str]], list[str]]:
    procs, urls = [], []
    for _ in range(n):
        proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(token_rate)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        procs.append(proc)
        urls.append(proc.stdout.readline().strip())
    return procs, urls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--token-rate", type=float, default=50.0, help="tokens/s per stream (default: 50)")
    parser.add_argument("--min-tokens", type=int, default=10)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--router", choices=("none", "sglang"), default="none")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--serve", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        serve(args.serve, 0)
        return
    workers = args.workers if args.router == "none" else max(2, args.workers)
    procs, urls = _start_workers(workers, args.token_rate)
    router = None
    try:
        url = urls[0]
        if args.router == "sglang":
            sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
            from router_helpers import start_router

            router, url = start_router(urls)
        truth = Emulator(enable_return_routed_experts=True, seed=0)
        report: dict[str, Any] = {"url": url, "workers": urls, "token_rate": args.token_rate}
        report["decode_step_s"] = 1.0 / args.token_rate
        report["round_trip_s"] = asyncio.run(_round_trip(urls[0]))
        report["rounds"] = [
            asyncio.run(run_round(url, urls, args.streams, args.min_tokens, drain, truth)) for drain in (2.0, None)
        ]
    finally:
        if router is not None:
            router.terminate()
            router.wait(30)
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(30)
    for r in report["rounds"]:
        mode = "cut" if r["drain_s"] is None else f"drain {r['drain_s']} s"
        print(
            f"{mode:>12}: replay complete {r['replay_complete']:.0%}, "
            f"routed experts in {r['routed_experts_present']:.0%}"
            f" (rows = truth in {r['routed_rows_equal_truth']:.0%}), "
            f"abort->return p50 {r['return_p50_s'] * 1e3:.1f} ms p99 {r['return_p99_s'] * 1e3:.1f} ms "
            f"max {r['return_max_s'] * 1e3:.1f} ms; {r['abort_requests']} abort requests; "
            f"busy after {r['busy_after']} (idle in {r['idle_after_s'] * 1e3:.0f} ms)"
        )
    print(f"decode step {report['decode_step_s'] * 1e3:.1f} ms, round trip {report['round_trip_s'] * 1e3:.2f} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
