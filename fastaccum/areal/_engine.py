"""``StreamingSGLangEngine``: AReaL's ``RemoteSGLangEngine`` whose inner engine streams, built on
first use as subclasses of AReaL's own classes (AReaL is imported only then).

Every method is AReaL's. Two things differ:

- the inner ``RemoteInfEngine``, which AReaL's ``WorkflowExecutor`` hands to every workflow, is a
  ``StreamingInfEngine``: its ``agenerate`` is fastaccum's loop, so workflows stream too (an
  engine that overrode only the wrapper's ``agenerate`` would not stream inside them);
- its backend tells SGLang AReaL's version with every full weight update (``weight_version``,
  which SGLang's update endpoints take and AReaL leaves out), so that the stream labels each
  token with the version that computed it. LoRA updates load an adapter per version, named in
  each request, so they need no label: a segment's pinned version is then the truth.
"""

from __future__ import annotations

from typing import Any

from fastaccum.areal._generate import generate
from fastaccum.areal._modules import modules

__all__ = ("engine_class", "CLASSES")

CLASSES = ("StreamingSGLangEngine", "StreamingInfEngine", "StreamingSGLangBackend")
# The full-weight updates whose requests carry the version (SGLang: UpdateWeightFromDiskReqInput,
# UpdateWeightsFromDistributedReqInput, both with weight_version).
_VERSIONED_ENDPOINTS = ("/update_weights_from_disk", "/update_weights_from_distributed")

_built: dict[str, type] = {}


def _with_version(requests: Any, meta: Any) -> Any:
    if getattr(meta, "version", None) is None or getattr(meta, "use_lora", False):
        return requests
    for request in requests.requests:
        if request.endpoint in _VERSIONED_ENDPOINTS:
            request.payload = {**request.payload, "weight_version": str(meta.version)}
    return requests


def _build() -> dict[str, type]:
    areal = modules()

    class StreamingSGLangBackend(areal.SGLangBackend):  # type: ignore[misc, name-defined]
        """AReaL's SGLang backend, whose full weight updates name the version they load."""

        def build_disk_weight_update_requests(self, meta: Any) -> Any:
            return _with_version(super().build_disk_weight_update_requests(meta), meta)

        def build_distributed_weight_update_requests(self, meta: Any, param_specs: Any) -> Any:
            return _with_version(super().build_distributed_weight_update_requests(meta, param_specs), meta)

    class StreamingInfEngine(areal.RemoteInfEngine):  # type: ignore[misc, name-defined]
        """AReaL's ``RemoteInfEngine`` whose ``agenerate`` streams through fastaccum."""

        async def agenerate(self, req: Any) -> Any:
            return await generate(self, req)

    class StreamingSGLangEngine(areal.RemoteSGLangEngine):  # type: ignore[misc, name-defined]
        """A drop-in for AReaL's ``RemoteSGLangEngine`` (same constructor, ``from_pretrained``,
        ``initialize`` and every other method, AReaL's own), whose generations stream through
        fastaccum: docs/areal.md."""

        def __init__(self, config: Any) -> None:
            super().__init__(config)
            self._engine = StreamingInfEngine(config, StreamingSGLangBackend())

    classes: dict[str, type] = {
        "StreamingSGLangEngine": StreamingSGLangEngine,
        "StreamingInfEngine": StreamingInfEngine,
        "StreamingSGLangBackend": StreamingSGLangBackend,
    }
    for name, cls in classes.items():
        # Importable by this name: AReaL's controllers start engines from "module.Class".
        cls.__module__, cls.__qualname__ = "fastaccum.areal", name
    return classes


def engine_class(name: str) -> type:
    """One of ``CLASSES``, built (and AReaL imported) on first use."""
    if not _built:
        _built.update(_build())
    return _built[name]


def forget() -> None:
    """Build the classes afresh on the next use (tests that swap AReaL checkouts)."""
    _built.clear()
