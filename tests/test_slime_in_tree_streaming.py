"""Stock slime's streaming generate function in SGLang's incremental stream mode: it keeps only the
last delta.

Stock THUDM/slime ships ``slime.rollout.sglang_streaming_rollout.generate_streaming``, written for
SGLang's default cumulative stream mode: every event's ``output_token_logprobs`` (and ``text``)
replaces what the call has received so far. With the server in ``--incremental-streaming-output``
mode each event carries only its own tokens, so the sample ends holding the last event's tokens,
log-probs and text, and is committed as finished (TRUNCATED or COMPLETED) all the same. With routing
replay on, the last event's routed experts (one row per position of the whole sequence) no longer
fit that sample and the call raises ``ValueError``. ``fastaccum.slime.generate`` on the same stream
holds every token.

Runs stock slime's real code, loaded from a checkout named in ``FASTACCUM_SLIME_PATH``
(tests/test_slime_real.py says how to export one), against the embedded emulator; a checkout
whose ``generate_streaming`` is request-abortable (the request-abort line, which reads incremental
streams) or that has none is skipped. The emulator sends plain text (no U+2028, U+2029 or U+0085),
so the line-splitting pitfall of slime's reader (docs/slime.md) does not mix in. The cumulative
case is the control: the same function and assertions on a cumulative stream keep every token.
benchmarks/slime_live.py shows the same against a live SGLang 0.5.23.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import framework_harness
import pytest

SLIME_PATH = os.environ.get("FASTACCUM_SLIME_PATH")
if not SLIME_PATH:
    pytest.skip("FASTACCUM_SLIME_PATH is not set (a stock THUDM/slime checkout)", allow_module_level=True)
pytest.importorskip("torch")
for needed in ("tqdm", "PIL", "pybase64", "httpx", "pylatexenc"):
    pytest.importorskip(needed)

harness = framework_harness.slime()
fs = harness.fs

IN_TREE = "slime.rollout.sglang_streaming_rollout.generate_streaming"
N = 40  # tokens the server sends (max_new_tokens; the emulator runs to the length limit)
INTERVAL = 8  # --stream-interval: events of 1, 8, 8, 8, 8 and 7 tokens, so the last delta is 7
LAST_DELTA = (N - 1) % INTERVAL or INTERVAL  # SGLang sends the first token at once, then every INTERVAL
SLIME_ROOTS = [str(Path(p).resolve()) for p in SLIME_PATH.split(os.pathsep) if p]


@pytest.fixture(scope="module", params=SLIME_ROOTS, ids=[Path(r).name for r in SLIME_ROOTS])
def stock(request: pytest.FixtureRequest) -> Iterator[tuple[Any, Any]]:
    """(slime env, its ``generate_streaming``) for a stock checkout; other checkouts skip."""
    root = request.param
    with harness.slime_env("real", root) as env:
        assert Path(env.rollout.__file__).resolve().is_relative_to(Path(root)), "not the checkout's slime"
        try:
            module = importlib.import_module("slime.rollout.sglang_streaming_rollout")
        except ImportError:
            pytest.skip(f"{root}: no slime.rollout.sglang_streaming_rollout (slime before its streaming generate)")
        fn = getattr(module, "generate_streaming", None)
        if fn is None:
            pytest.skip(f"{root}: sglang_streaming_rollout has no generate_streaming")
        if env.line != "stock" or getattr(fn, "abort_mode", None) == "request":
            pytest.skip(f"{root}: the request-abort line, whose generate_streaming reads incremental streams")
        yield env, fn


def _run(env: Any, fn: Any, args: Any, sample: Any) -> Any:
    async def main() -> Any:
        return await fn(args, sample, harness.sampling_params(env, args))

    return env.run(main())


def _response(sample: Any) -> list[int]:
    return list(sample.tokens[len(harness.prompt_ids()) :])


@pytest.mark.parametrize("incremental", [True, False], ids=["incremental", "cumulative-control"])
def test_stock_generate_streaming_keeps_only_the_last_delta_in_incremental_mode(
    stock: tuple[Any, Any], incremental: bool
) -> None:
    env, in_tree = stock
    with (
        harness.emulator_thread(
            incremental_streaming_output=incremental, stream_interval=INTERVAL, plain_text=True
        ) as emu,
        harness.wired(env, emu),
    ):
        args = harness.make_args(env, emu, rollout_max_response_len=N, custom_generate_function_path=IN_TREE)
        env.http_utils.init_http_client(args)
        theirs = _run(env, in_tree, args, harness.new_sample(env, 0))
        sent = harness.expected(emu, harness.UNNAMED_RID, N)  # stock slime's request names no rid
        assert emu.stats.written[harness.UNNAMED_RID] == N  # the server sent every token
        assert theirs.status == env.Sample.Status.TRUNCATED  # committed as finished either way
        if incremental:
            # The defect: each event replaced the call's tokens, so the sample holds the last one's.
            assert theirs.response_length == LAST_DELTA < N
            assert _response(theirs) == list(sent.token_ids[N - LAST_DELTA :])
            assert theirs.rollout_log_probs == [float(x) for x in sent.logprobs[N - LAST_DELTA :]]
            assert theirs.loss_mask == [1] * LAST_DELTA
            assert theirs.response == sent.text(N - LAST_DELTA, N)
        else:
            # The control: the same function on cumulative events holds what the server sent.
            assert theirs.response_length == N
            assert _response(theirs) == list(sent.token_ids)
            assert theirs.rollout_log_probs == [float(x) for x in sent.logprobs]
            assert theirs.response == sent.text(0, N)

        # fastaccum.slime.generate on the same server holds every token it sent.
        env.reset()
        args.custom_generate_function_path = "fastaccum.slime.generate"
        ours = _run(env, fs.generate, args, harness.new_sample(env, 1))
        rid = "s001a00"  # harness.wired names fastaccum's request
        mine = harness.expected(emu, rid, N)
        assert emu.stats.written[rid] == N
        assert ours.status == env.Sample.Status.TRUNCATED and ours.response_length == N
        assert _response(ours) == list(mine.token_ids)
        assert ours.rollout_log_probs == [float(x) for x in mine.logprobs]
        assert ours.response == mine.text(0, N)


def test_stock_generate_streaming_fails_on_routed_experts_in_incremental_mode(stock: tuple[Any, Any]) -> None:
    """With routing replay, the terminal event's routed experts cover the whole sequence; the sample
    holds the prompt and the last delta only, and slime's own length check refuses them."""
    env, in_tree = stock
    with (
        harness.emulator_thread(
            incremental_streaming_output=True,
            stream_interval=INTERVAL,
            plain_text=True,
            enable_return_routed_experts=True,
        ) as emu,
        harness.wired(env, emu),
    ):
        args = harness.make_args(
            env,
            emu,
            rollout_max_response_len=N,
            custom_generate_function_path=IN_TREE,
            use_rollout_routing_replay=True,
        )
        env.http_utils.init_http_client(args)
        rows = len(harness.prompt_ids()) + N - 1  # what the server sent: a row per position but the last
        held = len(harness.prompt_ids()) + LAST_DELTA - 1  # what the sample's tokens allow
        layers, topk = emu.expert_shape
        with pytest.raises(ValueError, match=rf"got={rows * layers * topk}, expected={held * layers * topk}"):
            _run(env, in_tree, args, harness.new_sample(env, 0))
        assert emu.stats.written[harness.UNNAMED_RID] == N

        env.reset()
        args.custom_generate_function_path = "fastaccum.slime.generate"
        ours = _run(env, fs.generate, args, harness.new_sample(env, 1))
        assert ours.response_length == N
        assert tuple(ours.rollout_routed_experts.shape) == (rows, layers, topk)
