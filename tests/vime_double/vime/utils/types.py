"""Double of vime.utils.types: ``Sample`` with the fields and rules the adapter relies on, per
line (vime._line). On request-abort and stock: ``append_response_tokens`` / ``_apply_meta_info``
(loss mask, log-probs, top-p CSR merge, routed experts reshaped to (len(tokens) - 1, layers,
topk), weight versions, prefix-cache info, status from the finish type), with vime's length
checks; on request-abort the routed experts are kept in chunks, appended from
``routed_experts_start_len``. On pause: ``update_from_meta_info`` alone (prefix-cache info, the meta's weight version,
status from the finish type) and no top-p fields; its generate writes the tokens itself."""

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from vime._line import LINE
from vime.utils.misc import decode_int32_meta_array


@dataclass
class _Sample:
    group_index: int | None = None
    index: int | None = None
    prompt: Any = ""
    tokens: list = field(default_factory=list)
    multimodal_inputs: dict | None = None
    multimodal_train_inputs: dict | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: Any = None
    loss_mask: list | None = None
    weight_versions: list = field(default_factory=list)
    rollout_log_probs: list | None = None
    rollout_routed_experts: Any = None

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    custom_rm_path: str | None = None
    session_id: str | None = None

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info):
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def update_from_meta_info(self, args, meta_info):
        """What the pause line's Sample takes from a finished call's meta (its generate wrote the
        tokens, log-probs and routed experts itself)."""
        self.prefix_cache_info.add(meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        self.status = {
            "length": Sample.Status.TRUNCATED,
            "abort": Sample.Status.ABORTED,
            "stop": Sample.Status.COMPLETED,
        }.get(meta_info["finish_reason"]["type"], self.status)


@dataclass
class _AppendingSample(_Sample):
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None

    def append_response_tokens(
        self,
        args=None,
        *,
        tokens=None,
        log_probs=None,
        trainable=True,
        meta_info=None,
        text=None,
        update_terminal_info=True,
    ):
        tokens = [int(t) for t in (tokens or [])]
        log_probs = None if log_probs is None else [float(x) for x in log_probs]
        if log_probs is not None and len(log_probs) != len(tokens):
            raise ValueError("log_probs length != tokens length")
        if tokens and trainable and log_probs is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        previous = self.response_length
        if text is not None:
            self.response += text
        if tokens:
            self.tokens += tokens
            self.response_length += len(tokens)
            if self.loss_mask is None:
                self.loss_mask = [1] * previous
            self.loss_mask += [1 if trainable else 0] * len(tokens)
        if log_probs is not None:
            if self.rollout_log_probs is None:
                if trainable and previous:
                    raise ValueError("existing response tokens but no rollout_log_probs")
                self.rollout_log_probs = [0.0] * previous
            self.rollout_log_probs += log_probs
        if meta_info is not None:
            self._apply_meta_info(
                args, meta_info, new_token_count=len(tokens), update_terminal_info=update_terminal_info
            )
        self._validate()

    def _apply_meta_info(
        self, args, meta_info, *, new_token_count=0, pad_missing_top_p=False, update_terminal_info=True
    ):
        if new_token_count:
            ids = decode_int32_meta_array(meta_info, "top_p_token_ids")
            offsets = decode_int32_meta_array(meta_info, "top_p_token_offsets")
            if (ids is None) != (offsets is None):
                raise ValueError("top-p replay must include both token ids and offsets.")
            if ids is not None:
                if offsets.numel() != new_token_count + 1 or int(offsets[0]) != 0 or int(offsets[-1]) != ids.numel():
                    raise ValueError("top-p offsets do not match the new tokens")
                if self.rollout_top_p_token_offsets is None:
                    self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
                else:
                    base = self.rollout_top_p_token_offsets
                    self.rollout_top_p_token_ids = torch.cat([self.rollout_top_p_token_ids, ids])
                    self.rollout_top_p_token_offsets = torch.cat([base, offsets[1:] + int(base[-1])])
        routed = decode_int32_meta_array(meta_info, "routed_experts")
        if routed is not None:
            start = int(meta_info.get("routed_experts_start_len", 0) or 0)
            rows = max(0, len(self.tokens) - 1 - start)
            if routed.numel() != rows * args.num_layers * args.moe_router_topk:
                raise ValueError("routed_experts element count does not match sample tokens")
            self.rollout_routed_experts = routed.reshape(rows, args.num_layers, args.moe_router_topk)
        if not update_terminal_info or "finish_reason" not in meta_info:
            return
        self.prefix_cache_info.add(meta_info)
        if new_token_count > 0 and "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        self.status = {
            "length": Sample.Status.TRUNCATED,
            "abort": Sample.Status.ABORTED,
            "stop": Sample.Status.COMPLETED,
        }.get(meta_info["finish_reason"]["type"], self.status)

    def _validate(self):
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError("loss_mask length != response_length")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError("rollout_log_probs length != response_length")
        offsets = self.rollout_top_p_token_offsets
        if offsets is not None and len(offsets) != self.response_length + 1:
            raise ValueError("rollout_top_p_token_offsets length must equal response_length + 1")


@dataclass
class _ChunkedSample(_AppendingSample):
    """request-abort's Sample: routed experts appended from ``routed_experts_start_len`` as
    chunks (a list of tensors), counted by ``get_rollout_routed_experts_length`` and joined by
    ``materialize_rollout_routed_experts``; its generate resumes with vLLM's
    ``routed_experts_prompt_start`` set to the rows held."""

    def get_rollout_routed_experts_length(self):
        held = self.rollout_routed_experts
        if held is None:
            return 0
        return sum(int(c.shape[0]) for c in held) if isinstance(held, list) else int(held.shape[0])

    def materialize_rollout_routed_experts(self, *, replace=True):
        held = self.rollout_routed_experts
        if held is None:
            return None
        tensor = torch.cat(held) if isinstance(held, list) else held
        if replace:
            self.rollout_routed_experts = tensor
        return tensor

    def _apply_meta_info(self, args, meta_info, **kwargs):
        start = int(meta_info.get("routed_experts_start_len", 0) or 0)
        held = self.rollout_routed_experts
        if start and decode_int32_meta_array(meta_info, "routed_experts") is not None:
            if self.get_rollout_routed_experts_length() < start:
                raise ValueError("existing routed experts shorter than routed_experts_start_len")
            kept = self.materialize_rollout_routed_experts(replace=False)[:start]
            super()._apply_meta_info(args, meta_info, **kwargs)  # the new rows, reshaped and checked
            self.rollout_routed_experts = [kept, self.rollout_routed_experts]
            return
        super()._apply_meta_info(args, meta_info, **kwargs)
        if self.rollout_routed_experts is not held and self.rollout_routed_experts is not None:
            self.rollout_routed_experts = [self.rollout_routed_experts]


Sample = {"pause": _Sample, "stock": _AppendingSample}.get(LINE, _ChunkedSample)
Sample.__name__ = Sample.__qualname__ = "Sample"
