"""A rollout abort behind a router that cannot abort, at fleet scale: what the fan-out costs.

``--workers`` emulated SGLang workers (``--streams-per-worker`` streams each) sit behind a router
that answers ``/abort_request`` with 404 and lists its workers at ``GET /workers``, as
sglang-router 0.3.2 does; ``fastaccum.Client`` then sends every rid to every worker. Workers and
router run in processes of their own (a worker process hosts several emulator servers; the router
is ``--router-procs`` processes on one port, ``SO_REUSEPORT``, so that no process holds more
sockets than the file limit), the client in this one, so the client's CPU is its own.

Each stream decodes ``--tokens`` tokens, then holds still until it is aborted; an aborted request
ends at its worker's next decode step (``--step-ms``) with one more token, as SGLang's scheduler
ends it. When every stream holds its tokens, all are aborted at once, as a rollout abort does.
Reported: abort POSTs (total, per worker); seconds from the aborts to every ``run()`` returning
(p50/p99/max) and to the last abort POST answered; the share of streams whose drain succeeded
(``replay_complete``) or fell back to a cut (``stream.abort_error``); the client's CPU, user and
system apart; and each worker's abort requests and the time it spent on them.

    python benchmarks/abort_fanout.py                                # 32 workers x 512 streams
    python benchmarks/abort_fanout.py --workers 4 --streams-per-worker 64   # seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import resource
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import numpy as np
import orjson
from aiohttp import web

import fastaccum
from fastaccum.emulator import ABORT_REASON, Emulator
from fastaccum.emulator._requests import Output, Request

PROMPT = [101, 102, 103, 104]
_TICK = os.sysconf("SC_CLK_TCK")


def _raise_file_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _cpu_of(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / _TICK, int(fields[12]) / _TICK


# ---- workers ----------------------------------------------------------------------------------


class HoldingWorker(Emulator):
    """An emulator whose requests decode ``tokens`` tokens and then hold still until aborted:
    16,384 streams decoding on two cores would measure the emulator, not the abort. The abort
    looks the rid up in a dict, as SGLang's tokenizer manager does (``rid_to_state``), and the
    request ends at the next decode step boundary with one more token."""

    def __init__(self, *, tokens: int, step_s: float, **options: Any) -> None:
        super().__init__(**options)
        self.tokens, self.step_s = tokens, step_s
        self._held: dict[str, tuple[Request, asyncio.Event]] = {}
        self.abort_requests = 0
        self.abort_hits = 0
        self.abort_handler_s = 0.0

    def make_app(self) -> web.Application:
        app = super().make_app()
        app.router.add_get("/bench_stats", self._bench_stats)
        return app

    def _admit(self) -> None:
        while self._waiting and not self._closing:
            req = self._waiting.popleft()
            req.state = "running"
            self._running.add(req)
            req.decoder = asyncio.get_running_loop().create_task(self._hold(req))
            req.admitted.set()

    async def _hold(self, req: Request) -> None:
        event = asyncio.Event()
        self._held[req.rid] = (req, event)
        try:
            k = min(self.tokens, len(req.gen.token_ids) - 1)
            req.outbox.append(Output(0, k))
            self._count(req, k)
            req.wake.set()
            await event.wait()
            loop = asyncio.get_running_loop()
            await asyncio.sleep(self.step_s - loop.time() % self.step_s)
            out = Output(k, k + 1, True, ABORT_REASON)
            req.outbox.append(out)
            req.final = out
            self._count(req, k + 1)
            req.wake.set()
        finally:
            self._held.pop(req.rid, None)

    async def _abort_request(self, request: web.Request) -> web.Response:
        started = time.perf_counter()
        self.abort_requests += 1
        rid = orjson.loads(await request.read() or b"{}").get("rid") or ""
        held = self._held.get(rid)
        if held is not None and not held[0].abort_requested:
            held[0].abort_requested = True
            held[1].set()
            self.abort_hits += 1
            self.stats.aborted += 1
        self.abort_handler_s += time.perf_counter() - started
        return web.Response(status=200)

    async def _bench_stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests": self.stats.requests,
                "abort_requests": self.abort_requests,
                "abort_hits": self.abort_hits,
                "abort_handler_s": self.abort_handler_s,
                "disconnects": self.stats.disconnects,
                "held": len(self._held),
            }
        )


def serve_workers(count: int, tokens: int, step_s: float) -> None:
    """``count`` workers in this process until stdin closes; prints their URLs on one line."""
    _raise_file_limit()

    async def main() -> None:
        workers = [
            HoldingWorker(tokens=tokens, step_s=step_s, max_running_requests=1 << 20, token_rate=1.0)
            for _ in range(count)
        ]
        urls = [await w.start() for w in workers]
        print(" ".join(urls), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        for w in workers:
            await w.stop()

    asyncio.run(main())


# ---- router -----------------------------------------------------------------------------------


class _Upstream(asyncio.Protocol):
    """The router's connection to a worker: what the worker writes goes to the client as is."""

    def __init__(self, down: _Downstream) -> None:
        self.down = down
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.down.transport is not None:
            self.down.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        # The worker ended the response (it was asked to close after it): so does the router.
        if self.down.transport is not None:
            self.down.transport.close()


