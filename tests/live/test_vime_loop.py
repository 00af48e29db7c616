"""vime's real rollout loop (``generate_rollout``, its data source, abort, buffer and resume) with
fastaccum.vime against the live vLLM 0.32 server, through the real vllm-router (PyPI 0.1.17).

One rollout of two groups of two samples: the group whose greedy answer meets the stop token
finishes, the rollout aborts the other mid-stream (the adapter drains: vLLM 0.32's abort chunk
ends each call, and each sample keeps the tokens it received), buffers it, and the next rollout
resumes it to the end. Every committed sample is held to the server's own non-streaming answer
for the same prompt and the sampling parameters vime sends: tokens and log-probs exactly. vLLM's
CPU path is batch-invariant for this model and gives a prefill of prompt + kept prefix the
log-probs and tokens the decode gave (measured bit-equal for prefixes of 1 to 40 tokens with the
prefix cache reset in between), so the resume is exact too. It runs on the vime double of both
lines (tests/vime_double) and, with ``FASTACCUM_VIME_PATH``, in real vime trees
(tests/test_vime_real.py says how).

Routed experts are off: this vLLM build cannot return them (docs/live.md).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import framework_harness
import pytest
from live_helpers import MODEL, ModelTokenizer, get_json, post_json, post_raw
from router_helpers import VLLM_ROUTER_AVAILABLE, vllm_router

pytest.importorskip("torch")  # vime's Sample holds tensors; the double's does too
pytest.importorskip("httpx")

pytestmark = [
    pytest.mark.live_vllm,
    pytest.mark.skipif(not VLLM_ROUTER_AVAILABLE, reason="vllm-router is not installed (the test extra has it)"),
]


harness = framework_harness.vime()
fv = harness.fv

GENERATE = "/inference/v1/generate"
MAX = 128  # --rollout-max-response-len
STOP_AT = 16  # the finishing group's answer ends with the stop token here (1-based) or a little later
SHORT = "the quick brown fox"  # the group that finishes
LONG = "zeta eta theta iota kappa"  # the group the rollout aborts and the next one resumes

VIME_PATH = os.environ.get("FASTACCUM_VIME_PATH", "")
VIME_ROOTS = [str(Path(p).resolve()) for p in VIME_PATH.split(os.pathsep) if p]
ENVS = [("double", harness.DOUBLE_ROOT, line) for line in harness.LINES] + [("real", root, None) for root in VIME_ROOTS]


@pytest.fixture(scope="module", params=ENVS, ids=[f"{k}-{line or Path(root).name}" for k, root, line in ENVS])
def env(request: pytest.FixtureRequest) -> Iterator[Any]:
    kind, root, line = request.param
    if kind == "real":
        if not (Path(root) / "vime" / "rollout" / "vllm_rollout.py").is_file():
            pytest.skip(f"{root} is not a vime tree (no vime/rollout/vllm_rollout.py)")
        for needed in ("tqdm", "PIL", "pybase64"):
            pytest.importorskip(needed)
    with harness.vime_env(kind, root, line) as loaded:
        if kind == "real":
            assert Path(loaded.rollout.__file__).resolve().is_relative_to(Path(root)), "not the tree's vime"
        yield loaded


# ---- the server's own answers -------------------------------------------------------------------


def answer(server: Any, prompt_ids: list[int], sampling_params: dict[str, Any]) -> dict[str, Any]:
    """The server's one choice in its non-streaming answer to ``sampling_params`` (vLLM's form)."""
    body = {"model": MODEL, "token_ids": prompt_ids, "sampling_params": sampling_params}
    choice: dict[str, Any] = post_json(server.url + GENERATE, body)["choices"][0]
    return choice


def logprobs_of(choice: dict[str, Any]) -> list[float]:
    content = choice["logprobs"]["content"]
    assert [item["token_id"] for item in content] == choice["token_ids"]
    return [float(item["logprob"]) for item in content]


def stop_token(short: list[int], long: list[int]) -> tuple[int, int]:
    """A stop token that ends ``short`` at position STOP_AT or a little later (not sooner) and
    never occurs in ``long``; with its position (1-based)."""
    for at in range(STOP_AT, STOP_AT + 16):
        token = short[at - 1]
        if token not in short[: at - 1] and token not in long:
            return token, at
    raise AssertionError("pick other prompts: every candidate stop token recurs")


def idle(server: Any) -> bool:
    return bool(get_json(server.url + "/load")["server_load"] == 0)


def wait_idle(server: Any) -> None:
    """Until the server runs nothing (what an earlier test cut may take a moment to leave)."""
    deadline = time.monotonic() + 120
    while not idle(server):
        assert time.monotonic() < deadline, "the server stayed busy"
        time.sleep(0.05)


# ---- the rollout --------------------------------------------------------------------------------


class Prompts:
    """vime's buffer semantics (``harness.BufferedPrompts``: buffered groups first, whole groups
    only) with one text per new group, in order."""

    def __init__(self, env: Any, args: Any, texts: list[str]) -> None:
        self._buffered = harness.BufferedPrompts(env, args)
        self.texts = texts
        self.created: list[list[Any]] = self._buffered.created  # every new group, in order
        self.added: list[list[list[Any]]] = self._buffered.added  # each add_samples call's groups

    def get_samples(self, num_groups: int) -> list[list[Any]]:
        made = len(self.created)
        groups: list[list[Any]] = self._buffered.get_samples(num_groups)
        for number, group in enumerate(self.created[made:], start=made):
            for sample in group:
                sample.prompt = self.texts[number]
        return groups

    def add_samples(self, groups: list[list[Any]]) -> None:
        self._buffered.add_samples(groups)


@contextlib.contextmanager
def server_wide_aborts(env: Any) -> Iterator[list[list[str]]]:
    """Every server-wide abort, by either caller: fastaccum's (its idle-wait fallback, the way the
    line does it) and vime's own helpers where the line has them (``abort_servers_until_idle`` on
    2b83ea20, ``abort_inflight_requests`` on 052693a8; the pause line posts ``/pause`` itself)."""
    from fastaccum.vime import _pools

    calls: list[list[str]] = []
    patch = pytest.MonkeyPatch()

    def spy_on(owner: Any, name: str, urls_at: int) -> None:
        original = getattr(owner, name)

        async def spy(*args: Any, **options: Any) -> Any:
            calls.append(list(args[urls_at]))
            return await original(*args, **options)

        patch.setattr(owner, name, spy)

    spy_on(_pools.FRAMEWORK, "server_abort", 1)
    for name in ("abort_servers_until_idle", "abort_inflight_requests"):
        for owner in (env.server_control, env.rollout):
            if owner is not None and hasattr(owner, name):
                spy_on(owner, name, 0)
    try:
        yield calls
    finally:
        patch.undo()


@contextlib.contextmanager
def model_tokenizer(env: Any, tokenizer: ModelTokenizer) -> Iterator[None]:
    """vime's ``load_tokenizer`` (through the stubbed ``transformers.AutoTokenizer``, which returns
    ``harness.TOKENIZER``) returns the model's own tokenizer."""
    patch = pytest.MonkeyPatch()
    patch.setattr(harness, "TOKENIZER", tokenizer)
    env.reset()  # a GenerateState made before holds the other tokenizer
    try:
        yield
    finally:
        patch.undo()
        env.reset()


