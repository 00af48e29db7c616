"""Double of slime.utils.misc: function loading, singletons, int32 meta arrays."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch


@functools.cache
def load_function(path: str) -> Any:
    """``pkg.module.attr`` -> the attribute itself (so function attributes stay visible); cached."""
    module_name, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


class SingletonMeta(type):
    """One instance per class, created by the first call; later calls ignore their arguments."""

    _instances: dict[type, Any] = {}

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls not in SingletonMeta._instances:
            SingletonMeta._instances[cls] = super().__call__(*args, **kwargs)
        return SingletonMeta._instances[cls]


def decode_int32_meta_array(meta_info: dict[str, Any], keys: Any) -> torch.Tensor | None:
    """The first present key's value as a flat int32 tensor; base64 str, bytes, tensor or array."""
    names = (keys,) if isinstance(keys, str) else tuple(keys)
    key = next((k for k in names if k in meta_info), None)
    if key is None or meta_info[key] is None:
        return None
    value = meta_info[key]
    if isinstance(value, str):
        import pybase64  # slime imports it lazily too (it is not in slime's requirements)

        value = pybase64.b64decode(value.encode("ascii"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return torch.frombuffer(bytearray(value), dtype=torch.int32)
    if torch.is_tensor(value):
        return value.detach().cpu().to(torch.int32).reshape(-1)
    if getattr(getattr(value, "flags", None), "writeable", True) is False:
        value = value.copy()  # torch refuses read-only numpy memory
    return torch.as_tensor(value, dtype=torch.int32).reshape(-1)
