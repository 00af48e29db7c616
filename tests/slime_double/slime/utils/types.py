"""Stand-in for slime.utils.types.Sample, written from slime's behaviour (docs/slime.md).

Fields and ``Status`` are slime's API surface (names must match); everything else — how a
response segment is checked, appended and reconciled with SGLang's meta_info — is our own code
reproducing the documented rules: the same validations, error cases and status mapping.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from slime.utils.misc import decode_int32_meta_array

# meta_info keys for top-p replay: the patched server may use either spelling.
TOP_P_ID_KEYS = ("top_p_token_ids", "top_p_kept_token_ids")
TOP_P_OFFSET_KEYS = ("top_p_token_offsets", "top_p_kept_token_offsets")

_ABSENT = object()

# finish_reason["type"] -> Status member name; any other type leaves the status alone.
FINISH_TO_STATUS = {"stop": "COMPLETED", "length": "TRUNCATED", "abort": "ABORTED"}

# (attribute, meta_info key) pairs summed into the terminal counters.
SPEC_COUNTERS = (
    ("spec_accept_token_num", "spec_accept_token_num"),
    ("spec_draft_token_num", "spec_draft_token_num"),
    ("spec_verify_ct", "spec_verify_ct"),
    ("completion_token_num", "completion_tokens"),
)
PREFIX_CACHE_COUNTERS = (
    ("cached_tokens", "cached_tokens"),
    ("total_prompt_tokens", "prompt_tokens"),
)


# ---- small conversions --------------------------------------------------------------------------
def _as_python_list(values: Any, cast: Callable[[Any], Any]) -> list | None:
    """Tensors are flattened and converted; any other iterable goes element by element."""
    if values is None:
        return None
    if torch.is_tensor(values):
        values = values.detach().cpu().flatten().tolist()
    return [cast(v) for v in values]


def _int32_flat(value: Any, when_missing: list[int]) -> torch.Tensor:
    source = when_missing if value is None else value
    return torch.as_tensor(source, dtype=torch.int32).flatten()


def _sum_into(target: Any, meta_info: dict, counters: tuple[tuple[str, str], ...]) -> None:
    for attribute, key in counters:
        setattr(target, attribute, getattr(target, attribute) + meta_info.get(key, 0))


def _checked_segment(tokens: Any, log_probs: Any, trainable: bool) -> tuple[list[int], list[float] | None]:
    """Normalise one segment and enforce the pairing rules between tokens and log-probs."""
    ids = _as_python_list(tokens, int) or []
    lps = _as_python_list(log_probs, float)
    if lps is not None and len(lps) != len(ids):
        raise ValueError(f"log_probs length ({len(lps)}) differs from tokens length ({len(ids)})")
    if not ids:
        return ids, lps
    if trainable:
        if lps is None:
            raise ValueError(
                f"{len(ids)} trainable tokens given without log_probs: they require rollout log probabilities"
            )
        return ids, lps
    if lps is not None:
        raise ValueError("log_probs were given for non-trainable response tokens; pass none for them")
    return ids, [0.0] * len(ids)  # non-trainable positions carry a 0.0 log-prob


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
        FAILED = "failed"  # exists in slime, handled nowhere

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

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    # ---- public: one response segment ------------------------------------------------------------
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
        """Add one response segment and keep every per-token array aligned with it."""
        ids, lps = _checked_segment(tokens, log_probs, trainable)
        self._grow(ids, lps, trainable, text)
        filler_rows = bool(ids) and not trainable
        if meta_info is not None or filler_rows:
            self._apply_meta_info(
                args,
                meta_info if meta_info is not None else {},
                added=len(ids),
                pad_top_p=filler_rows,
                terminal=update_terminal_info,
            )
        self._check_alignment()

    # ---- internals ---------------------------------------------------------------------------------
    def _grow(self, ids: list[int], lps: list[float] | None, trainable: bool, text: str | None) -> None:
        # slime's order: text, tokens and length, then the lazily created arrays.
        earlier = self.response_length
        if text is not None:
            self.response = self.response + text
        if ids:
            self.tokens.extend(ids)
            self.response_length = earlier + len(ids)
            if self.loss_mask is None:  # no mask so far means every earlier token was trainable
                self.loss_mask = [1] * earlier
            self.loss_mask.extend([1 if trainable else 0] * len(ids))
        if lps is None:
            return
        held_lps = self.rollout_log_probs
        if held_lps is None:
            # Trainable log-probs cannot be lined up with earlier response tokens whose
            # log-probs were never recorded.
            if trainable and earlier > 0:
                raise ValueError(
                    f"Cannot append trainable rollout log probabilities: the sample has {earlier} "
                    "response tokens and no rollout_log_probs."
                )
            held_lps = self.rollout_log_probs = [0.0] * earlier
        held_lps.extend(lps)

    def _apply_meta_info(
        self,
        args: Any,
        meta_info: dict,
        *,
        added: int = 0,
        pad_top_p: bool = False,
        terminal: bool = True,
    ) -> None:
        merged = added > 0 and self._merge_top_p(meta_info, added)
        if pad_top_p and added > 0 and not merged and self.rollout_top_p_token_offsets is not None:
            self._pad_top_p(added)
        self._take_routed_experts(args, meta_info)
        if terminal and "finish_reason" in meta_info:
            self._record_terminal(args, meta_info)

    def _merge_top_p(self, meta_info: dict, added: int) -> bool:
        """Take the segment's top-p CSR, if any; True when one was taken."""
        ids = decode_int32_meta_array(meta_info, TOP_P_ID_KEYS)
        offsets = decode_int32_meta_array(meta_info, TOP_P_OFFSET_KEYS)
        if ids is None and offsets is None:
            return False
        if ids is None or offsets is None:
            raise ValueError("top-p replay meta_info needs token ids and offsets together")
        first = offsets[:1].tolist()
        if first != [0]:
            raise ValueError(f"top-p offsets must begin at 0 (got {first})")
        end, id_count = int(offsets[-1]), int(ids.numel())
        if end != id_count:
            raise ValueError(f"top-p offsets end at {end} but {id_count} token ids were sent")
        if offsets.numel() != added + 1:
            raise ValueError(
                f"top-p offsets must number the generated token count + 1: got {offsets.numel()} offsets "
                f"for {added} generated tokens"
            )
        if not self._holds_top_p():
            self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets = ids, offsets
            return True
        held_ids = _int32_flat(self.rollout_top_p_token_ids, [])
        held_offsets = _int32_flat(self.rollout_top_p_token_offsets, [0])
        shift = int(held_offsets[-1])
        self.rollout_top_p_token_ids = torch.cat((held_ids, ids))
        self.rollout_top_p_token_offsets = torch.cat((held_offsets, offsets[1:] + shift))
        return True

    def _holds_top_p(self) -> bool:
        return self.rollout_top_p_token_ids is not None or self.rollout_top_p_token_offsets is not None

    def _pad_top_p(self, added: int) -> None:
        # Non-trainable tokens get empty kept-sets so the CSR stays one row per response token.
        held_offsets = _int32_flat(self.rollout_top_p_token_offsets, [0])
        last = int(held_offsets[-1])
        self.rollout_top_p_token_ids = _int32_flat(self.rollout_top_p_token_ids, [])
        self.rollout_top_p_token_offsets = torch.cat((held_offsets, torch.full((added,), last, dtype=torch.int32)))

    def _take_routed_experts(self, args: Any, meta_info: dict) -> None:
        flat = decode_int32_meta_array(meta_info, "routed_experts")
        if flat is None:
            return
        if args is None:
            raise ValueError("routed experts in meta_info cannot be reshaped without args")
        start = int(meta_info.get("routed_experts_start_len", 0) or 0)
        if start < 0:
            raise ValueError(f"routed_experts_start_len cannot be negative ({start})")
        layers, topk = args.num_layers, args.moe_router_topk
        rows = max(len(self.tokens) - 1 - start, 0)
        if flat.numel() != rows * layers * topk:
            raise ValueError(
                f"routed_experts element count {flat.numel()} does not fit the sample: "
                f"{rows} rows x {layers} layers x {topk} experts"
            )
        fresh = flat.reshape(rows, layers, topk)
        if start == 0:  # a whole-sequence answer replaces whatever was held
            self.rollout_routed_experts = fresh
            return
        held = self.rollout_routed_experts
        if held is None:
            raise ValueError(f"routed_experts_start_len={start} but the sample holds no routed experts")
        if not torch.is_tensor(held):
            held = torch.as_tensor(held, dtype=fresh.dtype)
        if held.shape[0] < start:
            raise ValueError(f"the sample holds {held.shape[0]} routed-expert rows, fewer than start_len {start}")
        self.rollout_routed_experts = torch.cat((held[:start], fresh), dim=0)

    def _record_terminal(self, args: Any, meta_info: dict) -> None:
        speculative = getattr(args, "sglang_speculative_algorithm", None)
        if speculative:
            _sum_into(self.spec_info, meta_info, SPEC_COUNTERS)
        _sum_into(self.prefix_cache_info, meta_info, PREFIX_CACHE_COUNTERS)
        version = meta_info.get("weight_version", _ABSENT)
        if version is not _ABSENT:  # one entry per terminal commit
            self.weight_versions.append(version)
        # Subscripting a None finish_reason raises TypeError, as slime does.
        kind = meta_info["finish_reason"]["type"]
        member = FINISH_TO_STATUS.get(kind)
        if member is not None:
            self.status = Sample.Status[member]

    def _check_alignment(self) -> None:
        n = self.response_length
        for name in ("loss_mask", "rollout_log_probs"):
            values = getattr(self, name)
            if values is not None and len(values) != n:
                raise ValueError(f"{name} has {len(values)} entries for response_length {n}")
        ids, offsets = self.rollout_top_p_token_ids, self.rollout_top_p_token_offsets
        if ids is None and offsets is None:
            return
        if ids is None or offsets is None:
            raise ValueError("top-p replay data needs both rollout_top_p_token_ids and its offsets")
        offsets = _int32_flat(offsets, [0])
        if offsets.numel() != n + 1:
            raise ValueError(
                f"rollout_top_p_token_offsets has {offsets.numel()} entries; response_length + 1 = {n + 1} expected"
            )
        if int(offsets[-1]) != _int32_flat(ids, []).numel():
            raise ValueError("rollout_top_p_token_offsets does not end at the number of top-p token ids")
