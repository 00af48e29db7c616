"""The emulator's pause and weight-update endpoints: SGLang's (``/pause_generation``,
``/continue_generation``, ``/update_weight_version``, ``/update_weights_from_disk``, and
``/health`` and ``/ready`` as a pause changes them) and vLLM 0.32's RL dev API (``/pause``,
``/resume``, ``/is_paused``, ``/update_weight_version``, ``/weight_info``), with their replies,
statuses and messages; fastaccum.emulator._scheduler does what they ask."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from fastaccum.emulator._scheduler import PAUSE_MODES, Scheduler

__all__ = ("PauseServer",)

# FastAPI's reading of a boolean query parameter.
_TRUE, _FALSE = ("1", "true", "on", "yes", "t", "y"), ("0", "false", "off", "no", "f", "n")


def _invalid(where: str, name: str, message: str, value: Any) -> web.Response:
    """A request the endpoint's model refuses: FastAPI's 422 (the servers' bodies are validated
    before the handler runs)."""
    detail = [{"type": "value_error", "loc": [where, name], "msg": message, "input": value}]
    return web.json_response({"detail": detail}, status=422)


def _literal(modes: tuple[str, ...]) -> str:
    return "Input should be " + ", ".join(repr(m) for m in modes[:-1]) + f" or {modes[-1]!r}"


async def _body(request: web.Request) -> dict[str, Any] | web.Response:
    raw = await request.read()
    try:
        body = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        return _invalid("body", "", f"JSON decode error: {exc}", raw.decode("utf-8", "replace"))
    if not isinstance(body, dict):
        return _invalid("body", "", "Input should be a valid dictionary", body)
    return body


class PauseServer:
    """The endpoints, on the emulator's scheduler."""

    def __init__(self, scheduler: Scheduler, *, health_check_timeout_s: float) -> None:
        self.scheduler = scheduler
        self.health_check_timeout_s = health_check_timeout_s

    # ---- SGLang -------------------------------------------------------------------------------
    def add_sglang_routes(self, app: web.Application) -> None:
        app.router.add_post("/pause_generation", self.pause_generation)
        app.router.add_post("/continue_generation", self.continue_generation)
        app.router.add_post("/update_weight_version", self.update_weight_version)
        app.router.add_post("/update_weights_from_disk", self.update_weights_from_disk)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/ready", self.ready)

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES["sglang"]:
            return _invalid("body", "mode", _literal(PAUSE_MODES["sglang"]), mode)
        await self.scheduler.pause(mode)
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        self.scheduler.resume()
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def update_weight_version(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        version = body.get("new_version")
        if not isinstance(version, str):
            return _invalid("body", "new_version", "Input should be a valid string", version)
        await self.scheduler.update_weight_version(version, abort_all=bool(body.get("abort_all_requests", True)))
        reply = {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        return web.json_response(reply)

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        path, version = body.get("model_path"), body.get("weight_version")
        if not isinstance(path, str):
            return _invalid("body", "model_path", "Input should be a valid string", path)
        if version is not None and not isinstance(version, str):
            return _invalid("body", "weight_version", "Input should be a valid string", version)
        success, message = await self.scheduler.update_weights_from_disk(
            path,
            weight_version=version,
            flush_cache=bool(body.get("flush_cache", True)),
            abort_all=bool(body.get("abort_all_requests", False)),
        )
        reply = {"success": success, "message": message, "num_paused_requests": 0}
        return web.json_response(reply, status=200 if success else 400)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=await self.scheduler.health(self.health_check_timeout_s))

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.scheduler.ready() else 503)

    # ---- vLLM ---------------------------------------------------------------------------------
    def add_vllm_routes(self, app: web.Application) -> None:
        app.router.add_post("/pause", self.pause)
        app.router.add_post("/resume", self.resume)
        app.router.add_get("/is_paused", self.is_paused)
        app.router.add_post("/update_weight_version", self.vllm_update_weight_version)
        app.router.add_get("/weight_info", self.weight_info)

    async def pause(self, request: web.Request) -> web.Response:
        """``POST /pause?mode=abort|wait|keep&clear_cache=true|false``: query parameters."""
        mode = request.query.get("mode", "abort")
        if mode not in PAUSE_MODES["vllm"]:
            return _invalid("query", "mode", _literal(PAUSE_MODES["vllm"]), mode)
        raw = request.query.get("clear_cache", "true").lower()
        if raw not in _TRUE + _FALSE:
            return _invalid("query", "clear_cache", "Input should be a valid boolean", raw)
        await self.scheduler.pause(mode, clear_cache=raw in _TRUE)
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        self.scheduler.resume()
        return web.json_response({"status": "resumed"})

    async def is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.scheduler.pause_mode is not None})

    async def vllm_update_weight_version(self, request: web.Request) -> web.Response:
        """Sets the engine's version, nothing else: no pause needed, nothing aborted."""
        body = await _body(request)
        if isinstance(body, web.Response):
            return body
        version = body.get("new_version")
        if not isinstance(version, str):
            return _invalid("body", "new_version", "Input should be a valid string", version)
        await self.scheduler.update_weight_version(version)
        return web.json_response({"success": True, "new_version": version})

    async def weight_info(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.scheduler.version})
