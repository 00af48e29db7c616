"""The one definition of fastaccum's exception hierarchy, shared by both twins and the client."""

from __future__ import annotations

__all__ = (
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
)


class StreamError(ValueError):
    """Base of every error about a generation stream; ``event_index`` is 0-based, None if unknown."""

    def __init__(self, message: str, *, event_index: int | None = None) -> None:
        super().__init__(message)
        self.event_index = event_index

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only attributes are not in .args; keep them across pickling (Ray, multiprocessing).
        return (_rebuild, (type(self), self.args, self.__dict__))


class StreamFormatError(StreamError):
    """Malformed SSE, JSON, base64 or field types; data after the terminal event."""


class StreamLengthError(StreamError):
    """A length invariant broke (often a cumulative/incremental mode mismatch)."""

    def __init__(
        self,
        message: str,
        *,
        event_index: int | None = None,
        mode: str | None = None,
        expected: int | None = None,
        actual: int | None = None,
    ) -> None:
        super().__init__(message, event_index=event_index)
        self.mode = mode
        self.expected = expected
        self.actual = actual


class StreamTruncatedError(StreamError):
    """Input ended before a terminal finish_reason, or in the middle of an event."""


class StreamLimitError(StreamError):
    """One event's data exceeded ``max_event_bytes``."""


class ServerError(StreamError):
    """SGLang reported an error: an ``{"error": ...}`` event or an HTTP error status."""

    def __init__(
        self,
        message: str,
        *,
        event_index: int | None = None,
        status: int | None = None,
        server_message: str | None = None,
    ) -> None:
        super().__init__(message, event_index=event_index)
        self.status = status
        self.message = server_message if server_message is not None else message


class StreamTimeoutError(StreamError):
    """The client's ``read_timeout`` passed with no bytes from the server (client only)."""


class StreamConnectionError(StreamError):
    """The connection failed or broke before the stream could be read (client only)."""


class ShardError(StreamConnectionError):
    """The Ray actor reading a stream died or could not be reached (``fastaccum.ray``); ``shard``
    is its index in the ``ShardedClient``."""

    def __init__(self, message: str, *, shard: int, event_index: int | None = None) -> None:
        super().__init__(message, event_index=event_index)
        self.shard = shard


class SettingsError(ValueError):
    """A setting an adapter reads (a ``fastaccum_*`` key of the framework's config, or one of the
    framework's own flags) is unknown or has a value it cannot take; raised before anything is
    sent. Not a ``StreamError``: no stream is involved."""


def _rebuild(cls: type[StreamError], args: tuple[object, ...], state: dict[str, object]) -> StreamError:
    exc = cls.__new__(cls)
    exc.args = args
    exc.__dict__.update(state)
    return exc
