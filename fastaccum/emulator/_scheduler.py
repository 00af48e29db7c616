"""The emulator's scheduler: its waiting queue and running set, aborts, and what a pause, a weight
update and a new weight version do to each request, as SGLang 0.5.23 and vLLM 0.32 do them
(fastaccum.emulator describes the endpoints; fastaccum.emulator._pause_server serves them).

The model, per request: tokens are committed one step at a time, and one step is always in
flight. SGLang's retract pause commits it before retracting (its overlap queue is drained);
its in_place pause leaves it unprocessed, so it is committed at continue, computed by the old
weights but labelled with the version in force then. A token is labelled with the version in
force when it is committed (SGLang's WeightVersionEvent record, vLLM's per-step stamp)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from fastaccum.emulator._requests import (
    ECHO_REASON,
    EmulatorStats,
    Request,
    Schedule,
    commit,
    decode,
    end_aborted,
)

__all__ = ("FLUSH_REFUSED", "PAUSE_MODES", "Scheduler")

PAUSE_MODES = {"sglang": ("abort", "retract", "in_place"), "vllm": ("abort", "wait", "keep")}
# SGLang's answer when a weight update cannot flush the cache (weight_updater.py); the weights
# are loaded all the same.
FLUSH_REFUSED = (
    "Weights were updated, but the cache was not flushed because requests are still running or "
    "queued. Retract or finish them, then call /flush_cache."
)
# A non-streaming request's outputs reach SGLang's tokenizer every 50 tokens
# (SGLANG_FORCE_STREAM_INTERVAL): what an abort echo of one holds.
_FORCE_STREAM_INTERVAL = 50


class Scheduler:
    """Requests from arrival to release. ``weights`` is the model path in force ("" while it is
    the one the server started with), ``version`` the scheduler's weight version (vLLM's engine
    core's), ``label`` SGLang's tokenizer-side one, which every event carries."""

    def __init__(
        self,
        *,
        dialect: str,
        stats: EmulatorStats,
        token_rate: float | None,
        max_running_requests: int,
        model_path: str,
        weight_version: str | None,
    ) -> None:
        self.dialect, self.stats = dialect, stats
        self.token_rate, self.max_running_requests = token_rate, max_running_requests
        self.model_path = model_path
        self.weights = ""
        self.version = self.label = weight_version or "default"
        # vLLM's spans only from a version set (a live 0.32 starts at "default"); SGLang's always.
        self.stamps = dialect != "vllm" or weight_version is not None
        self.running: set[Request] = set()
        self.waiting: deque[Request] = deque()
        self.gated: list[Request] = []  # held before the scheduler by SGLang's paused tokenizer
        self.inflight: set[Request] = set()  # past the gate, not yet released
        self.pause_mode: str | None = None  # the pause in force, as asked
        self.engine_paused = False  # nothing is admitted or decoded
        self.tokenizer_paused = False  # SGLang's is_pause: new requests wait before the scheduler
        self.updating = False  # SGLang's weight update holds the model lock: new requests wait
        self.cache_epoch = 0  # bumped by every cache flush
        self.unhealthy = False
        self.closing = False
        self._changed: asyncio.Event | None = None
        # What admits from the waiting queue: the emulator's _admit, which a subclass may replace.
        self.admit: Callable[[], None] = self.admit_waiting

    # ---- waiting for the scheduler ------------------------------------------------------------
    def notify(self) -> None:
        """Something changed (a token, a release, a control call): wake whoever waits on it."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def changed(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self.changed().wait()

    # ---- arrival, admission, release ----------------------------------------------------------
    def holds(self, rid: str) -> bool:
        """Whether a request of exactly this rid is held (SGLang's tokenizer knows it)."""
        return any(r.rid == rid for r in (*self.running, *self.waiting, *self.gated))

    def enqueue(self, req: Request) -> None:
        self.stats.requests += 1
        req.label = self.label
        if self.dialect != "vllm" and (self.tokenizer_paused or self.updating):
            # SGLang's tokenizer waits on its pause (and the model lock) before the scheduler
            # sees the request: its headers are sent, then nothing (tokenizer_manager.py).
            req.state = "gated"
            self.gated.append(req)
            return
        self._queue(req)

    def _queue(self, req: Request) -> None:
        req.state = "queued"
        req.versions = [(0, self.version)] if self.stamps else []
        if req.label != req.gen.weight_version or self.version != req.label:
            req.relabel()
        self.inflight.add(req)
        self.waiting.append(req)
        self.admit()

    def _ungate(self) -> None:
        gated, self.gated = self.gated, []
        for req in gated:
            self._queue(req)

    def admit_waiting(self) -> None:
        while (
            self.waiting
            and len(self.running) < self.max_running_requests
            and not self.closing
            and not self.engine_paused
        ):
            req = self.waiting.popleft()
            req.state = "running"
            self.running.add(req)
            if req.admitted.is_set():
                # A retracted request's prefill of prompt + output: a flushed cache recomputes it
                # all, else the prompt is a cache hit that keeps its rows.
                kept = req.gen.prompt_tokens if req.cache_epoch == self.cache_epoch else 0
                self._rebase(req, tokens_from=req.produced, rows_from=kept)
            elif self.weights:
                self._rebase(req, tokens_from=0, rows_from=0)
            req.cache_epoch = self.cache_epoch
            self._start(req)
            req.admitted.set()

    def _start(self, req: Request, *, at_once: bool = True) -> None:
        # vLLM applies an abort between steps, SGLang after one more token.
        step = 0 if self.dialect == "vllm" else 1
        coro = decode(
            req, token_rate=self.token_rate, count=self.count, abort_step=step, at_once=at_once, pause=self._fault
        )
        req.decoder = asyncio.get_running_loop().create_task(coro)

    @staticmethod
    def _stop(req: Request) -> None:
        task, req.decoder = req.decoder, None
        if task is not None and task is not asyncio.current_task() and not task.done():
            task.cancel()

    def release(self, req: Request) -> None:
        # A client that left stops its generation (docs/wire-format.md, "Aborts"; 0.5.23).
        self._stop(req)
        self.running.discard(req)
        self.inflight.discard(req)
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.gated:
            self.gated.remove(req)
        self.admit()
        self.notify()

    def stop(self) -> None:
        self.closing = True
        for req in [*self.running, *self.waiting, *self.gated]:
            self._stop(req)
            req.admitted.set()
            req.wake.set()

    def count(self, req: Request, k: int) -> None:
        """The request holds ``k`` tokens (called on every commit)."""
        if k > req.produced and req.versions and req.versions[-1][1] != self.version:
            req.versions.append((req.produced, self.version))
            req.relabel()
        self.stats.tokens += k - req.produced
        req.produced = k
        self.notify()

    def _rebase(self, req: Request, *, tokens_from: int, rows_from: int) -> None:
        """The weights in force compute the request's tokens from ``tokens_from`` and its replay
        rows from sequence position ``rows_from`` on."""
        token_weights = _from(req.token_weights, tokens_from, self.weights)
        row_weights = _from(req.row_weights, rows_from, self.weights)
        if (token_weights, row_weights) != (req.token_weights, req.row_weights):
            req.token_weights, req.row_weights = token_weights, row_weights
            req.regenerate()

    def _calls_land(self) -> None:
        """A control call came: requests the ``hold`` fault stopped decode again first."""
        for req in self.running:
            if req.hold == "call":
                req.hold = None
                self._start(req, at_once=False)

    # ---- aborts -------------------------------------------------------------------------------
    def abort(self, rid: str = "", *, abort_all: bool = False) -> int:
        """What ``/abort_request`` does; rids match by prefix, as SGLang's scheduler does
        (docs/wire-format.md, "Aborts"). vLLM's request ids match exactly (its ``/abort_requests``).
        A request SGLang's paused tokenizer holds is not the scheduler's yet: the abort finds
        nothing and is lost."""
        self._calls_land()
        exact = self.dialect == "vllm"
        held = [*self.running, *self.waiting]
        hits = [r for r in held if abort_all or (r.rid == rid if exact else r.rid.startswith(rid))]
        for req in hits:
            if req.abort_requested:
                continue
            req.abort_requested = True
            self.stats.aborted += 1
            if req.state == "queued":
                self.waiting.remove(req)
                req.state = "echo"
                if req.admitted.is_set():
                    # Retracted: the echo of what the tokenizer has received, at once, even while
                    # paused (scheduler.py pops the waiting queue on every ingest).
                    held_ids = req.pushed if req.streams else req.produced - req.produced % _FORCE_STREAM_INTERVAL
                    req.push(held_ids, terminal=True, reason=ECHO_REASON)
                else:
                    req.admitted.set()
            elif req.hold == "keep":  # vLLM's frozen request: aborted between steps, at once
                req.hold = None
                end_aborted(req, 0, self.count)
            # An in_place-held one only learns it at continue: one more step, then its end.
        self.notify()
        return len(hits)

    # ---- pauses -------------------------------------------------------------------------------
    def check_mode(self, mode: object) -> str:
        modes = PAUSE_MODES["vllm" if self.dialect == "vllm" else "sglang"]
        if mode not in modes:
            raise ValueError(f"mode must be one of {', '.join(map(repr, modes))}, not {mode!r}")
        assert isinstance(mode, str)
        return mode

    async def pause(self, mode: str, *, clear_cache: bool = True) -> None:
        """Pause as the dialect's endpoint does, returning when its call would."""
        self.pause_now(self.check_mode(mode), clear_cache=clear_cache)
        if mode == "abort" and self.dialect != "vllm":
            # SGLang's tokenizer returns once no /generate holds the model lock.
            await self.wait_for(lambda: not self.inflight)
        elif mode == "wait":
            await self.wait_for(lambda: all(r.final is not None for r in self.running))

    def pause_now(self, mode: str, *, clear_cache: bool = True) -> None:
        """What a pause does to the requests at once."""
        self._calls_land()
        self.pause_mode = mode
        decoding = [r for r in self.running if r.state == "running" and r.final is None]
        if self.dialect == "vllm":
            self.engine_paused = True  # every mode queues new requests (PAUSED_NEW, PAUSED_ALL)
            if mode == "abort":
                self.abort(abort_all=True)
            elif mode == "keep":
                for req in decoding:
                    self._stop(req)
                    req.hold = "keep"
                    # clear_cache is not ignored under keep: the cache reset preempts every
                    # running request, recomputed on resume (vLLM core.py, scheduler.py).
                    self.stats.preemptions += int(clear_cache)
                self.cache_epoch += int(clear_cache)
        else:
            self.tokenizer_paused = True
            if mode == "abort":  # the scheduler itself is not paused: only the tokenizer's gate
                self.abort(abort_all=True)
            else:
                self.engine_paused = True
                for req in decoding:
                    if mode == "retract":
                        self._retract(req)
                    else:
                        self._hold(req)
        self.notify()

    def _hold(self, req: Request) -> None:
        self._stop(req)
        req.hold = "in_place"  # the step in flight stays unprocessed until continue

    def _retract(self, req: Request) -> None:
        self._stop(req)
        req.hold = None
        # The step in flight is committed and streamed first (the overlap queue is drained).
        if req.abort_requested:
            end_aborted(req, 1, self.count)
            return
        commit(req, req.produced + 1, self.count)
        if req.final is not None:
            return  # that token ended it
        self.running.discard(req)
        req.state = "queued"
        self.waiting.append(req)
        req.retractions += 1
        self.stats.retractions += 1
        req.relabel()

    def resume(self) -> None:
        """SGLang's /continue_generation, vLLM's /resume."""
        self._calls_land()
        self.pause_mode = None
        self.tokenizer_paused = self.engine_paused = False
        for req in list(self.running):
            mode, req.hold = req.hold, None
            prompt = req.gen.prompt_tokens
            if mode == "in_place":
                # The step in flight ran under the old weights and is committed now, under the
                # version in force now: the first token truly from new weights is one later.
                self._rebase(req, tokens_from=req.produced + 1, rows_from=prompt + req.produced)
                if req.abort_requested:
                    end_aborted(req, 1, self.count)
                    continue
                commit(req, req.produced + 1, self.count)
                if req.final is None:
                    self._start(req, at_once=False)
            elif mode == "keep":
                # Rows already computed stay; the position of the last token is forwarded anew.
                rows_from = prompt + req.produced - 1 if req.produced else 0
                self._rebase(req, tokens_from=req.produced, rows_from=rows_from)
                self._start(req)
        if not self.updating:
            self._ungate()
        self.admit()
        self.notify()

    def _fault(self, req: Request) -> None:
        """The ``pause`` fault: the pause its ``mode`` names, as if the call came now. The ``hold``
        fault: decoding stops until the next control call, which so lands at exactly this point."""
        if req.fault.get("kind") == "hold":
            self._stop(req)
            req.hold = "call"
            return
        mode = req.fault.get("mode", "abort")
        self.pause_now(mode, clear_cache=bool(req.fault.get("clear_cache", True)))

    # ---- versions and weights -----------------------------------------------------------------
    def set_version(self, version: str) -> None:
        """The scheduler's (vLLM: the engine's) version: each token committed from now on is
        labelled with it; a request with no token under the old one takes it whole."""
        if version == self.version and self.stamps:
            return
        self.version, self.stamps = version, True
        for req in self.inflight:
            if req.final is None and req.versions and req.versions[-1][0] == req.produced:
                req.versions[-1] = (req.produced, version)
                if len(req.versions) > 1 and req.versions[-2][1] == version:
                    req.versions.pop()
                req.relabel()

    def set_label(self, version: str) -> None:
        """SGLang's tokenizer-side version, the ``weight_version`` of every event from now on."""
        self.label = version
        for req in (*self.inflight, *self.gated):
            if req.final is None and req.label != version:
                req.label = version
                req.relabel()

    async def update_weight_version(self, version: str, *, abort_all: bool = True) -> None:
        self._calls_land()
        if abort_all and self.dialect != "vllm":
            self.abort(abort_all=True)  # before anything else, retracted requests included
        self.set_version(version)
        if self.dialect != "vllm":
            self.set_label(version)
        self.notify()

    async def update_weights_from_disk(
        self, model_path: str, *, weight_version: str | None, flush_cache: bool, abort_all: bool
    ) -> tuple[bool, str]:
        """SGLang's update: the weights switch (and the scheduler's version) whatever the flush
        does; the tokenizer's label only when the whole call succeeds."""
        self._calls_land()
        if abort_all:
            self.abort(abort_all=True)
        locked = not self.tokenizer_paused
        if locked:  # the model lock's writer: every /generate ends first, new ones wait behind it
            self.updating = True
            try:
                await self.wait_for(lambda: not self.inflight)
            except BaseException:
                self.updating = False
                self._ungate()
                raise
        self.weights = "" if model_path == self.model_path else model_path
        success, message = True, "Succeeded to update model weights."
        if weight_version is not None:
            self.set_version(weight_version)
        if flush_cache:
            busy = any(r.state == "running" and r.final is None for r in self.running)
            if busy or (self.waiting and not self.engine_paused):
                success, message = False, FLUSH_REFUSED
            else:
                self.cache_epoch += 1
        if success and weight_version is not None:
            self.set_label(weight_version)
            message += f" Weight version updated to {weight_version}."
        if locked:
            self.updating = False
            if not self.tokenizer_paused:
                self._ungate()
        self.notify()
        return success, message

    # ---- health -------------------------------------------------------------------------------
    async def health(self, timeout_s: float) -> int:
        """SGLang's /health: a one-token generate, which a pause holds; any word from the scheduler
        within the timeout will do, else 503 and the server marked unhealthy."""
        if self.tokenizer_paused or self.updating:
            try:
                await asyncio.wait_for(self.changed().wait(), timeout_s)
            except TimeoutError:
                self.unhealthy = True
                return 503
        self.unhealthy = False
        return 200

    def ready(self) -> bool:
        return not self.tokenizer_paused and not self.unhealthy


def _from(schedule: Schedule, first: int, weights: str) -> Schedule:
    """``schedule`` with everything from ``first`` on under ``weights``."""
    kept = tuple(entry for entry in schedule if entry[0] < first)
    if (kept[-1][1] if kept else "") == weights:
        return kept
    return (*kept, (first, weights))
