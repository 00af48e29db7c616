"""Stand-in for slime.utils.misc: ``load_function``,
``SingletonMeta`` and ``decode_int32_meta_array``. Our own code; no slime code."""

from __future__ import annotations

import functools
import importlib
from typing import Any

import torch


@functools.cache
def load_function(path: str) -> Any:
    """Resolve ``package.module.name`` to the object itself (function attributes stay readable).

    Cached per path, as in slime; tests clear the cache with ``load_function.cache_clear()``.
    """
    module_path, _, attribute = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attribute)


class SingletonMeta(type):
    """The first construction wins; later ``Cls(...)`` calls hand back that object unchanged.

    Instances live in ``SingletonMeta._instances`` (keyed by class), which tests pre-seed or clear.
    """

    _instances: dict[type, Any] = {}

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        registry = SingletonMeta._instances
        existing = registry.get(cls)
        if existing is None:
            existing = registry[cls] = super().__call__(*args, **kwargs)
        return existing


# ---- int32 arrays in SGLang meta_info -----------------------------------------------------------
def _from_base64(encoded: str) -> torch.Tensor:
    import pybase64  # lazy, like slime: it is not among slime's declared requirements

    return _from_raw_bytes(pybase64.b64decode(encoded.encode()))


def _from_raw_bytes(raw: bytes | bytearray | memoryview) -> torch.Tensor:
    owned = bytearray(raw)  # a private, writable copy: the caller's buffer is never aliased
    return torch.frombuffer(owned, dtype=torch.int32)  # (torch rejects an empty buffer)


def _from_array_like(values: Any) -> torch.Tensor:
    if torch.is_tensor(values):
        return values.detach().to(device="cpu", dtype=torch.int32).flatten()
    flags = getattr(values, "flags", None)
    if flags is not None and not flags.writeable:
        values = values.copy()  # torch will not wrap read-only numpy memory
    return torch.as_tensor(values, dtype=torch.int32).flatten()


def decode_int32_meta_array(meta_info: dict[str, Any], keys: Any) -> torch.Tensor | None:
    """Flat int32 tensor for the first of ``keys`` (a name or a sequence of names) in ``meta_info``.

    Accepted values: base64 text, raw bytes-likes (copied), tensors, and anything
    ``torch.as_tensor`` takes. A missing key, or one holding None, gives None.
    """
    candidates = [keys] if isinstance(keys, str) else list(keys)
    for name in candidates:
        if name in meta_info:
            value = meta_info[name]
            break
    else:
        return None
    if value is None:
        return None
    if isinstance(value, str):
        return _from_base64(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _from_raw_bytes(value)
    return _from_array_like(value)