def rollout_args(env: Any, router: str, stop: int) -> SimpleNamespace:
    host, port = router.removeprefix("http://").split(":")
    target = SimpleNamespace(host=host, port=int(port), expert_shape=(2, 2))
    args: SimpleNamespace = harness.make_args(
        env,
        target,
        hf_checkpoint=MODEL,  # vime sends it as the body's "model": the name the server serves
        rollout_temperature=0.0,  # greedy: each sample has one right answer
        rollout_max_response_len=MAX,
        rollout_stop_token_ids=[stop],
        partial_rollout=True,
        rollout_batch_size=1,
        n_samples_per_prompt=2,
        over_sampling_batch_size=2,
        fastaccum_idle_timeout=120.0,  # a fallback to the server-wide abort fails the test instead
        fastaccum_idle_poll_interval=0.05,
    )
    return args


def assert_holds_answer(
    env: Any,
    sample: Any,
    prompt_ids: list[int],
    ref: dict[str, Any],
    tokenizer: ModelTokenizer,
    calls: list[int],
    versions: list[str],
) -> None:
    """The sample holds the answer's first ``sum(calls)`` tokens after its prompt, their log-probs,
    the text of each call's tokens, decoded once per call (vime's rule), and the weight version
    of each call that vLLM ended with its finishing chunk."""
    tokens, logprobs = ref["token_ids"], logprobs_of(ref)
    n = sum(calls)
    assert sample.tokens == prompt_ids + tokens[:n]
    assert sample.response_length == n and harness.mask(env, sample) == [1] * n
    assert sample.rollout_log_probs == logprobs[:n]
    bounds = [sum(calls[:i]) for i in range(len(calls) + 1)]
    assert sample.response == "".join(tokenizer.decode(tokens[a:b]) for a, b in zip(bounds, bounds[1:]))
    # vLLM 0.32 reports weight versions as spans inside the finishing chunk's choice
    # ("weight_versions": [{"version", "start", "end"}]), not as vime's top-level "weight_version":
    # fastaccum.vime reads the spans (vime's own generate records none).
    assert sample.weight_versions == versions


