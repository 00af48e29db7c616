"""Types of the compiled twin; the same public names, in the same order, as fastaccum._py."""

from collections.abc import Iterable
from typing import Any

from fastaccum.result import StreamResult

__all__ = ("StreamAccumulator", "accumulate")

class StreamAccumulator:
    """Feeds raw SSE bytes of one SGLang /generate stream and accumulates tokens into arrays."""

    def __init__(
        self,
        mode: str = "auto",
        *,
        expert_shape: tuple[int, int] | None = None,
        max_event_bytes: int | None = None,
        indexer_shape: tuple[int, int] | None = None,
        routed_start: int = 0,
        dialect: str = "sglang",
        routed_dtype: str | None = None,
        require_routed_experts: bool = False,
    ) -> None: ...
    @property
    def mode(self) -> str: ...
    @property
    def finished(self) -> bool: ...
    @property
    def events(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    # data: const unsigned char buffer (PyBUF_SIMPLE); non-contiguous memoryviews are copied
    def feed(self, data: bytes | bytearray | memoryview, /) -> int: ...
    # data: as feed(); chunk data reaches the framer span by span, with no Python call per chunk
    def feed_chunked(self, data: bytes | bytearray | memoryview, /) -> int: ...
    @property
    def chunked_ended(self) -> bool: ...
    def finish(self) -> StreamResult: ...
    def snapshot(self) -> StreamResult: ...

def accumulate(pieces: Iterable[bytes | bytearray | memoryview], /, **kwargs: Any) -> StreamResult: ...
