"""slime's modules, imported on first use: the only place fastaccum imports slime."""

from __future__ import annotations

from types import SimpleNamespace

from fastaccum._rollout.framework import framework_missing, import_framework

HOME = "THUDM/slime"  # where slime comes from: its checkout, never PyPI

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
        try:
            from slime.backends.sglang_utils import server_control
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.split(".")[0] != "slime":
                raise
            raise framework_missing("slime", HOME, exc) from exc
        _loaded = import_framework("slime", "sglang_rollout", HOME, server_control=server_control)
    return _loaded


def forget() -> None:
    """Import slime afresh on the next use (tests that swap slime checkouts)."""
    global _loaded
    _loaded = None
