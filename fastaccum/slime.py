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
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import threading
import uuid
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import aiohttp
import numpy as np

from fastaccum.client import STREAM_TIMEOUT, GenerateStream, StreamConsumer
from fastaccum.errors import ServerError, StreamFormatError
from fastaccum.result import StreamResult
from fastaccum.transport import DEFAULT_COALESCE_MS, Client

__all__ = ("generate", "generate_rollout", "request_abort")

logger = logging.getLogger(__name__)

# The finish_reason types slime maps to a status; anything else would leave a resumed sample
# ABORTED or a new one PENDING, so it is refused.
_FINISH_TYPES = ("stop", "length", "abort")
# Control calls (/workers, /server_info, /v1/loads) answer at once on a live server.
_CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=10)


# ---- lazy slime import -------------------------------------------------------------------------
_slime_modules: SimpleNamespace | None = None


def _slime() -> SimpleNamespace:
    """slime's modules, imported on first use.

    slime is never a dependency of fastaccum (it installs only from source; the PyPI name ``slime``
    is an unrelated project), and ``import fastaccum.slime`` must stay cheap: slime's rollout
    manager imports the rollout function at start-up. Only these light modules are touched; never
    ``slime.utils.arguments`` or the SGLang engine modules, which pull in SGLang and Megatron.
    """
    global _slime_modules
    if _slime_modules is None:
        # slime ships no stubs and is not installed where fastaccum is type-checked.
        from slime.backends.sglang_utils import server_control  # type: ignore[import-not-found]
        from slime.rollout import sglang_rollout  # type: ignore[import-not-found]
        from slime.utils import async_utils, http_utils, misc  # type: ignore[import-not-found]
        from slime.utils.types import Sample  # type: ignore[import-not-found]

        _slime_modules = SimpleNamespace(
            rollout=sglang_rollout,
            server_control=server_control,
            http_utils=http_utils,
            async_utils=async_utils,
            misc=misc,
            Sample=Sample,
        )
    return _slime_modules


# ---- settings ----------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Settings:
    """slime's flags plus the ``fastaccum_*`` keys of ``--custom-config-path`` (docs/slime.md).

    slime sets every YAML key onto ``args`` and silently drops unknown CLI flags, so these keys are
    the plugin's only settings channel; all are read with ``getattr`` defaults.
    """

    stream_mode: str  # "cumulative" | "incremental" | "auto"
    abort_mode: str  # "request" | "server"
    transport: str  # "client" | "aiohttp"
    coalesce_ms: float
    idle_timeout: float
    idle_poll_interval: float
    read_timeout: float | None
    max_event_bytes: int | None
    check_server_mode: bool

    @classmethod
    def from_args(cls, args: Any) -> _Settings:
        incremental = getattr(args, "sglang_incremental_streaming_output", getattr(args, "sglang_stream_output", False))
        mode = getattr(args, "fastaccum_stream_mode", None) or ("incremental" if incremental else "cumulative")
        if mode not in ("cumulative", "incremental", "auto"):
            raise ValueError(f"fastaccum_stream_mode must be 'cumulative', 'incremental' or 'auto', not {mode!r}")
        if mode != "auto" and (mode == "incremental") != bool(incremental):
            raise ValueError(
                f"fastaccum_stream_mode={mode!r} contradicts --sglang-incremental-streaming-output="
                f"{bool(incremental)}; drop the key or set it to 'auto'"
            )
        abort_mode = getattr(args, "fastaccum_abort_mode", None) or "request"
        if abort_mode not in ("request", "server"):
            raise ValueError(f"fastaccum_abort_mode must be 'request' or 'server', not {abort_mode!r}")
        transport = getattr(args, "fastaccum_transport", None) or "client"
        if transport not in ("client", "aiohttp"):
            raise ValueError(f"fastaccum_transport must be 'client' or 'aiohttp', not {transport!r}")
        raw_window = getattr(args, "fastaccum_coalesce_ms", None)
        try:
            coalesce_ms = DEFAULT_COALESCE_MS if raw_window is None else float(raw_window)
        except (TypeError, ValueError):
            coalesce_ms = math.nan
        if not coalesce_ms >= 0:
            raise ValueError(f"fastaccum_coalesce_ms must be a number >= 0, not {raw_window!r}")
        read_timeout = getattr(args, "fastaccum_read_timeout", None)
        max_event_bytes = getattr(args, "fastaccum_max_event_bytes", None)
        return cls(
            stream_mode=mode,
            abort_mode=abort_mode,
            transport=transport,
            coalesce_ms=coalesce_ms,
            idle_timeout=float(getattr(args, "fastaccum_idle_timeout", 30.0)),
            idle_poll_interval=float(getattr(args, "fastaccum_idle_poll_interval", 0.5)),
            read_timeout=None if read_timeout is None else float(read_timeout),
            max_event_bytes=None if max_event_bytes is None else int(max_event_bytes),
            check_server_mode=bool(getattr(args, "fastaccum_check_server_mode", True)),
        )


