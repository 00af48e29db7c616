"""The emulator's other servers (docs/dialects.md): what Dynamo's frontend changes on SGLang's
``/generate``, and vLLM's ``/inference/v1/generate`` with the control calls vime makes on a vLLM
worker (``POST /abort_requests``, ``GET /load``, ``GET /health``). The requests, their decoding
and the scheduler are the SGLang emulator's (fastaccum.emulator._server); only the bytes differ."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import orjson
from aiohttp import web

from fastaccum.emulator import writer, writer_vllm
from fastaccum.emulator._requests import (
    ABORT_REASON,
    FAULT_KEY,
    FAULT_KINDS,
    ConnectionCut,
    EmulatorStats,
    Output,
    Request,
    Schedule,
    StreamEnded,
    check_fault,
    drain,
    truncate,
)
from fastaccum.emulator._scheduler import PAUSE_MODES

__all__ = (
    "DIALECTS",
    "DYNAMO_INTERNAL_ERROR",
    "VLLM_ID_PREFIX",
    "VllmRequest",
    "VllmServer",
    "check_dialect",
    "check_dialect_fault",
    "dynamo_refusal",
    "dynamo_rid",
    "error_response",
)

DIALECTS = ("sglang", "dynamo", "vllm")
# vLLM's id for a /inference/v1/generate request: this prefix and the client's request_id (or its
# X-Request-Id header, or a random one). The chunks carry it, and an abort must name it.
VLLM_ID_PREFIX = "generate-tokens-"
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
# Dynamo's frontend writes every backend error mid-stream as this (SanitizedError::Internal).
DYNAMO_INTERNAL_ERROR = "Internal server error"
# The faults each dialect's stream can show; the rest are another server's.
_OWN_FAULTS = {
    "sglang": frozenset(FAULT_KINDS) - {"dynamo_error", "dynamo_killed", "dynamo_stopped", "vllm_error"},
    "dynamo": frozenset(FAULT_KINDS) - {"vllm_error", "pause", "hold"},
    "vllm": frozenset(
        ("vllm_error", "malformed_json", "cut", "http_500", "stall", "coalesce", "split", "pause", "hold")
    ),
}


def check_dialect(dialect: str, vllm_shape: str) -> None:
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(map(repr, DIALECTS))}, not {dialect!r}")
    if vllm_shape not in writer_vllm.SHAPES:
        raise ValueError(f"vllm_shape must be one of {', '.join(map(repr, writer_vllm.SHAPES))}, not {vllm_shape!r}")


def check_dialect_fault(dialect: str, fault: dict[str, Any]) -> None:
    check_fault(fault)
    kind = fault.get("kind")
    if kind is not None and kind not in _OWN_FAULTS[dialect]:
        raise ValueError(f"fault kind {kind!r} is not one a {dialect} server produces")
    if kind == "pause" and fault.get("mode", "abort") not in PAUSE_MODES[dialect]:
        modes = ", ".join(map(repr, PAUSE_MODES[dialect]))
        raise ValueError(f"a {dialect} server pauses in mode {modes}, not {fault.get('mode')!r}")


def error_response(dialect: str, status: int, message: str) -> web.Response:
    """A refusal before any SSE byte, in the server's shape: SGLang 0.5.23's ``{"error": <string>}``
    (docs/wire-format.md, "Errors"), Dynamo's ``{"error": {"message"}}``, vLLM's error object."""
    error: Any = message
    if dialect == "dynamo":
        error = {"message": message}
    elif dialect == "vllm":
        kind = "BadRequestError" if status < 500 else "InternalServerError"
        error = {"message": message, "type": kind, "param": None, "code": status}
    return web.Response(status=status, body=orjson.dumps({"error": error}), content_type="application/json")


# ---- Dynamo -------------------------------------------------------------------------------------


def dynamo_refusal(body: Mapping[str, Any]) -> web.Response | None:
    """What Dynamo's frontend refuses before the request reaches SGLang: streaming only (501), and
    ``input_ids`` required, non-empty (400)."""
    if body.get("stream") is not True:
        message = "non-streaming SGLang generate requests are not implemented; set stream=true"
        return error_response("dynamo", 501, message)
    ids = body.get("input_ids")
    if not isinstance(ids, list):
        return error_response("dynamo", 400, "Failed to deserialize the JSON body: input_ids must be a list of ints")
    if not ids:
        return error_response("dynamo", 400, "input_ids cannot be empty.")
    return None


def dynamo_rid(body: Mapping[str, Any], headers: Mapping[str, str]) -> Any:
    """The public id Dynamo writes into ``meta_info.id``: the body's ``rid``, else the
    ``x-request-id`` header, else a new UUID v4 (SGLang itself gets an internal id)."""
    return body.get("rid") or headers.get("x-request-id") or str(uuid.uuid4())


# ---- vLLM ---------------------------------------------------------------------------------------
# As vLLM 0.31 and 0.32 have it (vllm/entrypoints/scale_out/token_in_token_out/, rl/ and
# serve/dev/rlhf/ api_router.py, v1/engine/output_processor.py): routed experts and the sampling
# mask are the server's switches (--enable-return-routed-experts, --return-sampling-mask), never a
# request's; both arrive with the request's finishing output, an abort's included, and 0.32 on
# streams the sampling mask rows with each chunk's tokens (0.31 streams none).


@dataclasses.dataclass(frozen=True)
class VllmOptions:
    shape: str = "0.32"
    logprobs: bool = True  # sampling_params.logprobs is not null
    routed: bool = False  # routed experts on the finishing chunk
    mask: bool = False  # a sampling mask row per token
    usage: bool = False  # stream_options.include_usage


@dataclasses.dataclass(eq=False)
class VllmRequest(Request):
    vllm: VllmOptions = dataclasses.field(default_factory=VllmOptions)


def vllm_chunk(req: Request, outs: list[Output], *, first: bool) -> dict[str, Any]:
    """One chunk for the queued outputs: their tokens merged, as vLLM's output collector merges the
    deltas a slow reader left queued; the finishing one (an abort's too) carries finish_reason and
    the routed experts of every position forwarded so far."""
    assert isinstance(req, VllmRequest)
    opts, last, gen = req.vllm, outs[-1], req.gen
    finish, stop_reason, spans = None, None, None
    if last.terminal and last.reason is ABORT_REASON:
        finish = "abort"
        gen = truncate(gen, last.end, {"type": "abort"})
    elif last.terminal:
        finish, stop_reason = writer_vllm.finish_of(gen)
    if last.terminal and req.versions:  # each token's step's version; a request of no tokens has []
        spans = writer.weight_version_spans(gen, last.end) if last.end else []
    return writer_vllm.chunk(
        gen,
        outs[0].start,
        last.end,
        shape=opts.shape,
        logprobs=opts.logprobs,
        finish=finish,
        stop_reason=stop_reason,
        routed=opts.routed and last.terminal,
        sampling_mask=opts.mask,
        weight_versions=spans,
    )


class Host(Protocol):
    """What a dialect's server needs of the emulator that runs it: its settings, its scheduler's
    counts, and the request lifecycle. The emulator is one such host; nothing else of it is used."""

    vllm_shape: str
    fault: dict[str, Any] | None
    return_sampling_mask: bool
    enable_return_routed_experts: bool
    stream_interval: int
    stats: EmulatorStats

    @property
    def running(self) -> int: ...

    @property
    def queued(self) -> int: ...

    def expected(
        self,
        rid: str,
        n: int,
        *,
        prompt_tokens: int = ...,
        top_p: bool = ...,
        routed_experts: bool = ...,
        routed_start: int = ...,
        first_position: int = ...,
        token_weights: Schedule = ...,
        row_weights: Schedule = ...,
    ) -> writer.Generation: ...

    def key_of(self, rid: str, prompt: list[int] | str) -> tuple[str, int]: ...

    def abort(self, rid: str = "", *, abort_all: bool = False) -> int: ...

    def is_closing(self) -> bool: ...

    async def serve_request(
        self, req: Request, respond: Callable[[], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse: ...

    def note_disconnect(self, req: Request) -> None: ...


class VllmServer:
    """vLLM's endpoints, on the emulator's requests and scheduler."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/inference/v1/generate", self.generate)
        if self.host.vllm_shape == "0.32":
            app.router.add_post("/inference/v1/abort_requests", self.abort_by_id)
        # The RL dev API's, served whatever vllm_server_dev_mode says: vime's workers call it.
        app.router.add_post("/abort_requests", self.abort_requests)
        app.router.add_get("/load", self.load)
        app.router.add_get("/health", self.health)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def load(self, request: web.Request) -> web.Response:
        # What vime's server control reads (num_requests_from_load): the requests the server holds.
        return web.json_response({"server_load": self.host.running + self.host.queued})

    async def _ids(self, request: web.Request) -> tuple[list[str] | None, web.Response | None]:
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError as exc:
            return None, web.json_response({"detail": f"JSON decode error: {exc}"}, status=400)
        if not isinstance(body, dict):
            return None, web.json_response({"detail": "Request body must be a JSON object"}, status=400)
        ids = body.get("request_ids")
        if isinstance(ids, str):
            return [ids], None
        return ([str(rid) for rid in ids] if isinstance(ids, list) else None), None

    async def abort_by_id(self, request: web.Request) -> web.Response:
        """0.32 on: ``POST /inference/v1/abort_requests {"request_ids": [...]}``, 200 and no body."""
        ids, refusal = await self._ids(request)
        if refusal is not None:
            return refusal
        if ids is None:
            return web.json_response({"detail": "Missing 'request_ids' in request body"}, status=400)
        for rid in ids:
            self.host.abort(rid)
        return web.Response(status=200)

    async def abort_requests(self, request: web.Request) -> web.Response:
        """The RL dev API's ``POST /abort_requests`` (what vime calls on every worker):
        ``{"request_ids": [...]}`` aborts those, ``{}`` every request the server holds."""
        ids, refusal = await self._ids(request)
        if refusal is not None:
            return refusal
        aborted = sum(self.host.abort(rid) for rid in ids) if ids else self.host.abort(abort_all=True)
        return web.json_response({"status": "aborted", "aborted": aborted})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return error_response("vllm", 400, f"invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return error_response("vllm", 400, "the request body must be a JSON object")
        fault = body.get(FAULT_KEY, self.host.fault) or {}
        try:
            check_dialect_fault("vllm", fault)
            req = self.make_request(body, fault, request.headers.get("X-Request-Id"))
        except ValueError as exc:
            return error_response("vllm", 400, str(exc))
        if fault.get("kind") == "http_500":
            return error_response("vllm", 500, fault.get("message", "injected HTTP 500"))
        stream = bool(body.get("stream"))
        return await self.host.serve_request(req, lambda: self.stream(request, req) if stream else self.whole(req))

    def make_request(self, body: dict[str, Any], fault: dict[str, Any], header_id: str | None) -> VllmRequest:
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not ids or not all(type(t) is int and t >= 0 for t in ids):
            raise ValueError("token_ids must be a non-empty list of token ids")
        params = body.get("sampling_params")
        if not isinstance(params, dict):
            raise ValueError("sampling_params is required (an object)")
        base = body.get("request_id", uuid.uuid4().hex)
        if not isinstance(base, str):
            raise ValueError("request_id must be a string")
        base = header_id if header_id is not None else base  # vLLM's X-Request-Id overrides the body
        host = self.host
        # Left out: vLLM fills the model's context (here the emulator's SGLang default).
        max_tokens = params.get("max_tokens", 128)
        if type(max_tokens) is not int or max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens!r}")
        logprobs = params.get("logprobs")
        if logprobs is not None and (type(logprobs) is not int or logprobs < -1):
            raise ValueError(f"logprobs must be an integer or null, got {logprobs!r}")
        mask = host.return_sampling_mask
        if mask and not params.get("temperature", 1.0) > 0:
            raise ValueError("sampling distribution replay requires temperature > 0")
        if mask and not (type(params.get("top_k")) is int and params["top_k"] > 0):
            raise ValueError("sampling distribution replay requires top_k > 0")
        options = body.get("stream_options") or {}
        routed = host.enable_return_routed_experts
        start = params.get("routed_experts_prompt_start", 0)
        if type(start) is not int or not 0 <= start <= len(ids):  # vLLM's input processor checks it
            raise ValueError(
                f"routed_experts_prompt_start must be between 0 and the prompt length ({len(ids)}), inclusive."
            )
        # Tokens are keyed by the id the client gave; the wire (and every abort) uses vLLM's own.
        key, first = host.key_of(base, ids)
        rid = VLLM_ID_PREFIX + base
        stops = set(params.get("stop_token_ids") or ())

        def make(token_weights: Schedule = (), row_weights: Schedule = ()) -> writer.Generation:
            gen = host.expected(
                key,
                max_tokens,
                prompt_tokens=len(ids),
                top_p=mask,
                routed_experts=routed,
                routed_start=start if routed else 0,
                first_position=first,
                token_weights=token_weights,
                row_weights=row_weights,
            )
            hit = next((i for i, t in enumerate(gen.token_ids) if t in stops), None) if stops else None
            if hit is not None:
                gen = truncate(gen, hit + 1, {"type": "stop", "matched": gen.token_ids[hit]})
            else:
                gen = dataclasses.replace(gen, finish_reason={"type": "length"})
            return dataclasses.replace(gen, rid=rid)

        streamed_mask = mask and host.vllm_shape == "0.32"
        usage = bool(options.get("include_usage"))
        vllm = VllmOptions(host.vllm_shape, logprobs is not None, routed, streamed_mask, usage)
        interval = max(1, int(params.get("stream_interval") or host.stream_interval))
        streams = bool(body.get("stream"))
        return VllmRequest(
            rid=rid,
            gen=make(),
            opts=writer.WireOptions(),
            interval=interval,
            fault=fault,
            vllm=vllm,
            streams=streams,
            remake=make,
        )

    async def stream(self, request: web.Request, req: VllmRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await resp.prepare(request)
            await self._stream_body(request, req, resp)
        except ConnectionResetError:  # a write found the client gone
            self.host.note_disconnect(req)
        return resp

    async def _stream_body(self, request: web.Request, req: VllmRequest, resp: web.StreamResponse) -> None:
        await req.admitted.wait()
        host, opts, gen = self.host, req.vllm, req.gen
        if host.is_closing():
            return  # an unfinished body: the client sees a truncated stream
        kind, at = req.fault.get("kind"), req.fault.get("at", 1)
        split = int(req.fault.get("size", 7)) if kind == "split" else 0
        sent = 0

        async def write(data: bytes) -> None:
            step = split or len(data)
            for pos in range(0, len(data), step):
                await resp.write(data[pos : pos + step])

        async def emit(index: int, chunk: dict[str, Any]) -> None:
            nonlocal sent
            if index == at and kind == "stall":
                await wire_stall(req.fault)
            elif index == at and kind == "vllm_error":  # as vLLM writes an engine error by default
                message = req.fault.get("message", "Internal server error")
                code = int(req.fault.get("code", 500))
                kind_name = "InternalServerError" if code >= 500 else "BadRequestError"
                await write(writer_vllm.error_chunk(message, req.fault.get("type", kind_name), code))
                raise StreamEnded  # then [DONE]
            elif index == at and kind == "malformed_json":
                await write(b'data: {"request_id":"broken","choices":[{"index":0,\n\n')
                raise StreamEnded
            elif index == at and kind == "cut":
                data = writer_vllm.sse(chunk)
                await write(data[: len(data) // 2])
                raise ConnectionCut
            choice = chunk["choices"][0]
            if opts.shape != "0.32" and not choice["token_ids"] and choice["finish_reason"] == "abort":
                # Before 0.32 an output without tokens was skipped, the abort's too: the usage
                # chunk and [DONE] follow the last tokens, with no finish_reason.
                return
            await write(writer_vllm.sse(chunk))
            sent += len(choice["token_ids"])
            host.stats.written[req.rid] = sent

        try:
            if req.state == "echo" and req.final is None:  # aborted while queued: before any token
                await emit(0, vllm_chunk(req, [Output(0, 0, True, ABORT_REASON)], first=True))
            else:
                await drain(req, emit, closing=host.is_closing, build=vllm_chunk)
        except StreamEnded:
            req.state = "done"
            await write(writer.DONE)
            return
        except ConnectionCut:
            req.state = "done"
            if request.transport is not None:
                request.transport.close()
            return
        # The request is over once its finishing output went out (a client that leaves while the
        # usage chunk and [DONE] are written is no disconnect).
        req.state = "done"
        host.stats.completed += 1
        if opts.usage:
            await write(writer_vllm.sse(writer_vllm.usage_chunk(gen, sent, shape=opts.shape)))
        if kind == "stall" and at == "done":
            await wire_stall(req.fault)
        await write(writer.DONE)
        await resp.write_eof()

    async def whole(self, req: VllmRequest) -> web.Response:
        """``"stream": false``: one response with every token (the same chunk, usage filled)."""
        await req.admitted.wait()
        if self.host.is_closing():
            return error_response("vllm", 503, "emulator stopping")
        queued_abort = req.state == "echo" and req.final is None
        last: list[Output] = [Output(0, 0, True, ABORT_REASON)] if queued_abort else []

        async def keep(index: int, chunk: dict[str, Any]) -> None:
            pass

        try:
            if not last:
                await drain(req, keep, closing=self.host.is_closing, build=_record(last))
        except StreamEnded:
            return error_response("vllm", 503, "emulator stopping")
        end = last[-1].end if last else 0
        whole = vllm_chunk(req, [Output(0, end, True, last[-1].reason if last else None)], first=True)
        whole["usage"] = writer_vllm.usage_chunk(req.gen, end, shape=req.vllm.shape)["usage"]
        req.state = "done"
        self.host.stats.completed += 1
        return web.Response(body=orjson.dumps(whole), content_type="application/json")


def _record(outs: list[Output]) -> Any:
    def build(req: Request, pending: list[Output], *, first: bool) -> dict[str, Any]:
        outs.extend(pending)
        return {}

    return build


async def wire_stall(fault: Mapping[str, Any]) -> None:
    await asyncio.sleep(float(fault.get("seconds", 1.0)))
