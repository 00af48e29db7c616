"""Double of slime.utils.types.Sample: the fields fastaccum writes and append_response_tokens' rules."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from slime.utils.misc import decode_int32_meta_array

_TOP_P_IDS = ("top_p_token_ids", "top_p_kept_token_ids")
_TOP_P_OFFSETS = ("top_p_token_offsets", "top_p_kept_token_offsets")


def _ints(values: Any) -> list[int]:
    if values is None:
        return []
    if torch.is_tensor(values):
        values = values.detach().cpu().reshape(-1).tolist()
    return [int(v) for v in values]


def _floats(values: Any) -> list[float] | None:
    if values is None:
        return None
    if torch.is_tensor(values):
        values = values.detach().cpu().reshape(-1).tolist()
    return [float(v) for v in values]


def _flat_int32(values: Any, default: list[int]) -> torch.Tensor:
    return torch.as_tensor(default if values is None else values, dtype=torch.int32).reshape(-1)


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    prompt: Any = ""
    tokens: list[int] = field(default_factory=list)
    multimodal_inputs: dict[str, Any] | None = None
    multimodal_train_inputs: dict[str, Any] | None = None
    response: str = ""
    response_length: int = 0
    label: str | None = None
    reward: Any = None
    loss_mask: list[int] | None = None
    weight_versions: list[str] = field(default_factory=list)
    rollout_log_probs: list[float] | None = None
    rollout_top_p_token_ids: Any = None
    rollout_top_p_token_offsets: Any = None
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
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def add(self, meta_info: dict) -> None:
            self.spec_accept_token_num += meta_info.get("spec_accept_token_num", 0)
            self.spec_draft_token_num += meta_info.get("spec_draft_token_num", 0)
            self.spec_verify_ct += meta_info.get("spec_verify_ct", 0)
            self.completion_token_num += meta_info.get("completion_tokens", 0)

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict) -> None:
            self.cached_tokens += meta_info.get("cached_tokens", 0)
            self.total_prompt_tokens += meta_info.get("prompt_tokens", 0)

    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def append_response_tokens(
        self,
        args: Any = None,
        *,
        tokens: Any = None,
        log_probs: Any = None,
        trainable: bool = True,
        meta_info: dict | None = None,
        text: str | None = None,
        update_terminal_info: bool = True,
    ) -> None:
        """Extend the response by one segment and keep mask, log-probs and replay data aligned."""
        new_ids = _ints(tokens)
        new_lps = _floats(log_probs)
        if new_lps is not None and len(new_lps) != len(new_ids):
            raise ValueError(f"log_probs length {len(new_lps)} != tokens length {len(new_ids)}")
        if new_ids and trainable and new_lps is None:
            raise ValueError("trainable response tokens require rollout log probabilities.")
        if new_ids and not trainable:
            if new_lps is not None:
                raise ValueError("non-trainable response tokens should not pass rollout log probabilities.")
            new_lps = [0.0] * len(new_ids)

        if text is not None:
            self.response += text
        held = self.response_length
        if new_ids:
            self.tokens += new_ids
            self.response_length += len(new_ids)
            self.loss_mask = (self.loss_mask if self.loss_mask is not None else [1] * held) + [
                int(trainable)
            ] * len(new_ids)
        if new_lps is not None:
            if self.rollout_log_probs is None:
                if trainable and held:
                    raise ValueError(
                        "Cannot append trainable rollout log probabilities to a sample with existing response "
                        "tokens but no existing rollout_log_probs."
                    )
                self.rollout_log_probs = [0.0] * held
            self.rollout_log_probs += new_lps

        pad = bool(new_ids) and not trainable
        if meta_info is not None or pad:
            self._apply_meta_info(
                args, meta_info or {}, new_token_count=len(new_ids), pad_missing_top_p=pad,
                update_terminal_info=update_terminal_info,
            )
        self._validate_response_metadata_lengths()

    def _apply_meta_info(
        self,
        args: Any,
        meta_info: dict,
        *,
        new_token_count: int = 0,
        pad_missing_top_p: bool = False,
        update_terminal_info: bool = True,
    ) -> None:
        top_p_applied = False
        if new_token_count:
            ids = decode_int32_meta_array(meta_info, _TOP_P_IDS)
            offsets = decode_int32_meta_array(meta_info, _TOP_P_OFFSETS)
            if ids is not None or offsets is not None:
                if ids is None or offsets is None:
                    raise ValueError("SGLang top-p token replay must include both token ids and offsets.")
                if offsets.numel() == 0 or int(offsets[0]) != 0:
                    raise ValueError(f"SGLang top-p token offsets must start with 0, got {offsets[:1].tolist()}.")
                if int(offsets[-1]) != ids.numel():
                    raise ValueError(
                        f"SGLang top-p token ids/offsets mismatch: offsets[-1]={int(offsets[-1])}, "
                        f"len(token_ids)={ids.numel()}."
                    )
                if offsets.numel() != new_token_count + 1:
                    raise ValueError(
                        "SGLang top-p token offsets length must equal generated token count + 1: "
                        f"len(offsets)={offsets.numel()}, generated={new_token_count}."
                    )
                top_p_applied = True
                if self.rollout_top_p_token_ids is None and self.rollout_top_p_token_offsets is None:
                    self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
                else:  # merge: shift the new offsets past the held ids
                    base_ids = _flat_int32(self.rollout_top_p_token_ids, [])
                    base_offsets = _flat_int32(self.rollout_top_p_token_offsets, [0])
                    self.rollout_top_p_token_ids = torch.cat([base_ids, ids])
                    self.rollout_top_p_token_offsets = torch.cat([base_offsets, offsets[1:] + int(base_offsets[-1])])
        if pad_missing_top_p and new_token_count and self.rollout_top_p_token_offsets is not None and not top_p_applied:
            offsets = _flat_int32(self.rollout_top_p_token_offsets, [0])
            self.rollout_top_p_token_ids = _flat_int32(self.rollout_top_p_token_ids, [])
            self.rollout_top_p_token_offsets = torch.cat([offsets, offsets.new_full((new_token_count,), int(offsets[-1]))])

        experts = decode_int32_meta_array(meta_info, "routed_experts")
        if experts is not None:
            if args is None:
                raise ValueError("args is required to decode routed experts metadata.")
            start = int(meta_info.get("routed_experts_start_len", 0) or 0)
            if start < 0:
                raise ValueError(f"SGLang routed_experts_start_len must be non-negative, got {start}.")
            rows = max(0, len(self.tokens) - 1 - start)
            if experts.numel() != rows * args.num_layers * args.moe_router_topk:
                raise ValueError(
                    "SGLang routed_experts element count does not match sample tokens: "
                    f"got={experts.numel()}, expected={rows * args.num_layers * args.moe_router_topk}"
                )
            experts = experts.reshape(rows, args.num_layers, args.moe_router_topk)
            if start == 0:
                self.rollout_routed_experts = experts
            else:
                held = self.rollout_routed_experts
                if held is None:
                    raise ValueError("Cannot append partial routed experts without existing routed experts.")
                held = held if torch.is_tensor(held) else torch.as_tensor(held, dtype=experts.dtype)
                if held.shape[0] < start:
                    raise ValueError("Existing routed experts shorter than routed_experts_start_len.")
                self.rollout_routed_experts = torch.cat([held[:start], experts], dim=0)

        if not update_terminal_info or "finish_reason" not in meta_info:
            return
        if getattr(args, "sglang_speculative_algorithm", False):
            self.spec_info.add(meta_info)
        self.prefix_cache_info.add(meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        # A None finish_reason raises TypeError here, as in slime; unknown types keep the status.
        kind = meta_info["finish_reason"]["type"]
        status = {"stop": Sample.Status.COMPLETED, "length": Sample.Status.TRUNCATED, "abort": Sample.Status.ABORTED}
        if kind in status:
            self.status = status[kind]

    def _validate_response_metadata_lengths(self) -> None:
        if self.loss_mask is not None and len(self.loss_mask) != self.response_length:
            raise ValueError(f"loss_mask length {len(self.loss_mask)} != response_length {self.response_length}")
        if self.rollout_log_probs is not None and len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"rollout_log_probs length {len(self.rollout_log_probs)} != response_length {self.response_length}"
            )
        ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
        if ids is None and offsets is None:
            return
        if ids is None or offsets is None:
            raise ValueError("rollout top-p replay must include both token ids and offsets.")
        offsets = _flat_int32(offsets, [0])
        if offsets.numel() != self.response_length + 1:
            raise ValueError(
                "rollout_top_p_token_offsets length must equal response_length + 1: "
                f"len(offsets)={offsets.numel()}, response_length={self.response_length}."
            )
        if int(offsets[-1]) != _flat_int32(ids, []).numel():
            raise ValueError("rollout top-p token ids/offsets mismatch.")
