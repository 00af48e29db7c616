"""The adapters' skeleton, written once: a generate call's endings, the commit rule, the rollout
function and request-level abort, buffering, the idle wait and the per-loop pools, driven by a
``Framework`` record of what differs per framework (fastaccum.slime, fastaccum.vime,
fastaccum.miles).

By job: ``framework`` (the record), ``settings`` (the ``fastaccum_*`` keys every adapter reads),
``calls`` (a call's tokens, timing and budget), ``pools`` (per event loop: streams to stop,
connection pools, opening a stream), ``endings`` (how a call ends, committed once), ``lifecycle``
(the rollout function, ``request_abort``, buffering, the idle wait).
"""

from fastaccum._rollout.calls import (
    append_call,
    budget,
    call_text,
    call_tokens,
    call_versions,
    record_timing,
    sglang_finish,
)
from fastaccum._rollout.endings import committer, end_call, has_in_tree_request_abort, opted_out_of_request_cancel
from fastaccum._rollout.framework import CONTROL_TIMEOUT, Framework, import_framework
from fastaccum._rollout.lifecycle import Lifecycle, ModuleAbort, collect_groups, kept_a_prefix, leaves, wait_until_idle
from fastaccum._rollout.pools import Pools, Registry
from fastaccum._rollout.settings import RolloutSettings

__all__ = (
    "CONTROL_TIMEOUT",
    "Framework",
    "import_framework",
    "RolloutSettings",
    "Pools",
    "Registry",
    "Lifecycle",
    "ModuleAbort",
    "budget",
    "append_call",
    "call_tokens",
    "call_text",
    "sglang_finish",
    "call_versions",
    "record_timing",
    "committer",
    "end_call",
    "has_in_tree_request_abort",
    "opted_out_of_request_cancel",
    "leaves",
    "kept_a_prefix",
    "collect_groups",
    "wait_until_idle",
)
