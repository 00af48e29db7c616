"""Which vime line the double models, read once at import from ``FASTACCUM_VIME_DOUBLE_LINE``
(the harness sets it before it imports the double; tests/vime_double/README.md):

- ``request-abort`` (the default; 2b83ea20): ``GenerateState.cancellable_tasks``, ``Sample``
  with ``append_response_tokens``, ``server_control.abort_servers_until_idle``;
- ``stock`` (052693a8): ``server_control.abort_inflight_requests`` only (one sweep of
  ``POST /abort_requests {}``), which ``abort()`` repeats while groups are pending;
- ``pause`` (edbcb4c9): no ``vime.backends`` at all, ``abort()`` pauses every worker with
  ``POST /pause?mode=abort`` and resumes it after, and ``Sample`` has only
  ``update_from_meta_info``.
"""

import os

LINES = ("request-abort", "stock", "pause")
LINE = os.environ.get("FASTACCUM_VIME_DOUBLE_LINE", "request-abort")
if LINE not in LINES:
    raise ValueError(f"FASTACCUM_VIME_DOUBLE_LINE must be one of {LINES}, not {LINE!r}")
