"""The ``fastaccum`` command: ``demo`` (emulator + client, every token verified), ``replay``, ``emulator``."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from fastaccum.cli._common import CommandError
from fastaccum.cli._parser import build_parser

__all__ = ("CommandError", "main")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        status = int(args.handler(args))
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's last flush
        return status
    except BrokenPipeError:
        # Whoever read the output left (`fastaccum replay x.sse | head -1`): stop as quietly as a
        # command that SIGPIPE ended, with stdout on /dev/null so that the last flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except CommandError as exc:
        print(f"fastaccum {args.command}: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130  # the shell's code for SIGINT; Ctrl-C is how a user stops the demo early
