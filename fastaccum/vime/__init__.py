"""vime adapter: a streaming generate function and the request-level abort lifecycle for
vllm-project/vime (slime's port to vLLM).

Enable it with vime's own flags (docs/vime.md)::

    --custom-generate-function-path fastaccum.vime.generate
    --rollout-function-path fastaccum.vime.generate_rollout      # request-level abort, idle servers

``generate`` streams one vLLM ``/inference/v1/generate`` request per call through
``fastaccum.Client(dialect="vllm")`` and commits onto vime's ``Sample`` once: at the finishing
chunk, or with the observed prefix when a rollout abort cut it. Every other cancellation
propagates and every stream error raises with nothing committed; a request the server ends
without a finish_reason (vLLM before 0.32) outside a rollout abort raises too.

vime comes in two lines, told apart by ``GenerateState`` (docs/vime.md, "Two vime lines"): with
``cancellable_tasks`` vime's own ``abort()`` cancels the task running each sample, and ``generate``
commits the prefix before the cancel leaves it; without, ``generate_rollout`` swaps vime's
module-level ``abort`` for ``request_abort``, which cuts fastaccum's streams one by one. On both,
``request_abort`` names the cut requests to a worker's cancel endpoint where it has one, and waits
until every worker's ``/load`` is idle.

The package, by job: ``_settings`` (vime's flags and the ``fastaccum_*`` keys), ``_pools`` (per
event loop: the streams to stop, the connection pools, opening a stream), ``_generate`` (the
generate function and its abort paths), ``_commit`` (results onto the ``Sample``), ``_abort`` (the
rollout function and ``request_abort``), ``_modules`` (the lazy vime import: the only place
fastaccum imports vime).
"""

import sys

from fastaccum.vime._abort import generate_rollout, request_abort
from fastaccum.vime._generate import generate
from fastaccum.vime._modules import VimeLineError, modules
from fastaccum.vime._pools import POOLS

__all__ = ("generate", "generate_rollout", "request_abort", "close_session", "VimeLineError")

close_session = POOLS.close_session  # this loop's connections (tests, and custom loops that end)

if "vime.rollout.vllm_rollout" in sys.modules:
    # Imported by vime's load_function: vime is loaded already, so a line fastaccum does not know
    # fails here, at import of the generate function, never mid-rollout.
    modules()
