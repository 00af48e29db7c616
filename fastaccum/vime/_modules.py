"""vime's modules, imported on first use: the only place fastaccum imports vime."""

from __future__ import annotations

from types import SimpleNamespace

__all__ = ("modules", "forget")

_loaded: SimpleNamespace | None = None


def modules() -> SimpleNamespace:
    """vime's rollout, server-control, utility modules and ``Sample``.

    vime is never a dependency of fastaccum (it installs from source), and ``import fastaccum.vime``
    must stay cheap: vime's rollout manager imports the rollout function at start-up. Only the
    rollout's own modules are touched, never the vLLM engine or training backends.
    """
    global _loaded
    if _loaded is None:
        from vime.backends.vllm_utils import server_control
        from vime.rollout import vllm_rollout
        from vime.utils import async_utils, http_utils, misc
        from vime.utils.types import Sample

        _loaded = SimpleNamespace(
            rollout=vllm_rollout,
            server_control=server_control,
            http_utils=http_utils,
            async_utils=async_utils,
            misc=misc,
            Sample=Sample,
        )
    return _loaded


def forget() -> None:
    """Import vime afresh on the next use (tests that swap vime trees)."""
    global _loaded
    _loaded = None
