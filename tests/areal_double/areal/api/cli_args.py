"""The two configs the generate loop reads, with AReaL's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationHyperparameters:
    n_samples: int = 1
    max_new_tokens: int = 16384
    min_new_tokens: int = 0
    max_tokens: int = 32768
    greedy: bool = False
    top_p: float = 1.0
    top_k: int = int(1e8)
    temperature: float = 1.0
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    stop: list[str] | None = None
    frequency_penalty: float = 0.0
    seed: int | None = None
    lora_name: str = "default_lora"
    use_beam_search: bool = False

    def new(self, **kwargs):
        return GenerationHyperparameters(**{**asdict(self), **kwargs})

    def new_with_stop_and_pad_token_ids(self, tokenizer):
        ids = list(self.stop_token_ids)
        for extra in (tokenizer.pad_token_id, tokenizer.eos_token_id):
            if extra not in ids:
                ids.append(extra)
        return self.new(stop_token_ids=ids)


@dataclass
class InferenceEngineConfig:
    experiment_name: str | None = None
    trial_name: str | None = None
    max_concurrent_rollouts: int | None = None
    consumer_batch_size: int = 1
    max_head_offpolicyness: int = 0
    request_timeout: float = 3600
    request_retries: int = 3
    pause_grace_period: float = 0.0
    setup_timeout: float = 120.0
    return_routed_experts: bool = False
    routing_strategy: str = "round_robin"
    use_lora: bool = False
    backend: str = "sglang:d1"
