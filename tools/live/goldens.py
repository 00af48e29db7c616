"""Goldens written by real engines: stream bodies captured from live SGLang 0.5.23 and vLLM 0.32.

    python tools/live/goldens.py [--engine sglang|vllm] [--out tests/golden]

starts each server (tools/live/engines.py, one at a time), sends every scenario below twice, once
streaming (the body is the golden, byte for byte as the engine wrote it) and once not (the
engine's own answer to the same request: what the stream must read to), and writes
``<out>/live-<engine>-<version>-<cpu>/`` with a ``manifest.json``. tests/test_golden_live.py
replays every such folder on both twins; the live tiers (tests/live/test_goldens.py) request every
scenario again and hold the new body to the committed one, so a rerun of this script writes the
same stream. Two runs agree on the tokens, text, log-probs and closing fields, not on how the
engine grouped tokens into events, nor on SGLang's timings (``e2e_latency``,
``response_sent_to_client_ts``): the comparison is on ``comparable``'s form.

``<cpu>`` is the instruction set the engines' CPU kernels run on (``cpu_class``). The streams
hold only within one: the tiny random model has near-ties, and the rounding of another set's kernels
(AMX against AVX-512) resolves them differently (docs/live.md has what moved). So a machine
writes, and is checked against, the folder of its own class.

Each scenario runs on an empty prefix cache (SGLang ``/flush_cache``, vLLM ``/reset_prefix_cache``):
a cached prompt changes what the engine reports (``cached_tokens``), not what it generates.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))
import engines  # noqa: E402  (tools/live is no package)

VERSIONS = {"sglang": "0.5.23", "vllm": "0.32.0"}
PATHS = {"sglang": "/generate", "vllm": "/inference/v1/generate"}
FLUSH = {"sglang": "/flush_cache", "vllm": "/reset_prefix_cache"}
# What differs between two runs of the same request on SGLang: wall-clock timings.
VOLATILE = ("e2e_latency", "response_sent_to_client_ts")
OOV = 9999  # an id past the tiny model's 4096-token vocabulary


def _prompt(first: int) -> list[int]:
    # Distinct first tokens: no scenario's prompt is a prefix of another's.
    return [first + 7 * i for i in range(8)]


def _vllm(rid: str, first: int, **params: Any) -> dict[str, Any]:
    request = {"model": engines.MODEL_NAME, "token_ids": _prompt(first), "request_id": rid}
    output_mode = params.pop("output_mode", None)
    if output_mode is not None:
        request["output_mode"] = output_mode
    return {**request, "sampling_params": params}


def _sglang(rid: str, first: int, params: dict[str, Any], **keys: Any) -> dict[str, Any]:
    return {"input_ids": _prompt(first), "rid": rid, "sampling_params": params, **keys}


# name -> (description, request without "stream"); a stop id is filled in from a probe (_stop_id).
SCENARIOS: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    "vllm": {
        "greedy": ("greedy, logprobs=1", _vllm("live-greedy", 101, max_tokens=32, temperature=0, logprobs=1)),
        "seeded": (
            "seeded sampling with top-k, top-p, min-p",
            _vllm(
                "live-seeded", 102, max_tokens=32, temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, seed=7, logprobs=1
            ),
        ),
        "logprobs_3": (
            "logprobs=3 (top log-probs listed)",
            _vllm("live-lp3", 103, max_tokens=16, temperature=0, logprobs=3),
        ),
        "no_logprobs": ("no logprobs asked", _vllm("live-nolp", 104, max_tokens=16, temperature=0)),
        "stop_id": ("a stop token id ends it", _vllm("live-stop", 105, max_tokens=32, temperature=0, logprobs=1)),
        "min_tokens": (
            "a stop id held back by min_tokens",
            _vllm("live-min", 106, max_tokens=32, temperature=0, logprobs=1, min_tokens=12),
        ),
        "max_tokens_1": ("one token", _vllm("live-one", 107, max_tokens=1, temperature=0, logprobs=1)),
        "text_mode": (
            "output_mode text, no logprobs",
            _vllm("live-text", 108, max_tokens=16, temperature=0, output_mode="text"),
        ),
        "error_oov": (
            "an out-of-vocabulary id: an error chunk in a 200 stream",
            {**_vllm("live-oov", 109, max_tokens=4), "token_ids": [109, 116, OOV]},
        ),
    },
    "sglang": {
        "greedy": (
            "greedy with logprobs and text",
            _sglang("live-greedy", 201, {"max_new_tokens": 32, "temperature": 0}, return_logprob=True),
        ),
        "routed_experts": (
            "routed experts (prompt + completion - 1 rows)",
            _sglang(
                "live-experts",
                202,
                {"max_new_tokens": 24, "temperature": 0},
                return_logprob=True,
                return_routed_experts=True,
            ),
        ),
        "stop_id": (
            "a stop token id ends it",
            _sglang("live-stop", 203, {"max_new_tokens": 32, "temperature": 0}, return_logprob=True),
        ),
        "no_logprob": ("no logprobs asked", _sglang("live-nolp", 204, {"max_new_tokens": 16, "temperature": 0})),
        "logprob_text": (
            "return_text_in_logprobs",
            _sglang(
                "live-lptext",
                205,
                {"max_new_tokens": 16, "temperature": 0},
                return_logprob=True,
                return_text_in_logprobs=True,
            ),
        ),
        "max_new_tokens_1": (
            "one token",
            _sglang("live-one", 206, {"max_new_tokens": 1, "temperature": 0}, return_logprob=True),
        ),
    },
}


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _stop_id(engine: str, url: str, request: dict[str, Any]) -> int:
    """The greedy answer's token at position 6, from a probe (the server stops at its first use)."""
    probe = json.loads(json.dumps(request))
    if engine == "vllm":
        probe["request_id"] += "-probe"
        status, answer = _post(url + PATHS[engine], probe)
        return int(json.loads(answer)["choices"][0]["token_ids"][6])
    probe["rid"] += "-probe"
    status, answer = _post(url + PATHS[engine], probe)
    return int(json.loads(answer)["output_ids"][6])


