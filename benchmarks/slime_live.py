"""Stock slime's generate functions against fastaccum.slime.generate, on a live SGLang 0.5.23 (CPU).

    python -P benchmarks/slime_live.py --slime ~/slime-stock                  # starts each server
    python -P benchmarks/slime_live.py --slime ~/slime-stock --url http://127.0.0.1:PORT

Every generate function runs in this process, inside slime's own rollout-loop pieces from a stock
THUDM/slime checkout (``GenerateState``, ``generate_and_rm_group``, ``abort``; ``ray``,
``sglang_router`` and ``transformers`` stubbed as tests/framework_harness.py does, the tokenizer
the tiny model's own), against a real SGLang 0.5.23 serving the tiny MoE of tools/live on core 0
(tools/live/engines.py), one server per (stream mode, ``--stream-interval``). It measures:

1. **Client CPU per token**, user and system apart (``getrusage`` of this process; the server is
   other processes): slime's non-streaming ``slime.rollout.sglang_rollout.generate``, its
   ``slime.rollout.sglang_streaming_rollout.generate_streaming`` (cumulative mode only) and
   ``fastaccum.slime.generate`` (``Client`` transport, default settings). Greedy, ``ignore_eos``
   (the random model may end early), ``--streams`` concurrent samples, ``--group-size`` per
   prompt (slime's ``n_samples_per_prompt``), ``--tokens`` each; ``--rounds`` interleaved rounds
   after a warm-up one, the best of each function counts (noise only adds). Every sample is
   compared with the server's own non-streaming answer. slime talks to the server directly here
   (no router).
2. **The server's CPU per token, per process**, user and system apart (``/proc/<pid>/stat``
   before and after each of those runs, every process of the server's session): the main process
   (HTTP server and tokenizer manager), the detokenizer and the scheduler.
3. **What a rollout abort keeps**, with routing replay on (``return_routed_experts``), through a
   recording pass-through router in this process (``GET /workers`` lists the router itself, so
   aborts and load polls pass through it and are counted): the samples are submitted as slime's
   rollout does, and once the server runs all of them and ``--abort-after`` seconds have passed
   (default: half the non-streaming run's wall time, so about half the tokens are decoded)
   the rollout is aborted: stock slime's ``abort`` (server-wide ``abort_all`` until idle) or
   ``fastaccum.slime.request_abort`` (what ``fastaccum.slime.generate_rollout`` swaps in: a
   drain of each stream by rid). slime's httpx pool has ``--sglang-server-concurrency`` x engines
   connections, as many as its semaphore has slots: with every one held by a non-streaming request,
   slime's abort (``GET /workers``, then ``abort_all``) waits for a response to end. The
   comparison gives the pool twice the samples; one more case runs the non-streaming function with
   the pool exactly full. Per function: tokens kept against the tokens the server decoded
   (the ``completion_tokens`` of each request's last event or body, as the router saw it; the
   router reads on after a client leaves, as the abort ends every request anyway), routed experts
   and log-probs kept and equal to the server's answer, statuses, groups returned for buffering.
4. **Stock ``generate_streaming`` in incremental mode**: it replaces the call's tokens with every
   event's (it treats each as cumulative), so a sample keeps only the last delta; with routing
   replay the last event's routed experts no longer fit and slime raises ``ValueError``.

Prints markdown tables; ``--report`` writes them with the machine's facts, ``--json`` the raw
figures (``--from-json`` prints an earlier run's tables). tests/test_slime_in_tree_streaming.py
holds item 4 against the emulator. Needs the dev venv (torch CPU, httpx, pybase64, tqdm, pillow,
pylatexenc, tokenizers) and tools/live's SGLang venv; a whole run (four servers) takes about 12
minutes on 2 vCPUs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import importlib.util
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))  # framework_harness: slime's loader, stubs and test reward
import framework_harness  # noqa: E402


def _load(name: str, path: Path) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


live_helpers = _load("fastaccum_live_helpers", REPO / "tests" / "live" / "live_helpers.py")
engines = live_helpers.engines
harness = framework_harness.slime()
fs = harness.fs

NON_STREAMING = "slime.rollout.sglang_rollout.generate"
IN_TREE = "slime.rollout.sglang_streaming_rollout.generate_streaming"
FASTACCUM = "fastaccum.slime.generate"
LABEL = {
    NON_STREAMING: "slime `generate` (non-streaming)",
    IN_TREE: "slime `generate_streaming`",
    FASTACCUM: "`fastaccum.slime.generate`",
}
EXPERTS = (2, 2)  # the tiny model's (layers, top-k)
TEXTS = (
    "zeta eta theta iota kappa",
    "the quick brown fox",
    "alpha beta gamma delta",
    "one two three four five six",
    "red green blue yellow",
    "north south east west",
    "spring summer autumn winter",
    "sun moon stars sky",
)
TICK = os.sysconf("SC_CLK_TCK")


def build_stamp() -> str:
    """When the fastaccum this process imported was installed (a reinstall during a run shows)."""
    import fastaccum

    try:
        stamp = Path(fastaccum.__file__).parent.stat().st_mtime
    except OSError:
        return "(gone)"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


BUILD_AT_START = build_stamp()


# ---- the server and its processes ---------------------------------------------------------------


@dataclass
class Target:
    url: str
    incremental: bool
    interval: int
    version: str
    session: int | None  # the server's session id (its main process), for /proc; None: not found

    @property
    def mode(self) -> str:
        return "incremental" if self.incremental else "cumulative"


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


def post_json(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def _stat_fields(pid: int) -> list[str]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ... utime is [11]


def listening_pid(port: int) -> int | None:
    """The process that listens on 127.0.0.1:``port`` (for ``--url``), if this user may see it."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(f"socket:[{fields[9]}]")
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                for fd in (entry / "fd").iterdir():
                    if os.readlink(fd) in inodes:
                        return int(entry.name)
    return None


