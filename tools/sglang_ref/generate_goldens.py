"""Golden /generate SSE streams produced by SGLang's own output code (run with the SGLang venv's python).

    <sglang-venv>/bin/python tools/sglang_ref/generate_goldens.py --out tests/golden

Nothing here re-implements SGLang's output path. Per scenario this script
  1. simulates the scheduler's emission rule for the installed version (which steps send ids),
  2. builds real ``BatchTokenIDOutput`` objects (token deltas, logprob slices, ``FINISH_*.to_json()``
     reasons, weight-version spans from SGLang's helper, and the routed experts / indexer top-k
     tensors that SGLang's ``BaseTopkCapturer.get_topk`` gathers at finish),
  3. runs them through SGLang's ``DetokenizerManager.handle_batch_token_id_out`` (text deltas,
     stop trimming, base64 replay arrays) with a toy tokenizer, unless ``--skip-tokenizer-init``,
  4. hands them to a real ``TokenizerManager``'s ``_handle_batch_output`` / ``_handle_abort_req``
     and drains its real per-request stream (``_stream_one_response`` / ``_wait_one_response``:
     frame dropping, ``_coalesce_streaming_chunks``),
  5. serves the result through SGLang's real FastAPI app (``POST /generate``, SSE framing, error
     events, ``[DONE]``) over an in-process ASGI transport, with a fake tokenizer manager whose
     ``generate_request`` is steps 1-4.
The bytes the HTTP client reads are the golden. Token ids, logprobs and texts come from fastaccum's
deterministic token source (``fastaccum/emulator/writer.py::synthetic_generation``, loaded by path: the
package itself is not installed in this venv), so the manifest's expectations are computed
without SGLang. Clocks are replaced by a fixed-step counter so latencies and timestamps are
reproducible. Writes ``<out>/<sglang version>/{*.sse,manifest.json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import SCENARIOS, Scenario, read_plan  # noqa: E402


# ---- deterministic clock --------------------------------------------------------------------
class _StepClock:
    """perf_counter/time replacement: every call advances 1/64 s, so floats print short and exact."""

    STEP = 0.015625

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += self.STEP
        return self.now


_PERF_START = 1000.0
_EPOCH = 1767225600.0
_CLOCK = _StepClock(_PERF_START)
time.perf_counter = _CLOCK  # type: ignore[assignment]
time.time = lambda: _EPOCH + (time.perf_counter() - _PERF_START)  # type: ignore[assignment]
# Where the scenario table starts the clock, once SGLang's output path is imported. Imports read the
# clock too, as many times as the venv's modules happen to: SGLang's req_time_stats twice (its
# offset between the two clocks, time.time() - perf_counter(), one step whatever came before), and
# in a full SGLang install (the live tier's venv) scipy's import also reaches numpy.f2py, which
# reads time.time() once. So the table does not start where the imports left the clock but here,
# where the minimal venv of setup_venv.sh had it (both versions): the goldens do not depend on
# which venv wrote them.
_TABLE_START = _PERF_START + 2 * _StepClock.STEP


# ---- the token source, shared with the emulator ---------------------------------------------
def _load_writer() -> Any:
    spec = importlib.util.spec_from_file_location(
        "fastaccum_writer_standalone", REPO / "fastaccum" / "emulator" / "writer.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


writer = _load_writer()


class ToyTokenizer:
    """Decodes an id to ``TEXT_PIECES[id % len]``, the same rule as ``synthetic_generation``."""

    is_fast = True
    eos_token_id = None
    pad_token_id = None

    def _piece(self, token_id: int) -> str:
        return writer.TEXT_PIECES[int(token_id) % len(writer.TEXT_PIECES)]

    def decode(
        self, ids: Any, skip_special_tokens: bool = False, spaces_between_special_tokens: bool = True, **_: Any
    ) -> str:
        return "".join(self._piece(t) for t in ids)

    def batch_decode(
        self, batch: Any, skip_special_tokens: bool = False, spaces_between_special_tokens: bool = True, **_: Any
    ) -> list[str]:
        return [self.decode(ids) for ids in batch]


# ---- SGLang version adapters ------------------------------------------------------------------
def _version() -> str:
    from sglang.version import __version__

    return __version__


class Sglang:
    """Everything version-specific: building the managers and the batch objects."""

    def __init__(self, model_dir: Path) -> None:
        self.version = _version()
        self.model_dir = model_dir
        from sglang.srt.managers import io_struct, schedule_batch, tokenizer_manager
        from sglang.srt.managers.detokenizer_manager import DetokenizerManager

        self.io = io_struct
        self.sb = schedule_batch
        self.tm_mod = tokenizer_manager
        self.Detok = DetokenizerManager
        self.server_args: Any = None

    # server args: parsed by SGLang's own CLI parser
    def configure(self, sc: Scenario) -> None:
        from sglang.srt.server_args import prepare_server_args

        argv = ["--model-path", str(self.model_dir), "--device", "cpu", "--stream-interval", str(sc.interval)]
        if sc.incremental:
            argv.append("--incremental-streaming-output")
        if sc.skip_tokenizer_init:
            argv.append("--skip-tokenizer-init")
        if sc.experts:
            argv.append("--enable-return-routed-experts")
        if sc.indexer:
            argv.append("--enable-return-indexer-topk")
        self.server_args = prepare_server_args(argv)
        assert bool(self.server_args.incremental_streaming_output) == sc.incremental
        from sglang.srt import runtime_context

        if hasattr(runtime_context, "publish"):  # 0.5.23: process-wide config bags
            runtime_context.publish(self.server_args, role="test")

    def weight_version(self) -> str:
        return "default"

    def tokenizer_manager(self, sc: Scenario) -> Any:
        TM = self.tm_mod.TokenizerManager
        tm = TM.__new__(TM)
        tm.server_args = self.server_args
        tm.rid_to_state = {}
        tm.enable_metrics = False
        tm.enable_lora = False
        tm.enable_trace = False
        tm.incremental_streaming_output = sc.incremental
        tm.skip_tokenizer_init = sc.skip_tokenizer_init
        tm.tokenizer = None if sc.skip_tokenizer_init else ToyTokenizer()
        tm.dump_requests_folder = ""
        tm.crash_dump_folder = None
        tm.model_path = str(self.model_dir)
        tm.served_model_name = str(self.model_dir)
        tm.request_logger = _NullLogger()
        tm.request_metrics_exporter_manager = _NullExporter()
        tm._lora_release_tasks = set()
        tm.asyncio_tasks = set()
        return tm

    def detokenizer(self) -> Any:
        from sglang.srt.managers.detokenizer_manager import LimitedCapacityDict

        d = self.Detok.__new__(self.Detok)
        d.tokenizer = ToyTokenizer()
        d.decode_status = LimitedCapacityDict(capacity=1 << 16)
        d.disable_tokenizer_batch_decode = False
        d.is_tool_call_parser_gpt_oss = False
        d.tool_close_token_ids = set()
        d.vocab_size = None
        return d

    def req_state(self, obj: Any) -> Any:
        RS = self.tm_mod.ReqState
        fields = {f.name for f in dataclasses.fields(RS)}
        kwargs: dict[str, Any] = {"out_list": [], "finished": False, "event": asyncio.Event(), "obj": obj}
        if "time_stats" in fields:
            from sglang.srt.observability.req_time_stats import APIServerReqTimeStats

            stats = APIServerReqTimeStats()
            stats.set_created_time()
            kwargs["time_stats"] = stats
        else:  # older layout: plain timestamps
            kwargs["created_time"] = time.time()
        return RS(**kwargs)

    def stream(self, tm: Any, obj: Any, state: Any) -> Any:
        if hasattr(tm, "_stream_one_response"):
            return tm._stream_one_response(obj=obj, state=state, request=None)
        return tm._wait_one_response(obj, None)  # 0.5.15: looks the state up by rid

    def finish_reason(self, kind: str, gen: Any, n: int) -> dict[str, Any]:
        if kind == "stop":
            return self.sb.FINISH_MATCHED_TOKEN(matched=gen.token_ids[n - 1]).to_json()
        if kind == "length":
            return self.sb.FINISH_LENGTH(length=n).to_json()
        if kind == "abort_running":
            return self.sb.FINISH_ABORT().to_json()
        raise ValueError(kind)

    def weight_spans(self, n: int) -> Any:
        try:
            from sglang.srt.utils.weight_versions import compute_weight_version_spans
        except ImportError:
            return None
        return compute_weight_version_spans([], current_version=self.weight_version(), num_output_tokens=n)

    def token_batch(
        self, sc: Scenario, gen: Any, rid: str, prompt_ids: list[int], start: int, end: int, finish: dict | None
    ) -> Any:
        """The BatchTokenIDOutput the scheduler sends when ids [start, end) go out."""
        io = self.io
        fields = set(io.BatchTokenIDOutput.__struct_fields__)
        ids = list(gen.token_ids[start:end])
        # Incremental detokenization starts from a surrogate window of the prompt's last 5 ids.
        if start == 0:
            decode_ids, read_offset = prompt_ids[-5:] + ids, len(prompt_ids[-5:])
        else:
            decode_ids, read_offset = ids, 0
        lp = [(-float("inf") if v is None else v) for v in gen.logprobs[start:end]]
        kw: dict[str, Any] = dict(
            rids=[rid],
            http_worker_ipcs=[None],
            finished_reasons=[finish],
            decoded_texts=[""],
            decode_ids=[decode_ids],
            read_offsets=[read_offset],
            output_ids=[ids],
            skip_special_tokens=[True],
            spaces_between_special_tokens=[True],
            no_stop_trim=[sc.no_stop_trim],
            prompt_tokens=[len(prompt_ids)],
            reasoning_tokens=[0],
            completion_tokens=[end],
            cached_tokens=[0],
            cached_tokens_details=[None],
            input_token_logprobs_val=[[]] if sc.logprob else None,
            input_token_logprobs_idx=[[]] if sc.logprob else None,
            output_token_logprobs_val=[lp] if sc.logprob else None,
            output_token_logprobs_idx=[ids] if sc.logprob else None,
            input_top_logprobs_val=[[]] if sc.logprob else None,
            input_top_logprobs_idx=[[]] if sc.logprob else None,
            output_top_logprobs_val=[[]] if sc.logprob else None,
            output_top_logprobs_idx=[[]] if sc.logprob else None,
            input_token_ids_logprobs_val=[[]] if sc.logprob else None,
            input_token_ids_logprobs_idx=[[]] if sc.logprob else None,
            output_token_ids_logprobs_val=[[]] if sc.logprob else None,
            output_token_ids_logprobs_idx=[[]] if sc.logprob else None,
            output_token_entropy_val=None,
            output_token_sampling_mask=None,
            output_hidden_states=None,
            routed_experts=None,
            indexer_topk=None,
            placeholder_tokens_idx=None,
            placeholder_tokens_val=None,
            retraction_counts=[0],
            weight_versions=None,
            customized_info=None,
            time_stats=None,
            dp_ranks=[self.dp_rank()],
            image_tokens=[0],
            audio_tokens=[0],
            video_tokens=[0],
        )
        # Replay arrays are collected only when the request finishes (abort included): the terminal
        # batch only, gathered by SGLang's capturer from a host cache holding every position.
        if sc.experts:
            rows = gather_rows(self.capture_source(sc, "experts"), len(prompt_ids) + end, sc.routed_start)
            kw["routed_experts"] = [rows if finish is not None else None]
        if sc.indexer:
            rows = gather_rows(self.capture_source(sc, "indexer"), len(prompt_ids) + end, 0)  # no start len
            kw["indexer_topk"] = [rows if finish is not None else None]
        if finish is not None:
            spans = self.weight_spans(end)
            if spans is not None:
                kw["weight_versions"] = [spans]
        kw = {k: v for k, v in kw.items() if k in fields}
        # Fields this script does not know (a newer or older layout) get None, as in a batch where
        # no request asked for them.
        for name in io.BatchTokenIDOutput.__struct_fields__:
            kw.setdefault(name, None)
        return io.BatchTokenIDOutput(**kw)

    def capture_source(self, sc: Scenario, what: str) -> Any:
        """What the capturer's host cache holds for each position of the sequence (the routed
        experts from position 0, whatever the request's start len)."""
        full = writer.synthetic_generation(
            f"golden-{sc.name}",
            sc.n,
            seed=sc.seed,
            prompt_tokens=sc.prompt_tokens,
            expert_shape=sc.experts if what == "experts" else None,
            indexer_shape=sc.indexer if what == "indexer" else None,
        )
        return full.routed_experts if what == "experts" else full.indexer_topk

    def dp_rank(self) -> Any:
        # The scheduler sends get_parallel().dp_rank, which is None without a data-parallel
        # controller (single replica): the wire shows "dp_rank":null.
        return None

    def abort_req(self, rid: str, produced: int) -> Any:
        kwargs: dict[str, Any] = {"rid": rid}
        spans = self.weight_spans(produced)
        if spans is not None and "weight_versions" in self.io.AbortReq.__struct_fields__:
            kwargs["weight_versions"] = spans
        return self.io.AbortReq(**kwargs)


