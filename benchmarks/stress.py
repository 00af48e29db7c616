"""Stress runs: long streams, scaling, routed-experts memory, 256 concurrent streams.

    python benchmarks/stress.py                      # everything, ~11 min on 2 cores
    python benchmarks/stress.py --only scaling,experts --out /tmp/s.json
    python benchmarks/stress.py --quick              # small sizes: checks the script in ~1 min

Sections (``--only``):

- ``w1``: the 500,000-token incremental stream W1 through the client (``GenerateStream`` on aiohttp)
  and through an httpx ``aiter_lines`` + ``json.loads`` client, against the emulator over loopback.
  W1 through the core alone is the 500k point of the incremental scaling study.
- ``scaling``: cumulative 1k -> 32k tokens (W2's shape) and incremental 10k -> 500k (W1's shape),
  every consumer of bench_core plus ``rebuild``: the naive consumer that, like slime's streaming
  example, rebuilds the sample's token and logprob lists on every event.
- ``experts``: routed experts 48 x top-8 at 16k/64k/256k context (W3's shape), time and peak memory
  (RSS high-water mark and tracemalloc) of each consumer, each in a fresh interpreter.
- ``paced``: ``paced.py``: a paced server process writing one HTTP chunk per event at 100 tokens/s
  per stream; CPU per token (user and system) and reads per token of each client, fastaccum.Client
  among them, on the stock loop and uvloop.
- ``concurrency``: 256 concurrent streams from an emulator running in its own process; each client
  runs in a fresh process too and reports its CPU seconds (getrusage) per token.

Results (with machine info) go to ``--out`` (default benchmarks/results/stress.json); ``plot.py``
draws them. Every output is checked against the generation, outside the timed regions.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_core as core  # noqa: E402
import paced  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "results", "stress.json")
CUMULATIVE_SIZES = (1_000, 2_000, 4_000, 8_000, 16_000, 32_000)
INCREMENTAL_SIZES = (10_000, 20_000, 50_000, 100_000, 200_000, 500_000)
# (prompt, completion): context 16k/64k/256k, prompt 1/32 of it; 64k has W3's shape.
EXPERT_CONTEXTS = ((500, 15_500), (2_000, 62_000), (8_000, 248_000))
SCALING_CONSUMERS = ("compiled", "pure", "naive", "floor", "rebuild")
MEMORY_CONSUMERS = ("compiled", "pure", "naive", "floor")
# aiohttp-raw reads the same bytes with aiohttp and drops them: the transport's share of the CPU.
CLIENTS = ("fastaccum", "httpx-lines", "aiohttp-raw")
# (name, streams, tokens per stream, stream interval): interval 20 is W1's shape; interval 1 is
# SGLang's default and maximizes per-event costs.
CONCURRENCY = (("256x2000-i20", 256, 2_000, 20), ("256x500-i1", 256, 500, 1))
PROMPT = list(range(1, 17))  # 16 prompt ids for the network runs


# ---- the slime-example consumer ------------------------------------------------------------------


def rebuild_consume(pieces: Iterable[bytes], *, mode: str, prompt_tokens: int = 1024) -> core.NaiveResult:
    """The naive consumer plus slime's per-event sample rebuild (sglang_streaming_rollout.py):
    every event rebuilds ``tokens = prompt + call_tokens`` and copies the logprob list, so the
    partial sample is always current. Parsing is as in ``core.naive_consume``; the rebuild is
    O(tokens so far) per event, O(N^2 / interval) per stream. The ``append_response_tokens``
    validation slime also runs per event is not modeled (it would only add to the cost)."""
    base = list(range(prompt_tokens))
    call_ids: list[int] = []
    call_lps: list[float] = []
    texts: list[str] = []
    text = ""
    sample_tokens: list[int] = []
    sample_lps: list[float] = []
    events = 0
    for event in core.naive_events(pieces):
        events += 1
        triples = event["meta_info"]["output_token_logprobs"]
        if mode == "incremental":
            call_ids.extend(t[1] for t in triples)
            call_lps.extend(float("nan") if t[0] is None else t[0] for t in triples)
            texts.append(event.get("text", ""))
        else:
            call_ids = [t[1] for t in triples]
            call_lps = [float("nan") if t[0] is None else t[0] for t in triples]
            text = event.get("text", text)
        sample_tokens = base + call_ids  # the per-event rebuild
        sample_lps = list(call_lps)
    if mode == "incremental":
        text = "".join(texts)
    has_text = "text" in event
    return core.NaiveResult(
        sample_tokens[prompt_tokens:], sample_lps, text if has_text else None, None, None, None, events
    )


def consumer(name: str, spec: core.WorkloadSpec) -> Any:
    if name == "rebuild":
        return lambda pieces: rebuild_consume(pieces, mode=spec.mode, prompt_tokens=spec.prompt_tokens)
    return core.consumer_fn(name, spec)


# ---- scaling -------------------------------------------------------------------------------------


def scaling(
    mode: str, sizes: Sequence[int], names: Sequence[str], args: argparse.Namespace, bar: Any
) -> dict[str, Any]:
    """Best-of times per consumer and size. All sizes are built first; round 0 runs them in
    increasing size and skips a consumer from the size its measured growth predicts to take more
    than ``--run-cap`` s; later rounds go through every size again, so that the small and large
    sizes sample the same noisy stretches of the machine (time(500k)/time(50k) is a ratio of two
    sizes, not of two consumers in one run)."""
    out: dict[str, Any] = {
        "sizes": list(sizes),
        "interval": 20,
        "stream_bytes": [],
        "events": [],
        "consumers": {n: {"seconds": [], "runs": []} for n in names},
        "skipped": {},
    }
    workloads = []
    for n in sizes:
        bar.set_description(f"scaling {mode} {n:,}: build")
        spec = (
            core.WorkloadSpec(f"{mode}-{n}", mode, n, text=False)
            if mode == "incremental"
            else core.WorkloadSpec(f"{mode}-{n}", mode, n)
        )  # W1 / W2 shapes at n tokens
        workloads.append(core.build(spec))
        out["stream_bytes"].append(sum(map(len, workloads[-1].pieces)))
        out["events"].append(workloads[-1].expected.events)
    bar.update(1)
    runs: dict[tuple[str, int], list[float]] = {}
    active = list(names)
    for round_ in range(args.repeat):
        for k, w in enumerate(workloads):
            n = sizes[k]
            for c in active if round_ == 0 else names:
                key = (c, n)
                if round_ and (key not in runs or sum(runs[key]) > args.budget):
                    continue
                bar.set_description(f"scaling {mode} round {round_ + 1}: {n:,} {c}")
                fn = consumer(c, w.spec)
                seconds, result = core.time_once(functools.partial(fn, w.pieces))
                if round_ == 0:  # outputs checked once, outside the timed region
                    core.check_consumer(c, result, w.expected)
                del result
                runs.setdefault(key, []).append(seconds)
            if round_ == 0 and k + 1 < len(sizes):
                for c in list(active):
                    ts = [min(runs[(c, m)]) for m in sizes[: k + 1]]
                    slope = 1.0
                    if len(ts) >= 2:
                        # clamped to [1, 2]: every consumer here is linear or quadratic; steeper is noise
                        slope = min(2.0, max(1.0, math.log(ts[-1] / ts[-2]) / math.log(sizes[k] / sizes[k - 1])))
                    predicted = ts[-1] * (sizes[k + 1] / n) ** slope
                    if predicted > args.run_cap:
                        active.remove(c)
                        out["skipped"][c] = f"from {sizes[k + 1]:,} tokens: predicted {predicted:,.0f} s per run"
        bar.update(1)
    for c in names:
        out["consumers"][c]["runs"] = [runs.get((c, n)) for n in sizes]
        out["consumers"][c]["seconds"] = [min(runs[(c, n)]) if (c, n) in runs else None for n in sizes]
    del workloads
    gc.collect()
    return out


# ---- routed-experts memory (fresh interpreter per consumer) --------------------------------------


def experts_spec(prompt: int, tokens: int) -> core.WorkloadSpec:
    return core.WorkloadSpec(
        f"R3-{prompt + tokens}", "incremental", tokens, prompt_tokens=prompt, top_p=True, expert_shape=(48, 8)
    )


def memory_child(name: str, prompt: int, tokens: int, path: str) -> dict[str, Any]:
    """Runs in a fresh process: like bench_core.memory_child, for any context size."""
    spec = experts_spec(prompt, tokens)
    fn = consumer(name, spec)
    pieces = core.read_pieces(path)
    gc.collect()
    hwm_reset = core._reset_hwm()
    before = core._proc_status_kib()
    start = time.perf_counter()
    out = fn(pieces)
    seconds = time.perf_counter() - start
    after = core._proc_status_kib()
    del out
    gc.collect()
    tracemalloc.start()
    fn(pieces)
    traced_peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {
        "seconds": seconds,
        "hwm_reset": hwm_reset,
        "rss_growth_bytes": (after["VmHWM"] - before["VmRSS"]) * 1024,
        "tracemalloc_peak_bytes": traced_peak,
    }


def experts(args: argparse.Namespace, contexts: Sequence[tuple[int, int]], bar: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"contexts": []}
    for prompt, tokens in contexts:
        spec = experts_spec(prompt, tokens)
        bar.set_description(f"experts {prompt + tokens:,}: build")
        body, expected = core.stream_of(spec)
        row: dict[str, Any] = {
            "prompt_tokens": prompt,
            "tokens": tokens,
            "context": prompt + tokens,
            "stream_bytes": len(body),
            "routed_bytes": spec.routed_bytes(),
            "consumers": {},
        }
        # The built stream is checked once in-process by the compiled twin (the children only measure).
        core.check_outputs(
            "compiled", core.consumer_fn("compiled", spec)(core.writer.split_pieces(body, [core.PIECE_BYTES])), expected
        )
        del expected
        with tempfile.NamedTemporaryFile(prefix="fastaccum-r3-", suffix=".sse") as f:
            f.write(body)
            f.flush()
            del body
            gc.collect()
            for name in args.memory_consumers:
                bar.set_description(f"experts {prompt + tokens:,}: {name}")
                runs: list[dict[str, Any]] = []
                for _ in range(args.memory_repeat):
                    cmd = [sys.executable, __file__, "--memory-child", name, str(prompt), str(tokens), f.name]
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    if proc.returncode:
                        runs = [{"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}]
                        break
                    runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
                best = (
                    runs[0]
                    if "error" in runs[0]
                    else {
                        # best of each: the allocator and the noisy machine only ever add
                        key: min(r[key] for r in runs)
                        for key in ("seconds", "rss_growth_bytes", "tracemalloc_peak_bytes")
                    }
                )
                if "error" not in best:
                    best["hwm_reset"] = all(r["hwm_reset"] for r in runs)
                    best["rss_over_routed"] = best["rss_growth_bytes"] / spec.routed_bytes()
                    best["tracemalloc_over_routed"] = best["tracemalloc_peak_bytes"] / spec.routed_bytes()
                row["consumers"][name] = best
        out["contexts"].append(row)
        bar.update(1)
    return out


# ---- network: emulator process and client processes ---------------------------------------------


def serve(options: dict[str, Any]) -> None:
    """Runs in its own process: an Emulator on a free loopback port until stdin closes."""
    from fastaccum.emulator import Emulator

    async def main() -> None:
        emulator = Emulator(**options)
        url = await emulator.start()
        print(url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await emulator.stop()

    asyncio.run(main())


class EmulatorProcess:
    def __init__(self, **options: Any) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--serve", json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.url = self.proc.stdout.readline().strip()
        if not self.url:
            raise RuntimeError("the emulator process did not start")

    def cpu_seconds(self) -> float:
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


async def _fastaccum_client(url: str, payloads: list[dict[str, Any]]) -> Any:
    import aiohttp

    from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT, GenerateStream

    async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT, connector=aiohttp.TCPConnector(limit=len(payloads))) as s:

        async def one(p: dict[str, Any]) -> Any:
            return await GenerateStream(s, url + "/generate", p, mode="incremental").run()

        start = _cpu(), time.perf_counter()
        results = await asyncio.gather(*map(one, payloads))
        stop = _cpu(), time.perf_counter()
    return start, stop, [(r.token_ids, r.logprobs) for r in results]


async def _raw_client(url: str, payloads: list[dict[str, Any]]) -> Any:
    """aiohttp reading every body chunk (iter_any) and doing nothing with it: no feed, no result."""
    import aiohttp

    from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT

    async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT, connector=aiohttp.TCPConnector(limit=len(payloads))) as s:

        async def one(p: dict[str, Any]) -> int:
            received = 0
            async with s.post(url + "/generate", json={**p, "stream": True}) as response:
                async for piece in response.content.iter_any():
                    received += len(piece)
            return received

        start = _cpu(), time.perf_counter()
        results = await asyncio.gather(*map(one, payloads))
        stop = _cpu(), time.perf_counter()
    return start, stop, results


async def _httpx_client(url: str, payloads: list[dict[str, Any]]) -> Any:
    """The way slime's streaming example reads a stream (httpx, aiter_lines, json.loads per event),
    accumulating each event's delta (the example assumes cumulative events; with incremental ones
    it must extend, as here). slime's per-event sample rebuild is left out: parsing only."""
    import httpx

    limits = httpx.Limits(max_connections=len(payloads), max_keepalive_connections=len(payloads))
    async with httpx.AsyncClient(timeout=None, limits=limits, trust_env=False) as client:

        async def one(p: dict[str, Any]) -> tuple[list[int], list[float]]:
            ids: list[int] = []
            lps: list[float] = []
            async with client.stream("POST", url + "/generate", json={**p, "stream": True}) as response:
                response.raise_for_status()
                async for raw_line in response.aiter_lines():
                    if not raw_line or not raw_line.startswith("data:"):
                        continue
                    data = raw_line[5:].strip()
                    if not data or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    for lp, tid, _ in (chunk.get("meta_info") or {}).get("output_token_logprobs", ()):
                        ids.append(tid)
                        lps.append(lp)
            return ids, lps

        start = _cpu(), time.perf_counter()
        results = await asyncio.gather(*map(one, payloads))
        stop = _cpu(), time.perf_counter()
    return start, stop, results


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def client_child(kind: str, url: str, streams: int, tokens: int, tag: str) -> dict[str, Any]:
    """Runs in a fresh process: ``streams`` concurrent requests; CPU and wall of the streaming part."""
    import numpy as np

    from fastaccum.emulator import writer

    rids = [f"{tag}-{i:05d}x" for i in range(streams)]  # fixed width: no rid is a prefix of another
    payloads = [
        {"input_ids": PROMPT, "rid": rid, "return_logprob": True, "sampling_params": {"max_new_tokens": tokens}}
        for rid in rids
    ]
    run = {"fastaccum": _fastaccum_client, "httpx-lines": _httpx_client, "aiohttp-raw": _raw_client}[kind]
    (cpu0, t0), (cpu1, t1), results = asyncio.run(run(url, payloads))
    if kind == "aiohttp-raw":
        return {"cpu_seconds": cpu1 - cpu0, "wall_seconds": t1 - t0, "tokens": streams * tokens, "bytes": sum(results)}
    for rid, (ids, lps) in zip(rids, results):  # outside the measured region
        gen = writer.synthetic_generation(rid, tokens, prompt_tokens=len(PROMPT))
        want_lps = np.asarray(gen.logprobs, dtype=float)
        if not (
            np.array_equal(np.asarray(ids), gen.token_ids) and np.array_equal(np.asarray(lps, dtype=float), want_lps)
        ):
            raise AssertionError(f"{kind}: stream {rid} differs from the generation")
    return {"cpu_seconds": cpu1 - cpu0, "wall_seconds": t1 - t0, "tokens": streams * tokens}


