"""vime's modules, imported on first use and probed: the only place fastaccum imports vime.

vime changes its rollout loop every few weeks, so what the loaded vime offers is found here,
never assumed (docs/vime.md, "vime lines"): how its ``Sample`` takes a call's tokens, which
server-control helpers exist, and how a worker's running requests are ended server-wide. A vime
that offers no way the adapter knows fails here, before anything is sent, naming what is missing.
"""

from __future__ import annotations

import importlib
from types import ModuleType, SimpleNamespace

from fastaccum._rollout.framework import import_framework

__all__ = ("modules", "forget", "VimeLineError")

_loaded: SimpleNamespace | None = None


class VimeLineError(ImportError):
    """The loaded vime lacks what every way fastaccum.vime knows of driving it needs."""


def _optional(name: str) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            return None  # the module itself is absent (a line without it), not one of its imports
        raise


def modules() -> SimpleNamespace:
    """vime's rollout and utility modules, ``Sample``, and what this vime line offers.

    vime is never a dependency of fastaccum (it installs from source), and ``import fastaccum.vime``
    must stay cheap: vime's rollout manager imports the rollout function at start-up. Only the
    rollout's own modules are touched, never the vLLM engine or training backends.
    """
    global _loaded
    if _loaded is None:
        server_control = _optional("vime.backends.vllm_utils.server_control")
        found = import_framework("vime", "vllm_rollout", "vllm-project/vime", server_control=server_control)
        offers = probe(found.rollout, server_control, found.http_utils, found.misc, found.Sample)
        _loaded = SimpleNamespace(**vars(found), **offers)
    return _loaded


def probe(
    rollout: ModuleType, server_control: ModuleType | None, http_utils: ModuleType, misc: ModuleType, sample: type
) -> dict[str, str]:
    """What this vime line offers: ``commit`` ("append": ``Sample.append_response_tokens``;
    "update": tokens written directly, then ``Sample.update_from_meta_info``), ``server_abort``
    ("until-idle": ``abort_servers_until_idle``; "inflight": ``abort_inflight_requests``, then
    fastaccum polls ``/load``; "pause": ``POST /pause?mode=abort`` then ``/resume``) and
    ``routed_start`` ("prompt-start": the line resumes with vLLM's
    ``routed_experts_prompt_start`` itself, its ``Sample`` counting the rows it holds; "": it asks
    for every row on each call, and so does the adapter)."""
    missing = [
        f"vime.rollout.vllm_rollout.{name}"
        for name in (
            "GenerateState",
            "generate_rollout",
            "abort",
            "_prepare_prompt_ids",
            "_build_inference_sampling_params",
        )
        if not hasattr(rollout, name)
    ]
    missing += [f"vime.utils.http_utils.{n}" for n in ("get", "get_rollout_num_engines") if not hasattr(http_utils, n)]
    if not hasattr(misc, "load_function"):
        missing.append("vime.utils.misc.load_function")
    if hasattr(sample, "append_response_tokens"):
        commit = "append"
    elif hasattr(sample, "update_from_meta_info"):
        commit = "update"
    else:
        commit = ""
        missing.append("Sample.append_response_tokens or Sample.update_from_meta_info (vime.utils.types)")
    if server_control is not None and hasattr(server_control, "abort_servers_until_idle"):
        server_abort = "until-idle"
    elif server_control is not None and hasattr(server_control, "abort_inflight_requests"):
        server_abort = "inflight"
    elif hasattr(rollout, "_resume_vllm_workers"):  # its abort() pauses the workers with mode=abort
        server_abort = "pause"
    else:
        server_abort = ""
        missing.append(
            "a server-wide abort (server_control.abort_servers_until_idle or abort_inflight_requests, "
            "or the pause?mode=abort rollout with _resume_vllm_workers)"
        )
    if missing:
        raise VimeLineError(f"fastaccum.vime does not know this vime line: it lacks {'; '.join(missing)}")
    routed_start = "prompt-start" if hasattr(sample, "get_rollout_routed_experts_length") else ""
    return {"commit": commit, "server_abort": server_abort, "routed_start": routed_start}


def forget() -> None:
    """Import vime afresh on the next use (tests that swap vime trees)."""
    global _loaded
    _loaded = None
