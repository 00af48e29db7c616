"""The golden scenarios: one stream each, shared by the generator (SGLang venv) and the tests.

Plain data, stdlib only, so both interpreters import it. Sizes stay small: the whole golden set
must remain well under 2 MB.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ("Scenario", "SCENARIOS", "read_plan")


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    incremental: bool
    n: int  # ids the scheduler produces (for an echo: produced before the abort)
    interval: int = 1  # --stream-interval
    skip_tokenizer_init: bool = False
    logprob: bool = True
    logprob_text: bool = False
    experts: tuple[int, int] | None = None  # (num_layers, topk) with --enable-return-routed-experts
    routed_start: int = 0  # routed_experts_start_len: routed rows from this position on (<= prompt_tokens)
    indexer: tuple[int, int] | None = None  # (num_indexer_layers, index_topk) with --enable-return-indexer-topk
    kind: str = "stop"  # stop | length | abort_running | echo
    no_stop_trim: bool = True  # slime sets it; False makes the detokenizer drop the stop token's text
    step_tokens: int = 1  # ids per scheduler step (> 1: speculative decoding)
    drain_every: int = 1  # scheduler outputs queued per HTTP read (> 1: dropped frames / coalescing)
    echo_coalesced: bool = False  # the last normal chunk is still queued when the echo arrives
    error_after: int | None = None  # events sent before the tokenizer manager raises ValueError
    error_message: str = "The input (40000 tokens) is longer than the model's context length (32768 tokens)."
    seed: int = 7
    prompt_tokens: int = 8
    null_logprob_every: int = 0  # every k-th logprob is -inf (serialized as null)
    expect_cut: str | None = None  # the exception that cuts the stream (no [DONE]), if any
    emulator_comparable: bool = True  # fastaccum.emulator.writer can express this stream
    versions: tuple[str, ...] = ("*",)


def _both(name: str, description: str, **kw: object) -> list[Scenario]:
    return [
        Scenario(name=f"cum_{name}", description=f"cumulative, {description}", incremental=False, **kw),  # type: ignore[arg-type]
        Scenario(name=f"inc_{name}", description=f"incremental, {description}", incremental=True, **kw),  # type: ignore[arg-type]
    ]


SCENARIOS: tuple[Scenario, ...] = (
    *_both("i1_text", "stream interval 1, text and logprobs", n=24),
    *_both("i20", "stream interval 20, null logprobs", n=70, interval=20, null_logprob_every=9),
    *_both("i64", "stream interval 64", n=140, interval=64),
    *_both("skip_tokenizer", "--skip-tokenizer-init: no text key", n=20, skip_tokenizer_init=True),
    *_both("logprob_text", "return_text_in_logprobs", n=20, logprob_text=True),
    *_both("no_logprob", "no return_logprob: ids from output_ids", n=20, logprob=False),
    *_both("experts", "routed experts (2 layers, top-2), terminal only", n=16, experts=(2, 2)),
    *_both(
        "experts_skip_tokenizer",
        "routed experts encoded by the tokenizer manager",
        n=12,
        experts=(3, 2),
        skip_tokenizer_init=True,
    ),
    *_both("length", "finish by max_new_tokens", n=18, kind="length"),
    *_both(
        "abort_running",
        "abort of a running request: extra in-flight id + abort terminal with experts",
        n=10,
        kind="abort_running",
        experts=(2, 2),
    ),
    *_both("echo_retracted", "abort echo of a retracted request holding 6 ids", n=6, kind="echo"),
    *_both("echo_queued", "abort echo of a queued request (no ids)", n=0, kind="echo"),
    *_both("echo_i20", "abort echo at interval 20: the unsent ids are lost", n=30, interval=20, kind="echo"),
    *_both("echo_coalesced", "abort echo queued behind an unread normal chunk", n=8, kind="echo", echo_coalesced=True),
    Scenario(
        name="cum_echo_coalesced_skip_tokenizer",
        description="cumulative, echo queued behind a normal chunk without text: the echo supersedes it",
        incremental=False,
        n=8,
        kind="echo",
        echo_coalesced=True,
        skip_tokenizer_init=True,
    ),
    Scenario(
        name="inc_echo_coalesced_skip_tokenizer",
        description=(
            "incremental, echo queued behind a normal chunk without text: _coalesce_streaming_chunks "
            "indexes the missing text key, the stream is cut without [DONE]"
        ),
        incremental=True,
        n=8,
        kind="echo",
        echo_coalesced=True,
        skip_tokenizer_init=True,
        expect_cut="KeyError: 'text'",
        emulator_comparable=False,
    ),
    *_both(
        "slow_reader",
        "3 scheduler outputs per HTTP read (frame drops / coalescing)",
        n=20,
        drain_every=3,
        null_logprob_every=5,
    ),
    *_both(
        "spec_steps", "3 ids per scheduler step at interval 20 (speculative decoding)", n=50, interval=20, step_tokens=3
    ),
    *_both("error", "ValueError after 3 events: error event + [DONE]", n=12, error_after=3),
    Scenario(
        name="cum_error_first",
        description="cumulative, ValueError before any event",
        incremental=False,
        n=4,
        error_after=0,
    ),
    Scenario(
        name="cum_stop_trim",
        description="cumulative, no_stop_trim=false: the final text drops the stop token's text",
        incremental=False,
        n=12,
        no_stop_trim=False,
        emulator_comparable=False,
    ),
    Scenario(
        name="inc_stop_trim",
        description="incremental, no_stop_trim=false: the final delta drops the stop token's text",
        incremental=True,
        n=12,
        no_stop_trim=False,
        emulator_comparable=False,
    ),
    # Replay arrays from 0.5.15 on (appended: the generator's clock runs across the table, so a
    # scenario inserted earlier would move the timestamps of every later golden).
    *_both(
        "experts_start",
        "routed experts from routed_experts_start_len=5 (rows = prompt + completion - 1 - 5)",
        n=12,
        experts=(2, 2),
        routed_start=5,
    ),
    *_both(
        "indexer",
        "routed experts and indexer top-k (2 indexer layers, top-8), terminal only",
        n=14,
        experts=(2, 2),
        indexer=(2, 8),
    ),
    *_both(
        "indexer_skip_tokenizer",
        "indexer top-k (and routed experts) encoded by the tokenizer manager",
        n=10,
        experts=(3, 2),
        indexer=(2, 8),
        skip_tokenizer_init=True,
    ),
    *_both(
        "abort_running_indexer",
        "abort of a running request: extra in-flight id + abort terminal with experts and indexer top-k",
        n=10,
        kind="abort_running",
        experts=(2, 2),
        indexer=(2, 8),
    ),
)


def read_plan(sc: Scenario, points: list[int]) -> list[tuple[list[int], bool]]:
    """How the HTTP reader drains the tokenizer manager's queue, one entry per SSE event.

    Each entry lists the scheduler outputs (indices into ``points``) read together and whether the
    abort echo is among them (last). Several outputs in one read are the frame drops (cumulative)
    or the coalescing (incremental) of a slow reader. An error scenario stops after
    ``error_after`` entries.
    """
    plan: list[tuple[list[int], bool]] = []
    group: list[int] = []
    for k in range(len(points)):
        group.append(k)
        last = k == len(points) - 1
        terminal = last and sc.kind != "echo"
        # echo_coalesced: the last normal chunk is still unread when the echo lands.
        held_back = sc.kind == "echo" and sc.echo_coalesced and last
        if not held_back and (len(group) >= sc.drain_every or terminal or (sc.kind == "echo" and last)):
            plan.append((group, False))
            group = []
    if sc.kind == "echo":
        plan.append((group, True))
    if sc.error_after is not None:
        plan = plan[: sc.error_after]
    return plan
