"""A multi-turn generate function and a rollout function of your own, streamed through fastaccum
(docs/slime.md, "Your own generate function").

With this folder on ``PYTHONPATH``::

    --custom-generate-function-path slime_multi_turn.generate
    --rollout-function-path slime_multi_turn.generate_rollout
    --rollout-max-response-len 4096

Each turn is one streaming request through ``fastaccum.slime.generate_turn``: the model's tokens go
onto the sample with their log-probs (trainable), then a tool's answer with slime's own
``append_response_tokens(..., trainable=False)`` (loss mask 0), and the next turn asks again with
everything the sample holds. A rollout abort ends the running turn by rid and keeps its prefix:
the sample is then ABORTED and the loop stops, so a partial rollout resumes it later. The tool
here only counts the turn's tokens; put yours in its place.
"""

from __future__ import annotations

from typing import Any

from slime.rollout import sglang_rollout
from slime.utils.types import Sample

import fastaccum.slime

TURNS = 2  # model turns per sample
TURN_TOKENS = 64  # each turn's max_new_tokens


def tool(turn_text: str) -> str:
    """The environment's answer to one model turn."""
    return f" [tool: {len(turn_text.split())} words]"


@fastaccum.slime.request_abortable  # its streams are fastaccum's: aborted by rid, never server-wide
async def generate(args: Any, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
    tokenizer = sglang_rollout.GenerateState(args).tokenizer
    for turn in range(TURNS):
        left = sampling_params["max_new_tokens"] - sample.response_length
        if left <= 0:
            sample.status = Sample.Status.TRUNCATED
            return sample
        result = await fastaccum.slime.generate_turn(
            args, sample, {**sampling_params, "max_new_tokens": min(TURN_TOKENS, left)}
        )
        sample.metadata["turns"] = sample.metadata.get("turns", 0) + 1
        if result.aborted or (result.finish_reason or {}).get("type") != "stop" or turn == TURNS - 1:
            return sample  # aborted (ABORTED, the prefix kept), out of tokens, or done
        answer = tool(result.text or "")
        sample.append_response_tokens(
            args, tokens=tokenizer.encode(answer, add_special_tokens=False), trainable=False, text=answer
        )
    return sample


def my_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout with something of your own around it: here, a metric of the turns taken."""
    output = sglang_rollout.generate_rollout(args, rollout_id, data_source, evaluation=evaluation)
    if not evaluation:
        turns = [sample.metadata.get("turns", 0) for group in output.samples for sample in group]
        output.metrics = {**(output.metrics or {}), "multi_turn/turns_mean": sum(turns) / max(1, len(turns))}
    return output


# slime's module-level abort is swapped for fastaccum's request_abort while my_rollout runs.
generate_rollout = fastaccum.slime.with_request_abort(my_rollout)
