"""fastaccum: linear-time accumulation of SGLang /generate SSE streams into numpy arrays."""

from __future__ import annotations

from fastaccum._impl import IMPLEMENTATION, StreamAccumulator, accumulate
from fastaccum._version import __version__
from fastaccum.errors import (
    ServerError,
    StreamConnectionError,
    StreamError,
    StreamFormatError,
    StreamLengthError,
    StreamLimitError,
    StreamTimeoutError,
    StreamTruncatedError,
)
from fastaccum.result import StreamResult

__all__ = (
    "IMPLEMENTATION",
    "StreamAccumulator",
    "StreamResult",
    "accumulate",
    "StreamError",
    "StreamFormatError",
    "StreamLengthError",
    "StreamTruncatedError",
    "StreamLimitError",
    "ServerError",
    "StreamTimeoutError",
    "StreamConnectionError",
    "GenerateStream",
    "consume",
    "Client",
    "__version__",
)


def __getattr__(name: str) -> object:
    # The client pulls in aiohttp; import it only when asked so the core stays cheap to load.
    if name in ("GenerateStream", "consume"):
        from fastaccum import client

        return getattr(client, name)
    if name == "Client":  # the connection-owning transport (httptools): also loaded on demand
        from fastaccum import transport

        return transport.Client
    raise AttributeError(f"module 'fastaccum' has no attribute {name!r}")
