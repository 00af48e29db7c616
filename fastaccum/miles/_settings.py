"""The adapter's settings: Miles' own flags and the ``fastaccum_*`` keys of ``--custom-config-path``
(Miles sets every key of that file onto ``args``)."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from fastaccum._rollout import RolloutSettings
from fastaccum.errors import SettingsError

__all__ = ("Settings",)

MODES = ("cumulative", "incremental", "auto")


@dataclasses.dataclass(frozen=True)
class Settings(RolloutSettings):
    """The keys every adapter reads (``RolloutSettings``) plus the servers' stream mode
    (docs/miles.md): Miles hands ``--sglang-*`` flags to the SGLang servers it launches, so
    ``--sglang-incremental-streaming-output`` says how they stream, and ``fastaccum_stream_mode:
    auto`` lets the first events decide."""

    KEYS: ClassVar[tuple[str, ...]] = (*RolloutSettings.KEYS, "fastaccum_stream_mode")

    stream_mode: str = "cumulative"

    @classmethod
    def from_args(cls, args: Any) -> Settings:
        servers = "incremental" if getattr(args, "sglang_incremental_streaming_output", False) else "cumulative"
        mode = getattr(args, "fastaccum_stream_mode", None) or servers
        if mode not in MODES:
            raise SettingsError(f"fastaccum_stream_mode must be one of {', '.join(map(repr, MODES))}, not {mode!r}")
        if mode not in ("auto", servers):  # the flag is what the servers were started with
            raise SettingsError(
                f"fastaccum_stream_mode={mode!r}, but Miles starts its SGLang servers {servers} "
                f"(--sglang-incremental-streaming-output); drop the key or set it to 'auto'"
            )
        return cls(**cls.read(args, transports=("client", "aiohttp")), stream_mode=mode)