class _Downstream(asyncio.Protocol):
    """One client connection to the router: ``/generate`` streamed from the next worker,
    ``/workers`` listed, ``/abort_request`` 404 (not forwarded)."""

    def __init__(self, router: _Router) -> None:
        self.router = router
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.up: _Upstream | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.up is not None:  # a stream's connection: anything more goes to its worker
            if self.up.transport is not None:
                self.up.transport.write(data)
            return
        self.buffer += data
        while self.up is None and self.transport is not None:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(rest) < length:
                return
            request, self.buffer = head + sep + rest[:length], rest[length:]
            method, path = head.split(b" ", 2)[:2]
            self.dispatch(method, path, request)

    def dispatch(self, method: bytes, path: bytes, request: bytes) -> None:
        assert self.transport is not None
        if method == b"GET" and path == b"/workers":
            body = orjson.dumps({"workers": [{"url": url} for url in self.router.urls]})
            self.transport.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        elif path == b"/generate":
            self.transport.pause_reading()
            self.up = _Upstream(self)
            line, _, rest = request.partition(b"\r\n")
            asyncio.get_running_loop().create_task(self.forward(line + b"\r\nConnection: close\r\n" + rest))
        else:  # /abort_request among them: sglang-router 0.3.2 answers 404 and forwards nothing
            self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    async def forward(self, request: bytes) -> None:
        host, port = next(self.router.cycle)
        assert self.up is not None
        up = self.up
        try:
            await asyncio.get_running_loop().create_connection(lambda: up, host, port)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        assert up.transport is not None
        up.transport.write(request)
        if self.transport is not None:
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        if self.up is not None and self.up.transport is not None:
            self.up.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.up is not None and self.up.transport is not None:
            self.up.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()  # a client that left: its worker sees the disconnect


class _Router:
    def __init__(self, urls: list[str], index: int, count: int) -> None:
        self.urls = urls
        targets = [(u.removeprefix("http://").split(":")[0], int(u.rsplit(":", 1)[1])) for u in urls]
        turn = index * len(targets) // count  # each router process starts elsewhere: streams spread evenly
        self.cycle = itertools.cycle(targets[turn:] + targets[:turn])


def serve_router(port: int, urls: list[str], index: int, count: int) -> None:
    """One router process on ``port`` (SO_REUSEPORT) until stdin closes."""
    _raise_file_limit()

    async def main() -> None:
        router = _Router(urls, index, count)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        server = await asyncio.get_running_loop().create_server(lambda: _Downstream(router), sock=sock, backlog=4096)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        server.close()

    asyncio.run(main())


# ---- the client -------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(values), q)) if values else float("nan")


async def _get_json(url: str, path: str) -> Any:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path.encode())
    data = await reader.read()
    writer.close()
    return json.loads(data.partition(b"\r\n\r\n")[2])


