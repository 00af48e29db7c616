"""Helpers for the transport tests (test_client.py, test_transport.py): one request payload, the
emulator's truth for a result, and waiting on a condition inside the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import numpy as np

from fastaccum import StreamResult
from fastaccum.emulator import Emulator

__all__ = ("PROMPT", "assert_matches", "payload", "run", "wait_until")

T = TypeVar("T")
PROMPT = [101, 102, 103, 104]


def run(coro: Awaitable[T]) -> T:
    return asyncio.run(coro)  # type: ignore[arg-type]


def payload(rid: str, n: int, **extra: Any) -> dict[str, Any]:
    params = {"max_new_tokens": n, **extra.pop("sampling_params", {})}
    return {"input_ids": PROMPT, "rid": rid, "return_logprob": True, "sampling_params": params, **extra}


async def wait_until(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


def assert_matches(
    emulator: Emulator, rid: str, result: StreamResult, *, routed: bool = False, top_p: bool = False
) -> None:
    """Every token, logprob and text byte equals the emulator's truth for this prefix."""
    n = len(result)
    gen = emulator.expected(rid, n, prompt_tokens=len(PROMPT), top_p=top_p, routed_experts=routed)
    assert np.array_equal(result.token_ids, np.asarray(gen.token_ids, dtype=np.int32))
    if n == 0:
        return  # nothing arrived: no event said whether logprobs or text would come
    assert result.logprobs is not None
    assert np.array_equal(result.logprobs, np.asarray(gen.logprobs, dtype=np.float64))
    if not emulator.skip_tokenizer_init:
        assert result.text == gen.text(0, n)
    if routed and result.finished:
        assert result.routed_experts is not None and gen.routed_experts is not None
        assert np.array_equal(result.routed_experts, gen.routed_experts)
    if top_p and result.finished:
        assert result.top_p_token_offsets is not None and result.top_p_token_ids is not None
        rows = [
            list(result.top_p_token_ids[a:b])
            for a, b in zip(result.top_p_token_offsets[:-1], result.top_p_token_offsets[1:])
        ]
        assert rows == [list(r) for r in gen.top_p_rows or ()]