def target_of(url: str, session: int | None) -> Target:
    info = get_json(url + "/server_info")
    return Target(
        url,
        bool(info.get("incremental_streaming_output")),
        int(info.get("stream_interval") or 1),
        str(info.get("version", "?")),
        session,
    )


def roles(target: Target) -> dict[int, str]:
    """Each process of the server's session by role: main (HTTP server and tokenizer manager),
    detokenizer, scheduler, other (multiprocessing's resource tracker)."""
    if target.session is None:
        return {}
    out = {}
    for pid in engines._session_members(target.session):
        with contextlib.suppress(OSError):
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
            if pid == target.session:
                out[pid] = "main"
            elif comm.startswith("sglang::detok"):
                out[pid] = "detokenizer"
            elif comm.startswith("sglang::sched"):
                out[pid] = "scheduler"
            else:
                out[pid] = "other"
    return out


def server_cpu(pids: dict[int, str]) -> dict[str, list[float]]:
    """Seconds of [user, system] per role, summed over the role's processes (all their threads)."""
    out: dict[str, list[float]] = {}
    for pid, role in pids.items():
        with contextlib.suppress(OSError, IndexError):
            fields = _stat_fields(pid)
            user, system = int(fields[11]) / TICK, int(fields[12]) / TICK
            total = out.setdefault(role, [0.0, 0.0])
            total[0] += user
            total[1] += system
    return out


def other_sglang_servers(target: Target) -> int:
    """SGLang schedulers running outside this server's session (another server on the machine)."""
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                if (entry / "comm").read_text().startswith("sglang::sched"):
                    if int(_stat_fields(int(entry.name))[3]) != target.session:
                        count += 1
    return count


def idle(url: str) -> bool:
    loads = get_json(url + "/v1/loads")["loads"]
    return all(entry["num_running_reqs"] == entry["num_waiting_reqs"] == 0 for entry in loads)


def wait_idle(url: str, limit_s: float = 120.0) -> None:
    deadline = time.monotonic() + limit_s
    while not idle(url):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} stayed busy for {limit_s:.0f} s")
        time.sleep(0.05)


# ---- the recording pass-through router ----------------------------------------------------------


@dataclass
class Relayed:
    """One /generate request as the router passed it on, with what the server said it decoded."""

    stream: bool
    events: int = 0
    completion_tokens: int | None = None
    finish: str | None = None
    client_left: bool = False
    done: bool = False


