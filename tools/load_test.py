"""Load and fault test of the client against emulators on loopback: leaks, RSS, error bounds.

Each round opens one aiohttp session (or, with ``--transport client``, one ``fastaccum.Client`` per
server) and runs N concurrent streams against two emulator subprocesses (one cumulative, one
incremental, so the client process is measured alone). Every stream follows a random plan:

- ``complete``: runs to the end; the result must equal the emulator's truth;
- ``abort``: ``stream.abort()`` after a random delay; the prefix must equal the truth (with
  ``fastaccum.Client``, the abort is drained: the server ends the request with its abort event);
- ``cancel``: the task running the stream is cancelled from outside; CancelledError propagates;
- ``server_abort``: ``POST /abort_request`` after a delay; a finished result ending in an abort;
- server faults, each with its documented error and a time bound: ``cut`` (StreamTruncatedError),
  ``stall`` past ``read_timeout`` (StreamTimeoutError), ``http_500`` (ServerError 500),
  ``error_event`` (ServerError 400), ``malformed_json`` (StreamFormatError), and ``refused``
  (StreamConnectionError, to a port nobody listens on). Every failed stream's ``snapshot()`` must be
  a prefix of the truth.

After each round: no asyncio task left but the runner, no socket or other file descriptor left
open in /proc/self/fd, both
emulators idle (every abandoned request was noticed), no accumulator alive; RSS is recorded.

    python tools/load_test.py --streams 512 --rounds 10          # the issue's full run
    python tools/load_test.py --streams 128 --rounds 3 --twin python
    python tools/load_test.py --transport client                  # fastaccum.Client
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
import numpy as np

import fastaccum
import fastaccum.transport.aiohttp_stream
import fastaccum.transport.client
import fastaccum.transport.consumer
import fastaccum.transport.request
from fastaccum.emulator import ABORT_REASON, Emulator
from fastaccum.errors import (
    ServerError,
    StreamConnectionError,
    StreamError,
    StreamFormatError,
    StreamTimeoutError,
    StreamTruncatedError,
)
from fastaccum.transport.aiohttp_stream import STREAM_TIMEOUT, GenerateStream

PROMPT = [11, 12, 13, 14, 15]
TOKEN_RATE = 2000.0  # tokens/s per request in the emulators
STREAM_INTERVAL = 4
READ_TIMEOUT = 0.5  # only the stall plans set one; a stall lasts far longer
STALL_SECONDS = 60.0
# Plan weights; faults are rarer than the normal cases, but every kind occurs in every round.
PLANS: dict[str, int] = {
    "complete": 40,
    "abort": 16,
    "cancel": 16,
    "server_abort": 6,
    "cut": 4,
    "stall": 4,
    "http_500": 4,
    "error_event": 4,
    "malformed_json": 3,
    "refused": 3,
}
EXPECTED_ERRORS: dict[str, tuple[type[StreamError], int | None]] = {
    "cut": (StreamTruncatedError, None),
    "stall": (StreamTimeoutError, None),
    "http_500": (ServerError, 500),
    "error_event": (ServerError, 400),
    "malformed_json": (StreamFormatError, None),
    "refused": (StreamConnectionError, None),
}
# Run as a tool, a fault must surface within this many seconds of the stream's start (read_timeout
# included); the report's slowest_error_s is the figure. The tests assert no time: they check each
# fault's error and the prefix kept.
ERROR_BOUND_S = 10.0


@dataclass
class RoundReport:
    round: int
    streams: int
    wall_s: float
    plans: dict[str, int]
    outcomes: dict[str, int]
    leaked_tasks: int
    open_sockets: int
    live_accumulators: int
    server_busy: int
    rss_mib: float
    slowest_error_s: float
    failures: list[str] = field(default_factory=list)
    open_fds: int = 0
    transport: str = "aiohttp"


# ---- process measurements -----------------------------------------------------------------------


def open_sockets() -> int:
    """Sockets this process holds open, counted in /proc/self/fd (no psutil)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass  # the fd of the listdir itself, closed meanwhile
    return count


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def live_accumulators() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o).__name__ in ("StreamAccumulator", "SseFramer"))


