"""The adapter's settings: vime's own flags and the ``fastaccum_*`` keys of ``--custom-config-path``."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from fastaccum._rollout import RolloutSettings
from fastaccum.errors import SettingsError

__all__ = ("Settings",)


@dataclasses.dataclass(frozen=True)
class Settings(RolloutSettings):
    """The keys every adapter reads (``RolloutSettings``) plus vime's cancel endpoint (docs/vime.md).

    vLLM's stream is always incremental, so there is no stream mode; only ``fastaccum.Client``
    reads vLLM's dialect, so there is no transport choice.
    """

    KEYS: ClassVar[tuple[str, ...]] = (*RolloutSettings.KEYS, "fastaccum_cancel_endpoint")

    cancel_endpoint: str = "auto"  # "auto" (probe once per worker) | "off"

    @classmethod
    def from_args(cls, args: Any) -> Settings:
        cancel = getattr(args, "fastaccum_cancel_endpoint", None) or "auto"
        if cancel not in ("auto", "off"):
            raise SettingsError(f"fastaccum_cancel_endpoint must be 'auto' or 'off', not {cancel!r}")
        common = cls.read(args, transports=("client",), why=" for vime (vLLM's stream)")
        return cls(**common, cancel_endpoint=cancel)
