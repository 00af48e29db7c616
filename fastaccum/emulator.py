"""An SGLang ``/generate`` server emulator on aiohttp.web: the demo's server and every network test's double.

The bytes come from ``fastaccum.wire`` (orjson, SGLang 0.5.23 key order, ``data: …\\n\\n``,
``data: [DONE]\\n\\n``), so the emulator follows docs/wire-format.md; ``version="0.5.15"``
switches the stream-interval rule and the echo ``output_ids`` (its sections "Stream interval and
coalescing", "The abort echo" and "Version differences").

Tokens are a pure function of (seed, rid, position) (``wire.synthetic_generation``), so a client can
check every token with ``Emulator.expected``. Each running request has a decode task that produces
tokens and queues outputs; the HTTP handler drains the queue like SGLang's tokenizer manager:
cumulative mode sends only the newest output (dropped frames), incremental mode coalesces them.

Request keys: ``input_ids`` or ``text``, ``sampling_params`` (``max_new_tokens`` default 128,
``stream_interval``, ``stop_token_ids``, ``custom_params.return_top_p_token_ids``),
``return_logprob``, ``return_text_in_logprobs``, ``return_routed_experts``, ``rid``, ``stream``.

Fault injection: the request key ``"fastaccum_fault"`` (real SGLang ignores unknown keys) or the
server's ``fault`` option, a dict ``{"kind": …, "at": event index (default 1), …}``:

- ``error_event``: an ``{"error": …}`` event (``message``, ``code``) instead of event ``at``, then [DONE]
- ``malformed_json``: broken JSON instead of event ``at``, then [DONE]
- ``cut``: half of event ``at``, then the connection is closed without the end of the chunked body
- ``http_500``: HTTP 500 with a JSON body before any SSE byte
- ``stall``: ``seconds`` (default 1.0) of silence before event ``at`` (``"done"``: before [DONE])
- ``coalesce``: events go out in groups of ``count`` (default 3) outputs: incremental deltas are
  merged (``wire.coalesce``), cumulative frames dropped
- ``zero_token_terminal``: the terminal event carries no new token
- ``split``: every event is written in pieces of ``size`` bytes (default 7)
- ``retract``: before event ``at`` the request is retracted (it stops decoding and keeps its
  output, as under memory pressure); an ``/abort_request`` then ends it with the abort echo chunk
  holding every token decoded so far; without one, it stays silent for ``seconds`` (default 30)
- ``strip_keys``: every event's ``meta_info`` lacks the listed ``keys``
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from fastaccum import wire
from fastaccum.wire import Generation, WireOptions

__all__ = ("Emulator", "EmulatorStats", "FAULT_KEY", "FAULT_KINDS", "ABORT_REASON")

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
)
# finish_reason of a running request ended by /abort_request (docs/wire-format.md, "finish_reason").
ABORT_REASON: dict[str, Any] = {"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
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


@dataclasses.dataclass
class _Output:
    start: int
    end: int
    terminal: bool = False
    reason: dict[str, Any] | None = None


@dataclasses.dataclass(eq=False)
class _Request:
    rid: str
    gen: Generation
    opts: WireOptions
    interval: int
    fault: dict[str, Any]
    state: str = "queued"  # queued -> running -> done; queued -> echo on abort
    produced: int = 0
    abort_requested: bool = False
    outbox: list[_Output] = dataclasses.field(default_factory=list)
    final: _Output | None = None  # the terminal output, once decoded
    admitted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    wake: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # outbox has outputs
    sent: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # writer took the outbox
    decoder: asyncio.Task[None] | None = None


class Emulator:
    """An in-process SGLang server: ``async with Emulator(...) as url:``.

    Options are named like SGLang's server flags. ``token_rate`` is tokens/s per request; ``None``
    decodes in lockstep with the writer (as fast as the client reads, every emission point sent, so
    event boundaries are deterministic). ``num_layers``/``topk``/``num_experts`` describe the MoE
    model behind ``enable_return_routed_experts``.
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        incremental_streaming_output: bool = False,
        stream_interval: int = 1,
        skip_tokenizer_init: bool = False,
        enable_return_routed_experts: bool = False,
        num_layers: int = 4,
        topk: int = 2,
        num_experts: int = 16,
        token_rate: float | None = None,
        max_running_requests: int = 256,
        seed: int = 0,
        version: str = "0.5.23",
        fault: dict[str, Any] | None = None,
        plain_text: bool = False,
    ) -> None:
        if version not in ("0.5.23", "0.5.15"):
            raise ValueError(f"version must be '0.5.23' or '0.5.15', not {version!r}")
        if fault is not None:
            _check_fault(fault)
        self.host, self.port = host, port
        self.incremental_streaming_output = incremental_streaming_output
        self.stream_interval = max(1, int(stream_interval))
        self.skip_tokenizer_init = skip_tokenizer_init
        self.enable_return_routed_experts = enable_return_routed_experts
        self.expert_shape = (num_layers, topk)
        self.num_experts = num_experts
        self.token_rate = token_rate if token_rate else None
        self.max_running_requests = max(1, max_running_requests)
        self.seed = seed
        self.version = version
        self.fault = fault
        # Token texts without U+2028/U+2029/U+0085, for clients that read lines with splitlines().
        self.text_pieces = wire.PLAIN_TEXT_PIECES if plain_text else wire.TEXT_PIECES
        self.stats = EmulatorStats()
        self._running: set[_Request] = set()
        self._waiting: deque[_Request] = deque()
        self._runner: web.AppRunner | None = None
        self._closing = False

    # ---- lifecycle -----------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post("/generate", self._generate)
        app.router.add_post("/abort_request", self._abort_request)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_get("/v1/loads", self._loads)
        app.router.add_get("/health", self._health)
        return app

    async def start(self) -> str:
        """Listen and return the base URL (``http://host:port``; port 0 picks a free one)."""
        # handler_cancellation: like Starlette watching http.disconnect, a client leaving cancels
        # the handler at once, even while the request is queued or stalled.
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self.url

    async def stop(self) -> None:
        self._closing = True
        for req in [*self._running, *self._waiting]:
            if req.decoder is not None:
                req.decoder.cancel()
            req.admitted.set()
            req.wake.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def retracted(self) -> int:
        """Requests stopped by the ``retract`` fault and waiting for an abort."""
        return sum(1 for r in self._running if r.state == "retracted")

    @property
    def queued(self) -> int:
        return len(self._waiting)

    # ---- truth ---------------------------------------------------------------------------------
    def expected(
        self,
        rid: str,
        n: int,
        *,
        prompt_tokens: int = 16,
        top_p: bool = False,
        routed_experts: bool = False,
        finish_reason: dict[str, Any] | None = None,
    ) -> Generation:
        """The first ``n`` tokens this server generates for ``rid`` (a pure function of seed, rid, position).

        ``prompt_tokens`` only shapes the routed-expert rows: pass ``len(input_ids)`` (or
        ``prompt_tokens_of(text)``). ``finish_reason`` defaults to ``length``.
        """
        if finish_reason is None:
            finish_reason = {"type": "length", "length": n}
        return wire.synthetic_generation(
            rid,
            n,
            seed=self.seed,
            prompt_tokens=prompt_tokens,
            finish_reason=finish_reason,
            top_p=top_p,
            expert_shape=self.expert_shape if routed_experts else None,
            num_experts=self.num_experts,
            text_pieces=self.text_pieces,
        )

    @staticmethod
    def prompt_tokens_of(text: str) -> int:
        """The emulator's tokenizer: one token per whitespace-separated word, at least one."""
        return max(1, len(text.split()))

    # ---- HTTP handlers -------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _server_info(self, request: web.Request) -> web.Response:
        return _json_ok(
            {
                "version": self.version,
                "incremental_streaming_output": self.incremental_streaming_output,
                "stream_interval": self.stream_interval,
                "skip_tokenizer_init": self.skip_tokenizer_init,
                "enable_return_routed_experts": self.enable_return_routed_experts,
                "num_hidden_layers": self.expert_shape[0],
                "num_experts_per_tok": self.expert_shape[1],
                "num_experts": self.num_experts,
                "max_running_requests": self.max_running_requests,
                "token_rate": self.token_rate,
                "random_seed": self.seed,
                "emulator": "fastaccum",
            }
        )

    async def _loads(self, request: web.Request) -> web.Response:
        s = self.stats
        return _json_ok(
            {
                "num_running_reqs": self.running,
                "num_waiting_reqs": self.queued,
                "requests": s.requests,
                "completed": s.completed,
                "aborted": s.aborted,
                "disconnects": s.disconnects,
                "tokens": s.tokens,
            }
        )

    async def _abort_request(self, request: web.Request) -> web.Response:
        body = orjson.loads(await request.read() or b"{}")
        self.abort(body.get("rid") or "", abort_all=bool(body.get("abort_all")))
        return web.Response(status=200)

    def abort(self, rid: str = "", *, abort_all: bool = False) -> int:
        """What ``/abort_request`` does; rids match by prefix, as SGLang's scheduler does
        (docs/wire-format.md, "Aborts")."""
        hits = [r for r in [*self._running, *self._waiting] if abort_all or r.rid.startswith(rid)]
        for req in hits:
            if req.abort_requested:
                continue
            req.abort_requested = True
            self.stats.aborted += 1
            if req.state == "queued":
                self._waiting.remove(req)
                req.state = "echo"
                req.admitted.set()
        return len(hits)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _json_error(400, f"invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return _json_error(400, "the request body must be a JSON object")
        fault = body.get(FAULT_KEY, self.fault) or {}
        try:
            _check_fault(fault)
            req = self._make_request(body, fault)
        except ValueError as exc:
            return _json_error(400, str(exc))
        if fault.get("kind") == "http_500":
            body500 = {
                "object": "error",
                "message": fault.get("message", "injected HTTP 500"),
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            }
            return web.Response(status=500, body=orjson.dumps(body500), content_type="application/json")
        if any(r.rid == req.rid for r in [*self._running, *self._waiting]):
            duplicate = wire.error_event(f"Duplicate request ID: {req.rid}")
            if not body.get("stream"):
                return web.Response(status=400, body=orjson.dumps(duplicate), content_type="application/json")
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            await resp.write(wire.sse(duplicate) + wire.DONE)
            return resp
        self.stats.requests += 1
        self._waiting.append(req)
        self._admit()
        try:
            if body.get("stream"):
                return await self._stream(request, req)
            return await self._non_stream(req)
        except asyncio.CancelledError:
            self._note_disconnect(req)
            raise
        finally:
            self._release(req)

    def _note_disconnect(self, req: _Request) -> None:
        if req.state != "done":
            req.state = "done"
            self.stats.disconnects += 1
            self.stats.disconnected_rids.append(req.rid)

    # ---- requests ------------------------------------------------------------------------------
    def _make_request(self, body: dict[str, Any], fault: dict[str, Any]) -> _Request:
        params = body.get("sampling_params") or {}
        if "input_ids" in body:
            ids = body["input_ids"]
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
                raise ValueError("input_ids must be a list of ints (batches are not emulated)")
            prompt_tokens = len(ids)
        elif isinstance(body.get("text"), str):
            if self.skip_tokenizer_init:
                raise ValueError("text input needs a tokenizer; the server runs with --skip-tokenizer-init")
            prompt_tokens = self.prompt_tokens_of(body["text"])
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
        routed = bool(body.get("return_routed_experts")) and self.enable_return_routed_experts
        gen = self.expected(rid, max_new, prompt_tokens=prompt_tokens, top_p=top_p, routed_experts=routed)
        stops = set(params.get("stop_token_ids") or ())
        if stops:
            hit = next((i for i, t in enumerate(gen.token_ids) if t in stops), None)
            if hit is not None:
                gen = _truncate(gen, hit + 1, {"type": "stop", "matched": gen.token_ids[hit]})
        opts = WireOptions(
            incremental=self.incremental_streaming_output,
            return_logprob=return_logprob,
            logprob_text=bool(body.get("return_text_in_logprobs", False)),
            skip_tokenizer_init=self.skip_tokenizer_init,
            version=self.version,
        )
        interval = int(params.get("stream_interval") or self.stream_interval)
        return _Request(rid=rid, gen=gen, opts=opts, interval=max(1, interval), fault=fault)

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_running_requests and not self._closing:
            req = self._waiting.popleft()
            req.state = "running"
            self._running.add(req)
            req.decoder = asyncio.get_running_loop().create_task(self._decode(req))
            req.admitted.set()

    def _release(self, req: _Request) -> None:
        if req.decoder is not None and not req.decoder.done():
            # A client that left stops its generation (docs/wire-format.md, "Aborts"; 0.5.23).
            req.decoder.cancel()
        self._running.discard(req)
        if req in self._waiting:
            self._waiting.remove(req)
        self._admit()

    async def _decode(self, req: _Request) -> None:
        """Produce tokens and queue outputs at SGLang's emission points (docs/wire-format.md,
        "Stream interval and coalescing")."""
        n, fault_kind = len(req.gen.token_ids), req.fault.get("kind")
        points = set(wire.emission_points(n, req.interval, req.opts.version)[:-1])
        loop = asyncio.get_running_loop()
        start = loop.time()
        k = prev = 0

        def push(end: int, *, terminal: bool = False, reason: dict[str, Any] | None = None) -> None:
            nonlocal prev
            out = _Output(prev, end, terminal, reason)
            req.outbox.append(out)
            if terminal:
                req.final = out
            prev = end
            req.wake.set()

        while True:
            if req.abort_requested:
                # A running request decodes one more token before the abort applies
                # (docs/wire-format.md, "Aborts").
                k = min(k + 1, n)
                self._count(req, k)
                push(k, terminal=True, reason=ABORT_REASON)
                return
            if self.token_rate is None:
                due = k + 1
            else:
                due = min(n, int((loop.time() - start) * self.token_rate) + 1)  # first token at once
                if due <= k:
                    await asyncio.sleep(max(0.0, start + k / self.token_rate - loop.time()))
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
            self._count(req, due)
            k = due
            if k >= n:
                return
            if self.token_rate is None:
                if pushed:
                    req.sent.clear()
                    await req.sent.wait()
                elif k % _YIELD_EVERY_TOKENS == 0:
                    await asyncio.sleep(0)

    def _count(self, req: _Request, k: int) -> None:
        self.stats.tokens += k - req.produced
        req.produced = k

    def _build(self, req: _Request, outs: list[_Output], *, first: bool) -> dict[str, Any]:
        """One wire event for the queued outputs: newest only (cumulative), coalesced (incremental)."""
        events = [
            wire.normal_event(
                req.gen, req.opts, o.start, o.end, terminal=o.terminal, finish_reason=o.reason, first=first and i == 0
            )
            for i, o in enumerate(outs if req.opts.incremental else outs[-1:])
        ]
        return events[0] if len(events) == 1 else wire.coalesce(events)

    async def _drain(self, req: _Request, emit: Callable[[int, dict[str, Any]], Awaitable[None]]) -> None:
        """Hand every event to ``emit(index, event)`` until the terminal one."""
        group = int(req.fault.get("count", 3)) if req.fault.get("kind") == "coalesce" else 1
        pending: list[_Output] = []
        index = 0
        while True:
            await req.wake.wait()
            req.wake.clear()
            if self._closing:
                raise _StreamEnded
            pending += req.outbox
            req.outbox = []
            terminal = any(o.terminal for o in pending)
            if not pending or (len(pending) < group and not terminal):
                req.sent.set()
                continue
            event = self._build(req, pending, first=index == 0)
            pending = []
            await emit(index, event)
            index += 1
            req.sent.set()
            if terminal:
                return

    async def _stream(self, request: web.Request, req: _Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        # SGLang sends the headers before the generator runs, so queueing happens after them
        # (docs/wire-format.md, "SSE framing").
        try:
            await resp.prepare(request)
            return await self._stream_body(request, req, resp)
        except ConnectionResetError:
            # A write found the client gone; aiohttp treats the broken response as a disconnect.
            self._note_disconnect(req)
            return resp

    async def _stream_body(self, request: web.Request, req: _Request, resp: web.StreamResponse) -> web.StreamResponse:
        await req.admitted.wait()
        if self._closing:
            return resp  # an unfinished body: the client sees a truncated stream
        fault = req.fault
        kind, at = fault.get("kind"), fault.get("at", 1)
        split = int(fault.get("size", 7)) if kind == "split" else 0

        async def write(data: bytes) -> None:
            if not split:
                await resp.write(data)
                return
            for pos in range(0, len(data), split):
                await resp.write(data[pos : pos + split])

        # Aborted while queued: SGLang's echo chunk (docs/wire-format.md, "The abort echo").
        if req.state == "echo":
            await write(wire.sse(wire.echo_event(req.gen, req.opts, 0, first=True)) + wire.DONE)
            req.state = "done"
            return resp

        strip = tuple(fault.get("keys", ())) if kind == "strip_keys" else ()

        async def emit(index: int, event: dict[str, Any]) -> None:
            if index == at and kind is not None:
                if kind == "retract":
                    await self._retract(req, write, float(fault.get("seconds", 30.0)))
                    raise _StreamEnded
                if kind == "stall":
                    await asyncio.sleep(float(fault.get("seconds", 1.0)))
                elif kind == "error_event":
                    err = wire.error_event(fault.get("message", "injected error"), int(fault.get("code", 400)))
                    await write(wire.sse(err) + wire.DONE)
                    raise _StreamEnded
                elif kind == "malformed_json":
                    await write(b'data: {"text":"broken","output_ids":[1,\n\n' + wire.DONE)
                    raise _StreamEnded
                elif kind == "cut":
                    data = wire.sse(event)
                    await write(data[: len(data) // 2])
                    raise _ConnectionCut
            for key in strip:
                event["meta_info"].pop(key, None)
            await write(wire.sse(event))
            self.stats.written[req.rid] = event["meta_info"].get("completion_tokens", 0)

        try:
            await self._drain(req, emit)
        except _StreamEnded:
            req.state = "done"
            return resp
        except _ConnectionCut:
            req.state = "done"
            # Closing the transport leaves the chunked body unfinished: the client sees a truncated
            # stream, as when SGLang's generator raises mid-stream (docs/wire-format.md, "Errors").
            if request.transport is not None:
                request.transport.close()
            return resp
        if kind == "stall" and at == "done":
            await asyncio.sleep(float(fault.get("seconds", 1.0)))
        await write(wire.DONE)
        req.state = "done"
        self.stats.completed += 1
        await resp.write_eof()
        return resp

    async def _retract(self, req: _Request, write: Callable[[bytes], Awaitable[None]], seconds: float) -> None:
        """Stop decoding and keep the output; an abort ends the stream with the echo chunk."""
        if req.decoder is not None:
            req.decoder.cancel()
        req.state = "retracted"
        deadline = asyncio.get_running_loop().time() + seconds
        while not req.abort_requested and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        if req.abort_requested:
            await write(wire.sse(wire.echo_event(req.gen, req.opts, req.produced)) + wire.DONE)
            self.stats.written[req.rid] = req.produced
        req.state = "done"

    async def _non_stream(self, req: _Request) -> web.Response:
        await req.admitted.wait()
        if self._closing:
            return _json_error(503, "emulator stopping")
        cumulative = dataclasses.replace(req.opts, incremental=False)
        if req.state == "echo":
            final = wire.echo_event(req.gen, cumulative, 0)
        else:
            last: list[dict[str, Any]] = []

            async def keep(index: int, event: dict[str, Any]) -> None:
                last[:] = [event]

            try:
                await self._drain(req, keep)
            except _StreamEnded:
                return _json_error(503, "emulator stopping")
            assert req.final is not None
            final = wire.normal_event(
                req.gen, cumulative, 0, req.final.end, terminal=True, finish_reason=req.final.reason, first=True
            )
        req.state = "done"
        self.stats.completed += 1
        return web.Response(body=orjson.dumps(final), content_type="application/json")


class _StreamEnded(Exception):
    """An injected fault ended the stream with [DONE]."""


class _ConnectionCut(Exception):
    """An injected fault cut the connection mid-event."""


def _check_fault(fault: dict[str, Any]) -> None:
    if not isinstance(fault, dict):
        raise ValueError(f"{FAULT_KEY} must be an object")
    if fault and fault.get("kind") not in FAULT_KINDS:
        raise ValueError(f"unknown fault kind {fault.get('kind')!r}; expected one of {', '.join(FAULT_KINDS)}")


def _truncate(gen: Generation, n: int, reason: dict[str, Any]) -> Generation:
    """The same generation stopped after ``n`` tokens (the token source is prefix-stable)."""
    routed = gen.routed_experts
    if routed is not None:
        routed = routed[: max(gen.prompt_tokens + n - 1, 0)]
    rows = gen.top_p_rows[:n] if gen.top_p_rows is not None else None
    return dataclasses.replace(
        gen,
        token_ids=gen.token_ids[:n],
        logprobs=gen.logprobs[:n],
        token_texts=gen.token_texts[:n],
        finish_reason=reason,
        top_p_rows=rows,
        routed_experts=routed,
    )


def _json_ok(obj: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def _json_error(status: int, message: str) -> web.Response:
    # SGLang 0.5.23's request-contract failures: HTTP 400 with {"error": <string>}
    # (docs/wire-format.md, "Errors").
    return web.Response(status=status, body=orjson.dumps({"error": message}), content_type="application/json")
