"""The emulator's requests: their state, the decode loop that produces outputs at SGLang's
emission points, and the events written for them (fastaccum.emulator's server drives these)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from fastaccum.emulator import writer
from fastaccum.emulator.writer import Generation, WireOptions

__all__ = (
    "ABORT_REASON",
    "ECHO_REASON",
    "FAULT_KEY",
    "FAULT_KINDS",
    "ConnectionCut",
    "EmulatorStats",
    "Output",
    "Request",
    "StreamEnded",
    "Truth",
    "build_event",
    "check_fault",
    "commit",
    "decode",
    "drain",
    "end_aborted",
    "sglang_request",
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
    "pause",
    "hold",
    # what Dynamo's frontend and vLLM write (fastaccum.emulator._dialect_servers)
    "dynamo_error",
    "dynamo_killed",
    "dynamo_stopped",
    "vllm_error",
)
# finish_reason of a running request ended by /abort_request (docs/wire-format.md, "finish_reason").
ABORT_REASON: dict[str, Any] = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
# finish_reason of a request aborted in SGLang's waiting queue (a retracted one): the echo chunk.
ECHO_REASON: dict[str, Any] = {"type": "abort", "message": "Abort in waiting queue"}
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
    retractions: int = 0  # requests a retract pause put back in the waiting queue
    preemptions: int = 0  # requests vLLM's keep pause with clear_cache preempted


@dataclasses.dataclass
class Output:
    start: int
    end: int
    terminal: bool = False
    reason: dict[str, Any] | None = None


Schedule = tuple[tuple[int, str], ...]  # (first index, weights) per change (writer.synthetic_generation)


@dataclasses.dataclass(eq=False)
class Request:
    rid: str
    gen: Generation
    opts: WireOptions
    interval: int
    fault: dict[str, Any]
    streams: bool = True  # False: one non-streaming answer, written once at the end
    # gated (held by SGLang's paused tokenizer) -> queued -> running -> done; queued -> echo on abort
    state: str = "queued"
    produced: int = 0  # tokens committed (the scheduler's output_ids)
    pushed: int = 0  # tokens the outputs so far carry (what the tokenizer has received)
    abort_requested: bool = False
    outbox: list[Output] = dataclasses.field(default_factory=list)
    final: Output | None = None  # the terminal output, once decoded
    admitted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # outbox has outputs
    sent: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # writer took the outbox
    decoder: asyncio.Task[None] | None = None  # a decode loop runs while it is this task
    # The generation under a weights schedule (tokens, rows); None: the weights never change it.
    remake: Callable[[Schedule, Schedule], Generation] | None = None
    token_weights: Schedule = ()
    row_weights: Schedule = ()
    versions: list[tuple[int, str]] = dataclasses.field(default_factory=list)  # the engine's record
    label: str = "default"  # SGLang's tokenizer-side weight_version
    retractions: int = 0
    hold: str | None = None  # a paused engine keeps it, decoding stopped: "in_place" or "keep"
    cache_epoch: int = 0  # the prefix cache its prompt was prefilled into
    paused_at: int | None = None  # the pause fault fired (tokens then)

    def push(self, end: int, *, terminal: bool = False, reason: dict[str, Any] | None = None) -> None:
        out = Output(self.pushed, end, terminal, reason)
        self.outbox.append(out)
        if terminal:
            self.final = out
        self.pushed = end
        self.wake.set()

    def regenerate(self) -> None:
        """Rebuild ``gen`` under the weights schedules (committed tokens never change: a schedule
        only changes past them), then relabel it."""
        if self.remake is not None:
            self.gen = self.remake(self.token_weights, self.row_weights)
        self.relabel()

    def relabel(self) -> None:
        self.gen = dataclasses.replace(
            self.gen, weight_version=self.label, weight_versions=tuple(self.versions), num_retractions=self.retractions
        )


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


def _emits(req: Request, j: int) -> bool:
    """Whether an output goes out once ``j`` (< the total) tokens are committed: at SGLang's
    emission points (docs/wire-format.md, "Stream interval and coalescing"; writer.emission_points)."""
    if not req.streams:  # a non-streaming answer is written once, at its end
        return False
    if req.opts.version == "0.5.15" and req.interval > 1:
        return j % req.interval == 1
    return (j - 1) % req.interval == 0


def commit(req: Request, to: int, count: Callable[[Request, int], None], *, terminal: bool = True) -> bool:
    """Commit tokens up to ``to`` (capped at the total): an output at each emission point, the
    terminal one at the end (``terminal=False``: a plain one there). Whether an output went out."""
    n = len(req.gen.token_ids)
    to = min(to, n)
    pushed = False
    for j in range(req.produced + 1, to + 1):
        if j == n:
            req.push(n, terminal=terminal)
            pushed = True
        elif _emits(req, j):
            req.push(j)
            pushed = True
    count(req, to)
    return pushed


def end_aborted(req: Request, steps: int, count: Callable[[Request, int], None]) -> None:
    """An abort applied: ``steps`` more tokens (SGLang one, vLLM none), then the terminal abort output."""
    to = min(req.produced + steps, len(req.gen.token_ids))
    req.push(to, terminal=True, reason=ABORT_REASON)
    count(req, to)


async def decode(
    req: Request,
    *,
    token_rate: float | None,
    count: Callable[[Request, int], None],
    abort_step: int = 1,
    at_once: bool = True,
    pause: Callable[[Request], None] | None = None,
) -> None:
    """Produce tokens from ``req.produced`` on and queue outputs at SGLang's emission points
    (docs/wire-format.md, "Stream interval and coalescing"), while this task is the request's
    decoder. An abort decodes ``abort_step`` more tokens first (SGLang one, vLLM none).
    ``at_once``: the first token comes at once (a prefill), else one step later. ``pause``: what
    the ``pause`` and ``hold`` faults call once the request holds their ``at`` tokens."""
    fault_kind = req.fault.get("kind")
    pausing = fault_kind in ("pause", "hold") and pause is not None
    pause_at = int(req.fault.get("at", 1)) if pausing else None
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()
    start, base, lead = loop.time(), req.produced, 1 if at_once else 0
    while req.decoder is me:
        n = len(req.gen.token_ids)  # new weights can move a stop token
        k = req.produced
        if k >= n and not req.abort_requested:
            # Nothing left to decode (max_new_tokens 0): the prefill's finishing output alone.
            if req.final is None:
                req.push(n, terminal=True)
            return
        if req.abort_requested:
            # A running request decodes one more token before the abort applies
            # (docs/wire-format.md, "Aborts").
            end_aborted(req, abort_step, count)
            return
        if pause_at is not None and req.paused_at is None and k >= pause_at:
            assert pause is not None
            req.paused_at = k
            pause(req)  # as if the pause call came now: it may stop this decoder
            continue
        if token_rate is None:
            due = k + 1
        else:
            due = min(n, base + int((loop.time() - start) * token_rate) + lead)
            if due <= k:
                await asyncio.sleep(max(0.0, start + (k + 1 - base - lead) / token_rate - loop.time()))
                continue
        if pause_at is not None and req.paused_at is None:
            due = min(due, max(pause_at, k + 1))  # never past the pause point in one step
        zero = fault_kind == "zero_token_terminal"
        pushed = commit(req, due, count, terminal=not zero)
        if req.produced >= n:
            if zero:
                # A separate event: the writer must not merge the empty terminal delta.
                req.sent.clear()
                await req.sent.wait()
                req.push(n, terminal=True)
            return
        if token_rate is None:
            if pushed:
                req.sent.clear()
                await req.sent.wait()
            elif req.produced % _YIELD_EVERY_TOKENS == 0:
                await asyncio.sleep(0)


def build_event(req: Request, outs: list[Output], *, first: bool) -> dict[str, Any]:
    """One wire event for the queued outputs: newest only (cumulative), coalesced (incremental)."""
    events = [
        writer.echo_event(req.gen, req.opts, o.end, first=first and i == 0)
        if o.reason is ECHO_REASON
        else writer.normal_event(
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


# ---- an SGLang body ------------------------------------------------------------------------------


class Truth(Protocol):
    """What reading an SGLang body needs of the server: its switches, its tokenizer, its truth."""

    incremental_streaming_output: bool
    stream_interval: int
    skip_tokenizer_init: bool
    enable_return_routed_experts: bool
    enable_return_indexer_topk: bool
    indexer_topk_num_layers: bool
    version: str

    def prompt_tokens_of(self, text: str) -> int: ...

    def key_of(self, rid: str, prompt: list[int] | str) -> tuple[str, int]: ...

    def expected(
        self,
        rid: str,
        n: int,
        *,
        prompt_tokens: int = ...,
        top_p: bool = ...,
        routed_experts: bool = ...,
        routed_start: int = ...,
        indexer_topk: bool = ...,
        first_position: int = ...,
        token_weights: Schedule = ...,
        row_weights: Schedule = ...,
    ) -> Generation: ...


def sglang_request(host: Truth, body: dict[str, Any], fault: dict[str, Any]) -> Request:
    """The request an SGLang ``/generate`` body asks for (a ValueError says what is wrong with it),
    its generation remade under whichever weights compute it."""
    params = body.get("sampling_params") or {}
    if "input_ids" in body:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
            raise ValueError("input_ids must be a list of ints (batches are not emulated)")
        prompt_tokens = len(ids)
    elif isinstance(body.get("text"), str):
        if host.skip_tokenizer_init:
            raise ValueError("text input needs a tokenizer; the server runs with --skip-tokenizer-init")
        prompt_tokens = host.prompt_tokens_of(body["text"])
    else:
        raise ValueError("Either text or input_ids should be provided (batches are not emulated)")
    if prompt_tokens < 1:
        raise ValueError("the prompt is empty")
    rid = body.get("rid") or uuid.uuid4().hex
    if not isinstance(rid, str):
        raise ValueError("rid must be a string (batches are not emulated)")
    max_new = int(params.get("max_new_tokens", 128))
    custom = params.get("custom_params") or {}
    return_logprob = bool(body.get("return_logprob", False))
    top_p = bool(custom.get("return_top_p_token_ids")) and return_logprob
    asked = bool(body.get("return_routed_experts"))
    routed = asked and host.enable_return_routed_experts
    start = body.get("routed_experts_start_len") or 0
    # The scheduler checks the start whenever routed experts are asked for, flag or not.
    if asked and (type(start) is not int or not 0 <= start <= prompt_tokens):
        raise ValueError(f"routed_experts_start_len must be in [0, {prompt_tokens}], not {start!r}")
    indexer = bool(body.get("return_indexer_topk")) and host.enable_return_indexer_topk
    key, first = host.key_of(rid, ids if "input_ids" in body else body["text"])
    stops = set(params.get("stop_token_ids") or ())

    def make(token_weights: Schedule = (), row_weights: Schedule = ()) -> Generation:
        gen = host.expected(
            key,
            max_new,
            prompt_tokens=prompt_tokens,
            top_p=top_p,
            routed_experts=routed,
            routed_start=start if routed else 0,
            indexer_topk=indexer,
            first_position=first,
            token_weights=token_weights,
            row_weights=row_weights,
        )
        gen = dataclasses.replace(gen, rid=rid) if key != rid else gen
        if stops:
            hit = next((i for i, t in enumerate(gen.token_ids) if t in stops), None)
            if hit is not None:
                gen = truncate(gen, hit + 1, {"type": "stop", "matched": gen.token_ids[hit]})
        return gen

    opts = WireOptions(
        incremental=host.incremental_streaming_output,
        return_logprob=return_logprob,
        logprob_text=bool(body.get("return_text_in_logprobs", False)),
        skip_tokenizer_init=host.skip_tokenizer_init,
        version=host.version,
        indexer_topk_num_layers=host.indexer_topk_num_layers,
    )
    interval = int(params.get("stream_interval") or host.stream_interval)
    streams = bool(body.get("stream"))
    return Request(rid=rid, gen=make(), opts=opts, interval=max(1, interval), fault=fault, streams=streams, remake=make)