def _router_url(args: Any) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


# ---- per-event-loop state ----------------------------------------------------------------------
@dataclasses.dataclass(eq=False)
class _Registry:
    """What ``request_abort`` must stop, for one event loop (fully-async runs a second loop)."""

    request_streams: set[StreamConsumer] = dataclasses.field(default_factory=set)
    server_generations: int = 0
    session: aiohttp.ClientSession | None = None  # control calls, and streams on the aiohttp transport
    clients: dict[str, Client] = dataclasses.field(default_factory=dict)  # one pool per router URL
    mode_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)


_registries: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Registry] = weakref.WeakKeyDictionary()
_checked_modes: set[tuple[str, str]] = set()  # (router url, mode) pairs the servers agreed with


def _registry() -> _Registry:
    loop = asyncio.get_running_loop()
    registry = _registries.get(loop)
    if registry is None:
        registry = _registries[loop] = _Registry()
    return registry


def _session(args: Any) -> aiohttp.ClientSession:
    """This loop's aiohttp session (sessions are loop-bound), sized like slime's own client."""
    registry = _registry()
    if registry.session is None or registry.session.closed:
        # aiohttp's default of 100 connections would throttle slime's semaphore; trust_env=False:
        # rollout traffic is internal and must never go through a proxy.
        connector = aiohttp.TCPConnector(limit=_connection_limit(args))
        registry.session = aiohttp.ClientSession(connector=connector, timeout=STREAM_TIMEOUT, trust_env=False)
    return registry.session


def _client(args: Any) -> Client:
    """This loop's ``Client`` for the router (its connections are loop-bound). A second router URL
    gets a pool of its own, so streams still running on the first are never cut."""
    clients = _registry().clients
    url = _router_url(args)
    client = clients.get(url)
    if client is None or client.closed:
        # Client never reads proxy settings: rollout traffic is internal.
        client = clients[url] = Client(url, max_connections=_connection_limit(args))
    return client


def _connection_limit(args: Any) -> int:
    limit = int(getattr(args, "sglang_server_concurrency", 0) or 0) * _num_engines(args)
    return limit if limit > 0 else 100


def _num_engines(args: Any) -> int:
    return int(_slime().http_utils.get_rollout_num_engines(args))


async def close_session() -> None:
    """Close this loop's connections (tests, and custom loops that end)."""
    registry = _registries.get(asyncio.get_running_loop())
    if registry is None:
        return
    clients, registry.clients = registry.clients, {}
    for client in clients.values():
        await client.close()
    if registry.session is not None:
        await registry.session.close()
        registry.session = None


