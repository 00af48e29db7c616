"""An SGLang ``/generate`` server emulator on aiohttp.web: the demo's server and every network test's double.

The bytes come from ``fastaccum.emulator.writer`` (orjson, SGLang 0.5.23 key order, ``data: …\\n\\n``,
``data: [DONE]\\n\\n``), so the emulator follows docs/wire-format.md; ``version="0.5.15"``
switches the stream-interval rule and the echo ``output_ids`` (its sections "Stream interval and
coalescing", "The abort echo" and "Version differences").

Tokens are a pure function of (seed, rid, position) (``writer.synthetic_generation``), so a client can
check every token with ``Emulator.expected``. ``greedy=True`` keys them by the prompt's first token
and each token's position in the sequence instead (``Emulator.key_of``): a request for prompt + k
generated tokens continues the first exactly, as a greedy model's does, which is what resumes are
tested against. A non-streaming request (``"stream": false``) is answered once, at its end, with
what its stream's terminal event would hold; an aborted one with everything decoded so far.

Each running request has a decode task that produces tokens and queues outputs; the HTTP handler
drains the queue like SGLang's tokenizer manager: cumulative mode sends only the newest output
(dropped frames), incremental mode coalesces them.

Request keys: ``input_ids`` or ``text``, ``sampling_params`` (``max_new_tokens`` default 128,
``stream_interval``, ``stop_token_ids``, ``custom_params.return_top_p_token_ids``),
``return_logprob``, ``return_text_in_logprobs``, ``return_routed_experts``,
``routed_experts_start_len``, ``return_indexer_topk``, ``rid``, ``stream``. ``/abort_request``
aborts a rid the server holds exactly (then every rid it prefixes), as SGLang does.

Fault injection: the request key ``"fastaccum_fault"`` (real SGLang ignores unknown keys) or the
server's ``fault`` option, a dict ``{"kind": …, "at": event index (default 1), …}``:

- ``error_event``: an ``{"error": …}`` event (``message``, ``code``) instead of event ``at``, then [DONE]
- ``malformed_json``: broken JSON instead of event ``at``, then [DONE]
- ``cut``: half of event ``at``, then the connection is closed without the end of the chunked body
- ``http_500``: HTTP 500 with a JSON body before any SSE byte
- ``stall``: ``seconds`` (default 1.0) of silence before event ``at`` (``"done"``: before [DONE])
- ``coalesce``: events go out in groups of ``count`` (default 3) outputs: incremental deltas are
  merged (``writer.coalesce``), cumulative frames dropped
- ``zero_token_terminal``: the terminal event carries no new token
- ``split``: every event is written in pieces of ``size`` bytes (default 7)
- ``retract``: before event ``at`` the request is retracted (it stops decoding and keeps its
  output, as under memory pressure); an ``/abort_request`` then ends it with the abort echo chunk
  holding every token decoded so far; without one, it stays silent for ``seconds`` (default 30)
- ``strip_keys``: every event's ``meta_info`` lacks the listed ``keys``
- ``pause``: once the request holds ``at`` tokens (0: before its first), the whole server pauses
  in ``mode`` (SGLang ``abort``, ``retract``, ``in_place``; vLLM ``abort``, ``wait``, ``keep``,
  with ``clear_cache``), as if the pause call came then
- ``hold``: once the request holds ``at`` tokens it stops decoding until the next control call
  (a pause, continue or resume, abort, weight or version update), which so lands exactly there

Other servers (``dialect=``, docs/dialects.md; fastaccum.emulator._dialect_servers):

- ``"dynamo"``: Dynamo's frontend before SGLang workers. ``POST /generate`` streams SGLang's
  incremental events (whatever ``incremental_streaming_output`` says) with ``meta_info.id`` the
  public id (the body's ``rid``, else the ``x-request-id`` header, else a new UUID); streaming
  only (501 otherwise), ``input_ids`` required; a repeated rid is no duplicate. No
  ``/abort_request`` (404): a client that leaves aborts its request. Its own faults:
  ``dynamo_error`` (``{"error":{"message":"Internal server error"}}`` then [DONE], instead of
  event ``at``), ``dynamo_killed`` (the body ends cleanly after event ``at``, without [DONE]) and
  ``dynamo_stopped`` ([DONE] after event ``at``, when that is not the terminal one).
- ``"vllm"``: ``POST /inference/v1/generate`` (``token_ids``, ``sampling_params`` with
  ``max_tokens`` (default 128, standing for the model's context), ``logprobs`` (null: none),
  ``stop_token_ids``, ``stream_interval``, ``routed_experts_prompt_start`` (routed-expert rows
  from that position on, 0 to the prompt's length); ``stream_options.include_usage``, ``request_id``),
  written by fastaccum.emulator.writer_vllm in the shape of ``vllm_shape``. Tokens are keyed by the
  ``request_id`` (``expected(request_id, n)``; the ``X-Request-Id`` header overrides it), but the
  chunks, the stats and every abort use vLLM's own id, ``VLLM_ID_PREFIX + request_id``
  (``generate-tokens-<id>``). As in vLLM, routed
  experts (``enable_return_routed_experts``) and the sampling mask (``return_sampling_mask``: rows
  streamed with each chunk's tokens from 0.32, none streamed before; the request needs
  temperature > 0 and top_k > 0) are the server's switches, not a request's, and the routed experts
  come with the finishing chunk, an abort's too. An abort (``Emulator.abort(vllm_id)``, exact
  ids; ``POST /inference/v1/abort_requests {"request_ids": [...]}`` in 0.32; the RL dev API's
  ``POST /abort_requests``, ``{}`` for every request, in both) applies before the next token:
  ``"0.32"`` ends with a chunk of no new tokens and finish_reason ``"abort"``, ``"0.31"`` skips
  that chunk (the usage chunk and [DONE] follow, no finish_reason). ``GET /load`` answers
  ``{"server_load": requests held}``, ``GET /health`` is empty. Faults: ``vllm_error``
  (``writer_vllm.error_chunk`` then [DONE], instead of event ``at``; by default vLLM's engine error,
  ``Internal server error``, 500), and ``malformed_json``,
  ``cut``, ``http_500``, ``stall``, ``coalesce``, ``split`` as above.

``EmulatorStats.calls`` counts the requests each path received, served or not.

Pauses and weight updates (docs/weight-updates.md; fastaccum.emulator._scheduler does them),
also callable as ``Emulator.pause``, ``continue_``, ``update_weight_version`` and
``update_weights_from_disk``:

- SGLang: ``POST /pause_generation {"mode"}`` (``abort`` by default: each running request decodes
  one more token and ends with its abort event, a queued one gets the echo, and the call returns
  once every stream has ended; ``retract``: the step in flight is committed, then the request goes
  back to the waiting queue, ``num_retractions`` + 1, and is prefilled again at continue;
  ``in_place``: decoding stops, the step in flight is committed at continue),
  ``/continue_generation``, ``/update_weight_version {"new_version", "abort_all_requests"}``
  (aborts every request first unless told not to), ``/update_weights_from_disk {"model_path",
  "weight_version", "flush_cache", "abort_all_requests"}`` (outside a pause it waits for every
  request and holds new ones; a flush while requests hold their cache answers 400 with the weights
  loaded all the same, the events keeping the old label and the finishing spans the new version).
  A paused server holds new requests (a stream's headers go out, then nothing); an abort of a
  retracted request is the echo at once, of an ``in_place`` one one step after continue. ``GET
  /health`` waits ``health_check_timeout_s`` for any change in a pause and then answers 503, ``GET
  /ready`` 503 at once.
- vLLM (``vllm_server_dev_mode=True``, ``vllm_shape="0.32"``): ``POST /pause?mode=&clear_cache=``
  (``abort``: an abort chunk now; ``wait``: returns once the running requests finished; ``keep``:
  decoding stops, ``clear_cache`` preempts them), ``/resume``, ``GET /is_paused``, ``POST
  /update_weight_version {"new_version"}`` (nothing aborted), ``GET /weight_info``; new requests
  queue while paused.

Weights are a model path: tokens and routed-expert rows computed under other weights than
``model_path``'s are hashed with that path in the key (``Emulator.expected``'s ``token_weights``
and ``row_weights``), so they differ deterministically and a greedy request under the new weights
continues a stream that switched to them. Each token is labelled with the version in force when it
is committed; one step is always in flight, so ``in_place`` and a version change while running
label that step with the new version, as SGLang's overlap scheduler does. What the emulator
simplifies: loading is instant and any path loads; after ``in_place`` with new weights the later
tokens are the new weights' answer (the engine's stale cache gives neither answer); SGLang's
watchdog, data parallelism, ``--max-queued-requests`` and retractions under memory pressure are not
emulated (``num_retractions`` counts pauses only); ``/health`` counts any change of the scheduler's
state as the scheduler's word; vLLM loads no weights (only its version changes), and its initial
version is labelled only when ``weight_version`` is given.
"""

from fastaccum.emulator._dialect_servers import VLLM_ID_PREFIX
from fastaccum.emulator._requests import ABORT_REASON, ECHO_REASON, FAULT_KEY, FAULT_KINDS, EmulatorStats
from fastaccum.emulator._server import Emulator

__all__ = ("Emulator", "EmulatorStats", "FAULT_KEY", "FAULT_KINDS", "ABORT_REASON", "ECHO_REASON", "VLLM_ID_PREFIX")
