"""Ray shards: the caller's CPU with ``fastaccum.ray.ShardedClient`` against one ``fastaccum.Client`` loop.

Two measurements in one run (docs/scale.md turns them into a capacity model):

1. **Paced fleet.** Two emulator processes listen on one port (``SO_REUSEPORT``: the kernel spreads
   the connections over them, as a router would spread requests over engines) and pace every
   stream at ``--token-rate`` tokens/s, one event per token (interval 1, incremental, logprobs, no
   text: paced.py's shape). The same streams are read (a) by one ``Client`` in the caller's loop
   and (b) by ``ShardedClient(url, shards=2)``, alternately, ``--repeat`` times. Reported: the
   caller's CPU per token (``getrusage(RUSAGE_SELF)``: every thread of the caller process, Ray's
   own driver threads included; user and system apart), and from ``/proc/<pid>/stat`` the CPU of
   the shard actors, of Ray's other processes (raylet, GCS, idle workers) and of the emulators.
2. **Per-sample overhead.** One unpaced emulator process; one stream at a time of 1k, 8k and 32k
   tokens, with and without routed experts (48 layers x top-8, int32). For each, the wall time and
   the caller's CPU of ``await ShardedClient.stream(p).run()`` and of ``await Client.stream(p).run()``
   (alternating, median of ``--runs``), their difference, and the wall time outside the stream
   (wall minus the stream's own ``timing.duration_s``, measured where it was read), which leaves
   the emulator's speed out of the difference. Also: the result's size and the shard's CPU.

    python benchmarks/shards.py --json /tmp/shards.json          # ~2.5 min on 2 cores
    python benchmarks/shards.py --quick                          # small sizes, ~30 s: checks the script

Ray starts inside a temporary directory: Ray puts the driver's working directory on every worker's
``sys.path``, and from the checkout's root the source tree's ``fastaccum/`` (no compiled core)
would shadow the installed package in the shards. Nothing here is a result: every figure is
measured in the run that prints it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = [101, 102, 103, 104]  # tests/client_helpers.py's payload()
EXPERT_SHAPE = (48, 8)
TICK = os.sysconf("SC_CLK_TCK")


# ---- the emulator (own process) -----------------------------------------------------------------


def serve(port: int, token_rate: float) -> None:
    """One emulator process on ``port`` (0: a free one), ``SO_REUSEPORT`` so that a second process
    can share it; prints its URL, serves until stdin closes, then prints its /generate count."""
    from aiohttp import web

    from fastaccum.emulator import Emulator

    emulator = Emulator(
        incremental_streaming_output=True,
        skip_tokenizer_init=True,
        stream_interval=1,
        enable_return_routed_experts=True,
        num_layers=EXPERT_SHAPE[0],
        topk=EXPERT_SHAPE[1],
        num_experts=128,
        token_rate=token_rate or None,
        max_running_requests=4096,
    )

    async def main() -> None:
        runner = web.AppRunner(emulator.make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port, reuse_port=True).start()
        print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await emulator.stop()
        await runner.cleanup()
        print(json.dumps({"generate_calls": emulator.stats.calls.get("/generate", 0)}), flush=True)

    asyncio.run(main())


class Fleet:
    """``engines`` emulator processes sharing one port."""

    def __init__(self, engines: int, token_rate: float, cwd: str) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        port = 0
        for _ in range(engines):
            proc = subprocess.Popen(
                [sys.executable, "-P", os.path.abspath(__file__), "--serve", str(port), str(token_rate)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=cwd,
            )
            self.procs.append(proc)
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            if not line.startswith("http://"):
                self.close()
                raise RuntimeError(f"emulator did not start (exit status {proc.wait()})")
            self.url = line
            port = int(line.rsplit(":", 1)[1])

    @property
    def pids(self) -> set[int]:
        return {p.pid for p in self.procs}

    def close(self) -> list[int]:
        """Stop the emulators; the /generate calls each one served."""
        calls = []
        for proc in self.procs:
            if proc.stdin is not None and not proc.stdin.closed:
                proc.stdin.close()
        for proc in self.procs:
            try:
                assert proc.stdout is not None
                out = proc.stdout.read()
                proc.wait(30)
                calls.append(json.loads(out.strip().splitlines()[-1])["generate_calls"] if out.strip() else -1)
            except (subprocess.TimeoutExpired, ValueError, KeyError):
                proc.kill()
                proc.wait()
                calls.append(-1)
        return calls


# ---- CPU of other processes: /proc ------------------------------------------------------------


def _stat(pid: int) -> tuple[int, float, float] | None:
    """(ppid, user s, system s) of a live process, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), int(rest[11]) / TICK, int(rest[12]) / TICK


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def process_cpu(emulators: set[int]) -> dict[str, list[float]]:
    """User and system CPU seconds of the caller's descendants by kind: ``shards`` (Ray actors
    ``ray::_Shard``), ``emulators`` (the given pids) and ``ray`` (every other descendant: raylet,
    GCS, idle workers). The caller itself is left out (getrusage measures it)."""
    stats = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (s := _stat(int(name))) is not None:
            stats[int(name)] = s
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out = {"shards": [0.0, 0.0], "emulators": [0.0, 0.0], "ray": [0.0, 0.0]}
    todo = list(children.get(os.getpid(), ()))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, ()))
        kind = "emulators" if pid in emulators else "shards" if _cmdline(pid).startswith("ray::_Shard") else "ray"
        out[kind][0] += stats[pid][1]
        out[kind][1] += stats[pid][2]
    return out


