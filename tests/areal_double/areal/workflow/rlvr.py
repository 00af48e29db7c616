"""AReaL's single-turn workflow, as far as it uses a generate call: one agenerate, then the
response's lists concatenated into the trajectory (which is why they must be lists)."""

from __future__ import annotations

import uuid
from typing import Any

from areal.api.io_struct import ModelRequest


class RLVRWorkflow:
    def __init__(self, reward_fn: Any, gconfig: Any, tokenizer: Any, get_input_ids_fn: Any = None, **_: Any) -> None:
        self.reward_fn = reward_fn
        self.tokenizer = tokenizer
        self.gconfig = gconfig.new_with_stop_and_pad_token_ids(tokenizer)
        self.get_input_ids_fn = get_input_ids_fn

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any]:
        input_ids = self.get_input_ids_fn(data["messages"], self.tokenizer, False)
        req = ModelRequest(
            rid=uuid.uuid4().hex, input_ids=input_ids, gconfig=self.gconfig.new(n_samples=1), tokenizer=self.tokenizer
        )
        resp = await engine.agenerate(req)
        reward = self.reward_fn(None, None, resp.input_tokens, resp.output_tokens, **data)
        return {
            "input_ids": resp.input_tokens + resp.output_tokens,
            "loss_mask": [0] * resp.input_len + [1] * resp.output_len,
            "logprobs": [0.0] * resp.input_len + resp.output_logprobs,
            "versions": [-1] * resp.input_len + resp.output_versions,
            "rewards": reward,
        }