# ---- the generate function ---------------------------------------------------------------------
async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime's custom generate function: one streaming request, committed onto ``sample`` once."""
    sr = _slime()
    Sample = sr.Sample
    settings = _Settings.from_args(args)
    state = sr.rollout.GenerateState(args)
    if sample.status not in (Sample.Status.PENDING, Sample.Status.ABORTED):
        raise ValueError(f"fastaccum.slime.generate got a sample with status {sample.status}")
    if sampling_params.get("max_new_tokens") is None:
        raise ValueError("fastaccum.slime.generate needs --rollout-max-response-len (max_new_tokens is None)")

    prompt_ids = sr.rollout._prepare_prompt_ids(sample, state.tokenizer, state.processor)
    budget = sampling_params["max_new_tokens"] - sample.response_length
    if budget < 0:  # a resume that overran its budget (older slime): never send a negative one
        raise ValueError(
            f"max_new_tokens {sampling_params['max_new_tokens']} < response_length {sample.response_length}"
        )
    sampling_params["max_new_tokens"] = budget
    if budget == 0:
        sample.status = Sample.Status.TRUNCATED
        return sample

    payload: dict[str, Any] = {
        "rid": _new_rid(sample),  # SGLang aborts rids by prefix: fixed-length, never a prefix
        "sampling_params": sampling_params,
        "return_logprob": True,
        "stream": True,
    }
    routing_replay = bool(getattr(args, "use_rollout_routing_replay", False))
    if routing_replay:
        # No routed_experts_start_len: the server recomputes routing for prompt + partial + new on
        # every call and slime overwrites, so a request-cancelled prefix needs no routing.
        payload["return_routed_experts"] = True
    images = sample.multimodal_inputs.get("images") if sample.multimodal_inputs else None
    if images:
        from slime.utils.processing_utils import encode_image_for_rollout_engine  # type: ignore[import-not-found]

        payload["image_data"] = [encode_image_for_rollout_engine(image) for image in images]
        payload["text"] = sample.prompt
    else:
        payload["input_ids"] = list(prompt_ids)
    if not sample.tokens:
        sample.tokens = list(prompt_ids)
    headers = None
    if sample.session_id and getattr(args, "router_policy", None) == "consistent_hashing":
        headers = {"X-SMG-Routing-Key": sample.session_id}

    await _check_server_mode(args, settings, _session(args))
    expert_shape = (int(args.num_layers), int(args.moe_router_topk)) if routing_replay else None
    stream = _open_stream(args, settings, payload, expert_shape=expert_shape, headers=headers)
    # Top-p rows arrive only in the terminal event, so a cancelled prefix could never carry them:
    # such calls are stopped by the server-wide abort, whose terminal chunk has the full CSR.
    server_abort = settings.abort_mode == "server" or getattr(args, "rollout_top_p", 1.0) != 1.0
    if _has_in_tree_request_abort(state):
        if server_abort:
            with _opted_out_of_request_cancel(state):
                result = await _run_checked(state, stream)
        else:
            outcome = await _run_cancellable(args, sample, state, stream)
            if outcome is None:  # committed whole: the terminal event beat slime's abort
                return sample
            result = outcome
    elif server_abort:
        result = await _run_server_abortable(state, stream)
    else:
        result = await _run_request_abortable(state, stream)

    if result.aborted:
        _commit_prefix(args, sample, result, state.tokenizer)
    else:
        _commit_terminal(args, sample, result, state.tokenizer)
    return sample


generate.abort_mode = "request"  # type: ignore[attr-defined]  # the marker slime and request_abort read


def _open_stream(
    args: Any,
    settings: _Settings,
    payload: dict[str, Any],
    *,
    expert_shape: tuple[int, int] | None,
    headers: dict[str, str] | None,
) -> StreamConsumer:
    """The stream for one call, on the configured transport (both keep one contract)."""
    if settings.transport == "client":
        return _client(args).stream(
            payload,
            mode=settings.stream_mode,
            expert_shape=expert_shape,
            max_event_bytes=settings.max_event_bytes,
            headers=headers,
            read_timeout=settings.read_timeout,
            coalesce_ms=settings.coalesce_ms,  # per call: the setting may change between calls
        )
    return GenerateStream(
        _session(args),
        _router_url(args) + "/generate",
        payload,
        mode=settings.stream_mode,
        expert_shape=expert_shape,
        max_event_bytes=settings.max_event_bytes,
        headers=headers,
        read_timeout=settings.read_timeout,
    )


