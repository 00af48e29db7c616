"""Core benchmark: fastaccum's twins against a naive consumer and the orjson floor on W1, W2, W3.

``pytest benchmarks``: pytest-benchmark cases, impl x workload at reduced sizes, with the naive and
floor times of the same run and their ratios in ``extra_info`` (CI: ``--benchmark-disable``).
``python benchmarks/bench_core.py``: the full-size workloads, every consumer in one run, a
table of times and target ratios, W3 peak memory in fresh subprocesses, ``--json`` with machine
info. Workloads come from ``fastaccum.emulator.writer`` and are fed in 64 KiB pieces. Goals are ratios
against baselines timed in the same run; nothing here asserts a time. See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import functools
import gc
import importlib
import json
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson
import pytest

from fastaccum.emulator import writer

PIECE_BYTES = 64 * 1024  # every workload is fed in 64 KiB pieces (a typical socket read)
TWINS = {"compiled": "fastaccum._cy", "pure": "fastaccum._py"}
CONSUMERS = ("compiled", "pure", "naive", "floor")


# ---- workloads ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkloadSpec:
    """One SGLang stream shape: what the server was asked for and how the client reads it."""

    name: str
    mode: str  # "incremental" | "cumulative": the server flag, and the mode the twins are given
    tokens: int
    prompt_tokens: int = 1024
    interval: int = 20
    text: bool = True  # False: --skip-tokenizer-init, no "text" key at all
    top_p: bool = False
    expert_shape: tuple[int, int] | None = None  # (layers, topk) of routed experts

    def describe(self) -> str:
        parts = [
            self.mode,
            f"{self.tokens:,} tokens",
            f"interval {self.interval}",
            "logprobs",
            "text" if self.text else "no text",
        ] + ["top-p"] * self.top_p
        if self.expert_shape:
            parts.append(f"routed experts {'x'.join(map(str, self.expert_shape))}, prompt {self.prompt_tokens:,}")
        return ", ".join(parts)

    def accumulate_kwargs(self) -> dict[str, Any]:
        return {"mode": self.mode, **({"expert_shape": self.expert_shape} if self.expert_shape else {})}

    def routed_bytes(self) -> int:
        """Size of the decoded routed-experts array (0 without routed experts)."""
        layers, topk = self.expert_shape or (0, 0)
        return max(self.prompt_tokens + self.tokens - 1, 0) * layers * topk * 4


# The core workloads. W1 "logprobs, no text extras" is read as the suite's "logprobs only" payload:
# --skip-tokenizer-init (no text key, logprob triples end in null). W1text is the same stream with
# incremental text deltas, for comparison; it is not part of the targets.
FULL: dict[str, WorkloadSpec] = {
    "W1": WorkloadSpec("W1", "incremental", 500_000, text=False),
    "W2": WorkloadSpec("W2", "cumulative", 16_000),
    "W3": WorkloadSpec("W3", "incremental", 62_000, prompt_tokens=2_000, top_p=True, expert_shape=(48, 8)),
    "W1text": WorkloadSpec("W1text", "incremental", 500_000),
}
# pytest-benchmark sizes: same shapes, small enough that both twins run in seconds.
REDUCED: dict[str, WorkloadSpec] = {
    "W1": WorkloadSpec("W1", "incremental", 50_000, text=False),
    "W2": WorkloadSpec("W2", "cumulative", 4_000),
    "W3": WorkloadSpec("W3", "incremental", 7_680, prompt_tokens=512, top_p=True, expert_shape=(48, 8)),
}


@dataclass
class Expected:
    """What every consumer must return for a workload, taken from the generation itself."""

    token_ids: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float64]
    text: str | None
    top_p_token_ids: npt.NDArray[np.int32] | None
    top_p_token_offsets: npt.NDArray[np.int32] | None
    routed_experts: npt.NDArray[np.int32] | None
    events: int  # JSON data events ([DONE] excluded)


@dataclass
class Workload:
    spec: WorkloadSpec
    pieces: list[bytes]
    expected: Expected


def _progress(iterable: Iterable[Any], total: int, desc: str, enabled: bool) -> Iterable[Any]:
    if not enabled or not sys.stderr.isatty():
        return iterable
    try:
        from tqdm import tqdm
    except ImportError:
        return iterable
    return tqdm(iterable, total=total, desc=desc, unit="event", leave=False)


def stream_of(spec: WorkloadSpec, *, progress: bool = False) -> tuple[bytes, Expected]:
    """The workload's SSE bytes (ending in [DONE]) and the outputs they must produce."""
    gen = writer.synthetic_generation(
        spec.name,
        spec.tokens,
        prompt_tokens=spec.prompt_tokens,
        top_p=spec.top_p,
        expert_shape=spec.expert_shape,
    )
    opts = writer.WireOptions(incremental=spec.mode == "incremental", skip_tokenizer_init=not spec.text)
    points = writer.emission_points(spec.tokens, spec.interval, opts.version)
    events = writer.stream_events(gen, opts, points=points)
    body = b"".join(writer.sse(e) for e in _progress(events, len(points), f"build {spec.name}", progress))
    rows = gen.top_p_rows
    expected = Expected(
        token_ids=np.asarray(gen.token_ids, dtype=np.int32),
        logprobs=np.array([math.nan if x is None else x for x in gen.logprobs], dtype=np.float64),
        text=gen.text(0, spec.tokens) if spec.text else None,
        top_p_token_ids=None if rows is None else np.array([t for r in rows for t in r], dtype=np.int32),
        top_p_token_offsets=None if rows is None else np.cumsum([0, *map(len, rows)], dtype=np.int32),
        routed_experts=gen.routed_experts,
        events=len(points),
    )
    return body + writer.DONE, expected