class RecordingRouter:
    """What slime's router does for one worker, on a loop of its own (as tests/live/test_slime_loop.py's
    ``PassThroughRouter``; PyPI's sglang-router drops ``return_routed_experts``): every request is
    passed on byte for byte and the response streamed back as it comes. ``GET /workers`` lists the
    router itself, so the aborts and load polls of both slime and fastaccum pass through it and are
    recorded. After a client leaves, it reads the server's response to its end (recording only)."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self.url = ""
        self.generates: list[Relayed] = []
        self.aborts: list[dict[str, Any]] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="router")
        self._runner: Any = None
        self._session: Any = None
        self._relays: set[asyncio.Task[None]] = set()

    def __enter__(self) -> RecordingRouter:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def settled(self) -> bool:
        return all(r.done for r in self.generates)

    async def _start(self) -> None:
        import aiohttp
        from aiohttp import web

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), trust_env=False)
        app = web.Application()
        app.router.add_get("/workers", self._workers)
        app.router.add_route("*", "/{path:.*}", self._pass)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"

    async def _stop(self) -> None:
        for task in list(self._relays):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _workers(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"workers": [{"url": self.url}]})

    async def _pass(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.read()
        record = None
        if request.path == "/generate":
            record = Relayed(stream=bool(json.loads(body).get("stream")))
            self.generates.append(record)
        elif request.path == "/abort_request":
            self.aborts.append({**json.loads(body or b"{}"), "at": time.monotonic()})
        response = web.StreamResponse()
        # The relay runs in a task of its own: a client that leaves must not stop it.
        relay = asyncio.get_running_loop().create_task(self._relay(request, body, response, record))
        self._relays.add(relay)
        relay.add_done_callback(self._relays.discard)
        await asyncio.shield(relay)
        return response

    async def _relay(self, request: Any, body: bytes, response: Any, record: Relayed | None) -> None:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        buffer = b""
        left = False
        try:
            async with self._session.request(
                request.method, self.worker + request.path_qs, data=body, headers=headers
            ) as upstream:
                response.set_status(upstream.status)
                for key in ("Content-Type", "Cache-Control"):
                    if key in upstream.headers:
                        response.headers[key] = upstream.headers[key]
                await response.prepare(request)
                async for data in upstream.content.iter_any():
                    if record is not None:
                        buffer = self._record(record, buffer + data)
                    if not left:
                        try:
                            await response.write(data)
                        except Exception:  # the client left: read on, record only
                            left = True
                if record is not None and not record.stream and buffer:
                    meta = json.loads(buffer).get("meta_info", {})
                    record.completion_tokens = meta.get("completion_tokens")
                    record.finish = (meta.get("finish_reason") or {}).get("type")
                if not left:
                    with contextlib.suppress(Exception):
                        await response.write_eof()
        finally:
            if record is not None:
                record.client_left = left
                record.done = True

    @staticmethod
    def _record(record: Relayed, buffer: bytes) -> bytes:
        if not record.stream:
            return buffer
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            if event.startswith(b"data: {"):
                meta = json.loads(event[6:]).get("meta_info", {})
                record.events += 1
                record.completion_tokens = meta.get("completion_tokens")
                record.finish = (meta.get("finish_reason") or {}).get("type") or record.finish
        return buffer


# ---- slime's side ---------------------------------------------------------------------------------


@dataclass
class Answer:
    """The server's own non-streaming answer to a prompt (the reference every sample is held to)."""

    prompt_ids: list[int]
    tokens: list[int]
    logprobs: list[float]
    experts: Any  # (prompt + tokens - 1, layers, top-k) int32


def answers(url: str, prompts: list[list[int]], params: dict[str, Any]) -> list[Answer]:
    out = []
    for ids in prompts:
        body = {"input_ids": ids, "sampling_params": params, "return_logprob": True, "return_routed_experts": True}
        ref = post_json(url + "/generate", body)
        meta = ref["meta_info"]
        experts = np.frombuffer(base64.b64decode(meta["routed_experts"]), dtype="<i4").reshape(-1, *EXPERTS)
        logprobs = [float(lp) for lp, _, _ in meta["output_token_logprobs"]]
        out.append(Answer(ids, list(ref["output_ids"]), logprobs, experts))
    return out


def make_args(env: Any, host: str, port: int, target: Target, model: Path, options: Any, **overrides: Any) -> Any:
    where = SimpleNamespace(host=host, port=port, expert_shape=EXPERTS, incremental_streaming_output=target.incremental)
    overrides.setdefault("sglang_server_concurrency", options.streams)  # every sample runs at once
    args = harness.make_args(
        env,
        where,
        hf_checkpoint=str(model),
        rollout_temperature=0.0,  # greedy: every sample has one right answer, the server's
        rollout_max_response_len=options.tokens,
        n_samples_per_prompt=options.group_size,
        **overrides,
    )
    # fastaccum's default settings (the harness shortens its idle wait for the tests)
    for name in ("fastaccum_idle_timeout", "fastaccum_idle_poll_interval", "fastaccum_shards"):
        delattr(args, name)
    return args


def prompt_texts(options: Any) -> list[str]:
    """One prompt per group."""
    groups = options.streams // options.group_size
    return [TEXTS[g % len(TEXTS)] + ("" if g < len(TEXTS) else f" {g}") for g in range(groups)]


def new_groups(env: Any, options: Any) -> list[list[Any]]:
    """Fresh samples: ``group_size`` per prompt, as slime's data source makes them."""
    n = options.group_size
    return [
        [env.Sample(index=g * n + i, group_index=g, prompt=text) for i in range(n)]
        for g, text in enumerate(prompt_texts(options))
    ]


def state_for(env: Any, args: Any) -> Any:
    """slime's ``GenerateState`` (made before any timing: it loads the tokenizer); the rollout's
    sampling parameters with ``ignore_eos``, so that every sample runs its whole length."""
    state = env.rollout.GenerateState(args)
    state.sampling_params["ignore_eos"] = True
    return state