def _new_rid(sample: Any) -> str:
    return f"fastaccum-{uuid.uuid4().hex}"


async def _run_request_abortable(state: Any, stream: StreamConsumer) -> StreamResult:
    registry = _registry()
    registry.request_streams.add(stream)
    try:
        # Register, then check: an abort that swept the registry before we registered has set
        # state.aborted, so this call is stopped before it sends anything.
        if state.aborted:
            stream.abort()
        # abort() makes run() return the observed prefix (aborted=True); any other cancellation of
        # this task propagates from run() unchanged.
        return await stream.run()
    finally:
        registry.request_streams.discard(stream)


async def _run_server_abortable(state: Any, stream: StreamConsumer) -> StreamResult:
    registry = _registry()
    registry.server_generations += 1
    try:
        if state.aborted:
            stream.abort()
        return await stream.run()
    finally:
        registry.server_generations -= 1


def _has_in_tree_request_abort(state: Any) -> bool:
    """slime builds that cancel request-abort generate calls themselves carry these on GenerateState."""
    return hasattr(state, "cancellable_tasks") and hasattr(state, "active_server_generations")


async def _run_checked(state: Any, stream: StreamConsumer) -> StreamResult:
    if state.aborted:  # the rollout is already being aborted: send nothing
        stream.abort()
    return await stream.run()


async def _run_cancellable(args: Any, sample: Any, state: Any, stream: StreamConsumer) -> StreamResult | None:
    """Run a request-abortable call under slime's own abort, which cancels the task running it.

    slime registers that task in ``state.cancellable_tasks`` before this call starts, and its
    ``abort()`` removes it from the set, then cancels it. Exactly that cancellation is a cut:
    the prefix is committed here, synchronously, so the sample holds it when the ``CancelledError``
    reaches slime's wrapper (which marks the sample ABORTED). Returns None when the abort came
    after the terminal event: the result is then committed here and the cancel withdrawn.
    """
    task = asyncio.current_task()
    registered = task is not None and task in state.cancellable_tasks
    try:
        return await _run_checked(state, stream)
    except asyncio.CancelledError:
        cut_by_abort = (
            task is not None
            and registered
            and state.aborted
            and task not in state.cancellable_tasks
            and task.cancelling() == 1  # a caller's own cancel on top makes it theirs
        )
        if not cut_by_abort:
            raise
        kept = stream.kept()
        if kept.aborted:
            _commit_prefix(args, sample, kept, state.tokenizer)
            raise
    # The terminal event won the race with the abort: the sample is complete, and re-raising would
    # make slime's wrapper mark a finished sample ABORTED and resume it past its end.
    assert task is not None
    task.uncancel()
    _commit_terminal(args, sample, kept, state.tokenizer)
    return None


@contextlib.contextmanager
def _opted_out_of_request_cancel(state: Any) -> Iterator[None]:
    """Leave slime's cancel set while a call that needs its terminal chunk runs.

    Counted in ``active_server_generations`` instead, so slime's ``abort()`` aborts server-wide
    and the stream ends with the terminal abort chunk. The task goes back into the set afterwards,
    so that slime's wrapper still tells a caller's own cancel from an abort.
    """
    task = asyncio.current_task()
    registered = task is not None and task in state.cancellable_tasks
    if registered:
        state.cancellable_tasks.discard(task)
    state.active_server_generations += 1
    try:
        yield
    finally:
        state.active_server_generations -= 1
        if registered:
            state.cancellable_tasks.add(task)