def _delta(after: dict[str, list[float]], before: dict[str, list[float]]) -> dict[str, list[float]]:
    return {k: [after[k][0] - before[k][0], after[k][1] - before[k][1]] for k in after}


def _rusage() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


# ---- payloads and checks ------------------------------------------------------------------------


def payload(rid: str, n: int, routed: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"input_ids": PROMPT, "rid": rid, "return_logprob": True}
    body["sampling_params"] = {"max_new_tokens": n}
    if routed:
        body["return_routed_experts"] = True
    return body


def options(routed: bool) -> dict[str, Any]:
    return {"mode": "incremental", "expert_shape": EXPERT_SHAPE if routed else None}


def result_bytes(result: Any) -> int:
    """What a result carries: its arrays' bytes, plus its text's UTF-8 bytes."""
    size = len(result.text.encode()) if result.text else 0
    for name in ("token_ids", "logprobs", "top_p_token_ids", "top_p_token_offsets", "routed_experts", "indexer_topk"):
        array = getattr(result, name)
        if array is not None:
            size += array.nbytes
    return int(size)


_TRUTH: Any = None


def check(result: Any, rid: str, n: int, routed: bool) -> None:
    """Every token (and the routed experts) equals the emulator's truth."""
    global _TRUTH
    from fastaccum.emulator import Emulator

    if _TRUTH is None:
        _TRUTH = Emulator(skip_tokenizer_init=True, num_layers=EXPERT_SHAPE[0], topk=EXPERT_SHAPE[1], num_experts=128)
    if len(result) != n or not result.finished:
        raise AssertionError(f"{rid}: {len(result)} tokens of {n}, finish_reason {result.finish_reason}")
    gen = _TRUTH.expected(rid, n, prompt_tokens=len(PROMPT), routed_experts=routed)
    if not np.array_equal(result.token_ids, np.asarray(gen.token_ids, dtype=np.int32)):
        raise AssertionError(f"{rid}: token ids differ from the emulator's")
    if routed and not np.array_equal(result.routed_experts, gen.routed_experts):
        raise AssertionError(f"{rid}: routed experts differ from the emulator's")


# ---- 1. the paced fleet -------------------------------------------------------------------------


async def fleet_round(kind: str, reader: Any, fleet: Fleet, streams: int, tokens: int, tag: str) -> dict[str, Any]:
    rids = [f"{tag}-{i:04d}" for i in range(streams)]
    procs, wall = process_cpu(fleet.pids), time.perf_counter()
    user, system = _rusage()
    results = await asyncio.gather(*(reader.stream(payload(rid, tokens), **options(False)).run() for rid in rids))
    user2, system2 = _rusage()
    wall, procs = time.perf_counter() - wall, _delta(process_cpu(fleet.pids), procs)
    for rid, result in zip(rids, results):
        check(result, rid, tokens, False)
    n = streams * tokens
    us = 1e6 / n
    return {
        "reader": kind,
        "wall_s": wall,
        "tokens": n,
        "caller_user_us_per_token": (user2 - user) * us,
        "caller_sys_us_per_token": (system2 - system) * us,
        "caller_total_us_per_token": (user2 - user + system2 - system) * us,
        **{f"{k}_{m}_us_per_token": v[i] * us for k, v in procs.items() for i, m in enumerate(("user", "sys"))},
    }