def compare(sample: Any, ref: Answer) -> dict[str, bool]:
    """What the sample holds, against the answer's first ``response_length`` tokens."""
    k = sample.response_length
    tokens = sample.tokens == ref.prompt_ids + ref.tokens[:k]
    logprobs = sample.rollout_log_probs is not None and sample.rollout_log_probs == ref.logprobs[:k]
    experts = sample.rollout_routed_experts
    rows = len(ref.prompt_ids) + k - 1
    has_experts = experts is not None and tuple(experts.shape) == (rows, *EXPERTS)
    equal_experts = has_experts and bool(np.array_equal(np.asarray(experts), ref.experts[:rows]))
    return {"tokens": tokens, "logprobs": logprobs, "experts": has_experts, "experts_equal": equal_experts}


@dataclass
class CpuRun:
    function: str
    tokens: int
    wall_s: float
    user_s: float
    sys_s: float
    server: dict[str, list[float]]
    equal_samples: int
    samples: int


def fresh_http_client(env: Any, args: Any) -> None:
    """A new slime httpx client: SGLang's uvicorn closes a connection idle for 5 s
    (``SGLANG_TIMEOUT_KEEP_ALIVE``), and a pooled one reused at that moment fails with
    ``httpx.ReadError`` (seen here when a run started 5 s after the last one of the same client);
    ``generate_streaming`` does not retry. A fresh client opens its connections in the run."""
    client = env.http_utils._http_client
    if client is not None:
        env.run(client.aclose())
        env.http_utils._http_client = None
    env.http_utils.init_http_client(args)


def cpu_run(env: Any, args: Any, function: str, options: Any, refs: list[Answer], pids: dict[int, str]) -> CpuRun:
    env.reset()
    fresh_http_client(env, args)
    args.custom_generate_function_path = function
    state = state_for(env, args)
    groups = new_groups(env, options)

    async def main() -> Any:
        return await asyncio.gather(
            *(env.rollout.generate_and_rm_group(args, group, state.sampling_params.copy()) for group in groups),
            return_exceptions=True,  # every group ends before a failure is raised: none runs on
        )

    server0 = server_cpu(pids)
    usage0, wall0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    results = env.run(main())
    usage1, wall1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    server1 = server_cpu(pids)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    samples = [s for group in groups for s in group]
    total = sum(s.response_length for s in samples)
    if total != options.streams * options.tokens:
        raise AssertionError(f"{function}: {total} tokens, not {options.streams * options.tokens}")
    seen = [compare(s, refs[s.group_index]) for s in samples]
    equal = sum(c["tokens"] and c["logprobs"] for c in seen)
    server = {
        role: [server1[role][0] - server0.get(role, [0, 0])[0], server1[role][1] - server0.get(role, [0, 0])[1]]
        for role in server1
    }
    return CpuRun(
        function,
        total,
        wall1 - wall0,
        usage1.ru_utime - usage0.ru_utime,
        usage1.ru_stime - usage0.ru_stime,
        server,
        equal,
        len(samples),
    )


@dataclass
class AbortRun:
    function: str
    abort: str  # "slime abort_all" | "fastaccum request_abort (drain)"
    pool: int  # slime's httpx connections (--sglang-server-concurrency x engines; its semaphore too)
    kept: int = 0
    decoded: int = 0
    samples: int = 0
    with_experts: int = 0
    experts_equal: int = 0
    with_logprobs: int = 0
    tokens_equal: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    buffered_groups: int = 0
    abort_all: int = 0
    rid_aborts: int = 0
    client_left: int = 0
    reached_s: float | None = None  # from the abort call to its first /abort_request at the router
    took_s: float | None = None  # the abort call's duration
    error: str | None = None