# ---- commits (one append_response_tokens call per generate call) -------------------------------
def _call_tokens(result: StreamResult) -> tuple[list[int], list[float]]:
    tokens = result.token_ids.tolist()
    if not tokens:
        return [], []
    if result.logprobs is None:
        raise StreamFormatError(f"the stream carried {len(tokens)} tokens but no logprobs (return_logprob is set)")
    nulls = np.flatnonzero(np.isnan(result.logprobs))
    if nulls.size:
        # A NaN logprob would poison off-policy correction (TIS) for the whole batch.
        raise StreamFormatError(f"null logprob for sampled token at position {int(nulls[0])} of {len(tokens)}")
    return tokens, result.logprobs.tolist()


def _text(result: StreamResult, tokens: list[int], tokenizer: Any) -> str:
    if result.text is not None:
        return result.text
    # --skip-tokenizer-init servers send no text: decode once, not per event.
    return tokenizer.decode(tokens) if tokens else ""


def _record_timing(sample: Any, result: StreamResult) -> None:
    """One entry per generate call in ``sample.metadata["fastaccum_timing"]``, so stragglers
    (a late first token, a long gap) show in the rollout's data; the aiohttp transport has none."""
    if result.timing is not None:
        sample.metadata.setdefault("fastaccum_timing", []).append(dataclasses.asdict(result.timing))


def _commit_terminal(args: Any, sample: Any, result: StreamResult, tokenizer: Any) -> None:
    reason = result.finish_reason
    if reason is None:  # run() returns only finished or aborted results; never commit a cut one
        raise StreamFormatError("stream ended without a finish_reason")
    kind = reason.get("type")
    if kind == "abort" and reason.get("status_code") is not None:
        # A validation failure or a server timeout, not a pause or abort: fail the rollout.
        raise ServerError(
            f"SGLang aborted the request with status {reason.get('status_code')}: {reason.get('message')}",
            status=reason.get("status_code"),
            server_message=str(reason.get("message")),
        )
    if kind not in _FINISH_TYPES:
        raise StreamFormatError(f"unknown finish_reason type {kind!r}")
    tokens, logprobs = _call_tokens(result)
    meta = dict(result.meta_info)
    meta["finish_reason"] = reason
    # Decoded arrays go straight into meta_info: slime's decode_int32_meta_array takes arrays as is.
    if result.top_p_token_ids is not None:
        meta["top_p_token_ids"] = result.top_p_token_ids
        meta["top_p_token_offsets"] = result.top_p_token_offsets
    if result.routed_experts is not None:
        meta["routed_experts"] = result.routed_experts
    sample.append_response_tokens(
        args,
        tokens=tokens,
        log_probs=logprobs,
        trainable=True,
        meta_info=meta,
        text=_text(result, tokens, tokenizer),
        update_terminal_info=True,
    )
    _record_timing(sample, result)


def _commit_prefix(args: Any, sample: Any, result: StreamResult, tokenizer: Any) -> None:
    """A deliberate request-level cancel: the observed prefix, no terminal bookkeeping, ABORTED."""
    tokens, logprobs = _call_tokens(result)
    if tokens:
        sample.append_response_tokens(
            args,
            tokens=tokens,
            log_probs=logprobs,
            trainable=True,
            meta_info=None,
            text=_text(result, tokens, tokenizer),
            update_terminal_info=False,
        )
        version = result.meta_info.get("weight_version")
        if version is not None:  # keep one entry per committed segment, as terminal commits do
            sample.weight_versions.append(version)
    _record_timing(sample, result)
    sample.status = _slime().Sample.Status.ABORTED


