"""Miles adapter: a streaming generate function and the request-level abort lifecycle for
radixark/miles.

Enable it with Miles' own flags (docs/miles.md)::

    --custom-generate-function-path fastaccum.miles.generate
    --rollout-function-path fastaccum.miles.InferenceRolloutFn     # request-level abort
    [--sglang-incremental-streaming-output]                        # must match the servers

``generate`` has Miles' own signature (``GenerateFnInput`` in, ``GenerateFnOutput`` out). It sends
what Miles' single-turn generate sends, streamed through ``fastaccum.Client`` (or, with
``fastaccum_transport: aiohttp``, ``GenerateStream``), and fills Miles' ``Sample`` once, as Miles'
``update_sample_from_response`` fills it from a whole answer: at the terminal event, or with the
observed prefix when a rollout abort cut the request. Every other cancellation propagates and
every stream error raises, with nothing committed.

Miles aborts a rollout server-wide (``abort_all``) and has no per-task cancel, so it runs as a
stock-slime line (docs/slime.md): ``InferenceRolloutFn`` (Miles' rollout class) swaps Miles'
``abort`` for fastaccum's while a training rollout runs, which aborts fastaccum's requests by rid
(each keeps its prefix, routed experts and indexer top-k), buffers every pending group as Miles
does, and waits until the servers are idle. ``generate_rollout`` does the same for Miles' v1
rollout function (``MILES_USE_LEGACY_ROLLOUT_V1=1``).

The rollout skeleton is fastaccum._rollout's. Here, by job: ``_settings`` (the stream mode),
``_pools`` (Miles' record: workers, ``/v1/loads``, the server-wide abort; the stream-mode check),
``_generate`` (the request), ``_commit`` (results onto the ``Sample``), ``_abort`` (the rollout
class and function, and the aborts swapped in), ``_modules`` (the lazy Miles import: the only place
fastaccum imports Miles).
"""

from typing import Any

from fastaccum.miles._abort import abort, generate_rollout, log_rollout_data, request_abort, rollout_class
from fastaccum.miles._generate import generate
from fastaccum.miles._pools import POOLS

__all__ = (
    "generate",
    "InferenceRolloutFn",
    "abort",
    "generate_rollout",
    "request_abort",
    "log_rollout_data",
    "close_session",
)

close_session = POOLS.close_session  # this loop's connections (tests, and custom loops that end)


def __getattr__(name: str) -> Any:
    # Miles' rollout class is subclassed when first asked for (its loader does getattr on this
    # module): importing fastaccum.miles imports no Miles.
    if name == "InferenceRolloutFn":
        return rollout_class()
    raise AttributeError(f"module 'fastaccum.miles' has no attribute {name!r}")
