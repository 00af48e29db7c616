"""``fastaccum.ray``: streams read in Ray actors ("shards"), so the caller's process does no
per-token work (the ``ray`` extra, docs/install.md; docs/scale.md).

Each shard is an async Ray actor with its own event loop and its own ``fastaccum.Client``. A
``ShardedClient`` places every stream on the shard with the fewest streams; the shard reads it and
hands the ``StreamResult`` back through Ray's object store. The caller's loop sees one Ray call per
stream, one per abort, and one progress poll per shard and interval, whatever the token count.

The streams keep ``Client``'s contract: ``run()`` returns the same ``StreamResult``; ``abort()``
reaches the shard holding the stream and drains there; the caller's own cancellation propagates
and stops the remote stream (``kept()`` then holds the prefix the shard kept); a shard that dies
mid-stream is a ``ShardError`` naming it, and a new actor takes its place.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Mapping
from typing import Any

try:
    import ray
    import ray.exceptions
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
except ImportError as exc:  # an optional extra: say how to get it, not where the import failed
    raise ImportError(
        "fastaccum.ray needs ray, which is not installed: pip install 'ray>=2.40', or install fastaccum with "
        "its ray extra (docs/install.md)",
        name=exc.name,
    ) from None

from fastaccum._core.dialects import check_dialect
from fastaccum._core.resume import routed_start_of
from fastaccum._impl import StreamAccumulator
from fastaccum.errors import ShardError
from fastaccum.result import StreamResult
from fastaccum.transport.client import Client, ClientStream
from fastaccum.transport.request import check_drain

__all__ = (
    "ShardedClient",
    "ShardStream",
    "ShardError",
    "DEFAULT_PROGRESS_INTERVAL_S",
    "DEFAULT_SHARD_CPUS",
    "MAX_STREAMS_PER_SHARD",
)

# How often the caller asks each busy shard for its streams' counters: tokens, bytes_received and
# events are at most this old, plus one Ray round trip.
DEFAULT_PROGRESS_INTERVAL_S = 0.25
# What a shard reserves of a node's CPUs in Ray's bookkeeping. slime gives its POST actors a
# token share too: the training actors hold the node's CPUs, and a shard must never wait for them.
DEFAULT_SHARD_CPUS = 0.001
# Ray calls a shard runs at once: every stream holds one for its whole life, and aborts and
# progress polls must still get in beside them.
MAX_STREAMS_PER_SHARD = 100_000

# Early aborts and cuts a shard keeps before it prunes the stale ones.
_EARLY_KEPT = 256

# (tokens, bytes_received, events) of one stream
Counters = tuple[int, int, int]


@dataclasses.dataclass(frozen=True, slots=True)
class _Outcome:
    """What a shard hands back for one stream: its result or its error, and what it kept."""

    result: StreamResult | None  # run() returned it
    error: BaseException | None  # run() raised it (then ``kept`` is what the stream kept)
    kept: StreamResult
    counters: Counters
    rid: str | None
    abort_error: BaseException | None = None  # why a drain fell back to a cut
    retries: int = 0


class _Shard:
    """One shard: an event loop with a ``Client`` of its own, reading the streams placed on it.

    ``run`` ends with an ``_Outcome`` (never an exception: Ray would wrap it), whatever ended the
    stream. An abort or a cut can overtake the ``run`` it is meant for (Ray does not order the
    calls of an async actor): it is then kept and applied when that ``run`` starts.
    """

    def __init__(self, base_url: str, client_options: dict[str, Any]) -> None:
        self._base_url = base_url
        self._client_options = client_options
        self._client: Client | None = None
        self._streams: dict[int, ClientStream] = {}
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        # stream id -> ("abort" | "cut", when): arrived before the stream's run
        self._early: dict[int, tuple[str, float]] = {}

    async def run(self, sid: int, payload: dict[str, Any], options: dict[str, Any]) -> _Outcome:
        if self._client is None or self._client.closed:
            self._client = Client(self._base_url, **self._client_options)  # on the actor's loop
        stream = self._client.stream(payload, **options)
        early, _ = self._early.pop(sid, (None, 0.0))
        if early == "cut":
            return _Outcome(None, None, stream.kept(), (0, 0, 0), stream.rid)
        if early == "abort":
            stream.abort()
        task = asyncio.current_task()
        assert task is not None  # Ray runs each call of an async actor in a task of its own
        self._streams[sid] = stream
        self._tasks[sid] = task
        try:
            result = await stream.run()
            return _outcome(stream, result, None, result)
        except asyncio.CancelledError:  # cut(): the caller cancelled
            task.uncancel()
            return _outcome(stream, None, None, stream.kept())
        except Exception as exc:
            return _outcome(stream, None, exc, stream.kept())
        finally:
            del self._streams[sid], self._tasks[sid]

    async def abort(self, sid: int) -> None:
        stream = self._streams.get(sid)
        if stream is None:
            self._note_early(sid, "abort")
        else:
            stream.abort()

    async def cut(self, sid: int) -> None:
        task = self._tasks.get(sid)
        if task is None:
            self._note_early(sid, "cut")
        else:
            task.cancel()

    def _note_early(self, sid: int, kind: str) -> None:
        # An abort that lost the race with its stream's end lands here too, and no run comes to
        # take it: entries older than a minute are dropped once there are many.
        now = time.monotonic()
        if len(self._early) > _EARLY_KEPT:
            self._early = {k: v for k, v in self._early.items() if now - v[1] < 60.0}
        if kind == "cut" or sid not in self._early:  # a cut outranks an abort
            self._early[sid] = (kind, now)

    async def progress(self) -> dict[int, Counters]:
        return {sid: _counters(stream) for sid, stream in self._streams.items()}

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()


def _counters(stream: ClientStream) -> Counters:
    return (stream.tokens, stream.bytes_received, stream.events)


def _outcome(
    stream: ClientStream, result: StreamResult | None, error: BaseException | None, kept: StreamResult
) -> _Outcome:
    return _Outcome(result, error, kept, _counters(stream), stream.rid, stream.abort_error, stream.retries)


_ShardActor = ray.remote(_Shard)


@dataclasses.dataclass(eq=False)
class _Slot:
    """One shard's place in a ``ShardedClient``: its actor (replaced when it dies), its streams."""

    index: int
    actor: Any
    node_id: str | None
    streams: dict[int, ShardStream] = dataclasses.field(default_factory=dict)
    poller: asyncio.Task[None] | None = None


