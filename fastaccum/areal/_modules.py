"""AReaL's modules, imported on first use: the only place fastaccum imports AReaL."""

from __future__ import annotations

from types import SimpleNamespace

__all__ = ("modules", "forget", "HOME", "TESTED_COMMIT")

HOME = "areal-project/AReaL"
# The AReaL commit the adapter is tested inside (tests/test_areal_real.py; docs/areal.md).
TESTED_COMMIT = "cbff54d645d2cd8ee1f1c358a82f3f473588433d"

_loaded: SimpleNamespace | None = None


def modules() -> SimpleNamespace:
    """AReaL's SGLang engine, its backend, the engine they wrap and the types a generate call fills.

    AReaL is never a dependency of fastaccum: ``import fastaccum.areal`` stays cheap and works
    without it, and the names that need AReaL (``StreamingSGLangEngine``) load it when first used.
    Importing ``areal.engine.sglang_remote`` pulls in torch, aiohttp and AReaL's own utilities,
    which AReaL's environment has.
    """
    global _loaded
    if _loaded is None:
        try:
            from areal.api.io_struct import ModelResponse
            from areal.engine.sglang_remote import RemoteSGLangEngine, SGLangBackend
            from areal.infra.remote_inf_engine import RID_CACHE_SIZE, RemoteInfEngine
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] != "areal":
                raise  # AReaL is there; something it imports is not
            raise ImportError(
                f"fastaccum.areal runs inside AReaL ({HOME}), which is not importable here: {exc}. Run it in "
                f"AReaL's own environment, or put an AReaL checkout on PYTHONPATH (tested at commit "
                f"{TESTED_COMMIT[:8]}; docs/areal.md)",
                name=exc.name,
            ) from exc
        try:  # AReaL closes a workflow thread's HTTP clients when its event loop closes
            from areal.infra.utils.concurrent import register_loop_cleanup
        except ImportError:
            register_loop_cleanup = None
        _loaded = SimpleNamespace(
            RemoteSGLangEngine=RemoteSGLangEngine,
            SGLangBackend=SGLangBackend,
            RemoteInfEngine=RemoteInfEngine,
            ModelResponse=ModelResponse,
            RID_CACHE_SIZE=RID_CACHE_SIZE,
            register_loop_cleanup=register_loop_cleanup,
        )
    return _loaded


def forget() -> None:
    """Import AReaL afresh on the next use (tests that swap the double for a checkout)."""
    global _loaded
    _loaded = None