def abort_run(
    env: Any,
    args: Any,
    function: str,
    how: str,
    pool: int,
    options: Any,
    refs: list[Answer],
    router: RecordingRouter,
) -> AbortRun:
    env.reset()
    args.sglang_server_concurrency = pool
    fresh_http_client(env, args)
    args.custom_generate_function_path = function
    state = state_for(env, args)
    groups = new_groups(env, options)
    router.generates.clear()
    router.aborts.clear()
    label = "slime `abort` (abort_all until idle)" if how == "stock" else "fastaccum `request_abort`"
    run = AbortRun(function, label, pool)
    called: list[float] = []

    async def main() -> list[list[Any]]:
        state.submit_generate_tasks(groups)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 120
        while True:  # until the server runs every sample's request
            (load,) = (await asyncio.to_thread(get_json, router.worker + "/v1/loads"))["loads"]
            if load["num_running_reqs"] >= options.streams:
                break
            if loop.time() > deadline:
                raise RuntimeError("the requests did not all start")
            await asyncio.sleep(0.01)
        await asyncio.sleep(options.abort_after)
        called.append(time.monotonic())
        try:
            if how == "stock":
                return list(await env.rollout.abort(args, 0))
            return list(await fs.request_abort(args, 0))
        finally:
            called.append(time.monotonic())
            if state.pendings:  # an error left some: let them end (the abort ended their requests)
                await asyncio.gather(*state.pendings, return_exceptions=True)

    try:
        buffered = env.run(main())
        run.buffered_groups = len(buffered)
    except Exception as exc:  # recorded, e.g. slime's ValueError on routed experts in incremental mode
        run.error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    deadline = time.monotonic() + 60
    while not router.settled() and time.monotonic() < deadline:
        time.sleep(0.02)
    wait_idle(router.worker)
    samples = [s for group in groups for s in group]
    run.samples = len(samples)
    run.kept = sum(s.response_length for s in samples)
    run.decoded = sum(r.completion_tokens or 0 for r in router.generates)
    run.client_left = sum(r.client_left for r in router.generates)
    for s in samples:
        seen = compare(s, refs[s.group_index])
        run.with_experts += seen["experts"]
        run.experts_equal += seen["experts_equal"]
        run.with_logprobs += s.rollout_log_probs is not None and len(s.rollout_log_probs) == s.response_length
        run.tokens_equal += seen["tokens"] and seen["logprobs"]
        name = s.status.name
        run.statuses[name] = run.statuses.get(name, 0) + 1
    run.abort_all = sum(1 for body in router.aborts if body.get("abort_all"))
    run.rid_aborts = sum(1 for body in router.aborts if body.get("rid"))
    if called and router.aborts:
        run.reached_s = min(body["at"] for body in router.aborts) - called[0]
    if len(called) == 2:
        run.took_s = called[1] - called[0]
    return run


@dataclass
class Defect:
    """Stock generate_streaming on an incremental server: what each sample kept."""

    kept: list[int]
    answer_tokens: int
    kept_is_answer_tail: int
    statuses: dict[str, int]
    rewards: list[float]
    routed_error: str | None
    example: dict[str, Any]


def defect_run(env: Any, args: Any, options: Any, refs: list[Answer]) -> Defect:
    def once(replay: bool) -> tuple[list[Any], str | None]:
        env.reset()
        fresh_http_client(env, args)
        args.custom_generate_function_path = IN_TREE
        args.use_rollout_routing_replay = replay
        state = state_for(env, args)
        groups = new_groups(env, options)

        async def main() -> Any:
            return await asyncio.gather(
                *(env.rollout.generate_and_rm_group(args, group, state.sampling_params.copy()) for group in groups),
                return_exceptions=True,
            )

        results = env.run(main())
        errors = [r for r in results if isinstance(r, BaseException)]
        wait_idle(args_url(args))
        error = f"{type(errors[0]).__name__}: {str(errors[0]).splitlines()[0][:200]}" if errors else None
        return [s for group in groups for s in group], error

    samples, _ = once(False)
    _, routed_error = once(True)
    args.use_rollout_routing_replay = False
    tails = 0
    statuses: dict[str, int] = {}
    for s in samples:
        ref = refs[s.group_index]
        k = s.response_length
        tails += k > 0 and s.tokens[len(ref.prompt_ids) :] == ref.tokens[len(ref.tokens) - k :]
        statuses[s.status.name] = statuses.get(s.status.name, 0) + 1
    first = samples[0]
    ref = refs[first.group_index]
    example = {
        "sample_response_tokens": first.tokens[len(ref.prompt_ids) :],
        "answer_last_tokens": ref.tokens[-max(1, first.response_length) :],
        "answer_length": len(ref.tokens),
        "sample_response_text": first.response,
    }
    return Defect(
        [s.response_length for s in samples],
        options.tokens,
        tails,
        statuses,
        [float(s.reward) if s.reward is not None else float("nan") for s in samples],
        routed_error,
        example,
    )


def args_url(args: Any) -> str:
    return f"http://{args.sglang_router_ip}:{args.sglang_router_port}"


@contextlib.contextmanager
def model_tokenizer(env: Any, model: Path) -> Any:
    """slime's ``load_tokenizer`` (the stubbed ``transformers.AutoTokenizer``) gives the model's own."""
    tokenizer = live_helpers.ModelTokenizer(model)
    auto = sys.modules["transformers"].AutoTokenizer
    original = auto.__dict__["from_pretrained"]
    auto.from_pretrained = staticmethod(lambda *a, **k: tokenizer)
    try:
        yield tokenizer
    finally:
        auto.from_pretrained = original


# ---- one server -----------------------------------------------------------------------------------