def network(args: argparse.Namespace, configs: Sequence[tuple[str, int, int, int]], bar: Any) -> dict[str, Any]:
    """Each config: one emulator process; the clients alternate, ``--net-repeat`` times each."""
    out: dict[str, Any] = {}
    for name, streams, tokens, interval in configs:
        server = EmulatorProcess(
            incremental_streaming_output=True,
            stream_interval=interval,
            skip_tokenizer_init=True,
            max_running_requests=max(256, streams),
        )
        entry: dict[str, Any] = {
            "streams": streams,
            "tokens_per_stream": tokens,
            "interval": interval,
            "clients": {c: {"runs": []} for c in CLIENTS},
        }
        try:
            for r in range(args.net_repeat):
                for c in CLIENTS:
                    bar.set_description(f"network {name}: {c} ({r + 1}/{args.net_repeat})")
                    server_cpu = server.cpu_seconds()
                    cmd = [
                        sys.executable,
                        __file__,
                        "--client-child",
                        c,
                        server.url,
                        str(streams),
                        str(tokens),
                        f"{name}",
                    ]
                    proc = subprocess.run(cmd, capture_output=True, text=True)
                    if proc.returncode:
                        raise RuntimeError(f"{c} client failed: {proc.stderr.strip()[-2000:]}")
                    got = json.loads(proc.stdout.strip().splitlines()[-1])
                    got["server_cpu_seconds"] = server.cpu_seconds() - server_cpu
                    entry["clients"][c]["runs"].append(got)
        finally:
            server.close()
        for c in CLIENTS:
            runs = entry["clients"][c]["runs"]
            best = min(runs, key=lambda x: x["cpu_seconds"])
            entry["clients"][c].update(
                best_cpu_seconds=best["cpu_seconds"],
                cpu_us_per_token=best["cpu_seconds"] / best["tokens"] * 1e6,
                best_wall_seconds=min(x["wall_seconds"] for x in runs),
            )
        httpx_cpu = entry["clients"]["httpx-lines"]["best_cpu_seconds"]
        entry["fastaccum_over_httpx"] = entry["clients"]["fastaccum"]["best_cpu_seconds"] / httpx_cpu
        entry["raw_over_httpx"] = entry["clients"]["aiohttp-raw"]["best_cpu_seconds"] / httpx_cpu
        out[name] = entry
        bar.update(1)
    return out