class ShardedClient:
    """``Client``'s streams, read in Ray actors.

    ``async with ShardedClient(url, shards=2) as client: result = await client.stream(payload).run()``

    Placement: ``shards=N`` actors where Ray's scheduler puts them, or ``per_node=K`` actors on each
    alive node, pinned there (as slime places its ``--use-distributed-post`` actors); neither: one
    per node. ``num_cpus``: what each actor reserves; ``actor_options`` go to Ray's
    ``.options()`` as they are (a ``scheduling_strategy``, a ``runtime_env``, resources).
    ``progress_interval_s``: how often the counters of running streams are refreshed (None: only
    at their end). Every other keyword is ``Client``'s and goes to each shard's client.

    Ray must be initialised (``ray.init()``), or it starts a local instance on first use.
    """

    def __init__(
        self,
        base_url: str,
        *,
        shards: int | None = None,
        per_node: int | None = None,
        num_cpus: float = DEFAULT_SHARD_CPUS,
        actor_options: Mapping[str, Any] | None = None,
        progress_interval_s: float | None = DEFAULT_PROGRESS_INTERVAL_S,
        **client_options: Any,
    ) -> None:
        if shards is not None and per_node is not None:
            raise ValueError("give shards (a total) or per_node (actors on each node), not both")
        for name, count in (("shards", shards), ("per_node", per_node)):
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise ValueError(f"{name} must be a positive int or None, not {count!r}")
        if progress_interval_s is not None and not progress_interval_s > 0:
            raise ValueError(f"progress_interval_s must be seconds > 0 or None, not {progress_interval_s!r}")
        Client(base_url, **client_options)  # the same checks, in the caller, before any actor starts
        self._base_url = base_url
        self._client_options = client_options
        self._dialect = client_options.get("dialect", "sglang")
        self._shards = shards
        self._per_node = (per_node or 1) if shards is None else None  # neither: one per node
        self._actor_options = {
            "num_cpus": num_cpus,
            "max_concurrency": MAX_STREAMS_PER_SHARD,
            "max_restarts": 0,  # a dead shard is replaced by the client, which knows its streams
            "max_task_retries": 0,  # a stream is never read twice
            **(actor_options or {}),
        }
        self._interval = progress_interval_s
        self._slots: list[_Slot] = []
        self._ids = itertools.count()
        self._closed = False
        self.replaced = 0  # shards that died and were replaced

    async def __aenter__(self) -> ShardedClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop every shard; streams still running end as if the server had closed."""
        self._closed = True
        slots, self._slots = self._slots, []
        for slot in slots:
            if slot.poller is not None:
                slot.poller.cancel()
        await asyncio.gather(*(slot.actor.close.remote() for slot in slots), return_exceptions=True)
        for slot in slots:
            ray.kill(slot.actor, no_restart=True)

    def stream(self, payload: Mapping[str, Any], **options: Any) -> ShardStream:
        """One streaming request, as ``Client.stream()`` takes it (nothing is sent before
        ``run()``); it runs on the shard with the fewest streams when ``run()`` starts."""
        if "abort_drain_s" in options:
            check_drain(options["abort_drain_s"])
        if options.get("dialect") is not None:
            check_dialect(options["dialect"])
        return ShardStream(self, dict(payload), options)

    @property
    def base_url(self) -> str:
        return self._base_url

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def shards(self) -> int:
        """Shards started so far (they start with the first stream)."""
        return len(self._slots)

    def actors(self) -> list[Any]:
        """The shards' actor handles, in shard order (tests, and callers that place other work)."""
        return [slot.actor for slot in self._slots]

    # ---- placement -----------------------------------------------------------------------------
    def _place(self, stream: ShardStream) -> tuple[_Slot, int]:
        if self._closed:
            raise RuntimeError("ShardedClient is closed")
        if not self._slots:
            self._start()
        slot = min(self._slots, key=lambda s: len(s.streams))
        sid = next(self._ids)
        slot.streams[sid] = stream
        if self._interval is not None and slot.poller is None:
            slot.poller = asyncio.get_running_loop().create_task(self._poll(slot))
        return slot, sid

    def _start(self) -> None:
        if self._per_node is None:
            self._slots = [_Slot(i, self._spawn(None), None) for i in range(self._shards or 1)]
            return
        nodes = _alive_nodes()
        self._slots = [
            _Slot(i, self._spawn(node), node)
            for i, node in enumerate(node for node in nodes for _ in range(self._per_node or 1))
        ]

    def _spawn(self, node_id: str | None) -> Any:
        options = dict(self._actor_options)
        if node_id is not None and "scheduling_strategy" not in options:
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        return _ShardActor.options(**options).remote(self._base_url, self._client_options)

    def _replace(self, slot: _Slot, dead: Any) -> None:
        """A new actor for a shard that died (once, however many of its streams noticed)."""
        if slot.actor is not dead or self._closed:
            return
        node = slot.node_id
        if node is not None and node not in _alive_nodes():
            node = None  # its node went with it: let Ray place the new one
        slot.actor = self._spawn(node)
        slot.node_id = node
        self.replaced += 1

    def _release(self, slot: _Slot, sid: int) -> None:
        slot.streams.pop(sid, None)

    async def _poll(self, slot: _Slot) -> None:
        """Refresh the counters of the slot's running streams every interval, while it has any."""
        assert self._interval is not None
        try:
            while slot.streams:
                await asyncio.sleep(self._interval)
                try:
                    counters = await slot.actor.progress.remote()
                except ray.exceptions.RayError:
                    await asyncio.sleep(self._interval)  # a dead shard: its streams raise; a new one polls
                    continue
                for sid, values in counters.items():
                    stream = slot.streams.get(sid)
                    if stream is not None:
                        stream._counters = values
        finally:
            slot.poller = None


