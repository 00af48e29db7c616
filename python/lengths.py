"""The per-event rules of modes and lengths, and the text an event leaves, written once.

With ``held`` tokens held, an event listing ``listed`` tokens and reporting a total ``reported``
fits the cumulative reading when ``listed == reported >= held`` and the incremental one when
``held + listed == reported`` (docs/core.md, "Modes and lengths"). These are integer rules, run
for every event, so both twins run this one file: the pure twin as it is, the compiled twin
compiled (as ``fastaccum._cy.lengths``) with ``src_cython/lengths.pxd``, whose functions its
accumulator calls as C functions. Counts are -1 where the event does not carry them.
"""

from __future__ import annotations

from fastaccum._core.messages import (
    broken,
    length_decreased,
    lengths_disagree,
    logprobs_switched,
    mode_mismatch,
)
from fastaccum._core.policy import MODES, echo_text

__all__ = ("event_mode", "check_total", "check_logprobs", "text_after")

# MODES' own str objects: a mode is always one of them, so the compiled twin's comparisons take
# the identity shortcut.
AUTO = MODES[0]
CUMULATIVE = MODES[1]
INCREMENTAL = MODES[2]


def event_mode(
    index: int, mode: str, held: int, listed: int, logprobs_length: int, completion_tokens: int, newest: int
) -> str:
    """The stream's mode after an event (not an abort echo) that lists ``listed`` tokens; raises
    when its lengths break the rules. ``newest``: the newest total reported so far."""
    if logprobs_length >= 0 and completion_tokens >= 0 and logprobs_length != completion_tokens:
        raise lengths_disagree(index, mode, logprobs_length, completion_tokens)
    reported = logprobs_length if logprobs_length >= 0 else completion_tokens
    if reported < 0:
        raise broken(index, "no_total")
    cumulative_fits = listed == reported and reported >= held
    incremental_fits = held + listed == reported
    if mode == CUMULATIVE:
        fits = cumulative_fits
    elif mode == INCREMENTAL:
        fits = incremental_fits
    else:
        fits = cumulative_fits or incremental_fits
    if not fits:
        raise mode_mismatch(index, mode, held, listed, reported)
    if mode == AUTO and cumulative_fits != incremental_fits:
        # The first event that only one reading fits decides; before it both readings agree.
        mode = CUMULATIVE if cumulative_fits else INCREMENTAL
    if mode == CUMULATIVE:
        check_total(index, reported, newest)
    return mode


def check_total(index: int, reported: int, newest: int) -> int:
    """A cumulative total may not go down."""
    if reported < newest:
        raise length_decreased(index, newest, reported)
    return 0


def check_logprobs(index: int, had: bool | None, has: bool) -> int:
    """A stream carries output_token_logprobs on every event or on none (``had``: None before the
    first event)."""
    if had is not None and has != had:
        raise logprobs_switched(index, has)
    return 0


def text_after(parts: list[str] | None, mode: str, echo: bool, text: str | None) -> list[str] | None:
    """The stream's text parts once this event is committed (``parts`` itself, appended to, or a
    new list; None: no event carried text yet). Cumulative text replaces; incremental text (and
    undecided auto) appends, to be joined once when a result is built; an abort echo's text is the
    whole text, which fastaccum._core.policy.echo_text reconciles with the text held."""
    if echo:
        update = echo_text(mode, parts, text)
        replaces = True
    else:
        update = text
        replaces = mode == CUMULATIVE
    if update is None:
        return parts
    if replaces or parts is None:
        return [update]
    parts.append(update)
    return parts
