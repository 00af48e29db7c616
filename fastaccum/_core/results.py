"""A result's fields, built once per snapshot or finish() from a twin's buffers (both twins):
the arrays handed out or copied, text and top-p rows joined, meta_info without what the result
carries as arrays, and each token's weight version (docs/core.md, "Weight versions")."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from fastaccum._core.policy import B64_KEYS
from fastaccum.result import StreamResult

__all__ = ("build_result", "weight_spans")

# Token-aligned lists (sliced per event in incremental mode) and the decoded base64 arrays are
# returned as arrays, not repeated in meta_info.
_DROPPED_META = frozenset(
    (
        "output_token_logprobs",
        "output_top_logprobs",
        "output_token_ids_logprobs",
        "output_token_sampling_mask",
        "output_token_sampling_logprobs",
        "sampling_mask",  # vLLM's top-p rows
        *B64_KEYS,
    )
)


def _hand_out(buffer: Any, final: bool) -> npt.NDArray[Any]:
    """A twin's buffer as an array: its storage itself for a final result, else a copy."""
    array: npt.NDArray[Any] = buffer.take_array() if final else buffer.to_array()
    return array


def _join_top_p(
    parts: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]],
) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """One CSR (new arrays) from the rows of each event: later offsets move by the ids before them."""
    offsets = [parts[0][1]]
    base = parts[0][0].shape[0]
    for ids, more in parts[1:]:
        offsets.append(more[1:] + base)
        base += ids.shape[0]
    return np.concatenate([ids for ids, _ in parts]), np.concatenate(offsets)


def build_result(
    *,
    final: bool,
    mode: str,
    ids: Any,
    logprobs: Any,
    text_parts: list[str] | None,
    finish_reason: dict[str, Any] | None,
    meta: dict[str, Any],
    top_p: list[tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]] | None,
    replay: dict[str, npt.NDArray[np.int32]] | None,
    events: int,
    versions: list[tuple[int, str]],
) -> StreamResult:
    """The result so far, from the twin's buffers (``logprobs`` None: the stream has none):
    copies of them, or for ``final`` (finish()) their storage itself. Text parts and the top-p
    rows of each event (None: none yet) are joined here; meta_info loses the lists and arrays the
    result carries as arrays. ``replay``: the replay arrays by key (None: none yet);
    ``versions``: (first token, weight_version) per change (weight_spans)."""
    top_p_ids = top_p_offsets = None
    replay = replay or {}
    if top_p is not None:
        top_p_ids, top_p_offsets = _join_top_p(top_p)
    token_ids = _hand_out(ids, final)
    text = None
    if text_parts is not None:
        text = text_parts[0] if len(text_parts) == 1 else "".join(text_parts)
    return StreamResult(
        mode=mode,
        token_ids=token_ids,
        logprobs=_hand_out(logprobs, final) if logprobs is not None else None,
        text=text,
        finish_reason=dict(finish_reason) if finish_reason is not None else None,
        meta_info={k: v for k, v in meta.items() if k not in _DROPPED_META},
        completion_tokens=int(token_ids.shape[0]),
        top_p_token_ids=top_p_ids,
        top_p_token_offsets=top_p_offsets,
        routed_experts=replay.get("routed_experts"),
        indexer_topk=replay.get("indexer_topk"),
        events=events,
        weight_version_spans=weight_spans(versions, int(token_ids.shape[0]), meta.get("weight_versions")),
    )


def weight_spans(
    versions: list[tuple[int, str]], total: int, reported: object
) -> tuple[tuple[int, int, str], ...] | None:
    """``(start, end, version)`` runs over the ``total`` tokens, each token in exactly one, end
    exclusive: the engine's own record where the stream's last event has one (``reported``:
    SGLang's finishing event and vLLM's finishing chunk list ``{"version", "start", "end"}``
    spans), else the runs of the events' ``weight_version`` (``versions``: first token and
    version per change), adjacent equal versions merged and empty runs left out. None when the
    stream said no version for some token (vLLM before its finishing chunk)."""
    spans: list[tuple[int, int, str]] = []
    if isinstance(reported, list):
        at = 0
        for span in reported:
            if not isinstance(span, dict):
                break
            version, start, end = span.get("version"), span.get("start"), span.get("end")
            if type(version) is not str or type(start) is not int or type(end) is not int or start != at or end < start:
                break
            _add_span(spans, start, end, version)
            at = end
        else:
            if at == total:
                return tuple(spans)
        spans = []  # not a record of these tokens: the events' own versions say
    if not versions or (versions[0][0] > 0 and total > 0):
        return None  # no event said a version, or the first tokens came before one did
    for i, (start, version) in enumerate(versions):
        end = versions[i + 1][0] if i + 1 < len(versions) else total
        _add_span(spans, start, min(end, total), version)
    return tuple(spans)


def _add_span(spans: list[tuple[int, int, str]], start: int, end: int, version: str) -> None:
    if end <= start:
        return
    if spans and spans[-1][2] == version:
        spans[-1] = (spans[-1][0], end, version)
    else:
        spans.append((start, end, version))