def measure(target: Target, model: Path, options: Any) -> dict[str, Any]:
    logging.disable(logging.WARNING)  # slime warns per GenerateState that the stub has no processor
    # A sample task of a group whose gather failed first (slime's ValueError on routed experts in
    # incremental mode) fails the same way, unretrieved: that is recorded once, not logged per task.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    host, port = target.url.removeprefix("http://").split(":")
    pids = roles(target)
    out: dict[str, Any] = {
        "mode": target.mode,
        "interval": target.interval,
        "roles": {str(p): r for p, r in pids.items()},
        "other_sglang_servers": other_sglang_servers(target),
    }
    _say(f"{target.mode}, --stream-interval {target.interval}: server processes {out['roles']}")
    with harness.slime_env("real", options.slime) as env, model_tokenizer(env, model) as tokenizer:
        if env.line != "stock":
            raise SystemExit(
                f"{options.slime} is the request-abort line of slime; this compares stock slime's functions"
            )
        args = make_args(env, host, int(port), target, model, options)
        env.http_utils.init_http_client(args)
        params = state_for(env, args).sampling_params.copy()
        prompts = [tokenizer.encode(text) for text in prompt_texts(options)]
        refs = answers(target.url, prompts, params)
        out["sampling_params"] = params

        functions = [NON_STREAMING, FASTACCUM] + ([] if target.incremental else [IN_TREE])
        runs: dict[str, list[CpuRun]] = {f: [] for f in functions}
        if options.rounds:
            errors: list[str] = []

            def attempt(function: str) -> CpuRun:
                """A run that fails is recorded and run again (twice at most)."""
                for tries in range(3):
                    try:
                        return cpu_run(env, args, function, options, refs, pids)
                    except Exception as exc:
                        errors.append(f"{function}: {type(exc).__name__}: {str(exc)[:200]}")
                        _say(f"run failed ({errors[-1]}); again")
                        wait_idle(target.url)
                        if tries == 2:
                            raise
                raise AssertionError("unreachable")

            for function in functions:  # warm-up: pools, the mode check, the server's first requests
                attempt(function)
            for r in range(options.rounds):
                for function in functions:
                    runs[function].append(attempt(function))
                _say(f"round {r + 1}/{options.rounds} done")
            out["cpu_errors"] = errors
        out["cpu"] = {f: [asdict(run) for run in rs] for f, rs in runs.items()}

        if target.incremental:
            _say("stock generate_streaming on the incremental server")
            out["defect"] = asdict(defect_run(env, args, options, refs))

        if options.abort_after is None:
            walls = [run.wall_s for run in runs.get(NON_STREAMING, [])]
            options.abort_after = (min(walls) / 2) if walls else 1.5
        out["abort_after_s"] = options.abort_after
        with RecordingRouter(target.url) as router:
            rhost, rport = router.url.removeprefix("http://").split(":")
            abort_args = make_args(
                env,
                rhost,
                int(rport),
                target,
                model,
                options,
                use_rollout_routing_replay=True,
                partial_rollout=True,
            )
            # slime's httpx pool has as many connections as its semaphore has slots: with every one
            # held by a non-streaming request, the abort's own requests wait for a response to end.
            # The comparison gives the pool spare connections; the last case shows the full one.
            spare, full = 2 * options.streams, options.streams
            cases = [
                (NON_STREAMING, "stock", spare),
                (IN_TREE, "stock", spare),
                (FASTACCUM, "stock", spare),
                (FASTACCUM, "fastaccum", spare),
                (NON_STREAMING, "stock", full),
            ]
            aborts = []
            for function, how, pool in cases:
                _say(f"abort: {function} with {how} abort, {pool} connections")
                aborts.append(asdict(abort_run(env, abort_args, function, how, pool, options, refs, router)))
            out["aborts"] = aborts
    return out


def _say(message: str) -> None:
    print(f"[slime_live] {message}", file=sys.stderr, flush=True)


# ---- tables -------------------------------------------------------------------------------------


def best(runs: list[dict[str, Any]], key: Any) -> dict[str, Any]:
    return min(runs, key=key)


def client_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| SGLang mode | stream interval | generate function | user µs/token | system µs/token | total | "
        "× non-streaming | wall s | tokens/s | samples equal to the answer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        cpu = res.get("cpu", {})
        if not cpu.get(NON_STREAMING):
            continue
        base = best(cpu[NON_STREAMING], lambda r: r["user_s"] + r["sys_s"])
        base_total = (base["user_s"] + base["sys_s"]) / base["tokens"] * 1e6
        for function in (NON_STREAMING, IN_TREE, FASTACCUM):
            if not cpu.get(function):
                if function == IN_TREE and res["mode"] == "incremental":
                    lines.append(
                        f"| {res['mode']} | {res['interval']} | {LABEL[function]} | – | – | – | – | – | – | "
                        "keeps only the last delta (below) |"
                    )
                continue
            run = best(cpu[function], lambda r: r["user_s"] + r["sys_s"])
            user, system = run["user_s"] / run["tokens"] * 1e6, run["sys_s"] / run["tokens"] * 1e6
            lines.append(
                f"| {res['mode']} | {res['interval']} | {LABEL[function]} | {user:.1f} | {system:.1f} | "
                f"{user + system:.1f} | {(user + system) / base_total:.2f} | {run['wall_s']:.1f} | "
                f"{run['tokens'] / run['wall_s']:,.0f} | {run['equal_samples']}/{run['samples']} |"
            )
    return "\n".join(lines)


