"""Stand-in for miles.utils.processing_utils: tokenizer and processor through ``transformers``
(the tests install a stub of it), and images as the PNG data URLs SGLang takes."""

from __future__ import annotations

import base64
import io
from typing import Any


def load_tokenizer(name_or_path: str, chat_template_path: str | None = None, **kwargs: Any) -> Any:
    import transformers  # imported on use: the tests install their stub first

    return transformers.AutoTokenizer.from_pretrained(name_or_path, **kwargs)


def load_processor(name_or_path: str, **kwargs: Any) -> Any:
    """The checkpoint's processor, or None where it has none (text models)."""
    import transformers

    try:
        return transformers.AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (OSError, ValueError):
        return None


def encode_image_for_rollout_engine(image: Any) -> str:
    out = io.BytesIO()
    (image if image.mode == "RGB" else image.convert("RGB")).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def extract_multimodal_train_inputs(processor_output: Any) -> dict[str, Any] | None:
    kept = {k: v for k, v in processor_output.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    return kept or None