async def idle(seconds: float, emulators: set[int]) -> dict[str, float]:
    """CPU per second of wall time while nothing streams (Ray up, the shards started): what the
    caller's Ray driver threads and Ray's processes cost on their own."""
    procs, wall = process_cpu(emulators), time.perf_counter()
    user, system = _rusage()
    await asyncio.sleep(seconds)
    user2, system2 = _rusage()
    wall, procs = time.perf_counter() - wall, _delta(process_cpu(emulators), procs)
    return {
        "seconds": wall,
        "caller_user_ms_per_s": (user2 - user) / wall * 1e3,
        "caller_sys_ms_per_s": (system2 - system) / wall * 1e3,
        **{f"{k}_ms_per_s": sum(v) / wall * 1e3 for k, v in procs.items()},
    }


async def measure_fleet(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    from fastaccum.ray import ShardedClient
    from fastaccum.transport.client import Client

    fleet = Fleet(args.engines, args.token_rate, tmp)
    runs: list[dict[str, Any]] = []
    try:
        async with (
            Client(fleet.url) as client,
            ShardedClient(fleet.url, shards=args.shards) as sharded,
        ):
            warm_up: list[tuple[Any, str]] = [(client, "wc"), (sharded, "ws")]
            # Warm both: connections open, the shards' actors started and their imports done.
            for reader, tag in warm_up:
                await asyncio.gather(
                    *(reader.stream(payload(f"{tag}-{i}", 20), **options(False)).run() for i in range(4))
                )
            idle_rates = await idle(args.idle, fleet.pids)
            print(
                f"  idle: caller {idle_rates['caller_user_ms_per_s'] + idle_rates['caller_sys_ms_per_s']:.1f} ms/s",
                flush=True,
            )
            for r in range(args.repeat):
                order = [("client", client), ("sharded", sharded)]
                for kind, reader in order if r % 2 == 0 else order[::-1]:
                    runs.append(await fleet_round(kind, reader, fleet, args.streams, args.tokens, f"f{r}{kind[0]}"))
                    m = runs[-1]
                    print(
                        f"  fleet round {r + 1} {kind}: caller {m['caller_total_us_per_token']:.2f} µs/token, "
                        f"wall {m['wall_s']:.1f} s",
                        flush=True,
                    )
    finally:
        calls = fleet.close()
    out: dict[str, Any] = {
        "engines": args.engines,
        "shards": args.shards,
        "streams": args.streams,
        "tokens_per_stream": args.tokens,
        "token_rate_per_stream": args.token_rate,
        "stream_interval": 1,
        "generate_calls_per_engine": calls,
        "idle": idle_rates,
        "runs": runs,
        "best": {},
    }
    for kind in ("client", "sharded"):
        out["best"][kind] = min((m for m in runs if m["reader"] == kind), key=lambda m: m["caller_total_us_per_token"])
    a, b = out["best"]["client"], out["best"]["sharded"]
    out["sharded_over_client"] = {
        part: b[f"caller_{part}_us_per_token"] / a[f"caller_{part}_us_per_token"]
        if a[f"caller_{part}_us_per_token"]
        else None
        for part in ("user", "sys", "total")
    }
    return out


# ---- 2. per-sample overhead ---------------------------------------------------------------------


async def sample_once(reader: Any, rid: str, n: int, routed: bool, emulators: set[int]) -> tuple[dict[str, Any], Any]:
    procs = process_cpu(emulators)
    user, system = _rusage()
    wall = time.perf_counter()
    result = await reader.stream(payload(rid, n, routed), **options(routed)).run()
    wall = time.perf_counter() - wall
    user2, system2 = _rusage()
    shard = _delta(process_cpu(emulators), procs)["shards"]
    return {
        "wall_ms": wall * 1e3,
        "outside_stream_ms": (wall - result.timing.duration_s) * 1e3,
        "caller_user_ms": (user2 - user) * 1e3,
        "caller_sys_ms": (system2 - system) * 1e3,
        "caller_ms": (user2 - user + system2 - system) * 1e3,
        "shard_ms": (shard[0] + shard[1]) * 1e3,
    }, result


async def measure_samples(args: argparse.Namespace, tmp: str) -> list[dict[str, Any]]:
    from fastaccum.ray import ShardedClient
    from fastaccum.transport.client import Client

    fleet = Fleet(1, 0.0, tmp)
    rows: list[dict[str, Any]] = []
    try:
        async with Client(fleet.url) as client, ShardedClient(fleet.url, shards=1) as sharded:
            warm_up: list[tuple[Any, str]] = [(client, "wc"), (sharded, "ws")]
            for reader, tag in warm_up:
                for routed in (False, True):
                    await reader.stream(payload(f"{tag}-{routed}", 200, routed), **options(routed)).run()
            idle_rates = await idle(args.idle, fleet.pids)
            idle_ms_per_ms = (idle_rates["caller_user_ms_per_s"] + idle_rates["caller_sys_ms_per_s"]) / 1e3
            for n in args.sizes:
                for routed in (False, True):
                    runs: dict[str, list[dict[str, Any]]] = {"client": [], "sharded": []}
                    size = 0
                    readonly = None
                    for r in range(args.runs):
                        # A rid of its own per reader: the emulator caches a generation by rid, so a
                        # repeated rid would be served faster to whichever reader came second.
                        rid = f"s{n}-{int(routed)}-{r}"
                        order = [("client", client), ("sharded", sharded)]
                        got = {}
                        for kind, reader in order if r % 2 == 0 else order[::-1]:
                            m, got[kind] = await sample_once(reader, f"{rid}-{kind}", n, routed, fleet.pids)
                            runs[kind].append(m)
                        for kind, result in got.items():
                            check(result, f"{rid}-{kind}", n, routed)
                        size = result_bytes(got["sharded"])
                        if size != result_bytes(got["client"]):
                            raise AssertionError(f"{rid}: the shard's result has another size than the Client's")
                        arrays = [got["sharded"].token_ids, got["sharded"].logprobs, got["sharded"].routed_experts]
                        readonly = not any(a.flags.writeable for a in arrays if a is not None)
                        del got
                    med = {
                        kind: {key: statistics.median(m[key] for m in ms) for key in ms[0]} for kind, ms in runs.items()
                    }
                    for kind, ms in runs.items():  # /proc counts in clock ticks (10 ms): the mean resolves more
                        med[kind]["shard_ms"] = statistics.fmean(m["shard_ms"] for m in ms)
                        # the caller's CPU less what its idle Ray driver threads take over the same wall time
                        med[kind]["caller_net_of_idle_ms"] = statistics.median(
                            m["caller_ms"] - idle_ms_per_ms * m["wall_ms"] for m in ms
                        )
                    row = {
                        "tokens": n,
                        "routed_experts": routed,
                        "result_bytes": size,
                        "sharded_arrays_read_only": readonly,
                        "median": med,
                        "wall_diff_ms": med["sharded"]["wall_ms"] - med["client"]["wall_ms"],
                        "outside_stream_diff_ms": med["sharded"]["outside_stream_ms"]
                        - med["client"]["outside_stream_ms"],
                        "caller_diff_ms": med["sharded"]["caller_ms"] - med["client"]["caller_ms"],
                        "idle": idle_rates,
                        "runs": runs,
                    }
                    rows.append(row)
                    print(
                        f"  sample {n} tokens{' + routed experts' if routed else ''}: "
                        f"wall {row['wall_diff_ms']:+.1f} ms, "
                        f"outside the stream {row['outside_stream_diff_ms']:+.1f} ms, caller CPU "
                        f"{med['sharded']['caller_ms']:.2f} against {med['client']['caller_ms']:.2f} ms",
                        flush=True,
                    )
    finally:
        fleet.close()
    return rows


# ---- report -------------------------------------------------------------------------------------


def fleet_table(fleet: dict[str, Any]) -> str:
    lines = [
        f"Paced fleet: {fleet['engines']} engines, {fleet['streams']} streams x {fleet['tokens_per_stream']} tokens "
        f"at {fleet['token_rate_per_stream']:g} tokens/s, interval 1; best of {len(fleet['runs']) // 2} rounds "
        f"(µs of CPU per token; /generate calls per engine: {fleet['generate_calls_per_engine']})",
        "",
        "| reader | caller user | caller sys | caller total | shards user | shards sys | Ray's other processes "
        "| emulators | wall s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, label in (("client", "one Client loop"), ("sharded", f"ShardedClient, {fleet['shards']} shards")):
        m = fleet["best"][kind]
        lines.append(
            f"| {label} | {m['caller_user_us_per_token']:.2f} | {m['caller_sys_us_per_token']:.2f} | "
            f"{m['caller_total_us_per_token']:.2f} | {m['shards_user_us_per_token']:.2f} | "
            f"{m['shards_sys_us_per_token']:.2f} | {m['ray_user_us_per_token'] + m['ray_sys_us_per_token']:.2f} | "
            f"{m['emulators_user_us_per_token'] + m['emulators_sys_us_per_token']:.1f} | {m['wall_s']:.1f} |"
        )
    r = fleet["sharded_over_client"]
    ratio = " ".join(f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in r.items())
    i = fleet["idle"]
    lines += [
        "",
        f"Caller CPU, sharded / one loop: {ratio}",
        f"Idle for {i['seconds']:.1f} s (Ray up, shards started, no stream), CPU ms per s: caller "
        f"{i['caller_user_ms_per_s']:.2f} user + {i['caller_sys_ms_per_s']:.2f} sys, "
        f"shards {i['shards_ms_per_s']:.1f}, "
        f"Ray's other processes {i['ray_ms_per_s']:.1f}",
    ]
    return "\n".join(lines)


def sample_table(rows: list[dict[str, Any]], runs: int) -> str:
    i = rows[0]["idle"] if rows else {}
    lines = [
        f"Per sample, one stream at a time, unpaced emulator (median of {runs}; ms; net of idle: less the "
        f"caller's idle CPU rate, {i.get('caller_user_ms_per_s', 0) + i.get('caller_sys_ms_per_s', 0):.2f} ms/s, "
        "times the wall time)",
        "",
        "| tokens | routed experts | result bytes | wall: Client | wall: sharded | wall diff | outside the stream "
        "diff | caller CPU: Client | caller CPU: sharded (user, sys) | net of idle: Client | net of idle: sharded "
        "| shard CPU (mean) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        c, s = row["median"]["client"], row["median"]["sharded"]
        lines.append(
            f"| {row['tokens']:,} | {'48x8' if row['routed_experts'] else 'no'} | {row['result_bytes']:,} | "
            f"{c['wall_ms']:.1f} | {s['wall_ms']:.1f} | {row['wall_diff_ms']:+.1f} | "
            f"{row['outside_stream_diff_ms']:+.1f} | "
            f"{c['caller_ms']:.2f} | {s['caller_ms']:.2f} ({s['caller_user_ms']:.2f}, {s['caller_sys_ms']:.2f}) | "
            f"{c['caller_net_of_idle_ms']:.2f} | {s['caller_net_of_idle_ms']:.2f} | {s['shard_ms']:.1f} |"
        )
    return "\n".join(lines)


def machine() -> dict[str, Any]:
    import ray

    import fastaccum

    commit = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    cpu = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "fastaccum": getattr(fastaccum, "__version__", None),
        "implementation": fastaccum.IMPLEMENTATION,
        "ray": ray.__version__,
        "git_commit": commit.stdout.strip() or None,
        "loadavg_start": os.getloadavg(),
    }


async def run_all(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    report: dict[str, Any] = {}
    if not args.skip_fleet:
        print("1. paced fleet", flush=True)
        report["fleet"] = await measure_fleet(args, tmp)
    if args.sizes:
        print("2. per-sample overhead", flush=True)
        report["samples"] = await measure_samples(args, tmp)
    return report


def main(argv: list[str] | None = None) -> int:
    assert __doc__ is not None
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (~30 s): checks the script")
    parser.add_argument("--engines", type=int, default=2, help="emulator processes in the paced fleet")
    parser.add_argument("--shards", type=int, default=2, help="ShardedClient shards in the paced fleet")
    parser.add_argument("--streams", type=int, default=128, help="concurrent streams in the paced fleet")
    parser.add_argument("--tokens", type=int, default=2000, help="tokens per paced stream")
    parser.add_argument("--token-rate", type=float, default=100.0, help="tokens/s per paced stream")
    parser.add_argument("--repeat", type=int, default=2, help="fleet rounds per reader (alternating)")
    parser.add_argument("--sizes", default="1000,8000,32000", help="per-sample sizes in tokens ('' skips)")
    parser.add_argument("--runs", type=int, default=5, help="per-sample runs per size and reader (median)")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of idle CPU measured (Ray up, no stream)")
    parser.add_argument("--skip-fleet", action="store_true", help="only the per-sample overhead")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(int(args.serve[0]), float(args.serve[1]))
        return 0
    if args.quick:
        args.streams, args.tokens, args.repeat, args.runs = min(args.streams, 32), min(args.tokens, 300), 1, 3
        args.idle = min(args.idle, 2.0)
        args.sizes = "1000,8000"
    args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    with tempfile.TemporaryDirectory(prefix="fastaccum-shards-") as tmp:
        with contextlib.chdir(tmp):  # Ray puts this directory on every worker's sys.path
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            info = machine()
            report = asyncio.run(run_all(args, tmp))
        finally:
            ray.shutdown()
    info["loadavg_end"] = os.getloadavg()
    report = {"machine": info, **report}
    print()
    print(
        f"{info['date']}, {info['cpus']} CPUs ({info['cpu']}), fastaccum {info['fastaccum']} "
        f"({info['implementation']}), ray {info['ray']}, "
        f"load {info['loadavg_start'][0]:.2f} -> {info['loadavg_end'][0]:.2f}"
    )
    if "fleet" in report:
        print()
        print(fleet_table(report["fleet"]))
    if "samples" in report:
        print()
        print(sample_table(report["samples"], args.runs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
