"""Import-only stand-in for ``sgl_kernel`` (sglang-kernel has no CPU build on PyPI).

SGLang 0.5.23 with SGLANG_USE_CPU_ENGINE=1 imports the CPU kernels below at module load
(``if _is_cpu: from sgl_kernel import ...``): exactly these eight, found by recording every
attribute a running server asked this package for. Plain greedy decoding on the torch_native
attention backend never calls them: they serve speculative decoding (EAGLE / tree verify /
draft cache locations) and KV-cache copies that only speculative decoding enables.
Each name is a function that raises if it is ever called, so a path that does need a real
kernel fails loudly instead of computing something wrong.

Deliberately not provided: ``torch.ops.sgl_kernel.*`` (SGLang's Intel AMX backend checks
``hasattr(torch.ops.sgl_kernel, "convert_weight_packed")``; absent, it stays on the torch
native backend) and any submodule (``sgl_kernel.scalar_type``, ``sgl_kernel.kvcacheio``...:
SGLang catches the ImportError and falls back, as it does with no sgl_kernel at all).
"""

from __future__ import annotations

__version__ = "0.0.0+fastaccum.stub"

_NAMES = (
    # mem_cache/allocation.py: assign_req_to_token_pool_func (called by alloc_for_spec_decode)
    "assign_req_to_token_pool_cpu",
    # kernels/ops/kvcache/cache_move.py: KV copy (enable_kv_cache_copy, speculative decoding)
    "copy_all_layer_kv_cache_cpu",
    # kernels/ops/speculative/eagle.py
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    # kernels/ops/speculative/cache_locs.py
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    # kernels/ops/speculative/spec_tree.py
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
)
# Not listed: rotate_input_ids_cpu (kernels/ops/speculative/multi_layer_eagle.py), which is
# imported only when multi-layer EAGLE is in use; a plain server never loads that module.


def _missing(name: str):
    def kernel(*args: object, **kwargs: object) -> None:
        raise NotImplementedError(
            f"sgl_kernel.{name} is an import stand-in (no CPU sglang-kernel installed); "
            "it is only needed by speculative decoding"
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


for _name in _NAMES:
    globals()[_name] = _missing(_name)

__all__ = list(_NAMES)
del _name
