"""fastaccum: linear-time accumulation of SGLang /generate SSE streams into numpy arrays."""

from __future__ import annotations

from fastaccum._impl import IMPLEMENTATION, StreamAccumulator, accumulate
from fastaccum._version import __version__
from fastaccum.errors import (
    ServerError,
    SettingsError,
    ShardError,
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
    "ShardError",
    "SettingsError",
    "GenerateStream",
    "consume",
    "Client",
    "parse_response",
    "resume_payload",
    "join",
    "__version__",
)


# The transports are imported only when asked for, so the core stays cheap to load (and the
# resume contract too: the core's import names a missing dependency first).
_TRANSPORTS = {
    "resume_payload": "fastaccum._core.resume",
    "join": "fastaccum._core.resume",
    "Client": "fastaccum.transport.client",  # owns its connections (httptools)
    "GenerateStream": "fastaccum.transport.aiohttp_stream",  # on an aiohttp session
    "consume": "fastaccum.transport.consumer",  # any async byte iterator
    "parse_response": "fastaccum.transport.body",  # a whole non-streaming answer
}


def __getattr__(name: str) -> object:
    if name in _TRANSPORTS:
        import importlib

        return getattr(importlib.import_module(_TRANSPORTS[name]), name)
    raise AttributeError(f"module 'fastaccum' has no attribute {name!r}")
