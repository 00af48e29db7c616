"""A sample's routed experts across its calls, through the resume contract (fastaccum.join): a
call asks only for the rows the sample does not hold yet (``routed_start``), and what it brings is
joined to the rows held, its count checked, before the framework's ``Sample`` takes the whole
array (``routed_after``). A resumed sample thus never receives its prompt's routing again, and
never holds a row twice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from fastaccum._core.resume import join
from fastaccum.result import StreamResult

__all__ = ("held_rows", "routed_start", "routed_after")


def held_rows(sample: Any) -> int:
    """Routed-expert rows the sample holds: one per position of its sequence, from the start."""
    count = getattr(sample, "get_rollout_routed_experts_length", None)
    if callable(count):  # a line that keeps them in chunks or references counts them itself
        return int(count())
    value = sample.rollout_routed_experts
    if value is None:
        return 0
    shape = getattr(value, "shape", None)
    return int(shape[0]) if shape is not None and len(shape) > 1 else len(value)


def routed_start(sample: Any, prompt: Sequence[int] | None) -> int:
    """The first row a call for ``prompt`` (the token ids sent; None for a text prompt, which the
    server tokenizes) asks for: the rows the sample holds, which lie within the prompt. 0 (every
    row) when it holds none, or more than the prompt has positions (rows of another sequence)."""
    if prompt is None:
        return 0
    rows = held_rows(sample)
    return rows if 0 < rows <= len(prompt) else 0


def _held_array(sample: Any) -> npt.NDArray[Any] | None:
    materialize = getattr(sample, "materialize_rollout_routed_experts", None)
    value = materialize(replace=False) if callable(materialize) else sample.rollout_routed_experts
    if value is None:
        return None
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def routed_after(sample: Any, result: StreamResult, start: int, prompt_tokens: int | None) -> npt.NDArray[Any] | None:
    """The sample's routed experts once ``result`` (a call asked from row ``start``, for a prompt
    of ``prompt_tokens``; None: what the server reported) is committed: the rows held before
    ``start``, then the call's, checked by ``join``; None when the call brought none."""
    if result.routed_experts is None:
        return None
    held = _held_array(sample) if start else None
    shaped = result.routed_experts.shape[1:]
    if held is not None and held.ndim == 1 and shaped:
        held = held.reshape(-1, *shaped)
    joined = join(
        result,
        prompt_tokens=prompt_tokens,
        routed_start=start,
        held_routed=None if held is None else held[:start],
    )
    return joined.routed_experts
