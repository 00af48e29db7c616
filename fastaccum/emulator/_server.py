"""``Emulator``: the SGLang server on aiohttp.web: its options, its HTTP endpoints, and the event
stream it writes for each request (with the injected faults). fastaccum.emulator describes it."""

from __future__ import annotations

import asyncio
import dataclasses
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
from fastaccum.emulator._pause_server import PauseServer
from fastaccum.emulator._requests import (
    ECHO_REASON,
    FAULT_KEY,
    ConnectionCut,
    EmulatorStats,
    Request,
    Schedule,
    StreamEnded,
    drain,
    sglang_request,
)
from fastaccum.emulator._scheduler import Scheduler
from fastaccum.emulator.writer import Generation

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

    Pauses and weight updates (fastaccum.emulator describes them): ``model_path`` names the
    weights it starts with, ``weight_version`` their version (SGLang's ``--weight-version``,
    ``"default"``; vLLM: None stamps none until ``/update_weight_version``),
    ``health_check_timeout_s`` how long SGLang's ``/health`` waits in a pause before its 503,
    ``vllm_server_dev_mode`` mounts vLLM 0.32's RL pause endpoints (``VLLM_SERVER_DEV_MODE=1``).
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
        model_path: str = "fastaccum/emulated",
        weight_version: str | None = None,
        health_check_timeout_s: float = 20.0,
        vllm_server_dev_mode: bool = False,
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
        self.model_path = model_path
        self.health_check_timeout_s = health_check_timeout_s
        self.vllm_server_dev_mode = vllm_server_dev_mode
        self.scheduler = Scheduler(
            dialect=dialect,
            stats=self.stats,
            token_rate=self.token_rate,
            max_running_requests=self.max_running_requests,
            model_path=model_path,
            weight_version=weight_version,
        )
        self.scheduler.admit = self._admit
        self._runner: web.AppRunner | None = None

    # ---- lifecycle -----------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 30, middlewares=[self._count_call])
        pauses = PauseServer(self.scheduler, health_check_timeout_s=self.health_check_timeout_s)
        if self.dialect == "vllm":
            VllmServer(self).add_routes(app)
            if self.vllm_server_dev_mode and self.vllm_shape == "0.32":
                pauses.add_vllm_routes(app)
            return app
        app.router.add_post("/generate", self._generate)
        if self.dialect == "sglang":  # Dynamo's frontend serves /generate and no abort (the disconnect is)
            app.router.add_post("/abort_request", self._abort_request)
            app.router.add_get("/server_info", self._server_info)
            app.router.add_get("/get_server_info", self._server_info)
            app.router.add_get("/v1/loads", self._loads)
            pauses.add_sglang_routes(app)
        else:
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
        self.scheduler.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> str:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def is_closing(self) -> bool:
        return self.scheduler.closing

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> int:
        return len(self.scheduler.running)

    @property
    def retracted(self) -> int:
        """Requests stopped by the ``retract`` fault and waiting for an abort, and requests a
        retract pause put back in the waiting queue."""
        s = self.scheduler
        return sum(1 for r in s.running if r.state == "retracted") + sum(1 for r in s.waiting if r.retractions)

    @property
    def queued(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def paused(self) -> str | None:
        """The mode of the pause in force (SGLang's or vLLM's), or None."""
        return self.scheduler.pause_mode

    @property
    def weight_version(self) -> str:
        """The scheduler's weight version (vLLM: the engine's); SGLang's events may still carry
        the tokenizer's, ``scheduler.label``, after an update whose cache flush failed."""
        return self.scheduler.version

    @property
    def weights(self) -> str:
        """The model path whose weights are in force."""
        return self.scheduler.weights or self.model_path

    # ---- the scheduler's state under the names subclasses use (benchmarks/abort_fanout.py) --------
    @property
    def _running(self) -> set[Request]:
        return self.scheduler.running

    @property
    def _waiting(self) -> deque[Request]:
        return self.scheduler.waiting

    @property
    def _closing(self) -> bool:
        return self.scheduler.closing

    def _admit(self) -> None:
        self.scheduler.admit_waiting()

    def _count(self, req: Request, k: int) -> None:
        self.scheduler.count(req, k)

    # ---- pauses and weights, as the endpoints do them ----------------------------------------
    async def pause(self, mode: str = "abort", *, clear_cache: bool = True) -> None:
        """``/pause_generation`` (SGLang: abort, retract, in_place) or vLLM's ``/pause`` (abort,
        wait, keep, with ``clear_cache``); returns when the endpoint's call would."""
        await self.scheduler.pause(mode, clear_cache=clear_cache)

    def continue_(self) -> None:
        """``/continue_generation`` (vLLM: ``/resume``)."""
        self.scheduler.resume()

    async def update_weight_version(self, new_version: str, *, abort_all_requests: bool = True) -> None:
        """``/update_weight_version`` (vLLM's aborts nothing)."""
        await self.scheduler.update_weight_version(new_version, abort_all=abort_all_requests)

    async def update_weights_from_disk(
        self,
        model_path: str,
        *,
        weight_version: str | None = None,
        flush_cache: bool = True,
        abort_all_requests: bool = False,
    ) -> tuple[bool, str]:
        """SGLang's ``/update_weights_from_disk``: (success, message) as it answers them."""
        if self.dialect == "vllm":
            raise ValueError("vLLM loads weights through its weight-transfer engine, which is not emulated")
        return await self.scheduler.update_weights_from_disk(
            model_path, weight_version=weight_version, flush_cache=flush_cache, abort_all=abort_all_requests
        )

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
        token_weights: Schedule = (),
        row_weights: Schedule = (),
    ) -> Generation:
        """The first ``n`` tokens this server generates for ``rid`` (a pure function of seed, rid, position).

        ``prompt_tokens`` only shapes the replay rows (routed experts from ``routed_start`` on,
        indexer top-k): pass ``len(input_ids)`` (or ``prompt_tokens_of(text)``). ``finish_reason``
        defaults to ``length``. A greedy server's truth is ``expected(key, n, first_position=first,
        ...)`` with ``key, first = emulator.key_of(rid, prompt)``. ``token_weights`` and
        ``row_weights``: which weights (model paths) computed which tokens (from an output index
        on) and which replay rows (from a sequence position on), as after a weight update;
        ``model_path`` is the weights the server started with.
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
            token_weights=tuple((first, self._tag(path)) for first, path in token_weights),
            row_weights=tuple((first, self._tag(path)) for first, path in row_weights),
        )

    def _tag(self, model_path: str) -> str:
        return "" if model_path == self.model_path else model_path

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
        if abort_all or self.scheduler.holds(rid):
            self.abort(rid, abort_all=abort_all)
        return web.Response(status=200)

    def abort(self, rid: str = "", *, abort_all: bool = False) -> int:
        """What ``/abort_request`` does (fastaccum.emulator._scheduler.Scheduler.abort)."""
        return self.scheduler.abort(rid, abort_all=abort_all)

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
        if not dynamo and self.scheduler.holds(req.rid):
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
        self.scheduler.enqueue(req)
        try:
            return await respond()
        except asyncio.CancelledError:
            self.note_disconnect(req)
            raise
        finally:
            self.scheduler.release(req)

    def note_disconnect(self, req: Request) -> None:
        if req.state != "done":
            req.state = "done"
            self.stats.disconnects += 1
            self.stats.disconnected_rids.append(req.rid)

    # ---- requests ------------------------------------------------------------------------------
    def _make_request(self, body: dict[str, Any], fault: dict[str, Any]) -> Request:
        return sglang_request(self, body, fault)

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
        if self.is_closing():
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
        if req.state == "echo" and req.final is None:
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
        task, req.decoder = req.decoder, None
        if task is not None:
            task.cancel()
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
        if self.is_closing():
            return _json_error(503, "emulator stopping")
        cumulative = dataclasses.replace(req.opts, incremental=False)
        if req.state == "echo" and req.final is None:  # aborted while queued: before any token
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
            if req.final.reason is ECHO_REASON:  # aborted while retracted
                final = writer.echo_event(req.gen, cumulative, req.final.end)
            else:
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