def build(spec: WorkloadSpec, *, progress: bool = False) -> Workload:
    body, expected = stream_of(spec, progress=progress)
    return Workload(spec, writer.split_pieces(body, [PIECE_BYTES]), expected)


def read_pieces(path: str) -> list[bytes]:
    """A stream file as 64 KiB pieces, read piece by piece so the whole never sits in memory twice."""
    with open(path, "rb", buffering=0) as f:
        return list(iter(lambda: f.read(PIECE_BYTES), b""))


# ---- baselines: the orjson floor and the naive consumer -----------------------------------------


def orjson_floor(pieces: Iterable[bytes]) -> int:
    """Split lines on bytes and orjson.loads every data event, nothing else; returns the count.

    The lower bound for any consumer that parses every event with orjson: no validation, no copies
    into arrays, no base64. Lines are joined only when one spans pieces (linear, no re-scan).
    """
    loads = orjson.loads
    events = 0
    tail: list[bytes] = []
    for piece in pieces:
        lines = piece.split(b"\n")  # a piece without LF comes back as itself, uncopied
        if len(lines) == 1:
            tail.append(piece)
            continue
        if tail:
            tail.append(lines[0])
            lines[0] = b"".join(tail)
        tail = [lines.pop()]
        for line in lines:
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                loads(memoryview(line)[6:])
                events += 1
    return events


@dataclass
class NaiveResult:
    token_ids: list[int]
    logprobs: list[float]
    text: str | None
    top_p_token_ids: npt.NDArray[np.int32] | None
    top_p_token_offsets: npt.NDArray[np.int32] | None
    routed_experts: npt.NDArray[np.int32] | None
    events: int


