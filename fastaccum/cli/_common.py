"""What the command's parts share: the error a user's mistake becomes, and the emulator's
announcement the demo waits for."""

from __future__ import annotations

__all__ = ("ANNOUNCE", "DIALECTS", "MODES", "SGLANG_VERSIONS", "VLLM_SHAPES", "CommandError")

# The emulator child prints this line, then its URL, so the demo knows where to connect.
ANNOUNCE = "fastaccum emulator listening on "
MODES = ("auto", "cumulative", "incremental")
SGLANG_VERSIONS = ("0.5.23", "0.5.15")
# The servers the core reads and the emulator serves (docs/dialects.md), and vLLM's two chunk shapes
# ("0.31": vLLM 0.24 to 0.31).
DIALECTS = ("sglang", "dynamo", "vllm")
VLLM_SHAPES = ("0.32", "0.31")


class CommandError(Exception):
    """A mistake in how the command was used or what it was pointed at: reported in one line on
    stderr with exit status ``status``, never as a traceback."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