def gather_rows(per_position: Any, seqlen: int, start_len: int) -> Any:
    """The rows SGLang's ``BaseTopkCapturer.get_topk`` returns at finish (the batch result processor
    passes seqlen = prompt + output ids, and routed_experts_start_len for the routed experts).

    The real method runs on a stand-in capturer: a host cache indexed by KV slot (positions land in
    scattered slots, as the token pool hands them out) and a one-request req_to_token table.
    """
    import numpy as np
    import torch
    from sglang.srt.state_capturer.base import BaseTopkCapturer

    count = per_position.shape[0]  # prompt + n - 1 positions have a row
    slots = np.random.default_rng(count).permutation(np.arange(3, 3 + 2 * count + 2))[: count + 1]
    cache = np.full((3 + 2 * count + 2, *per_position.shape[1:]), -7, dtype=np.int32)
    cache[slots[:count]] = per_position
    capturer = BaseTopkCapturer.__new__(BaseTopkCapturer)
    capturer.host_cache = type("HostCache", (), {"buffer": torch.from_numpy(cache)})()
    pool = type("ReqToTokenPool", (), {"req_to_token": torch.from_numpy(slots.astype(np.int32)).reshape(1, -1)})()
    return BaseTopkCapturer.get_topk(
        capturer, req_pool_idx=0, seqlen=seqlen, req_to_token_pool=pool, start_len=start_len
    )