# ---- targets and main ----------------------------------------------------------------------------


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []

    def add(name: str, value: float | None, bound: float, kind: str = "max", target: bool = True) -> None:
        met = None if value is None or not target else (value <= bound if kind == "max" else value >= bound)
        rows.append({"ratio": name, "value": value, "target": f"{'<=' if kind == 'max' else '>='} {bound}", "met": met})

    inc = report.get("scaling", {}).get("incremental")
    if inc and 50_000 in inc["sizes"] and 500_000 in inc["sizes"]:
        i, j = inc["sizes"].index(50_000), inc["sizes"].index(500_000)
        for c in ("compiled", "pure", "naive", "floor"):
            t = inc["consumers"].get(c, {}).get("seconds") or []
            if len(t) > j and t[i] and t[j]:
                add(f"incremental {c} time(500k)/time(50k)", t[j] / t[i], 10.5, target=c == "compiled")
        t = inc["consumers"]
        if t.get("compiled") and t.get("floor") and t["compiled"]["seconds"][j]:
            add("W1 (500k) compiled/floor", t["compiled"]["seconds"][j] / t["floor"]["seconds"][j], 1.2)
            add("W1 (500k) naive/compiled", t["naive"]["seconds"][j] / t["compiled"]["seconds"][j], 3.0, "min")
    for row in report.get("experts", {}).get("contexts", []):
        for c, m in row["consumers"].items():
            if "rss_over_routed" in m:
                add(
                    f"R3 {row['context'] // 1000}k {c} peak RSS growth / decoded",
                    m["rss_over_routed"],
                    3.0,
                    target=c == "compiled",
                )
    for name, entry in report.get("paced", {}).items():
        clients = entry["clients"]
        limit = 0.4 if entry["interval"] == 1 else 0.15
        add(f"paced {name} Client/httpx total CPU per token", clients["client"]["total_over_httpx"], limit)
        if entry["interval"] == 1:
            add(f"paced {name} Client/httpx user CPU per token", clients["client"]["user_over_httpx"], 0.25)
            add(
                f"paced {name} Client/GenerateStream total CPU per token",
                clients["client"]["total_over_generate_stream"],
                0.6,
            )
    for name, entry in report.get("concurrency", {}).items():
        add(f"concurrency {name} fastaccum/httpx CPU per token", entry["fastaccum_over_httpx"], 0.3)
        add(f"concurrency {name} aiohttp-raw/httpx CPU per token", entry["raw_over_httpx"], 0.3, target=False)
    return rows


