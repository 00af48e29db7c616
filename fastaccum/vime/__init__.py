"""vime adapter: a streaming generate function and the request-level abort lifecycle for
vllm-project/vime (slime's port to vLLM).

Enable it with vime's own flags (docs/vime.md)::

    --custom-generate-function-path fastaccum.vime.generate
    --rollout-function-path fastaccum.vime.generate_rollout      # request-level abort, idle servers

``generate`` streams one vLLM ``/inference/v1/generate`` request per call through
``fastaccum.Client(dialect="vllm")`` and commits onto vime's ``Sample`` once: at the finishing
chunk (a finish, or an abort chunk), or with the observed prefix. A rollout abort drains each
request by id on vLLM 0.32 and later (the abort chunk keeps routed experts) and cuts it on older
servers; a request the server aborts by itself comes back ABORTED with its prefix, unscored.
Every other cancellation propagates and every stream error raises with nothing committed.

Which vime line is loaded is probed, never assumed (docs/vime.md, "vime lines"): request-level
cancel (vime's own ``abort()`` cancels each call's task; ``generate`` commits before the cancel
leaves), or a server-wide abort (``abort_inflight_requests``, or ``pause?mode=abort`` then
``resume``), for which ``generate_rollout`` swaps vime's ``abort`` for ``request_abort``; an
unknown line raises ``VimeLineError`` at import when vime is loaded.

The rollout skeleton is fastaccum._rollout's. Here, by job: ``_settings`` (the cancel-endpoint
key), ``_pools`` (vime's record: workers, ``/load``, the line's server-wide abort, the cancel
endpoint), ``_generate`` (vLLM's request body), ``_commit`` (results onto the ``Sample``, either
way a line takes them), ``_abort`` (the rollout function and ``request_abort``), ``_modules`` (the
lazy vime import and the probe: the only place fastaccum imports vime).
"""

import sys

from fastaccum.vime._abort import generate_rollout, log_rollout_data, request_abort, with_request_abort
from fastaccum.vime._generate import generate
from fastaccum.vime._modules import VimeLineError, modules
from fastaccum.vime._pools import POOLS

__all__ = (
    "generate",
    "generate_rollout",
    "request_abort",
    "close_session",
    "with_request_abort",
    "log_rollout_data",
    "VimeLineError",
)

close_session = POOLS.close_session  # this loop's connections (tests, and custom loops that end)

if "vime.rollout.vllm_rollout" in sys.modules:
    # Imported by vime's load_function: vime is loaded already, so a line fastaccum does not know
    # fails here, at import of the generate function, never mid-rollout.
    modules()
