"""AReaL's SGLang backend (the /generate payload and answer, pauses, weight updates) and the
RemoteSGLangEngine wrapper that delegates to a RemoteInfEngine built with it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pybase64

from areal.api.cli_args import InferenceEngineConfig
from areal.api.io_struct import (
    HttpGenerationResult,
    HttpRequest,
    WeightUpdateRequests,
    get_versioned_lora_name,
)
from areal.infra.remote_inf_engine import RemoteInfEngine


class SGLangBackend:
    def build_generation_request(self, req: Any, with_lora: bool, version: int) -> HttpRequest:
        g = req.gconfig
        if g.use_beam_search:
            raise NotImplementedError("Currently Beam search is not supported in SGLang backend.")
        params: dict[str, Any] = {
            "top_p": g.top_p,
            "top_k": g.top_k,
            "max_new_tokens": g.max_new_tokens,
            "temperature": 0.0 if g.greedy else g.temperature,
            "stop_token_ids": g.stop_token_ids,
            "ignore_eos": g.ignore_eos,
            "skip_special_tokens": g.skip_special_tokens,
            "frequency_penalty": g.frequency_penalty,
        }
        if g.stop:
            params["stop"] = g.stop
        if g.seed is not None:
            params["sampling_seed"] = g.seed
        payload: dict[str, Any] = {
            "input_ids": list(req.input_ids),
            "image_data": req.image_data,
            "sampling_params": params,
            "return_logprob": True,
            "stream": False,
        }
        if req.metadata.get("return_routed_experts", False):
            payload["return_routed_experts"] = True
        if with_lora:
            if not g.lora_name:
                raise ValueError("LoRA name (gconfig.lora_name) is required when use_lora is enabled.")
            payload["lora_path"] = get_versioned_lora_name(g.lora_name, version)
        return HttpRequest(endpoint="/generate", payload=payload)

    def parse_generation_response(self, response: dict[str, Any]) -> HttpGenerationResult:
        meta = response["meta_info"]
        reason = meta["finish_reason"]
        routed = meta.get("routed_experts")
        if routed is not None:
            rows = meta["prompt_tokens"] + meta["completion_tokens"] - 1
            routed = np.frombuffer(pybase64.b64decode(routed.encode()), dtype=np.int32).reshape(rows, -1)
        if reason["type"] == "abort" and reason.get("message", "").startswith("Abort before prefill"):
            return HttpGenerationResult([], [], reason["type"], routed)
        pairs = meta["output_token_logprobs"]
        return HttpGenerationResult([p[1] for p in pairs], [p[0] for p in pairs], reason["type"], routed)

    def build_disk_weight_update_requests(self, meta: Any) -> WeightUpdateRequests:
        if meta.use_lora:
            name = get_versioned_lora_name(meta.lora_name, meta.version)
            return WeightUpdateRequests(
                [HttpRequest("/load_lora_adapter", {"lora_name": name, "lora_path": str(meta.path)}, best_effort=True)]
            )
        payload = {"model_path": str(meta.path), "abort_all_requests": True}
        return WeightUpdateRequests([HttpRequest("/update_weights_from_disk", payload)])

    def build_distributed_weight_update_requests(self, meta: Any, param_specs: list[Any]) -> WeightUpdateRequests:
        if meta.use_lora:
            raise ValueError("SGLang distributed (XCCL/NCCL) weight update does not support LoRA.")
        payload = {"names": [p.name for p in param_specs], "group_name": "update", "abort_all_requests": True}
        return WeightUpdateRequests([HttpRequest("/update_weights_from_distributed", payload)])

    def get_pause_request(self, mode: str | None = None) -> HttpRequest:
        return HttpRequest("/pause_generation", {} if mode is None else {"mode": mode})

    def get_pause_requests(self) -> list[HttpRequest]:
        # SGLang's default (abort) first, then in place: the abort ends what runs, the second
        # step pauses the scheduler itself.
        return [self.get_pause_request(), self.get_pause_request(mode="in_place")]

    def get_resume_request(self) -> HttpRequest:
        return HttpRequest("/continue_generation", {})

    def get_abort_all_request(self) -> HttpRequest:
        return HttpRequest("/abort_request", {"abort_all": True})

    def get_health_check_request(self) -> HttpRequest:
        return HttpRequest("/health", {}, method="GET")


class RemoteSGLangEngine:
    """Composition: every call goes to ``self._engine``."""

    def __init__(self, config: InferenceEngineConfig) -> None:
        self.config = config
        self._engine = RemoteInfEngine(config, SGLangBackend())

    @classmethod
    def from_pretrained(cls, tokenizer_path: str | None = None, dp_size: int = 1, **kwargs: Any) -> Any:
        return cls(InferenceEngineConfig(backend=f"sglang:d{dp_size}", **kwargs))

    def initialize(self, engine_id: str | None = None, addr: Any = None, train_data_parallel_size: Any = None) -> None:
        return self._engine.initialize(engine_id, addr, train_data_parallel_size or 1)

    def destroy(self) -> None:
        return self._engine.destroy()

    @property
    def initialized(self) -> bool:
        return self._engine.initialized

    @property
    def workflow_executor(self) -> Any:
        return self._engine.workflow_executor

    def set_version(self, version: int) -> None:
        return self._engine.set_version(version)

    def get_version(self) -> int:
        return self._engine.get_version()

    async def agenerate(self, req: Any) -> Any:
        return await self._engine.agenerate(req)

    def update_weights_from_disk(self, meta: Any) -> Any:
        return self._engine.update_weights_from_disk(meta)

    def rollout_batch(self, data: list[dict[str, Any]], workflow: Any, workflow_kwargs: Any = None) -> Any:
        return self._engine.rollout_batch(data, workflow, workflow_kwargs)

    def pause(self) -> None:
        return self._engine.pause()

    def resume(self) -> None:
        return self._engine.resume()

    def pause_generation(self) -> None:
        return self._engine.pause_generation()

    def abort_all_requests(self) -> None:
        return self._engine.abort_all_requests()

    def continue_generation(self) -> None:
        return self._engine.continue_generation()
