"""The adapter's settings: slime's own flags and the ``fastaccum_*`` keys of ``--custom-config-path``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from fastaccum._rollout import RolloutSettings
from fastaccum.errors import SettingsError

__all__ = ("Settings",)


@dataclasses.dataclass(frozen=True)
class Settings(RolloutSettings):
    """The keys every adapter reads (``RolloutSettings``) plus slime's stream mode (docs/slime.md)."""

    KEYS: ClassVar[tuple[str, ...]] = (*RolloutSettings.KEYS, "fastaccum_stream_mode", "fastaccum_check_server_mode")

    stream_mode: str = "cumulative"  # "cumulative" | "incremental" | "auto"
    check_server_mode: bool = True

    @classmethod
    def from_args(cls, args: Any) -> Settings:
        incremental = getattr(args, "sglang_incremental_streaming_output", getattr(args, "sglang_stream_output", False))
        mode = getattr(args, "fastaccum_stream_mode", None) or ("incremental" if incremental else "cumulative")
        if mode not in ("cumulative", "incremental", "auto"):
            raise SettingsError(f"fastaccum_stream_mode must be 'cumulative', 'incremental' or 'auto', not {mode!r}")
        if mode != "auto" and (mode == "incremental") != bool(incremental):
            raise SettingsError(
                f"fastaccum_stream_mode={mode!r} contradicts --sglang-incremental-streaming-output="
                f"{bool(incremental)}; drop the key or set it to 'auto'"
            )
        return cls(
            **cls.read(args, transports=("client", "aiohttp")),
            stream_mode=mode,
            check_server_mode=bool(getattr(args, "fastaccum_check_server_mode", True)),
        )