def naive_events(pieces: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The naive consumers' reading of the stream: every data event but [DONE], json.loads'd.

    A careful version of what users write: UTF-8 decoded incrementally (a character may straddle
    pieces), lines split on LF only (str.splitlines would break on U+2028 inside text), partial
    lines joined once.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    partial: list[str] = []
    for piece in pieces:
        chunk = decoder.decode(piece)
        if "\n" not in chunk:
            partial.append(chunk)
            continue
        lines = chunk.split("\n")
        partial.append(lines[0])
        lines[0] = "".join(partial)
        partial = [lines.pop()]
        for line in lines:
            if line.startswith("data: ") and line != "data: [DONE]":
                yield json.loads(line[6:])


def naive_consume(pieces: Iterable[bytes], *, mode: str, expert_shape: tuple[int, int] | None = None) -> NaiveResult:
    """The consumer users write today: decode to str, split lines, json.loads per event, lists.

    Events are read by ``naive_events``; null logprobs are made NaN, the cumulative stream is read
    from its last event, and the base64 arrays go through stdlib base64 and np.frombuffer.
    """
    ids: list[int] = []
    logprobs: list[float] = []
    texts: list[str] = []
    last: dict[str, Any] | None = None
    events = 0
    for event in naive_events(pieces):
        if "error" in event:
            raise RuntimeError(f"server error: {event['error']}")
        events += 1
        last = event
        if mode == "incremental":
            for logprob, token_id, _ in event["meta_info"]["output_token_logprobs"]:
                ids.append(token_id)
                logprobs.append(math.nan if logprob is None else logprob)
            if "text" in event:
                texts.append(event["text"])
    if last is None or last["meta_info"]["finish_reason"] is None:
        raise RuntimeError("stream ended before the terminal event")
    meta = last["meta_info"]
    text: str | None = "".join(texts) if texts else None
    if mode == "cumulative":
        for logprob, token_id, _ in meta["output_token_logprobs"]:
            ids.append(token_id)
            logprobs.append(math.nan if logprob is None else logprob)
        text = last.get("text")

    def int32s(key: str) -> npt.NDArray[np.int32] | None:
        value = meta.get(key)
        return None if value is None else np.frombuffer(base64.b64decode(value), dtype="<i4")

    routed = int32s("routed_experts")
    if routed is not None and expert_shape is not None:
        routed = routed.reshape(-1, *expert_shape)
    return NaiveResult(ids, logprobs, text, int32s("top_p_token_ids"), int32s("top_p_token_offsets"), routed, events)


def check_outputs(who: str, got: Any, expected: Expected) -> None:
    """Fail unless ``got`` (a StreamResult or NaiveResult) holds exactly the expected outputs."""

    def same(field: str, a: Any, b: Any, **kw: Any) -> None:
        if (a is None) != (b is None) or (a is not None and not np.array_equal(np.asarray(a), b, **kw)):
            raise AssertionError(f"{who}: {field} differs from the generation")

    same("token_ids", got.token_ids, expected.token_ids)
    same("logprobs", got.logprobs, expected.logprobs, equal_nan=True)
    if got.text != expected.text:
        raise AssertionError(f"{who}: text differs from the generation")
    same("top_p_token_ids", got.top_p_token_ids, expected.top_p_token_ids)
    same("top_p_token_offsets", got.top_p_token_offsets, expected.top_p_token_offsets)
    same("routed_experts", got.routed_experts, expected.routed_experts)
    if got.events != expected.events:
        raise AssertionError(f"{who}: {got.events} events, expected {expected.events}")


def consumer_fn(name: str, spec: WorkloadSpec) -> Callable[[Sequence[bytes]], Any]:
    """The callable that consumes a workload's pieces (imports a twin; ImportError if unbuilt)."""
    if name == "floor":
        return orjson_floor
    if name == "naive":
        return lambda pieces: naive_consume(pieces, mode=spec.mode, expert_shape=spec.expert_shape)
    accumulate = importlib.import_module(TWINS[name]).accumulate
    kwargs = spec.accumulate_kwargs()
    return lambda pieces: accumulate(pieces, **kwargs)


def check_consumer(name: str, out: Any, expected: Expected) -> None:
    if name == "floor":
        if out != expected.events:
            raise AssertionError(f"floor parsed {out} events, expected {expected.events}")
    else:
        check_outputs(name, out, expected)


# ---- timing ------------------------------------------------------------------------------------


def time_once(fn: Callable[[], Any]) -> tuple[float, Any]:
    """One timed call. The garbage collector stays enabled during the call, as in a real client
    (and pytest-benchmark's default): the naive consumer's many small lists pay for collections,
    which is part of its real cost.

    Everything alive before the call is frozen out of the collector's sight for it. Otherwise each
    full collection during the call walks the whole process, and how big that is depends on what
    the run happened to import: with pytest's few tens of thousands of objects the orjson floor
    spent a fifth of its time in such walks, a larger import set made it 20% faster, and every
    ratio against the floor moved with the import set while no consumer changed."""
    gc.collect()
    gc.freeze()
    try:
        start = time.perf_counter()
        out = fn()
        return time.perf_counter() - start, out
    finally:
        gc.unfreeze()


def time_runs(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """Best of ``repeat`` calls, and the first call's output."""
    best, first = time_once(fn)
    for _ in range(repeat - 1):
        best = min(best, time_once(fn)[0])
    return best, first


TIMED_ROUNDS = 5
# Sub-millisecond cases (cumulative at interval 20 or 64) need hundreds of samples: with 30, their
# best-of still moved 15-20% between runs of one build, as much as the regression threshold.
MAX_ROUNDS = 400


def rounds_for(seconds: float) -> int:
    """Best-of rounds: at least TIMED_ROUNDS, more for short cases (about 0.25 s of each)."""
    return max(TIMED_ROUNDS, min(MAX_ROUNDS, int(0.25 / max(seconds, 1e-6))))


def interleaved_best(fns: dict[str, Any]) -> tuple[dict[str, float], dict[str, Any]]:
    """Best time of each consumer, runs interleaved (a, b, c, a, b, c, ...) so that all of them
    sample the same quiet and noisy stretches of a shared machine; also each one's first output.
    Timed back to back instead, a neighbour hogging the core for a second lands on one consumer
    only and moves the ratio by up to 2x on this 2-core VM."""
    best: dict[str, float] = {}
    first: dict[str, Any] = {}
    for name, fn in fns.items():
        best[name], first[name] = time_once(fn)
    rounds = {name: rounds_for(t) for name, t in best.items()}
    for r in range(1, max(rounds.values())):
        for name, fn in fns.items():
            if r < rounds[name]:
                best[name] = min(best[name], time_once(fn)[0])
    return best, first


# ---- peak memory (script mode, one fresh subprocess per consumer) -------------------------------


def _proc_status_kib() -> dict[str, int]:
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {key: int(fields[key].split()[0]) for key in ("VmHWM", "VmRSS")}


def _reset_hwm() -> bool:
    """Reset the RSS high-water mark to the current RSS (Linux: clear_refs "5")."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def memory_child(consumer: str, workload: str, size: str, path: str) -> dict[str, Any]:
    """Runs in a fresh process: peak RSS growth and tracemalloc peak of one consumer on one stream."""
    spec = (FULL if size == "full" else REDUCED)[workload]
    fn = consumer_fn(consumer, spec)  # imports before the baseline
    pieces = read_pieces(path)
    gc.collect()
    hwm_reset = _reset_hwm()
    before, faults = _proc_status_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    start = time.perf_counter()
    out = fn(pieces)
    seconds = time.perf_counter() - start
    after, faults = _proc_status_kib(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    del out
    gc.collect()
    tracemalloc.start()
    fn(pieces)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "consumer": consumer,
        "seconds": seconds,
        "hwm_reset": hwm_reset,
        "minor_page_faults": faults,
        # Without the reset the HWM may predate the run: then growth is an upper bound.
        "rss_growth_bytes": (after["VmHWM"] - before["VmRSS"]) * 1024,
        "rss_retained_bytes": (after["VmRSS"] - before["VmRSS"]) * 1024,
        "tracemalloc_peak_bytes": traced_peak,
    }


def measure_memory(spec: WorkloadSpec, size: str, body: bytes, consumers: Sequence[str]) -> dict[str, Any]:
    """Peak memory of each consumer on ``body``, each in its own fresh interpreter."""
    results: dict[str, Any] = {}
    with tempfile.NamedTemporaryFile(prefix=f"fastaccum-{spec.name}-", suffix=".sse") as f:
        f.write(body)
        f.flush()
        for name in consumers:
            cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", name, spec.name, size, f.name]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                results[name] = {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
                continue
            entry = json.loads(proc.stdout.strip().splitlines()[-1])
            entry["growth_over_routed"] = entry["rss_growth_bytes"] / spec.routed_bytes()
            entry["tracemalloc_over_routed"] = entry["tracemalloc_peak_bytes"] / spec.routed_bytes()
            results[name] = entry
    return results


# ---- script mode -------------------------------------------------------------------------------

# (workload, numerator, denominator, bound, fast-path bound, kind): the core targets, for the
# compiled twin, and the stricter fast-path ones; the same ratios are printed for the
# pure twin as information.
TARGETS = (
    ("W1", "compiled", "floor", 1.2, 0.35, "max"),
    ("W1", "naive", "compiled", 3.0, 10.0, "min"),
    ("W2", "compiled", "floor", 0.1, 0.05, "max"),
    ("W3", "compiled", "floor", 0.3, 0.15, "max"),
)
MEMORY_TARGET, FAST_PATH_MEMORY_TARGET = 3.0, 1.2  # W3 peak RSS growth / decoded routed experts


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    versions: dict[str, str | None] = {}
    for dist in ("numpy", "orjson", "pybase64", "fastaccum", "Cython"):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    git = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain"], capture_output=True, text=True)
    import fastaccum

    return {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "versions": versions,
        "fastaccum_implementation": getattr(fastaccum, "IMPLEMENTATION", None),
        "git_commit": git.stdout.strip() or None,
        "git_dirty": bool(dirty.stdout.strip()),
        "loadavg_start": os.getloadavg(),
    }


def _fmt_time(seconds: float) -> str:
    return f"{seconds * 1e3:9.1f} ms" if seconds < 10 else f"{seconds:9.2f} s "


def run_workload(spec: WorkloadSpec, size: str, args: argparse.Namespace) -> dict[str, Any]:
    """Build one workload, time every consumer on it (round-robin), measure W3's peak memory."""
    print(f"\n{spec.name}: {spec.describe()}", flush=True)
    t0 = time.perf_counter()
    body, expected = stream_of(spec, progress=not args.no_progress)
    pieces = writer.split_pieces(body, [PIECE_BYTES])
    report: dict[str, Any] = {
        "description": spec.describe(),
        "tokens": spec.tokens,
        "events": expected.events,
        "stream_bytes": len(body),
        "pieces": len(pieces),
        "build_seconds": time.perf_counter() - t0,
        "routed_experts_bytes": spec.routed_bytes(),
        "consumers": {},
    }
    print(
        f"    {expected.events:,} events, {len(body) / 1e6:,.1f} MB in {len(pieces):,} pieces "
        f"(built in {report['build_seconds']:.1f} s)"
    )
    errors: dict[str, str] = {}
    fns: dict[str, Callable[[Sequence[bytes]], Any]] = {}
    for name in args.consumers:
        try:
            fns[name] = consumer_fn(name, spec)
        except (ImportError, AttributeError) as exc:  # unbuilt, or a twin still being written
            errors[name] = f"not importable: {exc}"
    # Round-robin, so that on a noisy machine every consumer sees the same slow and fast stretches.
    runs: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(args.repeat):
        for name in [n for n in fns if n not in errors and (not round_ or sum(runs[n]) < args.budget)]:
            try:
                seconds, out = time_once(functools.partial(fns[name], pieces))
                if round_ == 0:  # outputs checked once, outside the timed region
                    check_consumer(name, out, expected)
            except Exception as exc:  # a twin under construction may fail; report it and go on
                errors[name] = f"FAILED {type(exc).__name__}: {exc}"
                continue
            del out
            runs[name].append(seconds)
    del pieces
    floor = min(runs["floor"]) if runs.get("floor") and "floor" not in errors else None
    for name in args.consumers:
        if name in errors:
            report["consumers"][name] = {"error": errors[name]}
            print(f"    {name:<9} {errors[name]}")
            continue
        best = min(runs[name])
        report["consumers"][name] = {
            "best_seconds": best,
            "runs_seconds": runs[name],
            "over_floor": best / floor if floor else None,
        }
        print(f"    {name:<9} {_fmt_time(best)}  ({len(runs[name])} runs, {len(body) / best / 1e6:,.0f} MB/s)")
    if expected.routed_experts is not None and not args.no_memory:
        print(
            f"    peak memory, one fresh process per consumer (decoded routed experts "
            f"{spec.routed_bytes() / 1e6:,.1f} MB):"
        )
        report["memory"] = measure_memory(spec, size, body, [c for c in args.consumers if c not in errors])
        for name, entry in report["memory"].items():
            if "error" in entry:
                print(f"    {name:<9} FAILED {entry['error']}")
                continue
            rss, traced = entry["rss_growth_bytes"] / 1e6, entry["tracemalloc_peak_bytes"] / 1e6
            print(
                f"    {name:<9} RSS growth {rss:8,.1f} MB = {entry['growth_over_routed']:5.2f}x   tracemalloc peak "
                f"{traced:8,.1f} MB = {entry['tracemalloc_over_routed']:5.2f}x"
                f"{'' if entry['hwm_reset'] else '  (HWM not reset: an upper bound)'}"
            )
    return report


def summarize(reports: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The target table: each ratio for the compiled twin (target) and the pure twin (reported)."""
    rows = []

    def row(
        workload: str, ratio: str, value: float | None, bounds: tuple[float, float], kind: str, targeted: bool
    ) -> dict[str, Any]:
        sign = "<=" if kind == "max" else ">="
        met = [None if value is None or not targeted else (value <= b if kind == "max" else value >= b) for b in bounds]
        return {
            "workload": workload,
            "ratio": ratio,
            "value": value,
            "target": f"{sign} {bounds[0]}",
            "met": met[0],
            "fast_path_target": f"{sign} {bounds[1]}",
            "fast_path_met": met[1],
        }

    for workload, num, den, bound, fast_bound, kind in TARGETS:
        if workload not in reports:
            continue
        consumers = reports[workload]["consumers"]
        for twin in ("compiled", "pure"):
            a, b = (twin if num == "compiled" else num), (twin if den == "compiled" else den)
            ta = consumers.get(a, {}).get("best_seconds")
            tb = consumers.get(b, {}).get("best_seconds")
            rows.append(
                row(workload, f"{a}/{b}", ta / tb if ta and tb else None, (bound, fast_bound), kind, twin == "compiled")
            )
    mem = reports.get("W3", {}).get("memory", {})
    for twin in ("compiled", "pure", "naive", "floor"):
        if twin in mem:
            rows.append(
                row(
                    "W3",
                    f"{twin} peak RSS growth / routed",
                    mem[twin].get("growth_over_routed"),
                    (MEMORY_TARGET, FAST_PATH_MEMORY_TARGET),
                    "max",
                    twin == "compiled",
                )
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="W1,W2,W3", help="comma-separated: W1,W2,W3,W1text")
    parser.add_argument("--consumers", default=",".join(CONSUMERS), help="subset of " + ",".join(CONSUMERS))
    parser.add_argument("--repeat", type=int, default=3, help="runs per consumer; the best is reported")
    parser.add_argument(
        "--budget",
        type=float,
        default=60.0,
        help="stop repeating a consumer once its runs took this many seconds in total",
    )
    parser.add_argument("--small", action="store_true", help="the reduced sizes of the pytest cases")
    parser.add_argument("--no-memory", action="store_true", help="skip the W3 peak-memory subprocesses")
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bar while building")
    parser.add_argument("--json", metavar="PATH", help="write the full report (with machine info) here")
    parser.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(memory_child(*args.memory_child)))
        return 0
    args.consumers = [c for c in args.consumers.split(",") if c]
    size = "small" if args.small else "full"
    specs = REDUCED if args.small else FULL
    info = machine_info()
    print(
        f"fastaccum {info['versions']['fastaccum']} ({info['fastaccum_implementation']}), {info['python']}, "
        f"{info['cpu']} x{info['cpu_count']}, load {info['loadavg_start'][0]:.2f}"
    )
    reports = {}
    for name in args.workloads.split(","):
        reports[name] = run_workload(specs[name], size, args)
        gc.collect()
    rows = summarize(reports)
    print(
        "\ntargets (compiled twin: the core bounds, and the fast-path bounds; the pure twin's ratios are"
        f" reported, not targeted{'; reduced sizes, the targets are for full size' if args.small else ''})"
    )
    verdicts = {True: "met", False: "MISSED", None: ""}
    for r in rows:
        value = "    n/a" if r["value"] is None else f"{r['value']:7.3f}"
        print(
            f"    {r['workload']}  {r['ratio']:<42} {value}   target {r['target']:<7} {verdicts[r['met']]:<6}"
            f"   fast path {r['fast_path_target']:<7} {verdicts[r['fast_path_met']]}"
        )
    info["loadavg_end"] = os.getloadavg()
    if args.json:
        config = {
            "size": size,
            "piece_bytes": PIECE_BYTES,
            "repeat": args.repeat,
            "budget_seconds": args.budget,
            "gc": "collected before each run, enabled during it, earlier objects frozen",
        }
        with open(args.json, "wb") as f:
            f.write(
                orjson.dumps(
                    {"machine": info, "config": config, "workloads": reports, "targets": rows},
                    option=orjson.OPT_INDENT_2,
                )
            )
        print(f"\nwrote {args.json}")
    return 0


# ---- pytest-benchmark cases --------------------------------------------------------------------


@cache
def _reduced(name: str) -> Workload:
    return build(REDUCED[name])


def timed_case(benchmark: Any, impl: ModuleType, workload: Workload) -> dict[str, Any]:
    """One pytest case (bench_core's and bench_suite's): the twin's outputs checked, then the twin,
    the floor and the naive consumer timed interleaved; their times and ratios for ``extra_info``.

    Disabled (CI's ``--benchmark-disable``), each consumer runs once and only the outputs count."""
    spec, pieces = workload.spec, workload.pieces
    kwargs = spec.accumulate_kwargs()
    # pytest-benchmark's own stats (histograms, --benchmark-compare) come from a short pedantic run.
    start = time.perf_counter()
    result = benchmark.pedantic(
        impl.accumulate, args=(pieces,), kwargs=kwargs, rounds=1 if benchmark.disabled else TIMED_ROUNDS, iterations=1
    )
    # Disabled, the fixture runs once and keeps no stats: our own clock is then the measurement.
    impl_s = benchmark.stats.stats.min if benchmark.stats else time.perf_counter() - start
    check_outputs(impl.__name__, result, workload.expected)
    del result
    floor, naive = consumer_fn("floor", spec), consumer_fn("naive", spec)
    fns = {"floor": lambda: floor(pieces), "naive": lambda: naive(pieces)}
    if benchmark.disabled:
        times, outputs = {}, {}
        for name, fn in fns.items():
            times[name], outputs[name] = time_once(fn)
    else:
        times, outputs = interleaved_best({"impl": lambda: impl.accumulate(pieces, **kwargs), **fns})
        impl_s = times["impl"]  # as many interleaved samples as the baselines had
    for name in ("floor", "naive"):
        check_consumer(name, outputs[name], workload.expected)
    return {
        "tokens": spec.tokens,
        "events": workload.expected.events,
        "stream_bytes": sum(map(len, pieces)),
        "impl_seconds": impl_s,
        "floor_seconds": times["floor"],
        "naive_seconds": times["naive"],
        "impl_over_floor": impl_s / times["floor"],
        "naive_over_impl": times["naive"] / impl_s,
    }


@pytest.fixture(scope="module", params=list(REDUCED))
def workload(request: pytest.FixtureRequest) -> Workload:
    return _reduced(request.param)


def test_accumulate(benchmark: Any, impl: ModuleType, workload: Workload) -> None:
    benchmark.group = f"core {workload.spec.name}: {workload.spec.describe()}"
    benchmark.extra_info.update(workload=workload.spec.name, **timed_case(benchmark, impl, workload))


if __name__ == "__main__":
    sys.exit(main())
