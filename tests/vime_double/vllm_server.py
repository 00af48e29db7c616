"""A vLLM ``/inference/v1/generate`` server double for benchmarks/vime_streaming.py (the tests run
against ``Emulator(dialect="vllm")``, tests/vime_double/harness.py), kept because the benchmark
draws token ids below a trained tokenizer's size (``vocab``), which the emulator cannot; its
chunks come from ``fastaccum.emulator.writer_vllm``.

It doubles as vime's router (``GET /workers`` lists itself) and serves what vime's server control
reads: ``GET /load`` (``{"server_load": n}``), ``GET /health`` and, with ``cancel_endpoint``,
vLLM's RLHF dev ``POST /abort_requests`` (``{"request_ids": [...]}``; ``{}`` or no ids: all).
Tokens are ``writer.synthetic_generation`` of (seed, key, position): the key is the request's
``request_id`` (``UNNAMED`` when it sends none, as vime's own reader does), or, with
``key_by_prompt``, the prompt's token ids, so two clients get the same stream for one prompt.

A request ends at ``max_tokens``, at a ``stop_token_ids`` token, at a per-key plan
(``plans[key] = {"stop_at": k}``; ``{"wait": s}`` holds its first chunk for s seconds), when
its client disconnects (vLLM aborts it), or when it is aborted: then ``shape="0.32"`` writes a
finishing chunk with ``finish_reason: "abort"`` and ``shape="0.31"`` only ``[DONE]`` (vLLM
before 0.32 sends no finish_reason for an abort).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import zlib
from typing import Any

from aiohttp import web

from fastaccum.emulator import writer_vllm
from fastaccum.emulator.writer import DONE, Generation, emission_points, synthetic_generation

UNNAMED = "unnamed"


@dataclasses.dataclass
class Stats:
    requests: int = 0
    tokens: int = 0
    completed: int = 0
    disconnected_keys: list[str] = dataclasses.field(default_factory=list)
    written: dict[str, int] = dataclasses.field(default_factory=dict)  # key -> tokens written
    abort_bodies: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    payloads: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    headers: list[dict[str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class _Running:
    key: str
    aborted: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class VllmDouble:
    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        shape: str = "0.32",
        stream_interval: int = 1,
        token_rate: float | None = None,
        routed_experts: bool = False,
        num_layers: int = 4,
        topk: int = 2,
        num_experts: int = 64,
        sampling_mask: bool = False,
        weight_version: str | None = "w1",
        cancel_endpoint: bool = True,
        key_by_prompt: bool = False,
        seed: int = 0,
        vocab: int = 151_000,
    ) -> None:
        self.host, self.port = host, 0
        self.shape = shape
        self.stream_interval = stream_interval
        self.token_rate = token_rate
        self.routed_experts = routed_experts
        self.expert_shape = (num_layers, topk)
        self.num_experts = num_experts
        self.sampling_mask = sampling_mask
        self.weight_version = weight_version
        self.cancel_endpoint = cancel_endpoint
        self.key_by_prompt = key_by_prompt
        self.seed = seed
        self.vocab = vocab  # token ids are below it (a real tokenizer's size)
        self.plans: dict[str, dict[str, Any]] = {}
        self.stats = Stats()
        self._running: set[_Running] = set()
        self._runner: web.AppRunner | None = None

    # ---- lifecycle ---------------------------------------------------------------------------
    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 28)
        app.router.add_post("/inference/v1/generate", self._generate)
        app.router.add_get("/load", self._load)
        app.router.add_get("/health", self._health)
        app.router.add_get("/workers", self._workers)
        if self.cancel_endpoint:
            app.router.add_post("/abort_requests", self._abort_requests)
        return app

    async def start(self) -> str:
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = int(self._runner.addresses[0][1])
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> int:
        return len(self._running)

    # ---- truth --------------------------------------------------------------------------------
    def key_of(self, body: dict[str, Any]) -> str:
        if self.key_by_prompt:
            return f"p{zlib.crc32(repr(body.get('token_ids')).encode()):08x}"
        return str(body.get("request_id") or UNNAMED)

    def expected(
        self, key: str, n: int, *, prompt_tokens: int, routed: bool = False, finish: dict[str, Any] | None = None
    ) -> Generation:
        """The first ``n`` tokens of ``key`` (routed experts for prompt + n - 1 rows)."""
        return synthetic_generation(
            key,
            n,
            seed=self.seed,
            prompt_tokens=prompt_tokens,
            vocab=self.vocab,
            finish_reason=finish or {"type": "length"},
            top_p=True,
            expert_shape=self.expert_shape if routed else None,
            num_experts=self.num_experts,
        )

    # ---- handlers -----------------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _workers(self, request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": self.url}]})

    async def _load(self, request: web.Request) -> web.Response:
        return web.json_response({"server_load": len(self._running)})

    async def _abort_requests(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.stats.abort_bodies.append(body)
        ids = body.get("request_ids") or None
        for run in list(self._running):
            if ids is None or run.key in ids:
                run.aborted.set()
        return web.json_response({})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.stats.requests += 1
        self.stats.payloads.append(body)
        self.stats.headers.append(dict(request.headers))
        key = self.key_of(body)
        params = body.get("sampling_params") or {}
        prompt = len(body.get("token_ids") or [])
        limit = int(params.get("max_tokens", 16))
        full = self.expected(key, limit, prompt_tokens=prompt)
        n, finish = limit, {"type": "length"}
        stops = set(params.get("stop_token_ids") or [])
        plan = self.plans.get(key, {})
        for i, token in enumerate(full.token_ids):
            if token in stops or plan.get("stop_at") == i + 1:
                n, finish = i + 1, {"type": "stop", "matched": int(token)}
                break
        mask = self.sampling_mask and float(params.get("top_p", 1.0)) < 1.0
        gen = self.expected(key, n, prompt_tokens=prompt, routed=self.routed_experts, finish=finish)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        run = _Running(key)
        self._running.add(run)
        try:
            await self._stream(resp, run, gen, mask)
        except (asyncio.CancelledError, ConnectionResetError):
            self.stats.disconnected_keys.append(key)
            raise
        finally:
            self._running.discard(run)
        return resp

    def _sse(self, chunk: dict[str, Any]) -> bytes:
        if self.weight_version is not None and chunk.get("choices"):
            chunk = {**chunk, "weight_version": self.weight_version}
        return writer_vllm.sse(chunk)

    async def _stream(self, resp: web.StreamResponse, run: _Running, gen: Generation, mask: bool) -> None:
        n = len(gen.token_ids)
        raw, matched = writer_vllm.finish_of(gen)
        prev = 0
        points = emission_points(n, self.stream_interval)
        wait = self.plans.get(run.key, {}).get("wait")
        if wait:  # a request that sends nothing for a while (queued, or a long prefill)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.aborted.wait(), wait)
        for k, end in enumerate(points):
            if self.token_rate and not run.aborted.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.aborted.wait(), (end - prev) / self.token_rate)
            if run.aborted.is_set():
                await self._abort_end(resp, gen, prev)
                return
            last = k == len(points) - 1
            chunk = writer_vllm.chunk(
                gen,
                prev,
                end,
                shape=self.shape,
                finish=raw if last else None,
                stop_reason=matched if last else None,
                routed=self.routed_experts and last,
                sampling_mask=mask,
            )
            self.stats.tokens += end - prev
            await resp.write(self._sse(chunk))
            self.stats.written[run.key] = end
            prev = end
            if self.token_rate is None:
                await asyncio.sleep(0)
        await resp.write(writer_vllm.sse(writer_vllm.usage_chunk(gen, n, shape=self.shape)) + DONE)
        self.stats.completed += 1

    async def _abort_end(self, resp: web.StreamResponse, gen: Generation, kept: int) -> None:
        if self.shape == "0.32":
            chunk = writer_vllm.chunk(gen, kept, kept, shape=self.shape, finish="abort")
            await resp.write(self._sse(chunk) + writer_vllm.sse(writer_vllm.usage_chunk(gen, kept, shape=self.shape)))
        await resp.write(DONE)