def _alive_nodes() -> list[str]:
    nodes = [node["NodeID"] for node in ray.nodes() if node.get("Alive")]  # type: ignore[no-untyped-call]
    if not nodes:
        raise RuntimeError("no alive Ray node to place shards on")
    return nodes


class ShardStream:
    """One streaming request read by a shard (made by ``ShardedClient.stream()``).

    ``run()``, ``abort()``, ``kept()``, ``aborted``, ``rid`` and the counters as on a ``Client``
    stream. The counters are the shard's, at most ``progress_interval_s`` old while it runs, exact
    once ``run()`` ended; ``kept()`` and ``rid`` are known once ``run()`` ended (before, ``kept()``
    is the empty prefix: the shard holds the rest).
    """

    def __init__(self, client: ShardedClient, payload: dict[str, Any], options: dict[str, Any]) -> None:
        self._client = client
        self._payload = payload
        self._options = options
        self._slot: _Slot | None = None
        self._sid = -1
        self._started = False
        self._ended = False
        self._abort_requested = False
        self._kept: StreamResult | None = None
        self._counters: Counters = (0, 0, 0)
        self.rid: str | None = None
        self.shard: int | None = None  # the shard reading it, once run() placed it
        self.abort_error: BaseException | None = None  # as Client's, once run() ended
        self.retries = 0  # as Client's, once run() ended

    # ---- progress ------------------------------------------------------------------------------
    @property
    def tokens(self) -> int:
        return self._counters[0]

    @property
    def bytes_received(self) -> int:
        return self._counters[1]

    @property
    def events(self) -> int:
        return self._counters[2]

    @property
    def aborted(self) -> bool:
        return self._abort_requested

    def kept(self) -> StreamResult:
        """What the shard kept: after ``run()`` ended, the complete result or the prefix, as
        ``Client``'s ``kept()``; before, the empty prefix (``aborted=True``)."""
        if self._kept is not None:
            return self._kept
        return dataclasses.replace(self._empty(), aborted=True)

    # ---- control -------------------------------------------------------------------------------
    def abort(self) -> None:
        """Request-level abort, done by the shard holding the stream (a drain, as ``Client``'s)."""
        if self._abort_requested:
            return
        self._abort_requested = True
        if self._slot is not None and not self._ended:
            self._slot.actor.abort.remote(self._sid)

    async def run(self) -> StreamResult:
        if self._started:
            raise RuntimeError("run() can be awaited only once per stream")
        self._started = True
        if self._abort_requested:  # aborted before it started: nothing was sent or read
            self._ended = True
            self._kept = dataclasses.replace(self._empty(), aborted=True, request_sent=False)
            return self._kept
        slot, self._sid = self._client._place(self)
        self._slot, self.shard, actor = slot, slot.index, slot.actor
        ref = actor.run.remote(self._sid, self._payload, self._options)
        try:
            outcome: _Outcome = await ref
        except asyncio.CancelledError:
            # The caller's cancel: stop the remote stream, keep what it kept, then propagate.
            actor.cut.remote(self._sid)
            with contextlib.suppress(ray.exceptions.RayError):
                self._take(await ref)
            raise
        except ray.exceptions.RayError as exc:
            self._client._replace(slot, actor)
            raise ShardError(
                f"shard {slot.index} (Ray actor {actor._actor_id.hex()[:16]}) failed while it read this "
                f"stream; what it had read is lost with it: {str(exc).splitlines()[0]}",
                shard=slot.index,
            ) from exc
        finally:
            self._ended = True
            self._client._release(slot, self._sid)
        self._take(outcome)
        if outcome.error is not None:
            outcome.error.add_note(f"(read by shard {slot.index} of fastaccum.ray.ShardedClient)")
            raise outcome.error
        assert outcome.result is not None
        return outcome.result

    def _take(self, outcome: _Outcome) -> None:
        self._kept = outcome.kept
        self._counters = outcome.counters
        self.rid = outcome.rid
        self.abort_error = outcome.abort_error
        self.retries = outcome.retries
        if outcome.result is not None:
            self._abort_requested = outcome.result.aborted  # False: the terminal event won the race

    def _empty(self) -> StreamResult:
        options = {k: v for k, v in self._options.items() if k in _CORE_OPTIONS and v is not None}
        options.setdefault("dialect", self._client._dialect)
        return StreamAccumulator(routed_start=routed_start_of(self._payload, options["dialect"]), **options).snapshot()


# Client.stream()'s options that the accumulator takes (what an empty result is shaped by).
_CORE_OPTIONS = (
    "mode",
    "expert_shape",
    "indexer_shape",
    "dialect",
    "routed_dtype",
    "max_event_bytes",
    "require_routed_experts",
)