# ---- mode check --------------------------------------------------------------------------------
async def _check_server_mode(args: Any, settings: _Settings, session: aiohttp.ClientSession) -> None:
    """Fail before the first request when the servers stream in the other mode.

    Servers that do not expose ``/server_info`` are not checked here; then the first event that
    contradicts the configured mode fails in the core (strict length validation).
    """
    if settings.stream_mode == "auto" or not settings.check_server_mode:
        return
    key = (_router_url(args), settings.stream_mode)
    if key in _checked_modes:
        return
    async with _registry().mode_lock:
        if key in _checked_modes:
            return
        configured = settings.stream_mode == "incremental"
        for where, info in await _server_infos(args, session):
            server = info.get("incremental_streaming_output")
            if isinstance(server, bool) and server != configured:
                raise ValueError(
                    f"stream mode mismatch: slime runs with --sglang-incremental-streaming-output "
                    f"{'on' if configured else 'off'}, but the SGLang server at {where} reports "
                    f"--incremental-streaming-output {'on' if server else 'off'}; make them agree "
                    f"(or set fastaccum_stream_mode: auto)"
                )
        _checked_modes.add(key)


async def _server_infos(args: Any, session: aiohttp.ClientSession) -> list[tuple[str, dict[str, Any]]]:
    external = getattr(args, "rollout_external_engine_infos", None) or []
    infos = [
        (str(entry.get("url", "external engine")), entry["server_info"])
        for entry in external
        if isinstance(entry, dict) and isinstance(entry.get("server_info"), dict)
    ]
    if any("incremental_streaming_output" in info for _, info in infos):
        return infos
    router = _router_url(args)
    workers = await _get_json(session, f"{router}/workers")
    urls = [w["url"] for w in (workers or {}).get("workers", []) if isinstance(w, dict) and "url" in w]
    found = []
    for url in urls or [router]:
        for endpoint in ("/server_info", "/get_server_info"):
            info = await _get_json(session, url + endpoint)
            if isinstance(info, dict):
                found.append((url, info))
                break
    return found


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with session.get(url, timeout=_CONTROL_TIMEOUT) as response:
            if response.status >= 400:
                return None
            return await response.json(content_type=None)
    except (TimeoutError, aiohttp.ClientError, ValueError):
        return None


# ---- the rollout function and request-level abort ----------------------------------------------
_swap_lock = threading.Lock()
_stock_abort: Any = None


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> Any:
    """slime's rollout function with request-level abort; delegates to slime's ``generate_rollout``.

    slime's module-level ``abort`` is swapped for ``request_abort`` while the rollout runs, on both
    slime lines, and restored afterwards. Evaluation never aborts and is delegated unchanged.
    """
    sr = _slime()
    if evaluation:
        return sr.rollout.generate_rollout(args, rollout_id, data_source, evaluation=True)
    if _generate_is_fastaccum(args):
        # Mode mismatches fail here, before the first rollout sends anything.
        sr.async_utils.run(_check_mode_for_rollout(args))
    with _abort_swapped(sr.rollout):
        return sr.rollout.generate_rollout(args, rollout_id, data_source, evaluation=False)


async def _check_mode_for_rollout(args: Any) -> None:
    await _check_server_mode(args, _Settings.from_args(args), _session(args))


def _generate_is_fastaccum(args: Any) -> bool:
    path = getattr(args, "custom_generate_function_path", None)
    return bool(path) and _slime().misc.load_function(path) is generate


@contextlib.contextmanager
def _abort_swapped(rollout_module: Any) -> Iterator[None]:
    """Swap slime's module-level ``abort`` for ``request_abort`` (looked up at call time)."""
    global _stock_abort
    with _swap_lock:
        previous = rollout_module.abort
        if previous is not request_abort:
            _stock_abort = previous
        rollout_module.abort = request_abort
    try:
        yield
    finally:
        with _swap_lock:
            rollout_module.abort = previous


def _original_abort() -> Any:
    current = _slime().rollout.abort
    return current if current is not request_abort else _stock_abort


