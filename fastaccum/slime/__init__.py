"""slime adapter: a streaming generate function and the request-level abort lifecycle for THUDM/slime.

Enable it with slime's own flags (docs/slime.md)::

    --custom-generate-function-path fastaccum.slime.generate
    --rollout-function-path fastaccum.slime.generate_rollout      # request-level abort
    [--sglang-incremental-streaming-output]                       # must match the servers

``generate`` streams one ``/generate`` request per call through ``fastaccum.Client`` (or, with
``fastaccum_transport: aiohttp``, ``GenerateStream`` on an aiohttp session) and commits onto the
``Sample`` once: at the terminal event, or with the observed prefix when a rollout abort cut
it. Every other cancellation propagates and every stream error raises, with nothing committed, so a
rollout never trains on a silently cut sample.

slime comes in two lines, told apart by ``GenerateState`` (docs/slime.md, "Two slime lines"):

- **stock** (no request-level abort in slime): ``generate_rollout`` swaps slime's module-level
  ``abort`` for ``request_abort``, which cancels fastaccum's streams one by one (closing the
  connection is SGLang's abort signal), buffers only groups that kept a prefix, and waits until
  the servers are idle;
- **request-abort in slime** (``GenerateState.cancellable_tasks``): slime's own ``abort()`` cancels
  the task running each sample, so ``generate`` commits the observed prefix synchronously before
  the ``CancelledError`` leaves it; ``request_abort`` runs slime's abort, then waits until idle.

On both, calls that need the terminal chunk (top-p replay, ``fastaccum_abort_mode: server``) are
stopped by the server-wide abort instead, whose terminal chunk carries the full top-p rows.

The rollout skeleton is fastaccum._rollout's. Here, by job: ``_settings`` (slime's stream mode),
``_pools`` (slime's record: workers, ``/v1/loads``, the server-wide abort), ``_generate`` (the
payload), ``_commit`` (results onto the ``Sample``),
``_probe`` (the servers' stream mode), ``_abort`` (the rollout function and ``request_abort``),
``_modules`` (the lazy slime import: the only place fastaccum imports slime).
"""

from fastaccum.slime._abort import generate_rollout, log_rollout_data, request_abort, with_request_abort
from fastaccum.slime._generate import generate, generate_turn, request_abortable
from fastaccum.slime._pools import POOLS

__all__ = (
    "generate",
    "generate_rollout",
    "request_abort",
    "close_session",
    "generate_turn",
    "request_abortable",
    "with_request_abort",
    "log_rollout_data",
)

close_session = POOLS.close_session  # this loop's connections (tests, and custom loops that end)
