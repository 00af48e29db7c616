"""Stand-in for miles.utils.types.Sample, written from Miles' behaviour (docs/miles.md).

The field names, ``Status`` and the nested counters are Miles' API (they must match); the code is
our own: a call's answer is written onto the sample directly by the generate function, then
``update_from_meta_info`` adds the counters, the weight version and the status.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

# finish_reason["type"] -> Status member; any other type leaves the status as it was.
_STATUS_OF_FINISH = {"length": "TRUNCATED", "abort": "ABORTED", "stop": "COMPLETED"}


def _counted(target: Any, meta_info: dict, pairs: tuple[tuple[str, str], ...]) -> None:
    for attribute, key in pairs:
        setattr(target, attribute, getattr(target, attribute) + meta_info.get(key, 0))


@dataclass
class Sample:
    group_index: int | None = None
    index: int | None = None
    rollout_id: int | None = None
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
    rollout_routed_experts: Any = None  # numpy int32, (len(tokens) - 1, layers, top-k)
    rollout_indexer_topk: Any = None  # numpy int32, (len(tokens) - 1, indexer layers, index top-k)
    remove_sample: bool = False

    class Status(Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    status: Status = Status.PENDING
    metadata: dict = field(default_factory=dict)
    generate_function_path: str | None = None
    train_metadata: dict | None = None
    adapter: Any = None
    reward_spec: Any = None
    routing_key: str | None = None  # sent as X-SMG-Routing-Key under the routing-key policies
    non_generation_time: float = 0.0

    @dataclass
    class SpecInfo:
        spec_accept_token_num: int = 0
        spec_draft_token_num: int = 0
        spec_verify_ct: int = 0
        completion_token_num: int = 0

        def add(self, meta_info: dict) -> None:
            _counted(
                self,
                meta_info,
                (
                    ("spec_accept_token_num", "spec_accept_token_num"),
                    ("spec_draft_token_num", "spec_draft_token_num"),
                    ("spec_verify_ct", "spec_verify_ct"),
                    ("completion_token_num", "completion_tokens"),
                ),
            )

    @dataclass
    class PrefixCacheInfo:
        cached_tokens: int = 0
        total_prompt_tokens: int = 0

        def add(self, meta_info: dict) -> None:
            _counted(self, meta_info, (("cached_tokens", "cached_tokens"), ("total_prompt_tokens", "prompt_tokens")))

    spec_info: SpecInfo = field(default_factory=SpecInfo)
    prefix_cache_info: PrefixCacheInfo = field(default_factory=PrefixCacheInfo)

    def update_from_meta_info(self, args: Any, meta_info: dict) -> None:
        """One call's terminal bookkeeping: speculative counts (only with a speculative algorithm),
        prefix-cache counts, one weight version when the answer has one, and the status from the
        finish type (a ``finish_reason`` of None is a TypeError, as in Miles)."""
        if args.sglang_speculative_algorithm:
            self.spec_info.add(meta_info)
        self.prefix_cache_info.add(meta_info)
        if "weight_version" in meta_info:
            self.weight_versions.append(meta_info["weight_version"])
        member = _STATUS_OF_FINISH.get(meta_info["finish_reason"]["type"])
        if member is not None:
            self.status = Sample.Status[member]

    def validate(self) -> None:
        """The per-token fields line up with the response and the replay arrays with the sequence
        (Miles checks this before training)."""
        n = self.response_length
        assert n >= 0 and len(self.tokens) >= n, (n, len(self.tokens))
        for name in ("loss_mask", "rollout_log_probs"):
            values = getattr(self, name)
            assert values is None or len(values) == n, f"{name} has {len(values)} entries, response_length {n}"
        for name in ("rollout_routed_experts", "rollout_indexer_topk"):
            rows = getattr(self, name)
            assert rows is None or len(rows) == len(self.tokens) - 1, f"{name} has {len(rows)} rows"