def test_a_rollout_aborted_mid_stream_buffers_cut_prefixes_and_resumes_them_to_the_servers_answer(
    vllm: Any, env: Any
) -> None:
    tokenizer = ModelTokenizer(vllm.model)
    short_ids, long_ids = tokenizer.encode(SHORT), tokenizer.encode(LONG)
    with vllm_router([vllm.url]) as router, model_tokenizer(env, tokenizer), server_wide_aborts(env) as hard:
        greedy = {"max_tokens": MAX, "temperature": 0}
        stop, stop_at = stop_token(
            answer(vllm, short_ids, greedy)["token_ids"], answer(vllm, long_ids, greedy)["token_ids"]
        )
        args = rollout_args(env, router, stop)
        env.http_utils.init_http_client(args)  # vime's RolloutManager makes it before any rollout
        params = env.rollout._build_inference_sampling_params(harness.sampling_params(env, args))
        short_ref, long_ref = answer(vllm, short_ids, params), answer(vllm, long_ids, params)
        assert (short_ref["finish_reason"], short_ref["stop_reason"]) == ("stop", stop)
        assert len(short_ref["token_ids"]) == stop_at
        assert long_ref["finish_reason"] == "length" and len(long_ref["token_ids"]) == MAX
        # The loop's requests compute every KV themselves, not from the answers'.
        wait_idle(vllm)  # vLLM resets its prefix cache only while no request runs
        assert post_raw(vllm.url + "/reset_prefix_cache", {})[0] == 200
        source = Prompts(env, args, [SHORT, LONG])
        stock_abort = env.rollout.abort

        # Rollout 0: the short group finishes, which ends the rollout; the long one is aborted.
        first = fv.generate_rollout(args, 0, source)
        assert env.rollout.abort is stock_abort and idle(vllm)
        finished, aborted = source.created
        assert first.samples == [finished]
        for sample in finished:
            assert sample.status == env.Sample.Status.COMPLETED
            assert_holds_answer(env, sample, short_ids, short_ref, tokenizer, [stop_at], ["default"])
            assert sample.reward == float(stop_at) and harness.REWARDS[sample.index] == 1
        assert source.added == [[aborted]]  # buffered: it kept a prefix
        kept = []
        for sample in aborted:
            k = sample.response_length
            assert sample.status == env.Sample.Status.ABORTED and 0 < k < MAX and sample.reward is None
            # Drained: vLLM's abort chunk finishes the call, with its span.
            assert_holds_answer(env, sample, long_ids, long_ref, tokenizer, [k], ["default"])
            assert sample.rollout_routed_experts is None  # off on this server
            assert sample.metadata["start_rollout_id"] == 0
            kept.append(k)
        assert hard == []  # cut request by request, never server-wide

        # Rollout 1: the buffered group comes back first and alone; it resumes where it stopped.
        args.over_sampling_batch_size = 1
        second = fv.generate_rollout(args, 1, source)
        assert env.rollout.abort is stock_abort and idle(vllm)
        assert second.samples == [aborted] and source.added == [[aborted]]
        for sample, k in zip(aborted, kept):
            assert sample.status == env.Sample.Status.TRUNCATED
            # no token twice, none lost
            assert_holds_answer(env, sample, long_ids, long_ref, tokenizer, [k, MAX - k], ["default", "default"])
            assert harness.REWARDS[sample.index] == 1 and sample.reward == float(MAX)
        assert hard == []


def generated_tokens(server: Any) -> float:
    """Tokens the vLLM engine has generated so far (its Prometheus counter)."""
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("vllm:generation_tokens_total"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError("vLLM's /metrics has no vllm:generation_tokens_total")


def test_a_weight_version_change_mid_rollout_under_a_keep_pause_leaves_every_sample_complete(
    vllm: Any, env: Any
) -> None:
    """What SkyRL, prime-rl and OpenRLHF do around a weight update: ``/pause?mode=keep``, the new
    version, ``/resume``. The rollout never notices but in the versions: every sample completes
    and records both versions, in order (vLLM's spans on the finishing chunk)."""
    tokenizer = ModelTokenizer(vllm.model)
    with vllm_router([vllm.url]) as router, model_tokenizer(env, tokenizer), server_wide_aborts(env) as hard:
        args = rollout_args(env, router, stop=-1)
        args.rollout_stop_token_ids = None
        args.over_sampling_batch_size = 1
        env.http_utils.init_http_client(args)
        source = Prompts(env, args, [LONG])
        done: list[Any] = []
        start = generated_tokens(vllm)
        rollout = threading.Thread(target=lambda: done.append(fv.generate_rollout(args, 0, source)), daemon=True)
        try:
            rollout.start()
            deadline = time.monotonic() + 120
            while generated_tokens(vllm) - start < 20:  # both samples are decoding
                assert time.monotonic() < deadline and rollout.is_alive(), "the rollout did not start decoding"
                time.sleep(0.01)
            assert post_raw(vllm.url + "/pause?mode=keep&clear_cache=false", {})[0] == 200
            assert post_raw(vllm.url + "/update_weight_version", {"new_version": "v2"})[0] == 200
            assert post_raw(vllm.url + "/resume", {})[0] == 200
            rollout.join(300)
            assert not rollout.is_alive()
        finally:
            post_raw(vllm.url + "/resume", {})
            rollout.join(300)
            assert post_raw(vllm.url + "/update_weight_version", {"new_version": "default"})[0] == 200
        ((group,),) = [done[0].samples]
        for sample in group:
            assert sample.status == env.Sample.Status.TRUNCATED and sample.response_length == MAX
            assert sample.weight_versions == ["default", "v2"], sample.weight_versions
            assert len(sample.rollout_log_probs) == MAX and sample.reward == float(MAX)
        assert hard == [] and idle(vllm)
