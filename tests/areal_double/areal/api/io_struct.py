"""Requests and responses of a generate call, HTTP requests the backend builds, weight updates."""

from __future__ import annotations

import copy
import os
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from areal.api.cli_args import GenerationHyperparameters


@dataclass
class ModelRequest:
    rid: str = field(default_factory=lambda: str(uuid.uuid4()))
    input_ids: list[int] = field(default_factory=list)
    gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    metadata: dict[str, Any] = field(default_factory=dict)
    tokenizer: Any = None
    image_data: list[str] | None = field(default_factory=list)
    processor: Any = None

    def copy(self) -> ModelRequest:
        return ModelRequest(
            rid=self.rid,
            input_ids=list(self.input_ids),
            gconfig=self.gconfig.new(),
            metadata=dict(self.metadata),
            tokenizer=self.tokenizer,
            image_data=list(self.image_data) if self.image_data is not None else None,
            processor=self.processor,
        )


@dataclass
class ModelResponse:
    input_tokens: list[int] = field(default_factory=list)
    output_tokens: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    output_versions: list[int] = field(default_factory=list)
    stop_reason: str = "stop"
    tokenizer: Any = None
    input_images: list[Any] = field(default_factory=list)
    processor: Any = None
    latency: float = float("inf")
    ttft: float = float("inf")
    itl: list[float] = field(default_factory=list)
    routed_experts: np.ndarray | None = None

    @property
    def input_len(self) -> int:
        return len(self.input_tokens)

    @property
    def output_len(self) -> int:
        return len(self.output_tokens)


@dataclass
class HttpRequest:
    endpoint: str
    payload: dict[str, Any]
    method: str = "POST"
    best_effort: bool = False


@dataclass
class HttpGenerationResult:
    output_tokens: list[int]
    output_logprobs: list[float]
    stop_reason: str
    routed_experts: np.ndarray | None = None


@dataclass
class WeightUpdateRequests:
    requests: list[HttpRequest]


@dataclass
class WeightUpdateMeta:
    type: str
    path: str | None = None
    use_lora: bool = False
    lora_name: str = ""
    lora_keep_versions: int = 0
    version: int | None = None

    def with_version(self, version: int) -> WeightUpdateMeta:
        new = copy.copy(self)
        new.version = version
        if self.path is not None:
            new.path = os.path.join(os.path.dirname(self.path), f"weight_update_v{version}")
        return new


def get_versioned_lora_name(lora_name: str, version: int) -> str:
    return f"{lora_name}-v{version}"
