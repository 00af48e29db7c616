"""Double of vime.utils.misc: load_function (cached), SingletonMeta, decode_int32_meta_array."""

import importlib
from functools import cache

import torch


def decode_int32_meta_array(meta_info, keys):
    if isinstance(keys, str):
        keys = (keys,)
    for key in keys:
        if key in meta_info:
            value = meta_info[key]
            break
    else:
        return None
    if value is None:
        return None
    if torch.is_tensor(value):
        return value.detach().to(dtype=torch.int32).reshape(-1)
    if hasattr(value, "flags") and not value.flags.writeable:
        value = value.copy()
    return torch.as_tensor(value, dtype=torch.int32).reshape(-1)


@cache
def load_function(path):
    module_path, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module_path), attr)


class SingletonMeta(type):
    _instances = {}

    def __call__(cls, *args, **kwargs):
        if cls not in cls._instances:
            cls._instances[cls] = super().__call__(*args, **kwargs)
        return cls._instances[cls]

    def clear_instances(cls):
        cls._instances = {}