def final_request(engine: str, url: str, name: str, request: dict[str, Any]) -> dict[str, Any]:
    """The request as sent: with its stop id for the stop scenarios."""
    request = json.loads(json.dumps(request))
    if name in ("stop_id", "min_tokens"):
        params = request["sampling_params"]
        probe = json.loads(json.dumps(request))
        probe["sampling_params"].pop("min_tokens", None)
        params["stop_token_ids"] = [_stop_id(engine, url, probe)]
    return request


def streamed(engine: str, request: dict[str, Any]) -> dict[str, Any]:
    body = {**request, "stream": True}
    if engine == "vllm":
        body["stream_options"] = {"include_usage": True}
    return body


def fetch(engine: str, url: str, request: dict[str, Any]) -> tuple[int, bytes, int, bytes]:
    """The stream's status and body, then the non-streaming answer's, each on an empty cache."""
    _post(url + FLUSH[engine], {})
    status, body = _post(url + PATHS[engine], streamed(engine, request))
    _post(url + FLUSH[engine], {})
    answer_request = json.loads(json.dumps(request))
    answer_request["request_id" if engine == "vllm" else "rid"] += "-answer"
    answer_status, answer = _post(url + PATHS[engine], answer_request)
    return status, body, answer_status, answer


# Where each event carries its own tokens, by engine: what one event's worth appends to the last's.
DELTAS: dict[str, tuple[tuple[str | int, ...], ...]] = {
    "sglang": (
        ("text",),
        ("output_ids",),
        ("meta_info", "output_token_logprobs"),
        ("meta_info", "output_top_logprobs"),
    ),
    "vllm": (("choices", 0, "token_ids"), ("choices", 0, "text"), ("choices", 0, "logprobs", "content")),
}


def _at(event: Any, path: tuple[str | int, ...]) -> Any:
    for step in path:
        try:
            event = event[step]
        except (KeyError, IndexError, TypeError):
            return None
    return event


