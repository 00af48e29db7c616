"""Stand-in for miles.utils.lora: the adapter name SGLang serves a trained LoRA under, and
whether the rollout uses one."""

from __future__ import annotations

from typing import Any

LORA_ADAPTER_NAME = "miles_lora"


def lora_rollout_enabled(args: Any) -> bool:
    """A LoRA is trained (``lora_rank`` > 0 or an adapter path) and the rollout serves it
    (not ``--lora-train-only``)."""
    trained = getattr(args, "lora_rank", 0) > 0 or getattr(args, "lora_adapter_path", None) is not None
    return trained and not getattr(args, "lora_train_only", False)
