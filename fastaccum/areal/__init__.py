"""AReaL adapter: ``StreamingSGLangEngine``, a drop-in for AReaL's ``RemoteSGLangEngine`` whose
generations stream through fastaccum, and ``agenerate``, the same loop for any AReaL engine.

AReaL's rollout client asks SGLang's ``/generate`` without streaming and, after an interruption,
asks again with the output appended. Streamed and joined by fastaccum's resume contract, a
sample's routed experts hold each position's row once, each token carries the weight version
that computed it, and the response's ``ttft`` and ``itl`` are measured (docs/areal.md).

By job: ``_modules`` (the lazy AReaL import: the only place fastaccum imports AReaL), ``_pools``
(AReaL's record for the skeleton: servers, settings from its config, per-loop pools),
``_generate`` (the loop), ``_response`` (versions and latencies), ``_engine`` (the classes, built
on AReaL's own on first use).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastaccum.areal import _generate, _modules, _pools

__all__ = ("StreamingSGLangEngine", "StreamingInfEngine", "agenerate", "close_session")

if TYPE_CHECKING:
    StreamingSGLangEngine: Any
    StreamingInfEngine: Any


def __getattr__(name: str) -> Any:
    # The engine classes subclass AReaL's own, so AReaL is imported only when one is asked for.
    if name in ("StreamingSGLangEngine", "StreamingInfEngine", "StreamingSGLangBackend"):
        from fastaccum.areal._engine import engine_class

        return engine_class(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _inner(engine: Any) -> Any:
    areal = _modules.modules()
    if isinstance(engine, areal.RemoteSGLangEngine):
        return engine._engine
    if isinstance(engine, areal.RemoteInfEngine):
        return engine
    raise TypeError(
        f"agenerate needs AReaL's RemoteSGLangEngine or the RemoteInfEngine a workflow is handed, "
        f"not {type(engine).__name__}"
    )


async def agenerate(engine: Any, req: Any) -> Any:
    """AReaL's ``agenerate`` for ``req`` (a ``ModelRequest``) on ``engine``, streamed through
    fastaccum: for a workflow that wants it without swapping the engine. ``engine``: AReaL's
    ``RemoteSGLangEngine`` or the inner engine a workflow is handed; returns a ``ModelResponse``.
    Versions are each token's own only where the server knows AReaL's versions: weight updates
    through ``StreamingSGLangEngine`` tell it (docs/areal.md, "Weight versions")."""
    return await _generate.generate(_inner(engine), req)


async def close_session(engine: Any) -> None:
    """Close this event loop's connections of ``engine`` (AReaL's workflow threads close theirs
    with their loop; tests and loops of your own call this)."""
    await _pools.pools_of(_inner(engine)).close()