def refused_url() -> str:
    """A loopback URL whose port was just released: connecting is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/generate"


# ---- emulator subprocesses ----------------------------------------------------------------------


class EmulatorProcess:
    """``fastaccum emulator`` in a child process; ``url`` once it listens."""

    def __init__(self, *, incremental: bool, seed: int, lockstep: bool = False) -> None:
        # Lockstep (no token rate) sends every emission point as its own event, so a fault's
        # event index fixes the prefix exactly: 1 + STREAM_INTERVAL * (at - 1) tokens.
        rate = "0" if lockstep else str(TOKEN_RATE)
        args = [
            sys.executable,
            "-P",
            "-m",
            "fastaccum",
            "emulator",
            "--port",
            "0",
            "--token-rate",
            rate,
            "--stream-interval",
            str(STREAM_INTERVAL),
            "--max-running-requests",
            "4096",
            "--seed",
            str(seed),
        ]
        if incremental:
            args.append("--incremental-streaming-output")
        self.incremental = incremental
        self.truth = Emulator(seed=seed)  # never started: expected() is a pure function of the seed
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            self.close()
            raise RuntimeError(f"emulator did not start: {line!r}")
        self.url = line.rsplit(" ", 1)[1].strip()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


# ---- one round ----------------------------------------------------------------------------------


def payload(rid: str, n: int, fault: dict[str, Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "input_ids": PROMPT,
        "rid": rid,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": n},
    }
    if fault is not None:
        body["fastaccum_fault"] = fault
    return body


def check_prefix(server: EmulatorProcess, rid: str, result: Any, n: int) -> str | None:
    """None if every token, logprob and text byte of ``result`` equals the truth's prefix."""
    k = len(result)
    if k > n:
        return f"{rid}: {k} tokens, more than the {n} asked for"
    gen = server.truth.expected(rid, k, prompt_tokens=len(PROMPT))
    if not np.array_equal(result.token_ids, np.asarray(gen.token_ids, dtype=np.int32)):
        return f"{rid}: token ids differ from the truth"
    if k and (result.logprobs is None or not np.array_equal(result.logprobs, np.asarray(gen.logprobs))):
        return f"{rid}: logprobs differ from the truth"
    if k and result.text != gen.text(0, k):
        return f"{rid}: text differs from the truth"
    return None


async def one_stream(
    session: aiohttp.ClientSession,
    make: Any,
    servers: list[EmulatorProcess],
    rid: str,
    plan: str,
    rng: random.Random,
    failures: list[str],
) -> tuple[str, float]:
    """Run one planned stream; return (outcome, seconds until an expected error, else 0).

    ``servers``: cumulative and incremental emulators with a token rate, then a lockstep one that
    serves the fault plans.
    """
    server = servers[-1] if plan in EXPECTED_ERRORS else rng.choice(servers[:-1])
    n = rng.randrange(8, 400)
    fault: dict[str, Any] | None = None
    at = rng.randrange(1, 6)
    if plan in ("cut", "error_event", "malformed_json"):
        fault = {"kind": plan, "at": at}
    elif plan == "stall":
        fault = {"kind": "stall", "at": at, "seconds": STALL_SECONDS}
    elif plan == "http_500":
        fault = {"kind": "http_500"}
    if fault is not None:
        n = max(n, 64)  # long enough that the fault's event exists
    url = refused_url() if plan == "refused" else f"{server.url}/generate"
    stream = make(url, payload(rid, n, fault), READ_TIMEOUT if plan == "stall" else None)
    loop = asyncio.get_running_loop()
    delay = rng.uniform(0.0, 0.25)
    task = asyncio.ensure_future(stream.run())
    if plan == "abort":
        loop.call_later(delay, stream.abort)
    elif plan == "cancel":
        loop.call_later(delay, task.cancel)
    elif plan == "server_abort":

        async def abort_on_server() -> None:
            await asyncio.sleep(delay)
            async with session.post(f"{server.url}/abort_request", json={"rid": rid}) as response:
                await response.read()

        abort_task = asyncio.ensure_future(abort_on_server())
    started = loop.time()
    try:
        result = await task
    except asyncio.CancelledError:
        if plan != "cancel" or not task.cancelled():
            raise  # the round itself was cancelled
        error = check_prefix(server, rid, stream.snapshot(), n)
        if error:
            failures.append(error)
        return "cancelled", 0.0
    except StreamError as exc:
        elapsed = loop.time() - started
        expected = EXPECTED_ERRORS.get(plan)
        if expected is None or type(exc) is not expected[0]:
            failures.append(f"{rid} ({plan}): unexpected {exc!r}")
        elif expected[1] is not None and getattr(exc, "status", None) != expected[1]:
            failures.append(f"{rid} ({plan}): status {getattr(exc, 'status', None)}, not {expected[1]}")
        prefix = stream.snapshot()
        if prefix.finished:
            failures.append(f"{rid} ({plan}): a failed stream's prefix is finished")
        if plan in ("cut", "error_event", "malformed_json") and (
            exc.event_index != at or len(prefix) != 1 + STREAM_INTERVAL * (at - 1)
        ):
            failures.append(f"{rid} ({plan} at {at}): {exc!r} with {len(prefix)} tokens")
        if plan == "stall" and (exc.event_index is None or exc.event_index > at):
            failures.append(f"{rid} ({plan} at {at}): {exc!r}")
        error = check_prefix(server, rid, prefix, n)
        if error:
            failures.append(error)
        return type(exc).__name__, elapsed
    finally:
        if plan == "server_abort":
            await abort_task
    error = check_prefix(server, rid, result, n)
    if error:
        failures.append(error)
    if plan in EXPECTED_ERRORS:
        failures.append(f"{rid} ({plan}): no error")
    if result.aborted:
        # fastaccum.Client drains an abort: the result then ends with the server's abort event.
        if plan != "abort" or (result.finished and (result.finish_reason or {}).get("type") != "abort"):
            failures.append(f"{rid} ({plan}): unexpected aborted result")
        return "drained" if result.replay_complete else "aborted", 0.0
    if result.finish_reason == ABORT_REASON:
        if plan != "server_abort":
            failures.append(f"{rid} ({plan}): the server aborted it")
        return "server_aborted", 0.0
    if len(result) != n or result.finish_reason != {"type": "length", "length": n}:
        failures.append(f"{rid} ({plan}): incomplete result {result!r}")
    return "complete", 0.0


