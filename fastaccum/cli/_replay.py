"""``fastaccum replay``: a captured response body (SGLang's or Dynamo's /generate, vLLM's
/inference/v1/generate) accumulated and summarized."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from typing import Any, BinaryIO

import numpy as np

from fastaccum.cli._common import CommandError

__all__ = ("run_replay",)

_PIECE_BYTES = 64 * 1024  # a typical socket read; the accumulator accepts any split


def run_replay(args: argparse.Namespace) -> int:
    from fastaccum import StreamAccumulator, StreamError, StreamTruncatedError
    from fastaccum.transport.consumer import FIRST_BYTES, not_an_event_stream

    try:
        accumulator = StreamAccumulator(
            mode=args.mode, expert_shape=args.expert_shape, max_event_bytes=args.max_event_bytes, dialect=args.dialect
        )
    except (ValueError, OverflowError) as exc:  # argparse checked each option; their product may not fit
        raise CommandError(str(exc), status=2) from None
    name = "<stdin>" if args.file == "-" else args.file
    size = 0
    first = b""  # a file that holds no event is described by its first bytes
    started = time.perf_counter()
    try:
        with _open_input(args.file) as f:
            while piece := f.read(_PIECE_BYTES):
                first = first or piece[:FIRST_BYTES]
                size += len(piece)
                accumulator.feed(piece)
        result = accumulator.finish()
    except StreamError as exc:  # the core's messages name the event themselves
        if isinstance(exc, StreamTruncatedError) and not accumulator.events:
            exc = not_an_event_stream(first) or exc  # a JSON answer or an error page, not a cut stream
        # The error is the one line on stderr every command's failure is; the prefix is output.
        print(f"fastaccum replay: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        try:
            prefix = accumulator.snapshot()
            print(f"prefix: {len(prefix)} tokens in {prefix.events} events (mode {prefix.mode})")
        except StreamError:
            pass
        return 1
    except OSError as exc:
        raise CommandError(f"cannot read {name}: {exc.strerror or exc}") from None
    elapsed = time.perf_counter() - started
    print(f"file:          {name} ({size / 1e6:.2f} MB, accumulated in {elapsed:.3f} s)")
    for line in _describe(result):
        print(line)
    return 0


def _open_input(path: str) -> contextlib.AbstractContextManager[BinaryIO]:
    if path != "-":
        return open(path, "rb")
    if sys.stdin is None:  # started with stdin closed
        raise CommandError("cannot read <stdin>: it is closed", status=2)
    if sys.stdin.isatty():  # someone typing, or waiting on a forgotten pipe: say how to end
        print("reading the stream from the terminal; end it with Ctrl-D", file=sys.stderr)
    # The caller's with-block must not close the process's stdin.
    return contextlib.nullcontext(sys.stdin.buffer)


def _describe(result: Any) -> list[str]:
    lines = [
        f"mode:          {result.mode}",
        f"events:        {result.events}",
        f"tokens:        {len(result)} (completion_tokens {result.completion_tokens})",
        f"finish_reason: {json.dumps(result.finish_reason)}",
    ]
    if result.text is not None:
        lines.append(f"text:          {len(result.text)} chars: {result.text[:60]!r}")
    if result.logprobs is not None:
        lines.append(f"logprobs:      {result.logprobs.shape[0]} ({int(np.isnan(result.logprobs).sum())} null)")
    if result.top_p_token_offsets is not None:
        lines.append(
            f"top-p rows:    {result.top_p_token_offsets.shape[0] - 1} ({result.top_p_token_ids.shape[0]} kept ids)"
        )
    if result.routed_experts is not None:
        lines.append(f"routed:        {tuple(result.routed_experts.shape)} {result.routed_experts.dtype}")
    return lines
