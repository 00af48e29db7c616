"""What a ``ModelResponse`` says beyond tokens: each token's weight version as AReaL numbers them,
read from the stream rather than guessed, and the first-token and inter-token latencies measured
by the transport."""

from __future__ import annotations

from typing import NamedTuple

from fastaccum.result import StreamResult, StreamTiming

__all__ = ("Segment", "version_number", "versions_of", "latencies")


class Segment(NamedTuple):
    """One request of a generate call: its result, the version AReaL pinned before sending it,
    what the transport measured, and when (``now()``) its stream returned."""

    result: StreamResult
    pinned: int
    timing: StreamTiming | None
    ended: float


def version_number(label: str, pinned: int) -> int:
    """AReaL's version for a token SGLang labelled ``label``: the number it is (fastaccum's engine
    sends ``weight_version=str(version)`` with every weight update), else, for a label that is
    none (SGLang's ``"default"``: the server was never told a version), the pinned one."""
    text = label.strip()
    digits = text[1:] if text[:1] == "-" else text
    return int(text) if digits.isdigit() and digits.isascii() else pinned


def versions_of(segments: list[Segment]) -> list[int]:
    """One version per token, in order: each segment's tokens by the runs of versions its stream
    reported (SGLang labels every event, and its finishing event lists the scheduler's own runs);
    a segment whose stream said no version for some token takes its pinned one throughout."""
    out: list[int] = []
    for result, pinned, _, _ in segments:
        spans = result.weight_version_spans
        if spans is None:
            out.extend([pinned] * len(result))
            continue
        for begin, end, label in spans:
            out.extend([version_number(label, pinned)] * (end - begin))
    return out


def latencies(start: float, segments: list[Segment]) -> tuple[float, list[float]]:
    """``(ttft, itl)`` of a generate call that began at ``start``: to its first token, and one
    entry per token after the first.

    Each stream's timing gives when its first and its last token arrived. Between two segments an
    entry is the real wait (a pause, a resume's prefill); within one, each entry is that stream's
    mean gap, from its first token to its last: the transport counts no arrival per token
    (docs/areal.md, "Latencies"). ``ttft`` is infinite, as AReaL's default, when no token came."""
    ttft = float("inf")
    itl: list[float] = []
    previous: float | None = None
    for result, _, timing, ended in segments:
        count = len(result)
        if not count:
            continue
        first = last = ended
        if timing is not None and timing.first_token_s is not None:
            sent = ended - timing.duration_s
            first = sent + timing.first_token_s
            last = sent + count / timing.tokens_per_s if timing.tokens_per_s else first
            last = min(max(last, first), ended)
        if previous is None:
            ttft = first - start
        else:
            itl.append(max(first - previous, 0.0))
        if count > 1:
            itl.extend([(last - first) / (count - 1)] * (count - 1))
        previous = last
    return ttft, itl
