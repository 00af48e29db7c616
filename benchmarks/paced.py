"""Paced streams: client CPU per token and reads per token at a real decode rate, per transport.

A paced server runs in its own process: every stream gets one event per ``interval`` tokens at
``TOKENS_PER_S`` tokens/s, each event written as its own HTTP chunk (as uvicorn writes SGLang's
stream), one write per event per stream per tick. Each client runs in a fresh process and reports
its CPU time from getrusage, user and system apart, and the reads it made. The clients take turns
``--repeat`` times against one server, so machine noise spreads over all of them.

    python benchmarks/paced.py                                   # 256x400 and 1024x100 at interval 1, 256x400 at 20
    python benchmarks/paced.py --configs 256x400-i1 --repeat 2 --out /tmp/p.json
    python benchmarks/paced.py --configs 256x400-i1 --clients httpx-lines,client --dialects sglang,dynamo,vllm

``stress.py --only paced`` runs the same. Clients: ``httpx-lines`` (httpx ``aiter_lines`` and
``json.loads`` per event, the way slime's streaming example reads), ``generate-stream``
(``fastaccum.GenerateStream`` on aiohttp), ``client`` (``fastaccum.Client`` defaults),
``client-<N>ms`` (a window of N ms; ``client-0ms``: no read coalescing), and ``client-uvloop``/
``httpx-uvloop`` on uvloop.
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
from typing import Any

NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
TOKENS_PER_S = 100.0  # per stream: a decode rate typical of a loaded RL rollout server
PROMPT = list(range(1, 17))
CONFIGS = {"256x400-i1": (256, 400, 1), "1024x100-i1": (1024, 100, 1), "256x400-i20": (256, 400, 20)}
CLIENTS = ("httpx-lines", "generate-stream", "client", "client-0ms", "client-uvloop", "httpx-uvloop")
HERE = os.path.dirname(os.path.abspath(__file__))


# ---- the paced server (own process) -------------------------------------------------------------


def serve(tokens: int, interval: int, dialect: str = "sglang") -> None:
    from fastaccum.emulator import writer, writer_vllm

    gen = writer.synthetic_generation("paced", tokens, prompt_tokens=len(PROMPT))
    opts = writer.WireOptions(incremental=True, skip_tokenizer_init=True)
    points = writer.emission_points(tokens, interval)
    chunks: list[bytes] = []
    if dialect == "vllm":  # vLLM's chunks, the usage chunk going out with the finishing one
        events = [writer_vllm.sse(c) for c in writer_vllm.stream_chunks(gen, points=points)]
        events[-2:] = [events[-2] + events[-1]]
    else:  # SGLang's incremental events, which Dynamo passes through
        events = [
            writer.sse(writer.normal_event(gen, opts, prev, end, terminal=k == len(points) - 1, first=k == 0))
            for k, (prev, end) in enumerate(zip([0, *points], points))
        ]
    for event in events:
        chunks.append(b"%x\r\n%s\r\n" % (len(event), event))
    chunks.append(b"%x\r\n%s\r\n0\r\n\r\n" % (len(writer.DONE), writer.DONE))
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
        b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    period = interval / TOKENS_PER_S
    active: dict[Any, int] = {}

    class Handler(asyncio.Protocol):
        def connection_made(self, transport: Any) -> None:
            self.transport = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            if self.buf.startswith(b"PRI "):  # a router's HTTP/2 probe: this server speaks HTTP/1.1
                self.transport.close()
                return
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if self.buf.startswith(b"GET "):  # a router's health and info checks
                found = self.buf.startswith((b"GET /health ", b"GET /server_info "))
                self.buf = self.buf[end + 4 :]
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}" if found else NOT_FOUND)
                return
            length = int(self.buf.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length :]
            self.transport.write(head)
            active[self] = 0

        def connection_lost(self, exc: Exception | None) -> None:
            active.pop(self, None)

    async def tick() -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            for handler, pos in list(active.items()):
                handler.transport.write(chunks[pos])  # one write per event per stream per tick
                if pos + 1 >= len(chunks) - 1:
                    handler.transport.write(chunks[-1])
                    del active[handler]
                else:
                    active[handler] = pos + 1
            next_at += period
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Handler, "127.0.0.1", 0, backlog=4096)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        ticker = asyncio.ensure_future(tick())
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        ticker.cancel()
        server.close()

    asyncio.run(main())


# ---- clients (one fresh process each) -----------------------------------------------------------


async def _httpx(url: str, payloads: list[dict[str, Any]], path: str = "/generate") -> tuple[list[int], int | None]:
    import httpx

    limits = httpx.Limits(max_connections=len(payloads), max_keepalive_connections=len(payloads))
    async with httpx.AsyncClient(timeout=None, limits=limits, trust_env=False) as client:

        async def one(p: dict[str, Any]) -> int:
            ids: list[int] = []
            async with client.stream("POST", url + path, json={**p, "stream": True}) as response:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data and data != "[DONE]":
                        event = json.loads(data)
                        if "choices" in event:  # vLLM (the usage chunk has no choices)
                            for choice in event["choices"]:
                                if choice["logprobs"] is not None:
                                    ids.extend(item["token_id"] for item in choice["logprobs"]["content"])
                            continue
                        for _, tid, _ in event["meta_info"]["output_token_logprobs"]:
                            ids.append(tid)
            return len(ids)

        return list(await asyncio.gather(*map(one, payloads))), None


async def _generate_stream(url: str, payloads: list[dict[str, Any]]) -> tuple[list[int], int | None]:
    import aiohttp

    from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT, GenerateStream

    connector = aiohttp.TCPConnector(limit=len(payloads))
    async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT, connector=connector) as session:
        results = await asyncio.gather(*(GenerateStream(session, url + "/generate", p).run() for p in payloads))
    return [len(r) for r in results], None


async def _client(url: str, payloads: list[dict[str, Any]], **options: Any) -> tuple[list[int], int | None]:
    import fastaccum

    async with fastaccum.Client(url, **options) as client:
        results = await asyncio.gather(*(client.stream(p).run() for p in payloads))
    return [len(r) for r in results], sum(r.timing.reads for r in results if r.timing)


def client_child(kind: str, url: str, streams: int, tokens: int, dialect: str = "sglang") -> dict[str, Any]:
    payloads: list[dict[str, Any]] = [
        {
            "input_ids": PROMPT,
            "rid": f"p-{i:05d}",
            "return_logprob": True,
            "sampling_params": {"max_new_tokens": tokens},
        }
        if dialect != "vllm"
        else {"token_ids": PROMPT, "request_id": f"p-{i:05d}", "sampling_params": {"max_tokens": tokens, "logprobs": 0}}
        for i in range(streams)
    ]
    if kind.startswith("httpx"):
        coro = _httpx(url, payloads)
    elif kind == "generate-stream":
        coro = _generate_stream(url, payloads)
    else:
        window = kind.removeprefix("client-").removesuffix("ms")  # client-<N>ms: a window of N ms
        options: dict[str, Any] = {"coalesce_ms": float(window)} if window.isdigit() else {}
        coro = _client(url, payloads, dialect=dialect, **options)
    # A rollout process imported its client long before: one-off import CPU is not per-token cost
    # (fastaccum, numpy and aiohttp take about 0.3 s here, 3 µs per token of a 100k-token run).
    for module in (
        ("httpx",)
        if kind.startswith("httpx")
        else ("fastaccum", "fastaccum.transport.client", "fastaccum.transport.aiohttp_stream", "aiohttp")
    ):
        importlib.import_module(module)
    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    if kind.endswith("uvloop"):
        import uvloop

        counts, reads = uvloop.run(coro)
    else:
        counts, reads = asyncio.run(coro)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - wall
    if counts != [tokens] * streams:
        raise AssertionError(f"{kind}: token counts differ from {tokens}")
    n = streams * tokens
    return {
        "user_us_per_token": (after.ru_utime - before.ru_utime) / n * 1e6,
        "sys_us_per_token": (after.ru_stime - before.ru_stime) / n * 1e6,
        "reads_per_token": None if reads is None else reads / n,
        "wall_s": wall,
    }


# ---- driver -------------------------------------------------------------------------------------


def measure(
    name: str, repeat: int, clients: tuple[str, ...] = CLIENTS, *, router: bool = False, dialect: str = "sglang"
) -> dict[str, Any]:
    """``router``: the clients stream through sglang-router (PyPI) in front of the paced server;
    ``dialect``: the server writes that dialect's stream, and ``client`` reads it as such."""
    streams, tokens, interval = CONFIGS[name]
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(tokens), str(interval), dialect],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None and server.stdin is not None
    url = server.stdout.readline().strip()
    gateway = None
    if router:
        sys.path.insert(0, os.path.join(HERE, os.pardir, "tests"))
        from router_helpers import start_router

        gateway, url = start_router([url])
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in clients}
    try:
        for _ in range(repeat):
            for c in clients:
                proc = subprocess.run(
                    [sys.executable, __file__, "--client", c, url, str(streams), str(tokens), dialect],
                    capture_output=True,
                    text=True,
                )
                if proc.returncode:
                    raise RuntimeError(f"{c}: {proc.stderr.strip()[-2000:]}")
                runs[c].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
        if gateway is not None:
            gateway.terminate()
            gateway.wait(30)
        server.stdin.close()
        server.wait(30)
    out: dict[str, Any] = {"streams": streams, "tokens": tokens, "interval": interval, "clients": {}}
    for c, rs in runs.items():
        best = min(rs, key=lambda r: r["user_us_per_token"] + r["sys_us_per_token"])  # noise only adds
        out["clients"][c] = {
            **best,
            "total_us_per_token": best["user_us_per_token"] + best["sys_us_per_token"],
            "runs": rs,
        }
    base = out["clients"].get("httpx-lines")
    if base:
        for m in out["clients"].values():
            m["total_over_httpx"] = m["total_us_per_token"] / base["total_us_per_token"]
            m["user_over_httpx"] = m["user_us_per_token"] / base["user_us_per_token"]
    gs = out["clients"].get("generate-stream")
    if gs:
        for m in out["clients"].values():
            m["total_over_generate_stream"] = m["total_us_per_token"] / gs["total_us_per_token"]
    return out