async def request_abort(args: Any, rollout_id: int) -> list[list[Any]]:
    """Abort the rollout's in-flight work and return the groups to buffer for partial rollout.

    When it returns, every cut stream's connection is closed and the servers are idle.
    """
    sr = _slime()
    path = getattr(args, "custom_generate_function_path", None)
    if not path or getattr(sr.misc.load_function(path), "abort_mode", None) != "request":
        # Another generate function: fastaccum cannot see its requests, slime's abort can.
        stock: list[list[Any]] = await _original_abort()(args, rollout_id)
        return stock
    settings = _Settings.from_args(args)
    state = sr.rollout.GenerateState(args)
    if _has_in_tree_request_abort(state):
        # slime cancels the request-abort calls itself (generate commits each prefix as it is
        # cancelled) and buffers the same groups; it only does not wait for the servers, which
        # notice a closed connection at their next write and may still be decoding.
        server_wide = state.active_server_generations > 0
        in_tree: list[list[Any]] = await _original_abort()(args, rollout_id)
        if not server_wide:
            await _wait_until_idle(args, settings)
        return in_tree
    assert not state.aborted, "request_abort called twice in one rollout"
    state.aborted = True  # before the first await: generate calls starting from now stop at once
    registry = _registry()
    for stream in list(registry.request_streams):
        stream.abort()
    server_wide = registry.server_generations > 0
    if server_wide:
        # Top-p replay (or fastaccum_abort_mode: server) is on: those streams must end with their
        # terminal abort chunk, which only the server-wide abort produces.
        await sr.server_control.abort_servers_until_idle(await _worker_urls(args))

    groups: list[list[Any]] = []
    count = 0
    # Drain as slime's abort does; never cancel group tasks: siblings may be computing rewards.
    while state.pendings:
        done, state.pendings = await asyncio.wait(state.pendings, return_when=asyncio.FIRST_COMPLETED)
        if not getattr(args, "partial_rollout", False):
            continue
        for task in done:
            group = task.result()
            if not _kept_a_prefix(group):
                continue  # nothing observed: resuming would only redo finished siblings' work
            for sample in _leaves(group):
                if sample.response and "start_rollout_id" not in sample.metadata:
                    sample.metadata["start_rollout_id"] = rollout_id
            groups.append(group)
            count += len(group)
    if getattr(args, "partial_rollout", False):
        logger.info("fastaccum: buffered %d partial groups (%d samples) for resume", len(groups), count)
    if not server_wide:
        await _wait_until_idle(args, settings)
    return groups


def _leaves(group: list[Any]) -> Iterator[Any]:
    for item in group:  # a fan-out generate returns list[Sample] per task
        if isinstance(item, list):
            yield from item
        else:
            yield item


def _kept_a_prefix(group: list[Any]) -> bool:
    aborted = _slime().Sample.Status.ABORTED
    return any(s.status == aborted and s.response_length > 0 for s in _leaves(group))


async def _worker_urls(args: Any) -> list[str]:
    response = await _slime().http_utils.get(f"{_router_url(args)}/workers")
    return [worker["url"] for worker in response["workers"]]


async def _wait_until_idle(args: Any, settings: _Settings) -> None:
    """Poll the workers' loads until none runs a request; on timeout, abort server-wide.

    The disconnect-driven abort is asynchronous (~2 s on SGLang 0.5.15), its propagation through
    slime's router is unverified, and --offload-rollout must not free memory under live requests.
    """
    sr = _slime()
    urls = await _worker_urls(args)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.idle_timeout
    busy = list(urls)
    while busy:
        try:
            loads = await asyncio.gather(
                *(
                    asyncio.wait_for(sr.http_utils.get(f"{url}/v1/loads?include=core"), _CONTROL_TIMEOUT.total)
                    for url in busy
                )
            )
        except Exception as exc:  # an unreadable load proves nothing: make sure the hard way
            logger.warning("fastaccum: could not read server loads (%r); aborting server-wide", exc)
            break
        busy = [url for url, load in zip(busy, loads) if sr.server_control.num_requests_from_load(load) > 0]
        if not busy:
            return
        if loop.time() >= deadline:
            logger.warning(
                "fastaccum: %s still busy %.1f s after request-level abort; aborting server-wide",
                busy,
                settings.idle_timeout,
            )
            break
        await asyncio.sleep(settings.idle_poll_interval)
    await sr.server_control.abort_servers_until_idle(busy)
