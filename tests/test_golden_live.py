"""Goldens written by real engines, read by both twins: each stream reads to the engine's own answer.

tests/golden/live-sglang-0.5.23-<cpu> and tests/golden/live-vllm-0.32.0-<cpu> hold stream bodies
that live SGLang and vLLM servers wrote for the tiny MoE model on CPUs of each instruction set
named (tools/live/goldens.py, which keeps in the manifest each request and the same server's
non-streaming answer to it). These are the first goldens written by an engine rather than around
one; the live tiers check that the engines still write them (tests/live/test_goldens.py).
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from fastaccum.emulator import writer
from fastaccum.errors import ServerError

GOLDEN = Path(__file__).resolve().parent / "golden"


def _cases() -> list[Any]:
    cases = []
    for path in sorted(GOLDEN.glob("live-*/manifest.json")):
        manifest = json.loads(path.read_text())
        for name, entry in sorted(manifest["scenarios"].items()):
            cases.append(pytest.param(manifest["engine"], path.parent, entry, id=f"{path.parent.name}-{name}"))
    return cases


CASES = _cases()


def _feed(impl: ModuleType, engine: str, data: bytes, piece_size: int, **options: Any) -> tuple[Any, Any]:
    acc = impl.StreamAccumulator(dialect="vllm" if engine == "vllm" else "sglang", **options)
    try:
        for piece in writer.split_pieces(data, [piece_size]) if piece_size else [data]:
            acc.feed(piece)
        return acc, acc.finish()
    except ServerError as exc:
        return acc, exc


def test_both_engines_have_goldens() -> None:
    engines = {case.values[0] for case in CASES}
    assert engines == {"sglang", "vllm"}


@pytest.mark.parametrize(("engine", "folder", "entry"), CASES)
@pytest.mark.parametrize("piece_size", [0, 7, 1021], ids=["whole", "7B", "1021B"])
def test_a_live_golden_reads_to_the_engines_own_answer(
    impl: ModuleType, engine: str, folder: Path, entry: dict[str, Any], piece_size: int
) -> None:
    data = (folder / entry["file"]).read_bytes()
    answer = entry["answer"]
    routed = entry["request"].get("return_routed_experts", False)
    acc, result = _feed(impl, engine, data, piece_size, expert_shape=(2, 2) if routed else None)
    if entry["answer_status"] != 200:  # refused: the stream carries the same error as an event
        assert isinstance(result, ServerError)
        assert result.message == answer["error"]["message"] and result.status == answer["error"]["code"]
        assert len(acc.snapshot()) == 0
        return
    if engine == "vllm":
        _assert_vllm(result, entry["request"], answer)
    else:
        _assert_sglang(result, entry, answer)


def _assert_vllm(result: Any, request: dict[str, Any], answer: dict[str, Any]) -> None:
    choice = answer["choices"][0]
    assert result.token_ids.tolist() == choice["token_ids"]
    if choice["logprobs"] is None:
        assert result.logprobs is None
    else:
        assert result.logprobs.tolist() == [item["logprob"] for item in choice["logprobs"]["content"]]
    assert result.meta_info["finish_reason"] == choice["finish_reason"]
    assert result.meta_info["stop_reason"] == choice["stop_reason"]
    assert result.completion_tokens == answer["usage"]["completion_tokens"]
    assert result.meta_info["request_id"] == f"generate-tokens-{request['request_id']}"
    assert result.text == choice.get("text")


def _assert_sglang(result: Any, entry: dict[str, Any], answer: dict[str, Any]) -> None:
    meta = answer["meta_info"]
    # One token comes in one event, which reads the same in both modes: the mode stays undecided.
    mode = "incremental" if entry["incremental"] else "cumulative"
    assert result.mode == (mode if len(answer["output_ids"]) > 1 else "auto")
    assert result.token_ids.tolist() == answer["output_ids"]
    if "output_token_logprobs" in meta:
        assert result.logprobs.tolist() == [entry_[0] for entry_ in meta["output_token_logprobs"]]
    else:
        assert result.logprobs is None
    assert result.finish_reason == meta["finish_reason"]
    assert result.completion_tokens == meta["completion_tokens"]
    assert result.text == answer["text"]
    if "routed_experts" in meta:
        experts = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype=np.int32).reshape(-1, 2, 2)
        assert experts.shape[0] == meta["prompt_tokens"] + meta["completion_tokens"] - 1
        assert result.routed_experts is not None and np.array_equal(result.routed_experts, experts)
    else:
        assert result.routed_experts is None
