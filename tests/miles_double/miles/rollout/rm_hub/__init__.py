"""Stand-in for miles.rollout.rm_hub: a sample's reward through ``--custom-rm-path`` (the only
kind the double models)."""

from __future__ import annotations

from typing import Any

from miles.utils.misc import load_function


async def async_rm(args: Any, sample: Any, **kwargs: Any) -> Any:
    if args.custom_rm_path is None:
        raise NotImplementedError("the Miles double scores only through --custom-rm-path")
    return await load_function(args.custom_rm_path)(args, sample, **kwargs)


async def batched_async_rm(args: Any, samples: list, inplace_set_reward_field: bool = False, **kwargs: Any) -> Any:
    raise NotImplementedError("group reward models are not part of the Miles double")
