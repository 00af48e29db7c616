"""AReaL's RemoteInfEngine as far as fastaccum.areal reaches it: addresses, the sticky server per
rid, versions, the pause gate, control requests on every server, and AReaL's own generate loop
(non-streaming, asked again with the output appended after an abort), in our own words."""

from __future__ import annotations

import asyncio
import concurrent.futures
import random
import threading
import time
import urllib.request
from typing import Any

import numpy as np

from areal.api.io_struct import ModelResponse
from areal.infra import workflow_context
from areal.infra.utils.http import arequest_with_retry
from areal.infra.workflow_executor import WorkflowExecutor

RID_CACHE_SIZE = 128


class RemoteInfEngine:
    def __init__(self, config: Any, backend: Any) -> None:
        self.config = config
        self.backend = backend
        self.rid_to_address: dict[str, str] = {}
        self.rid_queue: list[str] = []
        self.addresses: list[str] = []
        self.server_idx = 0
        self._version = 0
        self.lock = threading.Lock()
        self._workflow_executor: WorkflowExecutor | None = None
        self._initialized = False

    def initialize(self, engine_id: str | None = None, addr: Any = None, train_data_parallel_size: Any = None) -> None:
        if not addr:
            raise RuntimeError("No configured inference servers.")
        self.addresses = addr if isinstance(addr, list) else [addr]
        for address in self.addresses:
            health = self.backend.get_health_check_request()
            probe = urllib.request.Request(f"http://{address}{health.endpoint}", method=health.method)
            with urllib.request.urlopen(probe, timeout=30):  # an error status raises
                pass
        self.server_idx = random.randint(0, len(self.addresses) - 1)
        self.workflow_executor = WorkflowExecutor(self.config, self)
        self.workflow_executor.initialize(train_data_parallel_size=train_data_parallel_size)
        self._initialized = True

    def destroy(self) -> None:
        self._initialized = False

    @property
    def workflow_executor(self) -> WorkflowExecutor:
        if self._workflow_executor is None:
            raise RuntimeError("WorkflowExecutor is not initialized")
        return self._workflow_executor

    @workflow_executor.setter
    def workflow_executor(self, executor: WorkflowExecutor) -> None:
        self._workflow_executor = executor

    @property
    def initialized(self) -> bool:
        return self._initialized

    def set_version(self, version: int) -> None:
        with self.lock:
            self._version = version

    def get_version(self) -> int:
        with self.lock:
            return self._version

    def choose_server(self) -> str:
        if self.config.routing_strategy != "round_robin":
            raise NotImplementedError("Only round-robin scheduling is implemented.")
        server = self.addresses[self.server_idx]
        self.server_idx = (self.server_idx + 1) % len(self.addresses)
        return server

    async def agenerate(self, req: Any) -> ModelResponse:
        req = req.copy()
        if self.config.return_routed_experts:
            req.metadata["return_routed_experts"] = True
        gconfig = req.gconfig
        if gconfig.n_samples != 1:
            raise ValueError(
                "Inference engines do not support n_samples > 1. "
                "Please call generate multiple times with n_samples = 1."
            )
        budget = min(gconfig.max_tokens - len(req.input_ids), gconfig.max_new_tokens)
        if budget <= 0:
            raise RuntimeError(
                f"max_new_tokens ({budget}) is non-positive! "
                f"max_tokens={gconfig.max_tokens}, prompt_len={len(req.input_ids)}, "
                f"max_new_tokens={gconfig.max_new_tokens}."
            )
        gconfig.max_new_tokens = budget
        start = time.perf_counter()
        tokens: list[int] = []
        logprobs: list[float] = []
        versions: list[int] = []
        rows: list[np.ndarray] = []
        if req.rid in self.rid_to_address:
            address = self.rid_to_address[req.rid]
        else:
            address = self.choose_server()
            if len(self.rid_queue) >= RID_CACHE_SIZE:
                self.rid_to_address.pop(self.rid_queue.pop(0), None)
            self.rid_to_address[req.rid] = address
            self.rid_queue.append(req.rid)
        session = await workflow_context.get_aiohttp_session()
        stop_reason = None
        while stop_reason not in ("stop", "tool_calls", "length") and len(tokens) < budget:
            while self.workflow_executor.is_paused():
                await asyncio.sleep(0.5)
            version = self.get_version()  # every token of this request is stamped with it
            http = self.backend.build_generation_request(req, with_lora=self.config.use_lora, version=version)
            answer = await arequest_with_retry(
                session=session,
                addr=address,
                endpoint=http.endpoint,
                payload=http.payload,
                method=http.method,
                max_retries=self.config.request_retries,
                timeout=self.config.request_timeout,
            )
            if not isinstance(answer, dict):
                raise ValueError(f"Expected JSON dict response, got {type(answer).__name__}")
            result = self.backend.parse_generation_response(answer)
            stop_reason = result.stop_reason
            if req.metadata.get("return_routed_experts", False) and result.routed_experts is None:
                if stop_reason != "abort":
                    raise RuntimeError(
                        "Requested return_routed_experts=True but received None from SGLang. "
                        "This usually means the model is not a MoE (Mixture of Experts) model. "
                        "Please use a MoE model to get routed_experts information."
                    )
            tokens.extend(result.output_tokens)
            logprobs.extend(result.output_logprobs)
            versions.extend([version] * len(result.output_tokens))
            if result.routed_experts is not None:
                rows.append(result.routed_experts)  # each covers its own request's whole sequence
            req.input_ids += result.output_tokens
            req.gconfig.max_new_tokens -= len(result.output_tokens)
        if stop_reason == "abort":
            stop_reason = "length"
        latency = time.perf_counter() - start
        return ModelResponse(
            input_tokens=req.input_ids[: len(req.input_ids) - len(tokens)],
            input_images=req.image_data,
            output_tokens=tokens,
            output_logprobs=logprobs,
            output_versions=versions,
            stop_reason=stop_reason,
            latency=latency,
            ttft=latency,  # a non-streaming answer has no first token of its own
            tokenizer=req.tokenizer,
            processor=req.processor,
            routed_experts=np.concatenate(rows) if rows else None,
        )

    # ---- control ------------------------------------------------------------------------------
    def _on_every_server(self, request: Any) -> None:
        async def send() -> None:
            await asyncio.gather(
                *(
                    arequest_with_retry(
                        addr=address,
                        endpoint=request.endpoint,
                        payload=request.payload,
                        method=request.method,
                        max_retries=self.config.request_retries,
                        timeout=self.config.request_timeout,
                    )
                    for address in self.addresses
                )
            )

        asyncio.run(send())

    def pause_generation(self) -> None:
        steps = getattr(self.backend, "get_pause_requests", None)
        for request in steps() if steps is not None else [self.backend.get_pause_request()]:
            self._on_every_server(request)
        time.sleep(self.config.pause_grace_period)

    def continue_generation(self) -> None:
        self._on_every_server(self.backend.get_resume_request())

    def abort_all_requests(self) -> None:
        self._on_every_server(self.backend.get_abort_all_request())

    def pause(self) -> None:
        self.workflow_executor.pause()

    def resume(self) -> None:
        self.workflow_executor.resume()

    def update_weights_from_disk(self, meta: Any) -> concurrent.futures.Future[float]:
        """AReaL waits for the trainer's checkpoint (name_resolve) in a process pool first; here
        the requests go at once."""
        for request in self.backend.build_disk_weight_update_requests(meta).requests:
            self._on_every_server(request)
        done: concurrent.futures.Future[float] = concurrent.futures.Future()
        done.set_result(0.0)
        return done

    def rollout_batch(self, data: list[dict[str, Any]], workflow: Any, workflow_kwargs: Any = None) -> list[Any]:
        return self.workflow_executor.rollout_batch(data, workflow)
