"""AReaL's generate loop, streamed: ``RemoteInfEngine.agenerate``'s rules (the pause gate, the
pinned version, a server per ``rid``, the checks and their messages, asking again after an abort
until ``stop`` or ``length``) with each segment read by fastaccum and the segments joined by the
resume contract: a resumed request asks only for the routed-expert rows the sample does not hold,
and the rows, versions and timings of every segment end up in one ``ModelResponse``."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastaccum._core.resume import join, prompt_tokens_of, resume_payload, routed_start_of
from fastaccum._rollout import call_tokens
from fastaccum.areal._modules import modules
from fastaccum.areal._pools import pools_of
from fastaccum.areal._response import Segment, latencies, versions_of
from fastaccum.errors import StreamLengthError, StreamTimeoutError, StreamTruncatedError
from fastaccum.result import StreamResult
from fastaccum.transport.timing import now

__all__ = ("generate", "server_for", "ROUTED_EXPERTS_MISSING")

# AReaL's loop polls its workflow executor's pause this often (remote_inf_engine.py).
PAUSE_POLL_S = 0.5
# AReaL's own finish types that end the loop; anything else (an abort) asks again.
_FINAL = ("stop", "tool_calls", "length")
ROUTED_EXPERTS_MISSING = (
    "Requested return_routed_experts=True but received None from SGLang. "
    "This usually means the model is not a MoE (Mixture of Experts) model. "
    "Please use a MoE model to get routed_experts information."
)


def server_for(engine: Any, rid: str) -> str:
    """The server of a request: the one its ``rid`` went to before (its KV cache is there), else
    the engine's next by its routing strategy, remembered for the newest ``RID_CACHE_SIZE`` rids."""
    known = engine.rid_to_address.get(rid)
    if known is not None:
        return str(known)
    address = engine.choose_server()
    if len(engine.rid_queue) >= modules().RID_CACHE_SIZE:
        engine.rid_to_address.pop(engine.rid_queue.pop(0), None)
    engine.rid_to_address[rid] = address
    engine.rid_queue.append(rid)
    return str(address)


def _checked_budget(req: Any) -> int:
    """AReaL's two checks before anything is sent, with its messages; the budget they leave."""
    gconfig = req.gconfig
    if gconfig.n_samples != 1:
        raise ValueError(
            "Inference engines do not support n_samples > 1. Please call generate multiple times with n_samples = 1."
        )
    budget = min(gconfig.max_tokens - len(req.input_ids), gconfig.max_new_tokens)
    if budget <= 0:
        raise RuntimeError(
            f"max_new_tokens ({budget}) is non-positive! "
            f"max_tokens={gconfig.max_tokens}, prompt_len={len(req.input_ids)}, "
            f"max_new_tokens={gconfig.max_new_tokens}."
        )
    return int(budget)


def _rows_shaped(result: StreamResult, start: int) -> StreamResult:
    """The routed experts as AReaL shapes them, one row per position (``(rows, layers * top_k)``):
    SGLang sends them flat, and the width is whatever the model has."""
    flat = result.routed_experts
    if flat is None:
        return result
    if not flat.size:
        return dataclasses.replace(result, routed_experts=None)
    prompt = prompt_tokens_of(result)
    rows = (prompt if prompt is not None else 0) + len(result) - 1 - start
    if rows <= 0 or flat.size % rows:
        raise StreamLengthError(
            f"routed_experts has {flat.size} values, not a whole number of rows for {rows} positions "
            f"(prompt {prompt} + {len(result)} tokens - 1 - start {start})",
            mode=result.mode,
            expected=rows,
            actual=int(flat.size),
        )
    return dataclasses.replace(result, routed_experts=flat.reshape(rows, -1))


async def generate(engine: Any, req: Any) -> Any:
    """``RemoteInfEngine.agenerate`` for ``engine`` (AReaL's inner engine), each segment streamed."""
    pools = pools_of(engine)
    config = engine.config
    req = req.copy()  # AReaL's loop works on a copy too: the caller's request is left alone
    if config.return_routed_experts:
        req.metadata["return_routed_experts"] = True
    req.gconfig.max_new_tokens = budget = _checked_budget(req)
    routed = bool(req.metadata.get("return_routed_experts", False))
    prompt = list(req.input_ids)
    start = now()
    address = server_for(engine, req.rid)

    segments: list[Segment] = []
    held: StreamResult | None = None  # every segment so far, joined
    cuts_left = pools.settings.retries  # a connection cut mid-answer is resumed from what it kept
    finish: str | None = None
    while finish not in _FINAL and (held is None or len(held) < budget):
        # Paused for a weight update: wait, so as not to compete with it for the servers.
        while engine.workflow_executor.is_paused():
            await asyncio.sleep(PAUSE_POLL_S)
        pinned = engine.get_version()  # what AReaL stamps a segment with; the stream says better
        request = engine.backend.build_generation_request(req, with_lora=config.use_lora, version=pinned)
        payload = {**request.payload, "stream": True}
        if held is not None:
            payload = resume_payload(payload, held)
        stream = pools.open(address, payload)
        try:
            result = await stream.run()
        except (StreamTruncatedError, StreamTimeoutError):
            # Cut or silent mid-answer. Before the first event the Client has already retried
            # what qualifies (docs/client.md, "Retries"): nothing was received to resume from.
            if cuts_left <= 0 or not getattr(stream, "events", 0):
                raise
            cuts_left -= 1
            result = stream.kept()  # its tokens; its routed rows never came, the resume asks again
        ended = now()
        result = _rows_shaped(result, routed_start_of(payload))
        if routed and result.routed_experts is None and result.finished:
            if (result.finish_reason or {}).get("type") != "abort":
                raise RuntimeError(ROUTED_EXPERTS_MISSING)
        segments.append(Segment(result, pinned, getattr(stream, "timing", None), ended))
        held = result if held is None else join(held, result, prompt_tokens=len(prompt))
        if result.finished:
            finish = str((result.finish_reason or {}).get("type"))

    assert held is not None
    tokens, logprobs = call_tokens(held, "return_logprob")
    ttft, itl = latencies(start, segments)
    return modules().ModelResponse(
        input_tokens=prompt,
        input_images=req.image_data,
        output_tokens=tokens,
        output_logprobs=logprobs,
        output_versions=versions_of(segments),
        # The loop ended on the budget after an abort: AReaL calls that length.
        stop_reason="length" if finish not in _FINAL else finish,
        latency=now() - start,
        ttft=ttft,
        itl=itl,
        tokenizer=req.tokenizer,
        processor=req.processor,
        routed_experts=held.routed_experts,
    )