def _extension_stamp() -> dict[str, Any]:
    """Which compiled twin is on disk (the lead rebuilds it in place while others measure)."""
    import fastaccum._cy as cy

    repo = os.path.dirname(HERE)
    head = subprocess.run(["git", "-C", repo, "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return {"path": cy.__file__, "mtime": os.stat(cy.__file__).st_mtime, "git_head": head.stdout.strip()}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="w1,scaling,experts,concurrency,paced")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--quick", action="store_true", help="small sizes, to check the script")
    parser.add_argument("--repeat", type=int, default=5, help="scaling: runs per consumer and size (best of)")
    parser.add_argument("--budget", type=float, default=30.0, help="scaling: stop repeating after this many s")
    parser.add_argument("--run-cap", type=float, default=60.0, help="scaling: skip sizes predicted to take longer")
    parser.add_argument("--memory-repeat", type=int, default=2)
    parser.add_argument("--memory-consumers", default=",".join(MEMORY_CONSUMERS))
    parser.add_argument("--net-repeat", type=int, default=3)
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--client-child", nargs=5, help=argparse.SUPPRESS)
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(json.loads(args.serve))
        return 0
    if args.memory_child:
        name, prompt, tokens, path = args.memory_child
        print(json.dumps(memory_child(name, int(prompt), int(tokens), path)))
        return 0
    if args.client_child:
        kind, url, streams, tokens, tag = args.client_child
        print(json.dumps(client_child(kind, url, int(streams), int(tokens), tag)))
        return 0
    from tqdm import tqdm

    args.memory_consumers = args.memory_consumers.split(",")
    sections = args.only.split(",")
    cum, inc = (CUMULATIVE_SIZES[:3], (10_000, 50_000)) if args.quick else (CUMULATIVE_SIZES, INCREMENTAL_SIZES)
    ctx = ((500, 3_500), (500, 7_500)) if args.quick else EXPERT_CONTEXTS
    w1 = [("W1-500k", 1, 20_000 if args.quick else 500_000, 20)]
    conc = [(f"16x500-i{i}", 16, 500, i) for i in (20, 1)] if args.quick else list(CONCURRENCY)
    steps = (
        ("w1" in sections)
        + ("scaling" in sections) * 2 * (1 + args.repeat)
        + ("experts" in sections) * len(ctx)
        + ("concurrency" in sections) * len(conc)
        + ("paced" in sections)
    )
    report: dict[str, Any] = {
        "machine": {**core.machine_info(), "extension_start": _extension_stamp()},
        "config": {k: v for k, v in vars(args).items() if not k.endswith("child") and k != "serve"},
    }
    with tqdm(total=steps, unit="step", dynamic_ncols=True) as bar:
        # Each section records the compiled twin's mtime before and after, so a report says which
        # build each number comes from if the extension is rebuilt in place during the run.
        stamps = report["machine"]["extension_per_section"] = {}
        sections_run = {
            "w1": lambda: {"w1_client": network(args, w1, bar)["W1-500k"]},
            "scaling": lambda: {
                "scaling": {
                    "cumulative": scaling("cumulative", cum, SCALING_CONSUMERS, args, bar),
                    "incremental": scaling("incremental", inc, SCALING_CONSUMERS, args, bar),
                }
            },
            "experts": lambda: {"experts": experts(args, ctx, bar)},
            "concurrency": lambda: {"concurrency": network(args, conc, bar)},
            "paced": lambda: {
                "paced": {
                    name: paced.measure(name, 1 if args.quick else args.net_repeat)
                    for name in (["256x400-i1"] if args.quick else paced.CONFIGS)
                }
            },
        }
        for name, run in sections_run.items():
            if name in sections:
                before = _extension_stamp()["mtime"]
                report.update(run())
                stamps[name] = [before, _extension_stamp()["mtime"]]
    report["machine"]["loadavg_end"] = os.getloadavg()
    report["machine"]["extension_end"] = _extension_stamp()
    if report["machine"]["extension_end"] != report["machine"]["extension_start"]:
        print("WARNING: the compiled twin changed on disk during the run; fresh processes used the new one")
    report["targets"] = targets(report)
    for row in report["targets"]:
        verdict = {True: "met", False: "MISSED", None: ""}[row["met"]]
        print(f"  {row['ratio']:<58} {row['value']:8.3f}   target {row['target']:<7} {verdict}")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
