"""Start-up fix for SGLang 0.5.23 on a CPU-only torch, loaded by Python from PYTHONPATH.

``--enable-return-routed-experts`` allocates its host buffer (``BaseHostCache``) through
``sglang.srt.mem_cache.pool_host.common.ALLOC_MEMORY_FUNCS[device]`` with ``pin_memory=True``.
The default entry (``alloc_with_host_register``) then calls cudaHostRegister, which a CPU torch
cannot do ("Torch not compiled with CUDA enabled"). Pinning is meaningless when the "device" is
the CPU itself, so this registers an allocator for the "cpu" key that calls SGLang's own
``alloc_with_host_register`` with ``pin_memory=False``: same allocator (mmap-backed
``HostTensorAllocator``), same dims and dtype, no host registration.

The registration happens right after that module is first imported (in whichever process
imports it: the scheduler), through a meta-path hook, so nothing is imported early and
processes that never import SGLang's memory pools are untouched. No SGLang file is changed.
"""

from __future__ import annotations

import importlib.abc
import sys

_TARGET = "sglang.srt.mem_cache.pool_host.common"


def _register_cpu_allocator(module) -> None:  # noqa: ANN001
    register_host = module.alloc_with_host_register

    def alloc_cpu_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):  # noqa: ANN001, ANN202
        return register_host(
            dims,
            dtype=dtype,
            device=device,
            pin_memory=False,
            allocator=allocator,
            registration_granularity_bytes=registration_granularity_bytes,
        )

    module.ALLOC_MEMORY_FUNCS["cpu"] = alloc_cpu_unpinned


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: asks the other finders for the target's spec and wraps its loader."""

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001, ANN201
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # one module, once
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        original_exec = loader.exec_module

        def exec_module(module):  # noqa: ANN001, ANN202
            original_exec(module)
            _register_cpu_allocator(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _AfterImport())
