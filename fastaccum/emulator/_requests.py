"""The emulator's requests: their state, the decode loop that produces outputs at SGLang's
emission points, and the events written for them (fastaccum.emulator's server drives these)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from fastaccum.emulator import writer
from fastaccum.emulator.writer import Generation, WireOptions

__all__ = (
    "ABORT_REASON",
    "FAULT_KEY",
    "FAULT_KINDS",
    "ConnectionCut",
    "EmulatorStats",
    "Output",
    "Request",
    "StreamEnded",
    "build_event",
    "check_fault",
    "decode",
    "drain",
    "truncate",
)

FAULT_KEY = "fastaccum_fault"
FAULT_KINDS = (
    "error_event",
    "malformed_json",
    "cut",
    "http_500",
    "stall",
    "coalesce",
    "zero_token_terminal",
    "split",
    "retract",
    "strip_keys",
    # what Dynamo's frontend and vLLM write (fastaccum.emulator._dialect_servers)
    "dynamo_error",
    "dynamo_killed",
    "dynamo_stopped",
    "vllm_error",
)
# finish_reason of a running request ended by /abort_request (docs/wire-format.md, "finish_reason").
ABORT_REASON: dict[str, Any] = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# Lockstep decoding yields to the loop at least this often so other requests and aborts progress.
_YIELD_EVERY_TOKENS = 256


@dataclasses.dataclass
class EmulatorStats:
    """Counters a test can read (also served by ``GET /v1/loads``)."""

    requests: int = 0
    completed: int = 0  # streams that wrote their terminal event
    aborted: int = 0  # requests hit by /abort_request
    disconnects: int = 0  # streams the client left before their terminal event
    disconnected_rids: list[str] = dataclasses.field(default_factory=list)
    tokens: int = 0  # decoded tokens, all requests
    # rid -> completion tokens of the newest event whose write returned (streams only)
    written: dict[str, int] = dataclasses.field(default_factory=dict)
    # path -> requests received on it, served or not (a 404 included): which control calls came
    calls: dict[str, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Output:
    start: int
    end: int
    terminal: bool = False
    reason: dict[str, Any] | None = None


@dataclasses.dataclass(eq=False)
class Request:
    rid: str
    gen: Generation
    opts: WireOptions
    interval: int
    fault: dict[str, Any]
    streams: bool = True  # False: one non-streaming answer, written once at the end
    state: str = "queued"  # queued -> running -> done; queued -> echo on abort
    produced: int = 0
    abort_requested: bool = False
    outbox: list[Output] = dataclasses.field(default_factory=list)
    final: Output | None = None  # the terminal output, once decoded
    admitted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # outbox has outputs
    sent: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # writer took the outbox
    decoder: asyncio.Task[None] | None = None


class StreamEnded(Exception):
    """An injected fault ended the stream with [DONE]."""


class ConnectionCut(Exception):
    """An injected fault cut the connection mid-event."""


def check_fault(fault: dict[str, Any]) -> None:
    if not isinstance(fault, dict):
        raise ValueError(f"{FAULT_KEY} must be an object")
    if fault and fault.get("kind") not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {fault.get('kind')!r}; expected one of {', '.join(FAULT_KINDS)}")


def truncate(gen: Generation, n: int, reason: dict[str, Any]) -> Generation:
    """The same generation stopped after ``n`` tokens (the token source is prefix-stable)."""
    routed = gen.routed_experts
    if routed is not None:
        routed = routed[: gen.replay_rows(n, start=gen.routed_start)]
    indexer = gen.indexer_topk
    if indexer is not None:
        indexer = indexer[: gen.replay_rows(n)]
    rows = gen.top_p_rows[:n] if gen.top_p_rows is not None else None
    return dataclasses.replace(
        gen,
        token_ids=gen.token_ids[:n],
        logprobs=gen.logprobs[:n],
        token_texts=gen.token_texts[:n],
        finish_reason=reason,
        top_p_rows=rows,
        routed_experts=routed,
        indexer_topk=indexer,
    )


async def decode(
    req: Request, *, token_rate: float | None, count: Callable[[Request, int], None], abort_step: int = 1
) -> None:
    """Produce tokens and queue outputs at SGLang's emission points (docs/wire-format.md,
    "Stream interval and coalescing"). An abort decodes ``abort_step`` more tokens first (SGLang
    one, vLLM none)."""
    n, fault_kind = len(req.gen.token_ids), req.fault.get("kind")
    # A non-streaming answer is written once: decoding never waits for a writer to take an event.
    points = set(writer.emission_points(n, req.interval, req.opts.version)[:-1]) if req.streams else set()
    loop = asyncio.get_running_loop()
    start = loop.time()
    k = prev = 0

    def push(end: int, *, terminal: bool = False, reason: dict[str, Any] | None = None) -> None:
        nonlocal prev
        out = Output(prev, end, terminal, reason)
        req.outbox.append(out)
        if terminal:
            req.final = out
        prev = end
        req.wake.set()

    while True:
        if req.abort_requested:
            # A running request decodes one more token before the abort applies
            # (docs/wire-format.md, "Aborts").
            k = min(k + abort_step, n)
            count(req, k)
            push(k, terminal=True, reason=ABORT_REASON)
            return
        if token_rate is None:
            due = k + 1
        else:
            due = min(n, int((loop.time() - start) * token_rate) + 1)  # first token at once
            if due <= k:
                await asyncio.sleep(max(0.0, start + k / token_rate - loop.time()))
                continue
        pushed = False
        for j in range(k + 1, due + 1):
            if j == n:
                if fault_kind == "zero_token_terminal":
                    push(n)
                    # A separate event: the writer must not merge the empty terminal delta.
                    req.sent.clear()
                    await req.sent.wait()
                    push(n, terminal=True)
                else:
                    push(n, terminal=True)
                pushed = True
            elif j in points:
                push(j)
                pushed = True
        count(req, due)
        k = due
        if k >= n:
            return
        if token_rate is None:
            if pushed:
                req.sent.clear()
                await req.sent.wait()
            elif k % _YIELD_EVERY_TOKENS == 0:
                await asyncio.sleep(0)


def build_event(req: Request, outs: list[Output], *, first: bool) -> dict[str, Any]:
    """One wire event for the queued outputs: newest only (cumulative), coalesced (incremental)."""
    events = [
        writer.normal_event(
            req.gen, req.opts, o.start, o.end, terminal=o.terminal, finish_reason=o.reason, first=first and i == 0
        )
        for i, o in enumerate(outs if req.opts.incremental else outs[-1:])
    ]
    return events[0] if len(events) == 1 else writer.coalesce(events)


Build = Callable[..., dict[str, Any]]  # (req, outputs, *, first) -> the event for those outputs


async def drain(
    req: Request,
    emit: Callable[[int, dict[str, Any]], Awaitable[None]],
    *,
    closing: Callable[[], bool],
    build: Build = build_event,
) -> None:
    """Hand every event (``build``: SGLang's, or another server's) to ``emit(index, event)`` until
    the terminal one."""
    group = int(req.fault.get("count", 3)) if req.fault.get("kind") == "coalesce" else 1
    pending: list[Output] = []
    index = 0
    while True:
        await req.wake.wait()
        req.wake.clear()
        if closing():
            raise StreamEnded
        pending += req.outbox
        req.outbox = []
        terminal = any(o.terminal for o in pending)
        if not pending or (len(pending) < group and not terminal):
            req.sent.set()
            continue
        event = build(req, pending, first=index == 0)
        pending = []
        await emit(index, event)
        index += 1
        req.sent.set()
        if terminal:
            return
