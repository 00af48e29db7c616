"""slime's modules, imported on first use: the only place fastaccum imports slime."""

from __future__ import annotations

from types import SimpleNamespace

__all__ = ("modules", "forget")

_loaded: SimpleNamespace | None = None


def modules() -> SimpleNamespace:
    """slime's rollout, server-control, utility modules and ``Sample``.

    slime is never a dependency of fastaccum (it installs only from source; the PyPI name ``slime``
    is an unrelated project), and ``import fastaccum.slime`` must stay cheap: slime's rollout
    manager imports the rollout function at start-up. Only these light modules are touched; never
    ``slime.utils.arguments`` or the SGLang engine modules, which pull in SGLang and Megatron.
    """
    global _loaded
    if _loaded is None:
        # slime ships no stubs and is not installed where fastaccum is type-checked.
        from slime.backends.sglang_utils import server_control
        from slime.rollout import sglang_rollout
        from slime.utils import async_utils, http_utils, misc
        from slime.utils.types import Sample

        _loaded = SimpleNamespace(
            rollout=sglang_rollout,
            server_control=server_control,
            http_utils=http_utils,
            async_utils=async_utils,
            misc=misc,
            Sample=Sample,
        )
    return _loaded


def forget() -> None:
    """Import slime afresh on the next use (tests that swap slime checkouts)."""
    global _loaded
    _loaded = None