def server_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| SGLang mode | stream interval | requests (client) | main: HTTP + tokenizer manager, user + sys µs/token | "
        "detokenizer | scheduler | server total |",
        "|---|---|---|---|---|---|---|",
    ]
    kinds = {NON_STREAMING: "non-streaming (slime `generate`)", IN_TREE: "streaming (slime `generate_streaming`)"}
    kinds[FASTACCUM] = "streaming (`fastaccum.slime.generate`)"

    def total(run: dict[str, Any]) -> float:
        return sum(u + s for u, s in run["server"].values())

    for res in results:
        cpu = res.get("cpu", {})
        for function in (NON_STREAMING, FASTACCUM, IN_TREE):
            if not cpu.get(function) or not cpu[function][0]["server"]:
                continue
            run = best(cpu[function], total)
            cells = []
            for role in ("main", "detokenizer", "scheduler"):
                user, system = (x / run["tokens"] * 1e6 for x in run["server"].get(role, [0.0, 0.0]))
                cells.append(f"{user:.0f} + {system:.0f}")
            lines.append(
                f"| {res['mode']} | {res['interval']} | {kinds[function]} | {' | '.join(cells)} | "
                f"{total(run) / run['tokens'] * 1e6:.0f} |"
            )
    return "\n".join(lines)


def abort_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| SGLang mode | stream interval | generate function | rollout abort | slime pool | abort reached the "
        "server after | abort returned after | tokens kept / decoded by the server | samples with routed experts "
        "(equal to the answer's) | samples with log-probs | samples equal to the answer's prefix | statuses | "
        "groups returned to buffer | `abort_all` / by-rid aborts |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for run in res.get("aborts", []):
            statuses = ", ".join(f"{k} {v}" for k, v in sorted(run["statuses"].items()))
            if run["error"]:
                statuses += f"; **{run['error']}**"
            share = f" ({run['kept'] / run['decoded']:.0%})" if run["decoded"] else ""
            reached = f"{run['reached_s']:.2f} s" if run["reached_s"] is not None else "–"
            took = f"{run['took_s']:.2f} s" if run["took_s"] is not None else "–"
            lines.append(
                f"| {res['mode']} | {res['interval']} | {LABEL[run['function']]} | {run['abort']} | {run['pool']} | "
                f"{reached} | {took} | {run['kept']:,} / {run['decoded']:,}{share} | {run['with_experts']} "
                f"({run['experts_equal']}) / {run['samples']} | {run['with_logprobs']}/{run['samples']} | "
                f"{run['tokens_equal']}/{run['samples']} | {statuses} | {run['buffered_groups']} | "
                f"{run['abort_all']} / {run['rid_aborts']} |"
            )
    return "\n".join(lines)


def defect_table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| stream interval | samples | tokens the server sent per sample | tokens each sample kept | "
        "kept = the answer's last tokens | statuses | rewards | with routing replay |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        d = res.get("defect")
        if not d:
            continue
        kept = sorted(set(d["kept"]))
        rewards = sorted(set(d["rewards"]))
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(d["statuses"].items()))
        lines.append(
            f"| {res['interval']} | {len(d['kept'])} | {d['answer_tokens']} | {', '.join(map(str, kept))} | "
            f"{d['kept_is_answer_tail']}/{len(d['kept'])} | {statuses} | {', '.join(f'{r:g}' for r in rewards)} | "
            f"{d['routed_error'] or 'no error'} |"
        )
    return "\n".join(lines)