def table(report: dict[str, Any]) -> str:
    lines = [
        "| config | client | user µs/tok | sys µs/tok | total | ×httpx total | ×httpx user "
        "| ×GenerateStream | reads/tok |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in report.items():
        for c, m in entry["clients"].items():
            reads = "" if m["reads_per_token"] is None else f"{m['reads_per_token']:.3f}"
            lines.append(
                f"| {name} | {c} | {m['user_us_per_token']:.1f} | {m['sys_us_per_token']:.1f} | "
                f"{m['total_us_per_token']:.1f} | {m.get('total_over_httpx', 0):.2f} | "
                f"{m.get('user_over_httpx', 0):.2f} | {m.get('total_over_generate_stream', 0):.2f} | {reads} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--router", action="store_true", help="also stream through sglang-router (PyPI)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "paced.json"))
    parser.add_argument(
        "--dialects", default="sglang", help="comma-separated: sglang,dynamo,vllm; a row per dialect (docs/dialects.md)"
    )
    parser.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--client", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        tokens, interval, dialect = args.serve
        serve(int(tokens), int(interval), dialect)
        return 0
    if args.client:
        kind, url, streams, tokens, dialect = args.client
        print(json.dumps(client_child(kind, url, int(streams), int(tokens), dialect)))
        return 0
    clients = tuple(args.clients.split(","))
    for option, given, known in (
        ("--configs", args.configs.split(","), CONFIGS),
        ("--clients", clients, CLIENTS),
        ("--dialects", args.dialects.split(","), ("sglang", "dynamo", "vllm")),
    ):
        unknown = [name for name in given if name not in known]
        if unknown:
            parser.error(f"{option}: unknown {', '.join(unknown)} (known: {', '.join(known)})")
    report = {}
    for dialect in args.dialects.split(","):
        for name in args.configs.split(","):
            key = name if dialect == "sglang" else f"{name} {dialect}"
            report[key] = measure(name, args.repeat, clients, dialect=dialect)
    if args.router:
        for name in args.configs.split(","):
            report[f"{name} via router"] = measure(name, args.repeat, clients, router=True)
    print(table(report))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(
            {
                "machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg(), "python": sys.version},
                "tokens_per_s_per_stream": TOKENS_PER_S,
                "configs": report,
            },
            f,
            indent=1,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