def plan_round(rng: random.Random, n: int) -> list[str]:
    kinds = list(PLANS)
    plans = list(kinds) if n >= len(kinds) else []  # every kind at least once
    plans += rng.choices(kinds, weights=[PLANS[k] for k in kinds], k=n - len(plans))
    rng.shuffle(plans)
    return plans


async def server_busy(session: aiohttp.ClientSession, servers: list[EmulatorProcess]) -> int:
    busy = 0
    for server in servers:
        async with session.get(f"{server.url}/v1/loads") as response:
            loads = await response.json()
        busy += loads["num_running_reqs"] + loads["num_waiting_reqs"]
    return busy


async def run_round(
    servers: list[EmulatorProcess],
    index: int,
    n: int,
    rng: random.Random,
    baseline_sockets: int,
    baseline_fds: int = 0,
    transport: str = "aiohttp",
) -> RoundReport:
    failures: list[str] = []
    plans = plan_round(rng, n)
    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT, connector=connector) as session:
        clients: dict[str, fastaccum.Client] = {}

        def make(url: str, body: dict[str, Any], read_timeout: float | None) -> Any:
            if transport == "aiohttp":
                return GenerateStream(session, url, body, read_timeout=read_timeout)
            base = url.rsplit("/generate", 1)[0]
            if base not in clients:
                clients[base] = fastaccum.Client(base)
            return clients[base].stream(body, read_timeout=read_timeout)

        try:
            outcomes = await asyncio.gather(
                *(
                    one_stream(
                        session, make, servers, f"r{index:02d}-s{i:04d}-", plan, random.Random(rng.random()), failures
                    )
                    for i, plan in enumerate(plans)
                )
            )
        finally:
            for client in clients.values():
                await client.close()
            clients.clear()
    wall = time.perf_counter() - started
    # Every abandoned request must be noticed by its server (no zombie decoding), within a grace.
    async with aiohttp.ClientSession() as probe:
        deadline = time.monotonic() + 10
        while (busy := await server_busy(probe, servers)) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    # Let transports finish closing, then count what is left.
    current = asyncio.current_task()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        leaked = [t for t in asyncio.all_tasks() if t is not current]
        sockets = open_sockets() - baseline_sockets
        fds = open_fds() - baseline_fds
        if not leaked and sockets <= 0 and fds <= 0:
            break
        await asyncio.sleep(0.02)
    if leaked:
        failures.append(f"{len(leaked)} tasks left: {leaked[:3]!r}")
    if sockets > 0:
        failures.append(f"{sockets} sockets left open")
    if baseline_fds and fds > 0:
        failures.append(f"{fds} file descriptors left open")
    if busy:
        failures.append(f"{busy} requests still running or queued on the emulators")
    live = live_accumulators()
    if live:
        failures.append(f"{live} accumulators still alive")
    return RoundReport(
        round=index,
        streams=n,
        wall_s=round(wall, 2),
        plans=dict(Counter(plans)),
        outcomes=dict(Counter(o for o, _ in outcomes)),
        leaked_tasks=len(leaked),
        open_sockets=max(sockets, 0),
        live_accumulators=live,
        server_busy=busy,
        rss_mib=round(rss_mib(), 1),
        slowest_error_s=round(max((t for _, t in outcomes), default=0.0), 2),
        failures=failures,
        open_fds=max(fds, 0),
        transport=transport,
    )


