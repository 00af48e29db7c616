"""Stand-in for slime.utils.processing_utils: tokenizer and processor loading.

Goes through ``transformers``, which the tests replace with a stub.
Multimodal input is not modelled.
"""

from __future__ import annotations

from typing import Any


def _transformers() -> Any:
    import transformers  # imported on use: the tests install their stub first

    return transformers


def load_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    loader = _transformers().AutoTokenizer
    return loader.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any) -> Any:
    """The model's processor, or None for text-only checkpoints that have none."""
    loader = _transformers().AutoProcessor
    try:
        processor = loader.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError):
        processor = None
    return processor


def encode_image_for_rollout_engine(image: Any) -> str:
    raise NotImplementedError("multimodal input is outside what the slime double models")
