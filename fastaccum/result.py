"""StreamResult: the immutable outcome of one generation stream, built by both twins."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ("StreamResult", "StreamTiming")


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """How one request went on the wire, measured by ``fastaccum.Client`` (seconds, from the
    moment the request was written; after retries, the attempt that succeeded).

    Gaps are between reads that completed at least one event, as the client saw them (with read
    coalescing, events that arrive within one window count as one read). ``gap_p50_s`` and
    ``gap_p99_s`` come from a log-scale histogram with 16 buckets per doubling, so they are
    within about 4.5% of the exact quantile; ``gap_max_s`` is exact. None where nothing was
    measured yet (no byte, no token, fewer than two event reads).
    """

    first_byte_s: float | None
    first_token_s: float | None
    duration_s: float
    gap_p50_s: float | None
    gap_p99_s: float | None
    gap_max_s: float | None
    tokens_per_s: float | None
    tokens: int
    bytes: int
    events: int
    reads: int
    retries: int = 0  # attempts that failed before their first event and were made again


@dataclass(frozen=True, slots=True, eq=False)
class StreamResult:
    """What one /generate stream produced (or the prefix observed so far).

    Arrays are the result's own: copies of the accumulator's buffers in a snapshot, the buffers'
    storage itself (no copy) in the result of finish(). ``logprobs`` is NaN where
    the server sent ``null``; ``text``, ``logprobs``, top-p and routed experts are None when the
    stream carried none. ``meta_info`` is the newest event's meta_info without the token-aligned
    lists and the decoded base64 arrays. ``request_sent`` is False only for a request aborted
    before a transport wrote it: the server never saw it.
    """

    mode: str
    token_ids: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float64] | None = None
    text: str | None = None
    finish_reason: dict[str, Any] | None = None
    meta_info: dict[str, Any] = field(default_factory=dict)
    completion_tokens: int = 0
    top_p_token_ids: npt.NDArray[np.int32] | None = None
    top_p_token_offsets: npt.NDArray[np.int32] | None = None
    routed_experts: npt.NDArray[np.int32] | None = None
    events: int = 0
    aborted: bool = False
    timing: StreamTiming | None = None  # set by fastaccum.Client; None from the core
    indexer_topk: npt.NDArray[np.int32] | None = None
    request_sent: bool = True
    # (start, end, version) runs over the token indices, end exclusive, every token in one; None
    # when the stream did not say a version for every token
    weight_version_spans: tuple[tuple[int, int, str], ...] | None = None

    @property
    def finished(self) -> bool:
        """A terminal finish_reason was received."""
        return self.finish_reason is not None

    @property
    def replay_complete(self) -> bool:
        """The result holds everything the server has for the request: its terminal event was
        read (a normal finish, or a drained abort), or the request was never sent (nothing exists
        to replay). Routed experts, top-p rows and the indexer top-k come only in the terminal
        event, so when this is False they are missing whatever the server collected; when it is
        True they are what the server sent (none for a request aborted before it ran)."""
        return self.finish_reason is not None or not self.request_sent

    def __len__(self) -> int:
        return int(self.token_ids.shape[0])

    def __repr__(self) -> str:
        kind = (self.finish_reason or {}).get("type") if self.finish_reason else None
        return (
            f"StreamResult(mode={self.mode!r}, tokens={len(self)}, finish={kind!r}, "
            f"events={self.events}, aborted={self.aborted})"
        )


def snapshot_of(result: StreamResult) -> StreamResult:
    """A snapshot taken after finish(): the final result with arrays and dicts of its own (the
    accumulator handed its buffers to the final result). routed_experts is shared, as it is
    between any two snapshots."""
    return replace(
        result,
        token_ids=result.token_ids.copy(),
        logprobs=None if result.logprobs is None else result.logprobs.copy(),
        finish_reason=None if result.finish_reason is None else dict(result.finish_reason),
        meta_info=dict(result.meta_info),
        top_p_token_ids=None if result.top_p_token_ids is None else result.top_p_token_ids.copy(),
        top_p_token_offsets=None if result.top_p_token_offsets is None else result.top_p_token_offsets.copy(),
    )