def _carries_tokens(engine: str, event: Any) -> bool:
    if not isinstance(event, dict):
        return False
    return "output_ids" in event if engine == "sglang" else bool(event.get("choices"))


def comparable(body: bytes, engine: str, *, incremental: bool = True) -> list[Any]:
    """A stream body as two runs of one request agree on it: its tokens, not how they were grouped.

    How many tokens an engine puts in one event depends on timing (seen on SGLang at
    ``--stream-interval 1``: two tokens in one event when the client read late), so the events
    that carry tokens become one: the last of them, with every per-token field (ids, text,
    log-probs) joined over the stream (SGLang's cumulative events repeat them: the last holds them
    all). The events without tokens (vLLM's usage chunk, an error, ``[DONE]``) stay as they are,
    and SGLang's wall-clock timings are taken out.
    """
    events: list[Any] = []
    for block in body.split(b"\n\n"):
        if not block.startswith(b"data: "):
            continue
        data = block[6:]
        if data == b"[DONE]":
            events.append("[DONE]")
            continue
        event = json.loads(data)
        meta = event.get("meta_info") if isinstance(event, dict) else None
        if isinstance(meta, dict):
            for key in VOLATILE:
                meta.pop(key, None)
        events.append(event)
    streamed = [event for event in events if _carries_tokens(engine, event)]
    if not streamed:
        return events
    merged = json.loads(json.dumps(streamed[-1]))
    if incremental:
        for path in DELTAS[engine]:
            parts = [part for part in (_at(event, path) for event in streamed) if part is not None]
            if parts:
                _at(merged, path[:-1])[path[-1]] = "".join(parts) if isinstance(parts[0], str) else sum(parts, [])
    return [merged, *(event for event in events if not _carries_tokens(engine, event))]


def cpu_class() -> str:
    """The best of the instruction sets the engines' kernels choose between, on the machine running it."""
    machine = platform.machine()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return machine
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    for flag, name in (("amx_bf16", "amx"), ("avx512_bf16", "avx512bf16"), ("avx512f", "avx512"), ("avx2", "avx2")):
        if flag in flags:
            return name
    return machine


def folder(out: Path, engine: str, cpu: str | None = None) -> Path:
    return out / f"live-{engine}-{VERSIONS[engine]}-{cpu or cpu_class()}"


def capture(engine: str, out: Path) -> None:
    modes = [False, True] if engine == "sglang" else [False]
    target = folder(out, engine)
    target.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {
        "engine": engine,
        "version": VERSIONS[engine],
        "cpu": cpu_class(),
        "endpoint": f"POST {PATHS[engine]}",
        "generator": "tools/live/goldens.py",
        "model": "tools/live/build_tiny_moe.py (2 layers, 8 experts, top-2, vocab 4096)",
        "volatile": list(VOLATILE) if engine == "sglang" else [],
        "scenarios": {},
    }
    for incremental in modes:
        with engines.Server(engine, incremental=incremental) as server:
            manifest["server"] = server.engine.arguments(Path("MODEL"), 0, incremental=False)
            for name, (description, request) in SCENARIOS[engine].items():
                key = f"{'inc' if incremental else 'cum'}_{name}" if engine == "sglang" else name
                sent = final_request(engine, server.url, name, request)
                status, body, answer_status, answer = fetch(engine, server.url, sent)
                (target / f"{key}.sse").write_bytes(body)
                manifest["scenarios"][key] = {
                    "description": description,
                    "file": f"{key}.sse",
                    "incremental": incremental if engine == "sglang" else True,
                    "request": streamed(engine, sent),
                    "status": status,
                    "answer_status": answer_status,
                    "answer": json.loads(answer),
                }
                print(f"{engine} {key}: {len(body)} bytes", file=sys.stderr)
    (target / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(SCENARIOS), action="append", help="default: both")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "golden")
    args = parser.parse_args()
    for engine in args.engine or sorted(SCENARIOS):
        capture(engine, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