class _NullLogger:
    def log_finished_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class _NullExporter:
    def exporter_enabled(self) -> bool:
        return False


# ---- one scenario -----------------------------------------------------------------------------
def emission_steps(sc: Scenario, version: str, produced_total: int) -> list[int]:
    """Token counts after each scheduler step that sends output (the scheduler's rule, per version).

    0.5.23 (output_streamer.py): interval 1 sends every step; else the first ids at once, then
    whenever >= interval ids are unsent. 0.5.15: sends when len(output_ids) % interval == 1 (and
    every step at interval 1). The finishing step always sends.
    """
    points: list[int] = []
    sent = 0
    produced = 0
    while produced < produced_total:
        produced = min(produced + sc.step_tokens, produced_total)
        if produced == produced_total and sc.kind != "echo":
            points.append(produced)
            break
        n = sc.interval
        if version.startswith("0.5.15"):
            send = n == 1 or produced % n == 1
        else:
            unsent = produced - sent
            send = n == 1 or unsent >= n or (sent == 0 and unsent > 0)
        if send:
            points.append(produced)
            sent = produced
    return points


async def run_scenario(sg: Sglang, sc: Scenario) -> tuple[bytes, dict[str, Any]]:
    """Drive SGLang's code for one scenario; return the SSE body and the manifest entry."""
    from sglang.srt.entrypoints import http_server

    sg.configure(sc)
    tm = sg.tokenizer_manager(sc)
    detok = sg.detokenizer()
    rid = f"golden-{sc.name}"
    produced_total = sc.n
    gen = writer.synthetic_generation(
        rid,
        produced_total,
        seed=sc.seed,
        prompt_tokens=sc.prompt_tokens,
        expert_shape=sc.experts,
        routed_start=sc.routed_start,
        indexer_shape=sc.indexer,
        null_logprob_every=sc.null_logprob_every,
    )
    prompt_ids = [1000 + i for i in range(sc.prompt_tokens)]
    finish = None if sc.kind == "echo" else sg.finish_reason(sc.kind, gen, produced_total)
    points = emission_steps(sc, sg.version, produced_total)
    delivered = [0]  # ids the HTTP layer has received (prefix kept by a client on error/cut)

    class FakeTokenizerManager:
        """Stands in for the server's TokenizerManager: runs steps 1-4 for the HTTP layer."""

        def create_abort_task(self, obj: Any) -> None:
            return None

        async def generate_request(self, obj: Any, request: Any = None) -> Any:
            obj.normalize_batch_and_arguments()
            state = sg.req_state(obj)
            tm.rid_to_state[obj.rid] = state
            stream = sg.stream(tm, obj, state)
            # As in generate_request, the reader is already waiting on the request's event before
            # the scheduler answers (0.5.15 looks the state up by rid at that moment).
            waiting = asyncio.ensure_future(stream.__anext__())
            await asyncio.sleep(0)

            async def drain() -> Any:
                nonlocal waiting
                if waiting is not None:
                    first, waiting = waiting, None
                    return await first
                return await stream.__anext__()

            for group, with_echo in read_plan(sc, points):
                for k in group:
                    start = points[k - 1] if k else 0
                    terminal = finish if (k == len(points) - 1 and sc.kind != "echo") else None
                    batch = sg.token_batch(sc, gen, rid, prompt_ids, start, points[k], terminal)
                    if not sc.skip_tokenizer_init:
                        batch = detok.handle_batch_token_id_out(batch)
                    await tm._handle_batch_output(batch)
                if with_echo:
                    tm._handle_abort_req(sg.abort_req(rid, produced_total))
                out = await drain()
                if group:
                    delivered[0] = points[group[-1]]
                yield out
            if sc.error_after is not None:
                if waiting is not None:
                    waiting.cancel()
                raise ValueError(sc.error_message)
            async for out in stream:  # the stream ends after the terminal chunk
                yield out

    http_server.set_global_state(
        http_server._GlobalState(tokenizer_manager=FakeTokenizerManager(), template_manager=None, scheduler_info={})
    )
    body: dict[str, Any] = {
        "input_ids": prompt_ids,
        "rid": rid,
        "stream": True,
        "sampling_params": {"max_new_tokens": sc.n if sc.kind == "length" else 4096, "no_stop_trim": sc.no_stop_trim},
    }
    if sc.logprob:
        body["return_logprob"] = True
        if sc.logprob_text:
            body["return_text_in_logprobs"] = True
    if sc.experts:
        body["return_routed_experts"] = True
        if sc.routed_start:
            body["routed_experts_start_len"] = sc.routed_start
    if sc.indexer:
        body["return_indexer_topk"] = True
    status, headers, chunks, cut = await asgi_post(http_server.app, "/generate", json.dumps(body).encode())
    assert status == 200, status
    assert headers.get(b"content-type", b"").startswith(b"text/event-stream"), headers
    if cut != sc.expect_cut:
        raise RuntimeError(f"{sc.name}: SGLang's stream was cut by {cut!r}, expected {sc.expect_cut!r}")
    data = b"".join(chunks)
    entry = manifest_entry(sc, gen, finish, points, body, cut, delivered[0])
    return data, entry


