"""``Emulator``: the SGLang server on aiohttp.web: its options, its HTTP endpoints, and the event
stream it writes for each request (with the injected faults). fastaccum.emulator describes it."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from fastaccum.emulator import writer
from fastaccum.emulator._dialect_servers import (
    DYNAMO_INTERNAL_ERROR,
    SSE_HEADERS,
    VllmServer,
    check_dialect,
    check_dialect_fault,
    dynamo_refusal,
    dynamo_rid,
    error_response,
)
from fastaccum.emulator._requests import (
    FAULT_KEY,
    ConnectionCut,
    EmulatorStats,
    Request,
    StreamEnded,
    decode,
    drain,
    truncate,
)
from fastaccum.emulator.writer import Generation, WireOptions

__all__ = ("Emulator",)

_SSE_HEADERS = SSE_HEADERS


class Emulator:
    """An in-process SGLang server: ``async with Emulator(...) as url:``.

    Options are named like SGLang's server flags. ``token_rate`` is tokens/s per request; ``None``
    decodes in lockstep with the writer (as fast as the client reads, every emission point sent, so
    event boundaries are deterministic). ``num_layers``/``topk``/``num_experts`` describe the MoE
    model behind ``enable_return_routed_experts``, ``num_indexer_layers``/``index_topk`` the
    sparse-attention indexer behind ``enable_return_indexer_topk``; ``indexer_topk_num_layers``
    writes the indexer's layer count beside it, as SGLang forks (sglang-miles) do and SGLang does not.

    ``dialect`` picks the server (docs/dialects.md): ``"sglang"``; ``"dynamo"``, Dynamo's frontend
    before SGLang workers (incremental whatever was asked, no ``/abort_request``); ``"vllm"``,
    vLLM's ``/inference/v1/generate`` in the chunk shape of ``vllm_shape`` (``"0.32"``, or ``"0.31"``
    for 0.24 to 0.31), where ``enable_return_routed_experts`` and ``return_sampling_mask`` are
    vLLM's flags of those names. fastaccum.emulator._dialect_servers serves what differs.
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
        enable_return_indexer_topk: bool = False,
        num_indexer_layers: int = 2,
        index_topk: int = 8,
        indexer_topk_num_layers: bool = False,
        token_rate: float | None = None,
        max_running_requests: int = 256,
        seed: int = 0,
        version: str = "0.5.23",
        fault: dict[str, Any] | None = None,
        plain_text: bool = False,
        dialect: str = "sglang",
        vllm_shape: str = "0.32",
        return_sampling_mask: bool = False,
        greedy: bool = False,
    ) -> None:
        if version not in ("0.5.23", "0.5.15"):
            raise ValueError(f"version must be '0.5.23' or '0.5.15', not {version!r}")
        check_dialect(dialect, vllm_shape)
        if fault is not None:
            check_dialect_fault(dialect, fault)
        self.dialect, self.vllm_shape = dialect, vllm_shape
        self.return_sampling_mask = return_sampling_mask  # vLLM's --return-sampling-mask
        self.host, self.port = host, port
        # Dynamo's worker forces SGLang's incremental mode (facts: dynamo/sglang/args.py).
        self.incremental_streaming_output = incremental_streaming_output or dialect == "dynamo"
        self.stream_interval = max(1, int(stream_interval))
        self.skip_tokenizer_init = skip_tokenizer_init
        self.enable_return_routed_experts = enable_return_routed_experts
        self.expert_shape = (num_layers, topk)
        self.enable_return_indexer_topk = enable_return_indexer_topk
        self.indexer_shape = (num_indexer_layers, index_topk)
        self.indexer_topk_num_layers = indexer_topk_num_layers
        self.num_experts = num_experts
        self.token_rate = token_rate if token_rate else None
        self.max_running_requests = max(1, max_running_requests)
        self.seed = seed
        self.greedy = greedy
        self.version = version
        self.fault = fault
        # Token texts without U+2028/U+2029/U+0085, for clients that read lines with splitlines().
        self.text_pieces = writer.PLAIN_TEXT_PIECES if plain_text else writer.TEXT_PIECES
        self.stats = EmulatorStats()
        self._running: set[Request] = set()
        self._waiting: deque[Request] = deque()
        self._runner: web.AppRunner | None = None
        self._closing = False

    # ---- lifecycle -----------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30, middlewares=[self._count_call])
        if self.dialect == "vllm":
            VllmServer(self).add_routes(app)
            return app
        app.router.add_post("/generate", self._generate)
        if self.dialect == "sglang":  # Dynamo's frontend serves /generate and no abort (the disconnect is)
            app.router.add_post("/abort_request", self._abort_request)
            app.router.add_get("/server_info", self._server_info)
            app.router.add_get("/get_server_info", self._server_info)
            app.router.add_get("/v1/loads", self._loads)
        app.router.add_get("/health", self._health)
        return app

    @web.middleware
    async def _count_call(self, request: web.Request, handler: Any) -> web.StreamResponse:
        calls = self.stats.calls
        calls[request.path] = calls.get(request.path, 0) + 1
        response: web.StreamResponse = await handler(request)
        return response

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

    def is_closing(self) -> bool:
        return self._closing

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
        routed_start: int = 0,
        indexer_topk: bool = False,
        first_position: int = 0,
    ) -> Generation:
        """The first ``n`` tokens this server generates for ``rid`` (a pure function of seed, rid, position).

        ``prompt_tokens`` only shapes the replay rows (routed experts from ``routed_start`` on,
        indexer top-k): pass ``len(input_ids)`` (or ``prompt_tokens_of(text)``). ``finish_reason``
        defaults to ``length``. A greedy server's truth is ``expected(*emulator.key_of(prompt), n,
        ...)``.
        """
        if finish_reason is None:
            finish_reason = {"type": "length", "length": n}
        return writer.synthetic_generation(
            rid,
            n,
            seed=self.seed,
            prompt_tokens=prompt_tokens,
            finish_reason=finish_reason,
            top_p=top_p,
            expert_shape=self.expert_shape if routed_experts else None,
            num_experts=self.num_experts,
            routed_start=routed_start,
            indexer_shape=self.indexer_shape if indexer_topk else None,
            text_pieces=self.text_pieces,
            first_position=first_position,
        )

    def key_of(self, rid: str, prompt: list[int] | str) -> tuple[str, int]:
        """What a request's tokens are a function of, with where its first token falls: its rid
        and 0; in greedy mode its prompt's first token (or word) and the prompt's length, so that
        a request for prompt + k generated tokens continues the first one, as a greedy model's
        would (resumes are tested against it)."""
        if not self.greedy:
            return rid, 0
        if isinstance(prompt, str):
            return f"greedy:{prompt.split()[0] if prompt.split() else ''}", self.prompt_tokens_of(prompt)
        return f"greedy:{prompt[0]}", len(prompt)

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
                "enable_return_indexer_topk": self.enable_return_indexer_topk,
                "num_indexer_layers": self.indexer_shape[0],
                "index_topk": self.indexer_shape[1],
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
        rid, abort_all = body.get("rid") or "", bool(body.get("abort_all"))
        # SGLang's tokenizer manager passes an abort on only for a rid it holds (exactly); its
        # scheduler then matches by prefix (abort() below). Either way the answer is 200 at once.
        if abort_all or any(r.rid == rid for r in [*self._running, *self._waiting]):
            self.abort(rid, abort_all=abort_all)
        return web.Response(status=200)

    def abort(self, rid: str = "", *, abort_all: bool = False) -> int:
        """What ``/abort_request`` does; rids match by prefix, as SGLang's scheduler does
        (docs/wire-format.md, "Aborts"). vLLM's request ids match exactly (its ``/abort_requests``)."""
        exact = self.dialect == "vllm"
        held = [*self._running, *self._waiting]
        hits = [r for r in held if abort_all or (r.rid == rid if exact else r.rid.startswith(rid))]
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
            return error_response(self.dialect, 400, f"invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return error_response(self.dialect, 400, "the request body must be a JSON object")
        dynamo = self.dialect == "dynamo"
        if dynamo:
            refusal = dynamo_refusal(body)
            if refusal is not None:
                return refusal
            body["rid"] = dynamo_rid(body, request.headers)  # meta_info.id: the public id
        fault = body.get(FAULT_KEY, self.fault) or {}
        try:
            check_dialect_fault(self.dialect, fault)
            req = self._make_request(body, fault)
        except ValueError as exc:
            return error_response(self.dialect, 400, str(exc))
        if fault.get("kind") == "http_500":
            body500 = {
                "object": "error",
                "message": fault.get("message", "injected HTTP 500"),
                "type": "InternalServerError",
                "param": None,
                "code": 500,
            }
            return web.Response(status=500, body=orjson.dumps(body500), content_type="application/json")
        # Dynamo submits its own internal rid to SGLang: a repeated public id is no duplicate there.
        if not dynamo and any(r.rid == req.rid for r in [*self._running, *self._waiting]):
            duplicate = writer.error_event(f"Duplicate request ID: {req.rid}")
            if not body.get("stream"):
                return web.Response(status=400, body=orjson.dumps(duplicate), content_type="application/json")
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            await resp.write(writer.sse(duplicate) + writer.DONE)
            return resp
        stream = bool(body.get("stream"))
        return await self.serve_request(req, lambda: self._stream(request, req) if stream else self._non_stream(req))

    async def serve_request(
        self, req: Request, respond: Callable[[], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Queue the request, answer it with ``respond()``, and release it however that ends.
        With ``is_closing`` and ``note_disconnect``, what the other dialects' servers call (the
        ``Host`` protocol in fastaccum.emulator._dialect_servers)."""
        self.stats.requests += 1
        self._waiting.append(req)
        self._admit()
        try:
            return await respond()
        except asyncio.CancelledError:
            self.note_disconnect(req)
            raise
        finally:
            self._release(req)

    def note_disconnect(self, req: Request) -> None:
        if req.state != "done":
            req.state = "done"
            self.stats.disconnects += 1
            self.stats.disconnected_rids.append(req.rid)

    # ---- requests ------------------------------------------------------------------------------
    def _make_request(self, body: dict[str, Any], fault: dict[str, Any]) -> Request:
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
        asked = bool(body.get("return_routed_experts"))
        routed = asked and self.enable_return_routed_experts
        start = body.get("routed_experts_start_len") or 0
        # The scheduler checks the start whenever routed experts are asked for, flag or not.
        if asked and (type(start) is not int or not 0 <= start <= prompt_tokens):
            raise ValueError(f"routed_experts_start_len must be in [0, {prompt_tokens}], not {start!r}")
        indexer = bool(body.get("return_indexer_topk")) and self.enable_return_indexer_topk
        key, first = self.key_of(rid, ids if "input_ids" in body else body["text"])
        gen = self.expected(
            key,
            max_new,
            prompt_tokens=prompt_tokens,
            top_p=top_p,
            routed_experts=routed,
            routed_start=start if routed else 0,
            indexer_topk=indexer,
            first_position=first,
        )
        gen = dataclasses.replace(gen, rid=rid) if key != rid else gen
        stops = set(params.get("stop_token_ids") or ())
        if stops:
            hit = next((i for i, t in enumerate(gen.token_ids) if t in stops), None)
            if hit is not None:
                gen = truncate(gen, hit + 1, {"type": "stop", "matched": gen.token_ids[hit]})
        opts = WireOptions(
            incremental=self.incremental_streaming_output,
            return_logprob=return_logprob,
            logprob_text=bool(body.get("return_text_in_logprobs", False)),
            skip_tokenizer_init=self.skip_tokenizer_init,
            version=self.version,
            indexer_topk_num_layers=self.indexer_topk_num_layers,
        )
        interval = int(params.get("stream_interval") or self.stream_interval)
        streams = bool(body.get("stream"))
        return Request(rid=rid, gen=gen, opts=opts, interval=max(1, interval), fault=fault, streams=streams)

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_running_requests and not self._closing:
            req = self._waiting.popleft()
            req.state = "running"
            self._running.add(req)
            # vLLM applies an abort between steps, SGLang after one more token.
            step = 0 if self.dialect == "vllm" else 1
            req.decoder = asyncio.get_running_loop().create_task(
                decode(req, token_rate=self.token_rate, count=self._count, abort_step=step)
            )
            req.admitted.set()

    def _release(self, req: Request) -> None:
        if req.decoder is not None and not req.decoder.done():
            # A client that left stops its generation (docs/wire-format.md, "Aborts"; 0.5.23).
            req.decoder.cancel()
        self._running.discard(req)
        if req in self._waiting:
            self._waiting.remove(req)
        self._admit()

    def _count(self, req: Request, k: int) -> None:
        self.stats.tokens += k - req.produced
        req.produced = k

    async def _stream(self, request: web.Request, req: Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        # SGLang sends the headers before the generator runs, so queueing happens after them
        # (docs/wire-format.md, "SSE framing").
        try:
            await resp.prepare(request)
            return await self._stream_body(request, req, resp)
        except ConnectionResetError:
            # A write found the client gone; aiohttp treats the broken response as a disconnect.
            self.note_disconnect(req)
            return resp

    async def _stream_body(self, request: web.Request, req: Request, resp: web.StreamResponse) -> web.StreamResponse:
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
            await write(writer.sse(writer.echo_event(req.gen, req.opts, 0, first=True)) + writer.DONE)
            req.state = "done"
            return resp

        strip = tuple(fault.get("keys", ())) if kind == "strip_keys" else ()

        async def emit(index: int, event: dict[str, Any]) -> None:
            if index == at and kind is not None:
                if kind == "retract":
                    await self._retract(req, write, float(fault.get("seconds", 30.0)))
                    raise StreamEnded
                if kind == "stall":
                    await asyncio.sleep(float(fault.get("seconds", 1.0)))
                elif kind == "error_event":
                    err = writer.error_event(fault.get("message", "injected error"), int(fault.get("code", 400)))
                    await write(writer.sse(err) + writer.DONE)
                    raise StreamEnded
                elif kind == "malformed_json":
                    await write(b'data: {"text":"broken","output_ids":[1,\n\n' + writer.DONE)
                    raise StreamEnded
                elif kind == "cut":
                    data = writer.sse(event)
                    await write(data[: len(data) // 2])
                    raise ConnectionCut
                elif kind == "dynamo_error":  # any backend error, as Dynamo's frontend writes it
                    await write(writer.sse({"error": {"message": DYNAMO_INTERNAL_ERROR}}) + writer.DONE)
                    raise StreamEnded
            for key in strip:
                event["meta_info"].pop(key, None)
            await write(writer.sse(event))
            self.stats.written[req.rid] = event["meta_info"].get("completion_tokens", 0)
            if index == at and kind in ("dynamo_killed", "dynamo_stopped"):
                # Killed (a backend timeout): the body ends cleanly, no [DONE]. Stopped gracefully:
                # the worker drops SGLang's later outputs, then [DONE] without a terminal event.
                if kind == "dynamo_stopped":
                    await write(writer.DONE)
                raise StreamEnded

        try:
            await drain(req, emit, closing=self.is_closing)
        except StreamEnded:
            req.state = "done"
            return resp
        except ConnectionCut:
            req.state = "done"
            # Closing the transport leaves the chunked body unfinished: the client sees a truncated
            # stream, as when SGLang's generator raises mid-stream (docs/wire-format.md, "Errors").
            if request.transport is not None:
                request.transport.close()
            return resp
        if kind == "stall" and at == "done":
            await asyncio.sleep(float(fault.get("seconds", 1.0)))
        await write(writer.DONE)
        req.state = "done"
        self.stats.completed += 1
        await resp.write_eof()
        return resp

    async def _retract(self, req: Request, write: Callable[[bytes], Awaitable[None]], seconds: float) -> None:
        """Stop decoding and keep the output; an abort ends the stream with the echo chunk."""
        if req.decoder is not None:
            req.decoder.cancel()
        req.state = "retracted"
        deadline = asyncio.get_running_loop().time() + seconds
        while not req.abort_requested and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.005)
        if req.abort_requested:
            await write(writer.sse(writer.echo_event(req.gen, req.opts, req.produced)) + writer.DONE)
            self.stats.written[req.rid] = req.produced
        req.state = "done"

    async def _non_stream(self, req: Request) -> web.Response:
        await req.admitted.wait()
        if self._closing:
            return _json_error(503, "emulator stopping")
        cumulative = dataclasses.replace(req.opts, incremental=False)
        if req.state == "echo":
            final = writer.echo_event(req.gen, cumulative, 0)
        else:

            async def skip(index: int, event: dict[str, Any]) -> None:
                pass

            try:
                # Only the final answer is written: no event is built on the way (building each
                # cumulative one cost the whole response per emission point).
                await drain(req, skip, closing=self.is_closing, build=lambda *args, **kwargs: {})
            except StreamEnded:
                return _json_error(503, "emulator stopping")
            assert req.final is not None
            final = writer.normal_event(
                req.gen, cumulative, 0, req.final.end, terminal=True, finish_reason=req.final.reason, first=True
            )
        req.state = "done"
        self.stats.completed += 1
        return web.Response(body=orjson.dumps(final), content_type="application/json")


def _json_ok(obj: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(obj), content_type="application/json")


def _json_error(status: int, message: str) -> web.Response:
    # SGLang 0.5.23's request-contract failures: HTTP 400 with {"error": <string>}
    # (docs/wire-format.md, "Errors").
    return web.Response(status=status, body=orjson.dumps({"error": message}), content_type="application/json")
