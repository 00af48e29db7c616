"""The emulator's other servers (docs/dialects.md): what Dynamo's frontend changes on SGLang's
``/generate``, and vLLM's ``/inference/v1/generate`` with the control calls vime makes on a vLLM
worker (``POST /abort_requests``, ``GET /load``, ``GET /health``). The requests, their decoding
and the scheduler are the SGLang emulator's (fastaccum.emulator._server); only the bytes differ."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web

from fastaccum import wire, wire_vllm
from fastaccum.emulator._requests import (
    ABORT_REASON,
    FAULT_KEY,
    FAULT_KINDS,
    ConnectionCut,
    Output,
    Request,
    StreamEnded,
    check_fault,
    drain,
    truncate,
)

if TYPE_CHECKING:
    from fastaccum.emulator._server import Emulator

__all__ = (
    "DIALECTS",
    "DYNAMO_INTERNAL_ERROR",
    "VllmRequest",
    "VllmServer",
    "check_dialect",
    "check_dialect_fault",
    "dynamo_refusal",
    "dynamo_rid",
    "error_response",
)

DIALECTS = ("sglang", "dynamo", "vllm")
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
# Dynamo's frontend writes every backend error mid-stream as this (SanitizedError::Internal).
DYNAMO_INTERNAL_ERROR = "Internal server error"
# The faults each dialect's stream can show; the rest are another server's.
_OWN_FAULTS = {
    "sglang": frozenset(FAULT_KINDS) - {"dynamo_error", "dynamo_killed", "dynamo_stopped", "vllm_error"},
    "dynamo": frozenset(FAULT_KINDS) - {"vllm_error"},
    "vllm": frozenset(("vllm_error", "malformed_json", "cut", "http_500", "stall", "coalesce", "split")),
}


def check_dialect(dialect: str, vllm_shape: str) -> None:
    if dialect not in DIALECTS:
        raise ValueError(f"dialect must be one of {', '.join(map(repr, DIALECTS))}, not {dialect!r}")
    if vllm_shape not in wire_vllm.SHAPES:
        raise ValueError(f"vllm_shape must be one of {', '.join(map(repr, wire_vllm.SHAPES))}, not {vllm_shape!r}")


def check_dialect_fault(dialect: str, fault: dict[str, Any]) -> None:
    check_fault(fault)
    kind = fault.get("kind")
    if kind is not None and kind not in _OWN_FAULTS[dialect]:
        raise ValueError(f"fault kind {kind!r} is not one a {dialect} server produces")


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


def _flag(body: Mapping[str, Any], params: Mapping[str, Any], key: str) -> bool:
    return bool(body.get(key)) or bool(params.get(key))


def vllm_chunk(req: Request, outs: list[Output], *, first: bool) -> dict[str, Any]:
    """One chunk for the queued outputs: their tokens merged, as vLLM's output collector merges the
    deltas a slow reader left queued; the finishing one carries finish_reason and the arrays."""
    assert isinstance(req, VllmRequest)
    opts, last = req.vllm, outs[-1]
    finish, stop_reason, routed = None, None, False
    if last.terminal and last.reason is ABORT_REASON:
        finish = "abort"
    elif last.terminal:
        finish, stop_reason = wire_vllm.finish_of(req.gen)
        routed = opts.routed
    return wire_vllm.chunk(
        req.gen,
        outs[0].start,
        last.end,
        shape=opts.shape,
        logprobs=opts.logprobs,
        finish=finish,
        stop_reason=stop_reason,
        routed=routed,
        sampling_mask=opts.mask,
    )


class VllmServer:
    """vLLM's endpoints, on the emulator's requests and scheduler."""

    def __init__(self, emulator: Emulator) -> None:
        self.em = emulator

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_post("/abort_requests", self.abort_requests)
        app.router.add_get("/load", self.load)
        app.router.add_get("/health", self.health)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def load(self, request: web.Request) -> web.Response:
        # What vime's server control reads (num_requests_from_load): the requests the server holds.
        return web.json_response({"server_load": self.em.running + self.em.queued})

    async def abort_requests(self, request: web.Request) -> web.Response:
        """vLLM's RLHF API: ``{"request_ids": [...]}`` aborts those, ``{}`` every request."""
        try:
            body = orjson.loads(await request.read() or b"{}")
        except orjson.JSONDecodeError as exc:
            return error_response("vllm", 400, f"invalid JSON body: {exc}")
        ids = body.get("request_ids") if isinstance(body, dict) else None
        if ids:
            for rid in ids:
                self.em.abort(str(rid))
        else:
            self.em.abort(abort_all=True)
        return web.json_response({})

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return error_response("vllm", 400, f"invalid JSON body: {exc}")
        if not isinstance(body, dict):
            return error_response("vllm", 400, "the request body must be a JSON object")
        fault = body.get(FAULT_KEY, self.em.fault) or {}
        try:
            check_dialect_fault("vllm", fault)
            req = self.make_request(body, fault)
        except ValueError as exc:
            return error_response("vllm", 400, str(exc))
        if fault.get("kind") == "http_500":
            return error_response("vllm", 500, fault.get("message", "injected HTTP 500"))
        stream = bool(body.get("stream"))
        return await self.em._serve(req, lambda: self.stream(request, req) if stream else self.whole(req))

    def make_request(self, body: dict[str, Any], fault: dict[str, Any]) -> VllmRequest:
        ids = body.get("token_ids")
        if not isinstance(ids, list) or not ids or not all(type(t) is int for t in ids):
            raise ValueError("token_ids must be a non-empty list of ints")
        params = body.get("sampling_params")
        if not isinstance(params, dict):
            raise ValueError("sampling_params is required (an object)")
        rid = body.get("request_id") or uuid.uuid4().hex
        if not isinstance(rid, str):
            raise ValueError("request_id must be a string")
        max_tokens = params.get("max_tokens")
        max_tokens = 16 if max_tokens is None else max_tokens
        if type(max_tokens) is not int or max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens!r}")
        logprobs = params.get("logprobs")
        if logprobs is not None and (type(logprobs) is not int or logprobs < -1):
            raise ValueError(f"logprobs must be an integer or null, got {logprobs!r}")
        options = body.get("stream_options") or {}
        em = self.em
        routed = _flag(body, params, "return_routed_experts") and em.enable_return_routed_experts
        mask = _flag(body, params, "return_sampling_mask")
        gen = em.expected(rid, max_tokens, prompt_tokens=len(ids), top_p=mask, routed_experts=routed)
        stops = set(params.get("stop_token_ids") or ())
        hit = next((i for i, t in enumerate(gen.token_ids) if t in stops), None)
        if hit is not None:
            gen = truncate(gen, hit + 1, {"type": "stop", "matched": gen.token_ids[hit]})
        else:
            gen = dataclasses.replace(gen, finish_reason={"type": "length"})
        vllm = VllmOptions(em.vllm_shape, logprobs is not None, routed, mask, bool(options.get("include_usage")))
        interval = max(1, int(params.get("stream_interval") or em.stream_interval))
        return VllmRequest(rid=rid, gen=gen, opts=wire.WireOptions(), interval=interval, fault=fault, vllm=vllm)

    async def stream(self, request: web.Request, req: VllmRequest) -> web.StreamResponse:
        resp = web.StreamResponse(headers=SSE_HEADERS)
        try:
            await resp.prepare(request)
            await self._stream_body(request, req, resp)
        except ConnectionResetError:  # a write found the client gone
            self.em._note_disconnect(req)
        return resp

    async def _stream_body(self, request: web.Request, req: VllmRequest, resp: web.StreamResponse) -> None:
        await req.admitted.wait()
        em, opts, gen = self.em, req.vllm, req.gen
        if em._is_closing():
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
            elif index == at and kind == "vllm_error":
                message = req.fault.get("message", "injected error")
                await write(wire_vllm.error_chunk(message, code=int(req.fault.get("code", 400))))
                raise StreamEnded  # then [DONE]
            elif index == at and kind == "malformed_json":
                await write(b'data: {"request_id":"broken","choices":[{"index":0,\n\n')
                raise StreamEnded
            elif index == at and kind == "cut":
                data = wire_vllm.sse(chunk)
                await write(data[: len(data) // 2])
                raise ConnectionCut
            choice = chunk["choices"][0]
            if choice["finish_reason"] == "abort" and opts.shape != "0.32":
                # Before 0.32 vLLM dropped the aborted request's last output: [DONE], no finish_reason.
                choice["finish_reason"] = None
                if choice["token_ids"]:
                    await write(wire_vllm.sse(chunk))
                    sent += len(choice["token_ids"])
                    em.stats.written[req.rid] = sent
                raise StreamEnded
            await write(wire_vllm.sse(chunk))
            sent += len(choice["token_ids"])
            em.stats.written[req.rid] = sent

        try:
            if req.state == "echo":  # aborted while queued: the abort ends it before any token
                await emit(0, vllm_chunk(req, [Output(0, 0, True, ABORT_REASON)], first=True))
            else:
                await drain(req, emit, closing=em._is_closing, build=vllm_chunk)
        except StreamEnded:
            req.state = "done"
            await write(wire.DONE)
            return
        except ConnectionCut:
            req.state = "done"
            if request.transport is not None:
                request.transport.close()
            return
        if opts.usage:
            await write(wire_vllm.sse(wire_vllm.usage_chunk(gen, sent, shape=opts.shape)))
        if kind == "stall" and at == "done":
            await wire_stall(req.fault)
        await write(wire.DONE)
        req.state = "done"
        em.stats.completed += 1
        await resp.write_eof()

    async def whole(self, req: VllmRequest) -> web.Response:
        """``"stream": false``: one response with every token (the same chunk, usage filled)."""
        await req.admitted.wait()
        if self.em._is_closing():
            return error_response("vllm", 503, "emulator stopping")
        last: list[Output] = [Output(0, 0, True, ABORT_REASON)] if req.state == "echo" else []

        async def keep(index: int, chunk: dict[str, Any]) -> None:
            pass

        try:
            if not last:
                await drain(req, keep, closing=self.em._is_closing, build=_record(last))
        except StreamEnded:
            return error_response("vllm", 503, "emulator stopping")
        end = last[-1].end if last else 0
        whole = vllm_chunk(req, [Output(0, end, True, last[-1].reason if last else None)], first=True)
        whole["usage"] = wire_vllm.usage_chunk(req.gen, end, shape=req.vllm.shape)["usage"]
        req.state = "done"
        self.em.stats.completed += 1
        return web.Response(body=orjson.dumps(whole), content_type="application/json")


def _record(outs: list[Output]) -> Any:
    def build(req: Request, pending: list[Output], *, first: bool) -> dict[str, Any]:
        outs.extend(pending)
        return {}

    return build


async def wire_stall(fault: Mapping[str, Any]) -> None:
    await asyncio.sleep(float(fault.get("seconds", 1.0)))