async def _wait(predicate: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {seconds} s")
        await asyncio.sleep(0.02)


async def run_round(
    url: str,
    workers: list[str],
    server_pids: dict[str, list[int]],
    *,
    streams: int,
    tokens: int,
    drain_s: float,
    ramp: int,
) -> dict[str, Any]:
    # The emulator builds a request's whole generation up front: a few tokens past the held ones.
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": tokens + 8}, "return_logprob": True}
    async with fastaccum.Client(url, abort_drain_s=drain_s) as client:
        live, tasks = [], []
        setup = time.perf_counter()
        for start in range(0, streams, ramp):  # in waves: a connect storm would measure the backlog
            wave = [client.stream(body) for _ in range(start, min(streams, start + ramp))]
            live += wave
            tasks += [asyncio.ensure_future(s.run()) for s in wave]
            await _wait(
                lambda wave=wave: all(s.tokens >= tokens for s in wave), 120, "streams did not get their tokens"
            )
        setup_s = time.perf_counter() - setup
        sender = client._aborts_for("sglang")
        returned: list[float] = []
        cpu0, others0 = os.times(), {k: [_cpu_of(p) for p in pids] for k, pids in server_pids.items()}
        started = time.perf_counter()
        for task in tasks:
            task.add_done_callback(lambda _t: returned.append(time.perf_counter() - started))
        for stream in live:
            stream.abort()
        results = await asyncio.gather(*tasks)
        all_returned = time.perf_counter() - started
        cpu1 = os.times()
        await _wait(lambda: not sender.sending, 600, "the abort POSTs did not end")
        fanout_s = time.perf_counter() - started
        cpu2, others1 = os.times(), {k: [_cpu_of(p) for p in pids] for k, pids in server_pids.items()}
        sent = sender.sent
        errors = Counter(type(s.abort_error).__name__ for s in live if s.abort_error is not None)
    stats = [await _get_json(w, "/bench_stats") for w in workers]
    per_worker = [s["abort_requests"] for s in stats]
    held = [s["requests"] for s in stats]
    drained = sum(r.replay_complete for r in results)

    def used(kind: str) -> dict[str, float]:
        pairs = [(b[0] - a[0], b[1] - a[1]) for a, b in zip(others0[kind], others1[kind])]
        return {"user_s": sum(p[0] for p in pairs), "system_s": sum(p[1] for p in pairs)}

    return {
        "streams": streams,
        "workers": len(workers),
        "streams_per_worker_min_max": [min(held), max(held)],
        "setup_s": setup_s,
        "abort_posts": sent,
        "abort_posts_per_worker_min_max": [min(per_worker), max(per_worker)],
        "abort_posts_received": sum(per_worker),
        "posts_per_stream": sent / streams,
        "return_p50_s": _quantile(returned, 0.5),
        "return_p99_s": _quantile(returned, 0.99),
        "return_max_s": max(returned),
        "all_returned_s": all_returned,
        "fanout_done_s": fanout_s,
        "drained": drained / streams,
        "cut": sum(s.abort_error is not None for s in live) / streams,
        "cut_reasons": dict(errors),
        "client_cpu_to_return": {"user_s": cpu1.user - cpu0.user, "system_s": cpu1.system - cpu0.system},
        "client_cpu_to_fanout_done": {"user_s": cpu2.user - cpu0.user, "system_s": cpu2.system - cpu0.system},
        "worker_abort_handler_s_total": sum(s["abort_handler_s"] for s in stats),
        "worker_abort_handler_s_max": max(s["abort_handler_s"] for s in stats),
        "worker_procs_cpu": used("workers"),
        "router_procs_cpu": used("router"),
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--streams-per-worker", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=2, help="tokens each stream holds before the abort")
    parser.add_argument("--step-ms", type=float, default=20.0, help="a worker's decode step (default: 20)")
    parser.add_argument("--drain-s", type=float, default=2.0, help="the client's abort_drain_s (default: 2)")
    parser.add_argument("--worker-procs", type=int, default=2)
    parser.add_argument("--router-procs", type=int, default=2)
    parser.add_argument("--ramp", type=int, default=512, help="streams started per wave")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--serve-workers", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-router", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_workers is not None:
        serve_workers(args.serve_workers, args.tokens, args.step_ms / 1e3)
        return
    if args.serve_router is not None:
        port, index, count, *urls = args.serve_router
        serve_router(int(port), urls, int(index), int(count))
        return
    _raise_file_limit()
    procs: list[subprocess.Popen[str]] = []
    pids: dict[str, list[int]] = {"workers": [], "router": []}
    urls: list[str] = []
    try:
        shares = [len(range(i, args.workers, args.worker_procs)) for i in range(args.worker_procs)]
        for share in filter(None, shares):
            command = [sys.executable, "-P", __file__, "--serve-workers", str(share)]
            command += ["--tokens", str(args.tokens), "--step-ms", str(args.step_ms)]
            proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            pids["workers"].append(proc.pid)
            assert proc.stdout is not None
            urls += proc.stdout.readline().split()
        port = _free_port()
        for index in range(args.router_procs):
            command = [sys.executable, "-P", __file__, "--serve-router", str(port), str(index), str(args.router_procs)]
            proc = subprocess.Popen([*command, *urls], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            pids["router"].append(proc.pid)
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a router process did not start")
        report = asyncio.run(
            run_round(
                f"http://127.0.0.1:{port}",
                urls,
                pids,
                streams=args.workers * args.streams_per_worker,
                tokens=args.tokens,
                drain_s=args.drain_s,
                ramp=args.ramp,
            )
        )
    finally:
        for proc in procs:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
    report.update(
        step_s=args.step_ms / 1e3,
        drain_s=args.drain_s,
        cpu=_cpu_model(),
        python=sys.version.split()[0],
        fastaccum=fastaccum.__version__,
    )
    r = report
    cpu_r, cpu_f = r["client_cpu_to_return"], r["client_cpu_to_fanout_done"]
    print(
        f"{r['workers']} workers x {r['streams'] // r['workers']} streams ({r['streams']}; "
        f"{r['streams_per_worker_min_max'][0]}-{r['streams_per_worker_min_max'][1]} per worker), "
        f"decode step {r['step_s'] * 1e3:.0f} ms, abort_drain_s {r['drain_s']}"
    )
    print(
        f"  abort POSTs: {r['abort_posts']} ({r['posts_per_stream']:.1f} per stream; per worker "
        f"{r['abort_posts_per_worker_min_max'][0]}-{r['abort_posts_per_worker_min_max'][1]})"
    )
    print(
        f"  abort -> run() returned: p50 {r['return_p50_s']:.3f} s, p99 {r['return_p99_s']:.3f} s, "
        f"max {r['return_max_s']:.3f} s; last abort POST answered at {r['fanout_done_s']:.3f} s"
    )
    print(f"  drained {r['drained']:.1%}, cut {r['cut']:.1%} {r['cut_reasons'] or ''}")
    print(
        f"  client CPU to every return: user {cpu_r['user_s']:.2f} s, system {cpu_r['system_s']:.2f} s; "
        f"to the last POST: user {cpu_f['user_s']:.2f} s, system {cpu_f['system_s']:.2f} s"
    )
    wp = r["worker_procs_cpu"]
    print(
        f"  workers: abort handlers {r['worker_abort_handler_s_total']:.2f} s in all "
        f"(max {r['worker_abort_handler_s_max']:.3f} s per worker); worker processes' CPU "
        f"user {wp['user_s']:.2f} s, system {wp['system_s']:.2f} s; "
        f"{wp['user_s'] + wp['system_s']:.0f} s / {r['abort_posts_received']} POSTs = "
        f"{(wp['user_s'] + wp['system_s']) / max(1, r['abort_posts_received']) * 1e6:.0f} us per POST"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


def _cpu_model() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} vCPU"
    return f"{os.cpu_count()} vCPU"


if __name__ == "__main__":
    main()
