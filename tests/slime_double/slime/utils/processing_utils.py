"""Double of slime.utils.processing_utils: tokenizer/processor loading through ``transformers``."""

from __future__ import annotations

from typing import Any


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any) -> Any:
    """None when no processor loads (text-only models), as slime's fallback ends."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError):
        return None


def encode_image_for_rollout_engine(image: Any) -> str:
    raise NotImplementedError("the slime double does not model multimodal input")