async def asgi_post(app: Any, path: str, body: bytes) -> tuple[int, dict[bytes, bytes], list[bytes], str | None]:
    """POST through the ASGI interface the way uvicorn does; keep every body piece sent.

    Unlike a buffering test transport this keeps the bytes sent before an exception, which is what
    a client sees when the server's generator crashes (the connection is cut, no final chunk).
    """
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"127.0.0.1:30000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 30000),
    }
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays connected; Starlette cancels this listener at the end
        return {"type": "http.disconnect"}

    status = 0
    headers: dict[bytes, bytes] = {}
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers.update((k.lower(), v) for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body":
            if message.get("body"):
                chunks.append(bytes(message["body"]))

    cut: str | None = None
    try:
        await app(scope, receive, send)
    except BaseException as exc:  # noqa: BLE001 - the server's generator crashed: connection cut
        while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            exc = exc.exceptions[0]
        cut = f"{type(exc).__name__}: {exc}"
    return status, headers, chunks, cut


def manifest_entry(
    sc: Scenario,
    gen: Any,
    finish: dict | None,
    points: list[int],
    body: dict[str, Any],
    cut: str | None,
    delivered: int,
) -> dict[str, Any]:
    """What the stream must parse to, computed from the token source and the scenario alone."""
    held = (points[-1] if points else 0) if sc.kind == "echo" else sc.n
    token_ids = list(gen.token_ids[:held])
    text: str | None = None
    if not sc.skip_tokenizer_init:
        text = gen.text(0, held)
        if sc.kind == "stop" and not sc.no_stop_trim:
            text = gen.text(0, held - 1)  # the detokenizer drops the matched stop token's text
        if sc.kind == "echo" and not points:
            # The echo alone cannot tell a text stream from --skip-tokenizer-init (it always holds
            # "text", "" here), and fastaccum reads its text only after text was seen (docs/core.md).
            text = None
    expect: dict[str, Any] = {
        "outcome": "ok",
        "mode": "incremental" if sc.incremental else "cumulative",
        "token_ids": token_ids,
        "logprobs": list(gen.logprobs[:held]) if sc.logprob else None,
        "text": text,
        "finish_reason": finish if finish is not None else {"type": "abort", "message": "Abort in waiting queue"},
        "completion_tokens": held,
        "routed_experts": None,
    }
    if sc.experts and sc.kind != "echo":
        arr = gen.routed_experts
        expect["routed_experts"] = {"shape": list(arr.shape), "values": arr.reshape(-1).tolist()}
    if sc.indexer:
        # Keys only where used: the entries of the other scenarios stay as they were.
        expect["indexer_topk"] = None
        if sc.kind != "echo":  # never on the echo
            arr = gen.indexer_topk
            expect["indexer_topk"] = {"shape": list(arr.shape), "values": arr.reshape(-1).tolist()}
    if sc.error_after is not None:
        expect = {"outcome": "server_error", "status": 400, "message": sc.error_message, "prefix_tokens": delivered}
    if cut is not None:
        expect = {"outcome": "truncated", "server_exception": cut, "prefix_tokens": delivered}
    server: dict[str, Any] = {
        "incremental_streaming_output": sc.incremental,
        "skip_tokenizer_init": sc.skip_tokenizer_init,
        "stream_interval": sc.interval,
        "enable_return_routed_experts": bool(sc.experts),
    }
    source: dict[str, Any] = {
        "rid": f"golden-{sc.name}",
        "n": sc.n,
        "seed": sc.seed,
        "prompt_tokens": sc.prompt_tokens,
        "expert_shape": list(sc.experts) if sc.experts else None,
        "null_logprob_every": sc.null_logprob_every,
    }
    if sc.routed_start:
        source["routed_start"] = sc.routed_start
    if sc.indexer:
        server["enable_return_indexer_topk"] = True
        source["indexer_shape"] = list(sc.indexer)
    return {
        "description": sc.description,
        "request": body,
        "server": server,
        "source": source,
        "scheduler": {
            "step_tokens": sc.step_tokens,
            "emission_points": points,
            "drain_every": sc.drain_every,
            "kind": sc.kind,
        },
        "expect": expect,
        "emulator_comparable": sc.emulator_comparable,
    }


# ---- main -------------------------------------------------------------------------------------
def _import_output_path() -> None:
    """Everything a scenario imports, imported before the table starts the clock (see _TABLE_START)."""
    import numpy  # noqa: F401
    import torch  # noqa: F401
    from sglang.srt import runtime_context  # noqa: F401
    from sglang.srt.entrypoints import http_server  # noqa: F401
    from sglang.srt.managers import detokenizer_manager, tokenizer_manager  # noqa: F401
    from sglang.srt.observability import req_time_stats  # noqa: F401
    from sglang.srt.server_args import prepare_server_args  # noqa: F401
    from sglang.srt.state_capturer import base  # noqa: F401

    try:  # weight-version spans: 0.5.23 (Sglang.weight_spans)
        from sglang.srt.utils import weight_versions  # noqa: F401
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="golden root; files go to OUT/<sglang version>/")
    parser.add_argument(
        "--only",
        nargs="*",
        help="scenario names (default: all): only their files are written, the other entries of an existing "
        "manifest are kept; the scenarios before them still run (unwritten) so the clock matches a full run",
    )
    args = parser.parse_args(argv)

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    with tempfile.TemporaryDirectory(prefix="fastaccum-sglang-model-") as tmp:
        model_dir = Path(tmp)
        # Only config.json: enough for ServerArgs and the runtime context, no weights, no tokenizer.
        (model_dir / "config.json").write_text(json.dumps(_TINY_CONFIG))
        sg = Sglang(model_dir)
        _import_output_path()
        _CLOCK.now = _TABLE_START
        out_dir = args.out / sg.version
        out_dir.mkdir(parents=True, exist_ok=True)
        manifest: dict[str, Any] = {
            "sglang_version": sg.version,
            "generator": "tools/sglang_ref/generate_goldens.py",
            "token_source": "fastaccum/emulator/writer.py::synthetic_generation",
            "scenarios": {},
        }
        kept: dict[str, Any] = {}
        if args.only and (out_dir / "manifest.json").is_file():
            kept = json.loads((out_dir / "manifest.json").read_text())["scenarios"]
        # The step clock runs across the whole table: a scenario's timestamps depend on every
        # scenario run before it, so --only still runs those (and discards their output).
        last = max((k for k, sc in enumerate(SCENARIOS) if not args.only or sc.name in args.only), default=-1)
        for k, sc in enumerate(SCENARIOS):
            if sg.version not in sc.versions and "*" not in sc.versions:
                continue
            selected = not args.only or sc.name in args.only
            if not selected:
                if sc.name in kept:
                    manifest["scenarios"][sc.name] = kept[sc.name]  # in table order, as a full run writes it
                if k < last:
                    asyncio.run(run_scenario(sg, sc))  # advances the clock only
                continue
            data, entry = asyncio.run(run_scenario(sg, sc))
            (out_dir / f"{sc.name}.sse").write_bytes(data)
            entry["file"] = f"{sc.name}.sse"
            entry["bytes"] = len(data)
            manifest["scenarios"][sc.name] = entry
            logging.disable(logging.NOTSET)
            print(f"{sg.version} {sc.name}: {len(data)} bytes, {entry['expect']['outcome']}", file=sys.stderr)
            logging.disable(logging.CRITICAL)
        (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return 0


_TINY_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 151936,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "max_position_embeddings": 4096,
    "torch_dtype": "float32",
}

if __name__ == "__main__":
    os.environ.setdefault("SGLANG_LOGGING_LEVEL", "ERROR")
    sys.exit(main())