def run(
    streams: int, rounds: int, *, seed: int = 0, twin: str = "cython", log: Any = None, transport: str = "aiohttp"
) -> list[RoundReport]:
    """Start the emulators, run the rounds, stop the emulators; one report per round."""
    if twin == "python":
        from fastaccum import _py

        accumulator = _py.StreamAccumulator
    else:
        from fastaccum import _cy

        accumulator = _cy.StreamAccumulator
    # Each transport module names the twin its streams feed.
    transports = (fastaccum.transport.consumer, fastaccum.transport.aiohttp_stream, fastaccum.transport.request)
    saved = [module.StreamAccumulator for module in transports]
    for module in transports:
        module.StreamAccumulator = accumulator  # type: ignore[misc]
    servers = [
        EmulatorProcess(incremental=False, seed=seed),
        EmulatorProcess(incremental=True, seed=seed),
        EmulatorProcess(incremental=True, seed=seed, lockstep=True),
    ]
    try:

        async def main() -> list[RoundReport]:
            rng = random.Random(seed)
            baseline = open_sockets()
            baseline_fds = open_fds()
            reports = []
            for index in range(1, rounds + 1):
                report = await run_round(servers, index, streams, rng, baseline, baseline_fds, transport)
                reports.append(report)
                if log is not None:
                    print(_line(report), file=log, flush=True)
            return reports

        return asyncio.run(main())
    finally:
        for module, original in zip(transports, saved):
            module.StreamAccumulator = original  # type: ignore[misc]
        for server in servers:
            server.close()


def _line(r: RoundReport) -> str:
    return (
        f"round {r.round:2d}: {r.streams} streams in {r.wall_s:5.2f} s  rss {r.rss_mib:7.1f} MiB  "
        f"tasks {r.leaked_tasks}  sockets {r.open_sockets}  fds {r.open_fds}  accumulators {r.live_accumulators}  "
        f"server busy {r.server_busy}  slowest error {r.slowest_error_s:.2f} s  "
        f"failures {len(r.failures)}  {dict(sorted(r.outcomes.items()))}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--streams", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--twin", choices=("cython", "python"), default="cython")
    parser.add_argument("--transport", choices=("aiohttp", "client"), default="aiohttp")
    parser.add_argument(
        "--rss-growth-mib",
        type=float,
        default=32.0,
        help="fail if RSS grows more than this from round 2 to the last round",
    )
    parser.add_argument("--json", help="also write the reports to this file")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    reports = run(args.streams, args.rounds, seed=args.seed, twin=args.twin, log=sys.stdout, transport=args.transport)
    failures = [f for r in reports for f in r.failures]
    growth = reports[-1].rss_mib - reports[min(1, len(reports) - 1)].rss_mib
    print(
        f"{args.rounds} rounds x {args.streams} streams ({args.twin}) in {time.perf_counter() - started:.1f} s; "
        f"RSS per round {[r.rss_mib for r in reports]} MiB; growth after round 1: {growth:+.1f} MiB"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in reports], f, indent=1)
    for failure in failures[:50]:
        print("FAIL", failure)
    if growth > args.rss_growth_mib:
        print(f"FAIL RSS grew {growth:.1f} MiB (limit {args.rss_growth_mib})")
        return 1
    slowest = max(r.slowest_error_s for r in reports)
    if slowest > ERROR_BOUND_S:
        print(f"FAIL a fault surfaced {slowest:.1f} s after its stream started (limit {ERROR_BOUND_S} s)")
        return 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
