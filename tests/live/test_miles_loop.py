"""Miles' real rollout (its rollout class, data source, abort, buffer and resume) with
fastaccum.miles against the live SGLang 0.5.23 server, incremental mode, routing replay on.

One rollout of two groups of two samples through ``fastaccum.miles.InferenceRolloutFn``: the group
whose greedy answer meets the stop token finishes, which ends the rollout; its abort drains the
other group's streams by rid (each sample keeps its prefix and, from the terminal abort event, the
routed experts of every kept position) and buffers the group; the next rollout resumes it to the
end. Every sample is held to the server's own non-streaming answer for the same prompt and the
sampling parameters Miles sends: tokens, log-probs and routed experts exactly (why exactly, and why
the resume must reuse the drained request's KV: tests/live/test_slime_loop.py). Then Miles' weight
update (``--pause-generation-mode`` retract, its default, and in_place) in the middle of a rollout.
It runs on the Miles double (tests/miles_double) and, with ``FASTACCUM_MILES_PATH``, on real Miles
checkouts (tests/test_miles_real.py says how).

The router, the server's answers and the tokenizer are the slime loop's (tests/live/test_slime_loop.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import framework_harness
import numpy as np
import pytest
import test_slime_loop as slime_loop
from live_helpers import ModelTokenizer, engines
from test_slime_loop import (
    LONG,
    PassThroughRouter,
    Prompts,
    abort_then_resume,
    assert_both_versions,
    idle,
    model_tokenizer,
    rollout_across_a_weight_update,
)

pytest.importorskip("torch")  # the slime harness the Miles one builds on holds tensors
pytest.importorskip("httpx")  # Miles' own client

pytestmark = pytest.mark.live_sglang

HARNESS = Path(__file__).resolve().parents[1] / "miles_double" / "harness.py"
harness = framework_harness._load("fastaccum_miles_harness", HARNESS)

MILES_PATH = os.environ.get("FASTACCUM_MILES_PATH", "")
ENVS = [("double", harness.DOUBLE_ROOT)] + [("real", str(Path(p).resolve())) for p in MILES_PATH.split(os.pathsep) if p]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{kind}-{Path(root).name}" for kind, root in ENVS])
def env(request: pytest.FixtureRequest) -> Iterator[Any]:
    kind, root = request.param
    if kind == "real":
        for needed in ("pybase64", "ray", "sglang_router"):
            pytest.importorskip(needed)
    with harness.miles_env(kind, root) as loaded:
        if kind == "real":
            assert Path(loaded.train.__file__).resolve().is_relative_to(Path(root)), "not the checkout's Miles"
        yield loaded


@contextlib.contextmanager
def server_wide_aborts(env: Any) -> Iterator[list[str]]:
    """Every ``abort_all`` sent through Miles' ``post`` (fastaccum's idle-wait fallback sends it so)."""
    calls: list[str] = []
    original = env.http_utils.post

    async def spy(url: str, payload: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(payload, dict) and payload.get("abort_all"):
            calls.append(url)
        return await original(url, payload, *args, **kwargs)

    patch = pytest.MonkeyPatch()
    patch.setattr(env.http_utils, "post", spy)
    try:
        yield calls
    finally:
        patch.undo()


def rollout_args(env: Any, router: PassThroughRouter, model: Path, stop: int | None) -> SimpleNamespace:
    """The slime loop's arguments, made by the Miles harness (which also makes Miles' client)."""
    args: SimpleNamespace = slime_loop.rollout_args(env, router, model, -1, make_args=harness.make_args)
    args.rollout_stop_token_ids = None if stop is None else [stop]
    return args


def assert_equals_answer(sample: Any, prompt_ids: list[int], ref: dict[str, Any], kept: int | None = None) -> None:
    """The slime loop's check, on the sample as Miles keeps it: routed experts as a numpy int32
    array, and no loss mask (Miles' single-turn generate starts none)."""
    slime_loop.assert_equals_answer(sample, prompt_ids, ref, kept, masked=False)
    experts = sample.rollout_routed_experts
    assert isinstance(experts, np.ndarray) and experts.dtype == np.int32


@pytest.mark.parametrize("sglang_mode", ["incremental"])  # Miles' --sglang-incremental-streaming-output
def test_a_miles_rollout_aborted_mid_stream_buffers_drained_prefixes_and_resumes_them_to_the_servers_answer(
    sglang: Any, env: Any
) -> None:
    tokenizer = ModelTokenizer(sglang.model)
    with PassThroughRouter(sglang.url) as router, model_tokenizer(env, tokenizer), server_wide_aborts(env) as hard:

        def start(args: Any, source: Any) -> tuple[Callable[[int], Any], dict[str, Any]]:
            rollouts = harness.Rollouts(env, args, source, "class")  # Miles' loader builds the class once
            return rollouts, dict(rollouts.fn.state.sampling_params)  # what Miles' GenerateState sends

        abort_then_resume(
            sglang,
            env,
            router,
            hard,
            tokenizer,
            args_for=lambda stop: rollout_args(env, router, sglang.model, stop),
            start=start,
            abort_home=env.train,  # inference_rollout_train.abort, swapped while the rollout runs
            equals_answer=assert_equals_answer,
        )


@pytest.mark.parametrize("sglang_mode", ["incremental"])
@pytest.mark.parametrize("pause_mode", ["retract", "in_place"])
def test_a_weight_update_mid_miles_rollout_leaves_every_sample_complete_with_both_versions(
    sglang: Any, env: Any, pause_mode: str
) -> None:
    """Miles' weight update (``--pause-generation-mode`` retract, its default, or in_place): the
    server pauses mid-rollout, loads the second checkpoint as "v2" and goes on. The rollout never
    notices but in the versions: every sample completes, its routed experts cover its sequence,
    and it records both versions, in order."""
    tokenizer = ModelTokenizer(sglang.model)
    second = engines.model_dir(sglang.python, seed="b")
    with PassThroughRouter(sglang.url) as router, model_tokenizer(env, tokenizer), server_wide_aborts(env) as hard:
        args = rollout_args(env, router, sglang.model, stop=None)
        args.over_sampling_batch_size = 1
        source = Prompts(env, args, [LONG])
        rollouts = harness.Rollouts(env, args, source, "class")
        output = rollout_across_a_weight_update(sglang, router, lambda: rollouts(0), second, pause_mode)
        assert_both_versions(env, output)
        assert hard == [] and idle(sglang)
