"""What the command's parts share: the error a user's mistake becomes, and the emulator's
announcement the demo waits for."""

from __future__ import annotations

__all__ = ("ANNOUNCE", "MODES", "SGLANG_VERSIONS", "CommandError")

# The emulator child prints this line, then its URL, so the demo knows where to connect.
ANNOUNCE = "fastaccum emulator listening on "
MODES = ("auto", "cumulative", "incremental")
SGLANG_VERSIONS = ("0.5.23", "0.5.15")


class CommandError(Exception):
    """A mistake in how the command was used or what it was pointed at: reported in one line on
    stderr with exit status ``status``, never as a traceback."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status
