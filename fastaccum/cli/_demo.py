"""``fastaccum demo``: streams from the embedded emulator (a child process by default) through
``fastaccum.Client``, in the dialect asked for (SGLang, Dynamo or vLLM), and verifies every token,
logprob and text byte against the emulator's truth."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np

from fastaccum import IMPLEMENTATION
from fastaccum.cli._common import ANNOUNCE, SGLANG_VERSIONS, CommandError
from fastaccum.cli._emulator import emulator_from

__all__ = ("Outcome", "run_demo", "verify")


@dataclass
class Outcome:
    rid: str
    result: Any = None
    error: BaseException | None = None


def run_demo(args: argparse.Namespace) -> int:
    return asyncio.run(_demo_async(args))


async def _demo_async(args: argparse.Namespace) -> int:
    from fastaccum.transport.client import Client, ClientStream

    if args.dialect != "sglang" and "cumulative" in (args.mode, args.server_mode):
        raise CommandError(f"{args.dialect} streams are incremental: --mode and --server-mode cannot be cumulative", 2)
    server_mode = args.server_mode or ("cumulative" if args.mode == "cumulative" else "incremental")
    # Cumulative events repeat the whole response (O(N^2) bytes): a wider interval keeps the
    # default run short; incremental at 4 keeps the emulator (not the client) from dominating.
    interval = args.stream_interval or (64 if server_mode == "cumulative" else 4)
    layers, topk = args.routed_experts or (4, 2)
    server_args = argparse.Namespace(
        incremental_streaming_output=server_mode == "incremental",
        stream_interval=interval,
        skip_tokenizer_init=False,
        enable_return_routed_experts=args.routed_experts is not None,
        num_layers=layers,
        topk=topk,
        num_experts=128,
        enable_return_indexer_topk=False,
        num_indexer_layers=2,
        index_topk=8,
        indexer_topk_num_layers=False,
        token_rate=args.token_rate,
        max_running_requests=args.concurrency,
        seed=args.seed,
        sglang_version=SGLANG_VERSIONS[0],
        fault=None,
        dialect=args.dialect,
        vllm_shape=args.vllm_shape,
        return_sampling_mask=False,
    )
    truth = emulator_from(server_args)  # never started: expected() is a pure function
    server = {"sglang": f"server {server_mode}", "dynamo": "Dynamo", "vllm": f"vLLM {args.vllm_shape}"}[args.dialect]
    print(
        f"fastaccum demo: {args.requests} x {args.tokens} tokens, concurrency {args.concurrency}, "
        f"{server} (interval {interval}), accumulator {args.mode} [{IMPLEMENTATION}]"
        + (f", routed experts {layers}x{topk}" if args.routed_experts else "")
    )
    prompt = list(range(1, 17))
    streams: list[ClientStream] = []
    outcomes: list[Outcome] = []
    limit = asyncio.Semaphore(args.concurrency)

    async def one(client: Client, i: int) -> None:
        rid = f"demo-{i:05d}-"  # the trailing '-' keeps rids prefix-free: /abort_request matches by prefix
        outcome = Outcome(rid)
        outcomes.append(outcome)
        async with limit:
            payload = _payload(args.dialect, rid, prompt, args.tokens, routed=args.routed_experts is not None)
            stream = client.stream(payload, mode=args.mode, expert_shape=args.routed_experts)
            streams.append(stream)
            after = args.abort_after
            timer = None if after is None else asyncio.get_running_loop().call_later(after, stream.abort)
            try:
                outcome.result = await stream.run()
            except Exception as exc:  # reported with the others below
                outcome.error = exc
            finally:
                if timer is not None:
                    timer.cancel()

    child: subprocess.Popen[str] | None = None
    embedded = None
    died: int | None = None
    if args.in_process:
        embedded = truth
        url = await embedded.start()
    else:
        child, url = await _spawn_emulator(server_args)
    try:  # from the moment the child runs: a second Ctrl-C may come anywhere
        progress = _Progress(args.requests * args.tokens, enabled=not args.no_progress)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        async with Client(url, dialect=args.dialect) as client:
            ticker = asyncio.create_task(progress.follow(streams))
            await asyncio.gather(*(one(client, i) for i in range(args.requests)))
            ticker.cancel()
    finally:
        if embedded is not None:
            await embedded.stop()
        if child is not None:
            # A child that died (a crash, the OOM killer) cut every stream, and its death is the news,
            # not the cut streams. Its sockets close just before its exit status can be read.
            if any(o.error is not None for o in outcomes):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=1)
                died = child.poll()
            _stop(child)
    if died is not None:
        progress.close(sum(s.tokens for s in streams))
        hint = ": out of memory? It computes each request's tokens up front; try fewer --tokens"
        hint = hint if died == -signal.SIGKILL else ""
        raise CommandError(f"the emulator child died during the run ({_ended(died)}){hint}")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    progress.close(sum(s.tokens for s in streams))

    failures = []
    for outcome in outcomes:
        failures += verify(truth, outcome, len(prompt), args)
    tokens = sum(len(o.result) for o in outcomes if o.result is not None)
    events = sum(s.events for s in streams)
    wire_mb = sum(s.bytes_received for s in streams) / 1e6
    aborted = sum(1 for o in outcomes if o.result is not None and o.result.aborted)
    print(
        f"tokens:        {tokens:,} verified against the emulator's truth"
        + (f" ({aborted} requests aborted, prefixes checked)" if aborted else "")
    )
    print(f"events:        {events:,}")
    print(f"on the wire:   {wire_mb:,.1f} MB")
    # A run aborted before its first token has no per-token figures: any number would be noise.
    rate = f" ({tokens / max(wall, 1e-9):,.0f} tokens/s)" if tokens else ""
    per_token = f"{cpu / tokens * 1e6:.2f} us/token" if tokens else "no token arrived"
    print(f"wall time:     {wall:.2f} s{rate}")
    print(f"client CPU:    {cpu:.2f} s ({per_token}" + (", emulator included)" if args.in_process else ")"))
    for line in failures[:20]:
        print(f"MISMATCH {line}")
    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        return 1
    print("OK")
    return 0


async def _spawn_emulator(a: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    # -P: run from a source checkout, "-m" would otherwise import the checkout's fastaccum/ (which
    # holds no compiled core) instead of the installed package.
    values = ["stream_interval", "num_layers", "topk", "num_experts", "seed", "max_running_requests", "token_rate"]
    values += ["dialect", "vllm_shape"]
    flags = ("incremental_streaming_output", "enable_return_routed_experts")
    command = [sys.executable, "-P", "-m", "fastaccum", "emulator", "--port=0"]
    command += [f"--{name.replace('_', '-')}={getattr(a, name)}" for name in values]
    command += [f"--{name.replace('_', '-')}" for name in flags if getattr(a, name)]
    # A terminal's Ctrl-C signals the whole process group. The demo stops its child itself, so the
    # child starts with SIGINT blocked (the mask survives exec): interrupted while importing, it
    # would print a traceback, and the demo would take its death for a failure to start.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    assert child.stdout is not None
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # runs the handler of a Ctrl-C that came meanwhile
        # In a thread, so that Ctrl-C (which cancels this task) need not wait for the child.
        line = await asyncio.to_thread(child.stdout.readline)
    except BaseException:
        _stop(child)
        raise
    if not line.startswith(ANNOUNCE):
        status = _stop(child)
        said = f"it said {line.strip()!r}" if line else "its error, if any, is above"
        raise CommandError(f"the emulator child did not start ({_ended(status)}; {said})")
    return child, line[len(ANNOUNCE) :].strip()


def _stop(child: subprocess.Popen[str]) -> int:
    child.terminate()
    try:
        return child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _ended(status: int) -> str:
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"


def _payload(dialect: str, rid: str, prompt: list[int], tokens: int, *, routed: bool) -> dict[str, Any]:
    """One request in the server's own keys (docs/dialects.md); logprobs asked for. vLLM sends
    routed experts when the server has them on: a request does not ask."""
    if dialect == "vllm":
        params = {"max_tokens": tokens, "temperature": 1.0, "logprobs": 0}
        return {"token_ids": prompt, "request_id": rid, "sampling_params": params}
    params = {"max_new_tokens": tokens, "temperature": 1.0}
    body = {"input_ids": prompt, "rid": rid, "return_logprob": True, "sampling_params": params}
    return {**body, "return_routed_experts": routed}


def verify(truth: Any, outcome: Outcome, prompt_tokens: int, args: argparse.Namespace) -> list[str]:
    if outcome.error is not None:
        return [f"{outcome.rid}: {type(outcome.error).__name__}: {outcome.error}"]
    result = outcome.result
    n = len(result)
    routed = args.routed_experts is not None
    expected = truth.expected(outcome.rid, n, prompt_tokens=prompt_tokens, routed_experts=routed)
    problems = []
    if not np.array_equal(result.token_ids, np.asarray(expected.token_ids, dtype=np.int32)):
        problems.append("token ids differ")
    # Before the first event nothing says whether logprobs or text will come, so an empty prefix
    # holds None for both: that is the empty truth, not a mismatch.
    if n > 0 or result.logprobs is not None:
        if result.logprobs is None or not np.array_equal(
            result.logprobs, np.asarray(expected.logprobs, dtype=np.float64)
        ):
            problems.append("logprobs differ")
    text = getattr(args, "dialect", "sglang") != "vllm"  # vLLM's token-out endpoint sends no text
    if text and (n > 0 or result.text is not None) and result.text != expected.text(0, n):
        problems.append("text differs")
    elif not text and result.text is not None:
        problems.append("text where vLLM sends none")
    if result.aborted:
        if n > args.tokens:
            problems.append(f"aborted prefix of {n} tokens exceeds max_new_tokens")
    else:
        if n != args.tokens:
            problems.append(f"{n} tokens, expected {args.tokens}")
        # vLLM's "length" carries no count (docs/dialects.md).
        length = {"type": "length", "length": args.tokens} if text else {"type": "length"}
        if result.finish_reason != length:
            problems.append(f"finish_reason {result.finish_reason}")
        if routed and not np.array_equal(result.routed_experts, expected.routed_experts):
            problems.append("routed experts differ")
    return [f"{outcome.rid}: {p}" for p in problems]


class _Progress:
    """A tqdm bar over all tokens, or a plain line per second when tqdm is not installed."""

    def __init__(self, total: int, *, enabled: bool, out: TextIO = sys.stderr) -> None:
        self._total, self._enabled, self._out = total, enabled, out
        self._bar: Any = None
        self._last_line = 0.0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                self._bar = None
            else:
                self._bar = tqdm(total=total, unit="tok", unit_scale=True, file=out, dynamic_ncols=True)

    async def follow(self, streams: list[Any]) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.update(sum(s.tokens for s in streams))

    def update(self, done: int) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif time.monotonic() - self._last_line >= 1.0:
            self._last_line = time.monotonic()
            print(f"tokens {done:,}/{self._total:,} ({100 * done / max(self._total, 1):.0f}%)", file=self._out)

    def close(self, done: int) -> None:
        self.update(done)
        if self._bar is not None:
            self._bar.close()
