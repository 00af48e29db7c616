"""Miles' modules, imported on first use: the only place fastaccum imports Miles."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

from fastaccum._rollout.framework import import_framework

HOME = "radixark/miles"  # where Miles comes from: its checkout, never PyPI

__all__ = ("modules", "legacy_modules", "forget", "HOME")

# The rollout module whose ``abort`` a rollout looks up at call time, per rollout path: Miles'
# rollout class (the default) and its v1 rollout function (MILES_USE_LEGACY_ROLLOUT_V1=1).
CLASS_ROLLOUT = "inference_rollout.inference_rollout_train"
LEGACY_ROLLOUT = "sglang_rollout"

_loaded: dict[str, SimpleNamespace] = {}


def _load(rollout: str) -> SimpleNamespace:
    """Miles' utilities, ``Sample`` and ``rollout`` (the module swapped), plus what every path
    uses: ``common`` (``GenerateState``, ``InferenceRolloutFn``), ``train`` (``get_worker_urls``),
    ``endpoint`` (the payload, prompt ids and routing headers Miles' single-turn generate builds)
    and ``base_types`` (``GenerateFnOutput``).

    Miles is never a dependency of fastaccum (it installs from its checkout), and
    ``import fastaccum.miles`` must stay cheap: Miles' rollout manager imports the rollout
    function at start-up. Only the rollout's modules are touched, never SGLang's engine or the
    training backends.
    """
    found = _loaded.get(rollout)
    if found is None:
        base = import_framework("miles", rollout, HOME)
        # Miles is importable (import_framework said why not otherwise): a module missing below is
        # a dependency of Miles', and says so itself.
        extra = {
            name: importlib.import_module(f"miles.rollout.{path}")
            for name, path in (
                ("common", "inference_rollout.inference_rollout_common"),
                ("train", CLASS_ROLLOUT),
                ("endpoint", "generate_utils.generate_endpoint_utils"),
                ("base_types", "base_types"),
            )
        }
        found = _loaded[rollout] = SimpleNamespace(**vars(base), **extra)
    return found


def modules() -> SimpleNamespace:
    """Miles as its rollout class runs it: ``rollout`` is ``inference_rollout_train``, whose
    ``generate_rollout_async`` calls its module-level ``abort(state, pendings, rollout_id)``."""
    return _load(CLASS_ROLLOUT)


def legacy_modules() -> SimpleNamespace:
    """Miles as its v1 rollout function runs it: ``rollout`` is ``sglang_rollout``, slime's shape
    (a ``GenerateState`` singleton holding the pending groups, ``abort(args, rollout_id)``)."""
    return _load(LEGACY_ROLLOUT)


def forget() -> None:
    """Import Miles afresh on the next use (tests that swap Miles trees)."""
    _loaded.clear()