def machine(options: Any, results: list[dict[str, Any]], version: str) -> list[str]:
    model = "?"
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    import fastaccum

    commit = options.slime_commit
    if not commit:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            commit = subprocess.run(
                ["git", "-C", options.slime, "rev-parse", "--short=9", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
    here = options.fastaccum_commit
    if not here:
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            here = subprocess.run(
                ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
            ).stdout.strip()
    from fastaccum._impl import IMPLEMENTATION

    others = max((r.get("other_sglang_servers", 0) for r in results), default=0)
    afters = [r["abort_after_s"] for r in results if "abort_after_s" in r] or [0.0]
    after = f"{min(afters):.2f}" + ("" if max(afters) == min(afters) else f" to {max(afters):.2f}")
    return [
        f"- machine: {model}, {os.cpu_count()} vCPU (server pinned to core 0, this process on the other), "
        f"CPython {platform.python_version()}, {time.strftime('%Y-%m-%d')}",
        f"- SGLang {version} (tools/live), tiny MoE model; stock slime at `{commit or options.slime}`; "
        f"fastaccum {fastaccum.__version__} at `{here or '?'}` ({IMPLEMENTATION} core, from "
        f"{Path(fastaccum.__file__).parent.parent}, files of {build_stamp()})"
        + ("" if build_stamp() == BUILD_AT_START else f"; **reinstalled during the run (at start: {BUILD_AT_START})**"),
        f"- {options.streams} samples ({options.streams // options.group_size} prompts × {options.group_size}), "
        f"{options.tokens} tokens each, greedy, `ignore_eos`; client CPU best of {options.rounds} interleaved rounds "
        f"after a warm-up; each abort {after} s after the server ran every request (half the non-streaming "
        "run's wall time)",
        f"- other SGLang servers on the machine during the runs: {others}",
    ]


def render(results: list[dict[str, Any]], facts: list[str]) -> str:
    parts = ["### Machine", "", *facts, ""]
    parts += ["### Client CPU per token (this process: getrusage)", "", client_table(results), ""]
    parts += ["### Server CPU per token, per process (/proc/<pid>/stat)", "", server_table(results), ""]
    parts += ["### What a rollout abort keeps (routing replay on)", "", abort_table(results), ""]
    if any(r.get("defect") for r in results):
        parts += ["### Stock `generate_streaming` on an incremental server", "", defect_table(results), ""]
        for r in results:
            if r.get("defect"):
                ex = r["defect"]["example"]
                parts.append(
                    f"- interval {r['interval']}, sample 0: response tokens {ex['sample_response_tokens']} "
                    f"(text {ex['sample_response_text']!r}); the server's answer has {ex['answer_length']} tokens, "
                    f"ending {ex['answer_last_tokens']}"
                )
        parts.append("")
    return "\n".join(parts)


# ---- command line -------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--slime",
        default=os.environ.get("FASTACCUM_SLIME_PATH", "").split(os.pathsep)[0],
        help="a stock THUDM/slime checkout (exported work tree)",
    )
    parser.add_argument(
        "--slime-commit", default="", help="the checkout's commit, for the report (an export has no .git)"
    )
    parser.add_argument("--fastaccum-commit", default="", help="fastaccum's commit, for the report (default: git's)")
    parser.add_argument("--url", default="", help="a running SGLang server instead of starting them")
    parser.add_argument("--modes", default="cumulative,incremental", help="stream modes to start servers in")
    parser.add_argument("--intervals", default="1,20", help="--stream-interval values to start servers with")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4, help="samples per prompt (n_samples_per_prompt)")
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--abort-after",
        type=float,
        default=None,
        help="seconds from all requests running to the abort (default: half the non-streaming run's wall time)",
    )
    parser.add_argument("--report", default="", help="write the tables and the machine's facts here (markdown)")
    parser.add_argument("--json", default="", help="write the raw figures here")
    parser.add_argument("--from-json", default="", help="print the tables of an earlier run's --json file")
    options = parser.parse_args()
    if options.from_json:
        saved = json.loads(Path(options.from_json).read_text())
        print(render(saved["servers"], saved["machine"]))
        return 0
    if not options.slime or not (Path(options.slime) / "slime" / "rollout" / "sglang_streaming_rollout.py").exists():
        print(
            "slime_live.py: needs --slime PATH, a stock slime checkout with sglang_streaming_rollout", file=sys.stderr
        )
        return 2
    options.slime = str(Path(options.slime).resolve())
    if options.streams % options.group_size:
        parser.error("--streams must be a multiple of --group-size")
    abort_after = options.abort_after
    results = []
    version = "?"
    if options.url:
        url = options.url.rstrip("/")
        pid = listening_pid(int(url.rsplit(":", 1)[1]))
        session = int(_stat_fields(pid)[3]) if pid else None
        target = target_of(url, session)
        version = target.version
        model = Path(get_json(url + "/server_info")["model_path"])
        results.append(measure(target, model, options))
    else:
        for mode in options.modes.split(","):
            for interval in (int(x) for x in options.intervals.split(",")):
                options.abort_after = abort_after
                with engines.Server("sglang", incremental=mode == "incremental", stream_interval=interval) as server:
                    assert server.proc is not None
                    target = target_of(server.url, server.proc.pid)
                    assert target.incremental == (mode == "incremental") and target.interval == interval, target
                    version = target.version
                    results.append(measure(target, server.model, options))
                if options.json:  # each server's figures as soon as they are measured
                    Path(options.json).write_text(json.dumps({"machine": [], "servers": results}, default=str))
    facts = machine(options, results, version)
    text = render(results, facts)
    print(text)
    if options.report:
        Path(options.report).write_text(text)
    if options.json:
        Path(options.json).write_text(json.dumps({"machine": facts, "servers": results}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
