"""The emulator's pauses held to the real engines': each scenario runs on the emulator and on the
live server (SGLang 0.5.23 in incremental mode with routing replay on; vLLM 0.32 with its RL dev
API), and what the stream sees must be the same on both: the finish reason, the versions its
tokens are labelled with (and SGLang's last label), whether it was retracted, whether it is
complete and holds a routed-expert row per position, and the weight update's answer (its status
and message).

Token positions are timing on the live server, so they are compared only as facts that hold on
both: a new version begins at or after the token the stream held when the pause was asked. The
emulator is paused at exactly that token by its ``hold`` fault (sent to the emulator only). The
second weights are the second tiny checkpoint on the live server and another model path
on the emulator (vLLM: a version change alone); each scenario loads the first weights and the
version "default" back.
"""

from __future__ import annotations

import asyncio
import json
from types import ModuleType
from typing import Any

import pytest
from client_helpers import run
from live_helpers import engines, post_json
from test_weight_updates_live import AT, EXPERTS, PROMPT, N, across_a_pause, post, sglang_body, vllm_body

import fastaccum
from fastaccum import StreamResult
from fastaccum.emulator import FAULT_KEY, Emulator

# (pause mode, weight update: None, or its flush_cache)
SCENARIOS = {
    "in_place": ("in_place", None),
    "in_place-new-weights": ("in_place", False),
    "in_place-new-weights-flush-refused": ("in_place", True),
    "retract-new-weights": ("retract", True),
    "abort": ("abort", None),
}


def emulator() -> Emulator:
    return Emulator(
        greedy=True,
        incremental_streaming_output=True,
        enable_return_routed_experts=True,
        num_layers=EXPERTS[0],
        topk=EXPERTS[1],
        token_rate=2000,
    )


async def scenario(server: Any, mode: str, flush: bool | None, second: str, *, held_at: bool) -> dict[str, Any]:
    """What the stream sees across the pause, and the update's answer; ``held_at``: the emulator,
    held at the pause point."""
    answers: list[tuple[int, Any]] = []

    async def pause(stream: Any) -> None:
        assert (await post(server, "/pause_generation", {"mode": mode}))[0] == 200
        if flush is not None:
            update = {"model_path": second, "weight_version": "v2", "flush_cache": flush}
            status, reply = await post(server, "/update_weights_from_disk", update)
            answers.append((status, json.loads(reply)))
        assert (await post(server, "/continue_generation"))[0] == 200

    body = {**sglang_body(), **({FAULT_KEY: {"kind": "hold", "at": AT}} if held_at else {})}
    async with fastaccum.Client(server.url, coalesce_ms=0) as client:
        result, held = await across_a_pause(client, body, pause, options={"expert_shape": EXPERTS})
    return seen(result, held, answers)


def seen(result: StreamResult, held: int, answers: list[tuple[int, Any]]) -> dict[str, Any]:
    spans = result.weight_version_spans or ()
    n = len(result)
    return {
        "finish": (result.finish_reason or {}).get("type"),
        "versions": [v for _, _, v in spans],
        "label": result.meta_info.get("weight_version"),
        "retracted": result.meta_info.get("num_retractions", 0) > 0,
        "complete": n == N,
        "rows": result.routed_experts is not None and result.routed_experts.shape[0] == len(PROMPT) + n - 1,
        "new version after the pause point": len(spans) < 2 or spans[1][0] >= held,
        "update": [(status, reply["success"], reply["message"]) for status, reply in answers],
    }


@pytest.mark.live_sglang
@pytest.mark.parametrize("sglang_mode", ["incremental"])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_emulator_pauses_as_sglang_does(sglang: Any, twin: ModuleType, name: str) -> None:
    mode, flush = SCENARIOS[name]
    second = str(engines.model_dir(sglang.python, seed="b"))

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with emulator() as url:
            double = await scenario(_Served(url), mode, flush, "fastaccum/second", held_at=True)
        try:
            live = await scenario(sglang, mode, flush, second, held_at=False)
        finally:
            first = {"model_path": str(sglang.model), "weight_version": "default"}
            done = await asyncio.to_thread(post_json, sglang.url + "/update_weights_from_disk", first)
            assert done["success"], done
        return double, live

    double, live = run(main())
    assert double == live


class _Served:
    """A URL as the helpers take a server: ``.url``."""

    def __init__(self, url: str) -> None:
        self.url = url


# ---- vLLM -----------------------------------------------------------------------------------------

# the /pause query, and whether a version change comes while paused
VLLM_SCENARIOS = {
    "keep-new-version": ("mode=keep&clear_cache=false", True),
    "keep-cleared-new-version": ("mode=keep&clear_cache=true", True),
    "abort": ("mode=abort", False),
    "wait": ("mode=wait", False),
}


async def vllm_scenario(server: Any, query: str, version: bool, *, held_at: bool) -> dict[str, Any]:
    paused_at: list[int] = []

    async def pause(stream: Any) -> None:
        assert (await post(server, f"/pause?{query}"))[0] == 200
        paused_at.append(stream.tokens)
        if version:
            assert (await post(server, "/update_weight_version", {"new_version": "v2"}))[0] == 200
        assert (await post(server, "/resume"))[0] == 200

    body = {**vllm_body(), **({FAULT_KEY: {"kind": "hold", "at": AT}} if held_at else {})}
    async with fastaccum.Client(server.url, dialect="vllm", coalesce_ms=0) as client:
        result, _ = await across_a_pause(client, body, pause)
    spans = result.weight_version_spans or ()
    return {
        "finish": (result.finish_reason or {}).get("type"),
        "versions": [v for _, _, v in spans],
        "complete": len(result) == N,
        # vLLM labels a token when its step is processed: the new version begins with the first
        # token after those the stream held when the pause returned.
        "new version where the pause left it": len(spans) < 2 or spans[1][0] == paused_at[0],
    }


@pytest.mark.live_vllm
@pytest.mark.parametrize("name", list(VLLM_SCENARIOS))
def test_the_emulator_pauses_as_vllm_does(vllm: Any, twin: ModuleType, name: str) -> None:
    query, version = VLLM_SCENARIOS[name]
    double_server = Emulator(greedy=True, dialect="vllm", vllm_server_dev_mode=True, weight_version="default")

    async def main() -> tuple[dict[str, Any], dict[str, Any]]:
        async with double_server as url:
            double = await vllm_scenario(_Served(url), query, version, held_at=True)
        try:
            live = await vllm_scenario(vllm, query, version, held_at=False)
        finally:
            await post(vllm, "/update_weight_version", {"new_version": "default"})
        return double, live

    double, live = run(main())
    assert double == live
