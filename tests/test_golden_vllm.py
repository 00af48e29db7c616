"""Golden streams from vLLM's own serving code: both twins read them as dialect "vllm".

The goldens in tests/golden/vllm-<version>/ were written by tools/vllm_ref/generate_goldens.py,
which posts each scenario's body through vLLM's own FastAPI route, request models, handler and
stream generator (vLLM 0.27, 0.31, 0.32 and 0.34; only the engine is simulated:
tools/vllm_ref/README.md). Their manifest holds what each stream must read to, computed from the
token source alone. The emulator's vLLM writer (fastaccum.emulator.writer_vllm) writes the same
bytes for the same scenario, but for what it states it does not write. The live vLLM tier
regenerates 0.32's goldens from the vLLM it installs (tests/live/test_regenerate.py); the other
versions are regenerated only in a venv built by hand (FASTACCUM_VLLM_PYTHON, below).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from fastaccum.emulator import writer, writer_vllm
from fastaccum.errors import ServerError, StreamTruncatedError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"


def _cases() -> list[Any]:
    cases = []
    for path in sorted(GOLDEN.glob("vllm-*/manifest.json")):
        manifest = json.loads(path.read_text())
        for name, entry in manifest["scenarios"].items():
            cases.append(pytest.param(path.parent, entry, id=f"{path.parent.name}-{name}"))
    return cases


def _read(impl: ModuleType, pieces: list[bytes]) -> Any:
    acc = impl.StreamAccumulator(dialect="vllm")
    for piece in pieces:
        acc.feed(piece)
    return acc, acc.finish()


@pytest.mark.parametrize(("folder", "entry"), _cases())
@pytest.mark.parametrize("piece_size", [0, 7, 1021], ids=["whole", "7B", "1021B"])
def test_vllm_golden_reads_to_what_its_scenario_sent(
    impl: ModuleType, folder: Path, entry: dict[str, Any], piece_size: int
) -> None:
    data = (folder / entry["file"]).read_bytes()
    pieces = writer.split_pieces(data, [piece_size]) if piece_size else [data]
    expect = entry["expect"]
    acc = impl.StreamAccumulator(dialect="vllm")
    if expect["outcome"] == "error_event":
        with pytest.raises(ServerError) as info:
            for piece in pieces:
                acc.feed(piece)
            acc.finish()
        assert info.value.message == expect["error"]["message"]
        assert len(acc.snapshot()) == len(expect["token_ids"])
        return
    assert expect["outcome"] == "ok"
    if expect["finish_reason"] is None:
        # vLLM before 0.32 drops an aborted request's last chunk: [DONE] without a finish_reason
        with pytest.raises(StreamTruncatedError, match="vLLM before 0.32"):
            for piece in pieces:
                acc.feed(piece)
            acc.finish()
        assert acc.snapshot().token_ids.tolist() == expect["token_ids"]
        return
    for piece in pieces:
        acc.feed(piece)
    result = acc.finish()
    assert result.token_ids.tolist() == expect["token_ids"]
    if expect["logprobs"] is None:
        assert result.logprobs is None
    else:
        np.testing.assert_array_equal(result.logprobs, np.array(expect["logprobs"], dtype=np.float64))
    raw = expect["finish_reason"]
    assert result.meta_info["finish_reason"] == raw
    normalised = {"type": raw}
    if raw == "stop":
        normalised["matched"] = expect["stop_reason"]
    assert result.finish_reason == normalised
    assert result.meta_info["request_id"] == expect["request_id"]
    if expect["usage"] is not None:
        assert {k: result.meta_info["usage"][k] for k in expect["usage"]} == expect["usage"]
    experts = expect["routed_experts"]
    if experts is None:
        assert result.routed_experts is None
    else:
        assert result.routed_experts.dtype == np.dtype(experts["dtype"])
        assert result.routed_experts.shape == tuple(experts["shape"])
        assert result.routed_experts.reshape(-1).tolist() == experts["values"]
    mask = expect["sampling_mask"]
    if mask is None:
        assert result.top_p_token_ids is None
    else:
        offsets = result.top_p_token_offsets.tolist()
        rows = [result.top_p_token_ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
        assert rows == mask
    if expect["weight_versions"] is not None:
        assert result.meta_info["weight_versions"] == expect["weight_versions"]


def test_vllm_goldens_cover_each_version_read() -> None:
    versions = {path.parent.name for path in GOLDEN.glob("vllm-*/manifest.json")}
    assert {"vllm-0.27.0", "vllm-0.31.0", "vllm-0.32.0", "vllm-0.34.0"} <= versions


# ---- the emulator's writer against vLLM's bytes -----------------------------------------------
# What fastaccum.emulator.writer_vllm does not write as vLLM does: its two shapes are vLLM 0.31's
# and 0.32's, and these versions differ from them (the writer's docstring says so). Each path is
# taken out of the writer's chunks before the bytes are compared; were vLLM to write it after all,
# the comparison fails and the entry must go.
UNWRITTEN: dict[str, tuple[str, ...]] = {
    # 0.27's choice has no sampling_mask field (0.31's has, null unless the server returns masks),
    # and its UsageInfo no completion_tokens_details (a per-chunk usage writes the model's nulls)
    "vllm-0.27.0": ("choices.sampling_mask", "usage.completion_tokens_details"),
    # 0.34's per-chunk usage (continuous_usage_stats) has no prompt_tokens_details
    "vllm-0.34.0": ("usage.prompt_tokens_details",),
}


def _vllm_version(folder: Path) -> tuple[int, int]:
    major, minor = folder.name.removeprefix("vllm-").split(".")[:2]
    return int(major), int(minor)


def _as_written_by(folder: Path, chunk: dict[str, Any]) -> dict[str, Any]:
    for path in UNWRITTEN.get(folder.name, ()):
        where, key = path.split(".")
        holders = chunk["choices"] if where == "choices" else [chunk.get(where)]
        for holder in holders:
            if isinstance(holder, dict):
                holder.pop(key, None)
    return chunk


def _emulated(folder: Path, entry: dict[str, Any]) -> bytes:
    """What the emulator's writer writes for the scenario vLLM's code wrote: the same token source,
    engine steps, finish and switches; the top log-probs listed are the manifest's (the simulated
    engine's candidates: the sampled token at rank 3 on odd positions, its alternatives)."""
    version = _vllm_version(folder)
    src, server, engine, expect = entry["source"], entry["server"], entry["engine"], entry["expect"]
    params, options = entry["request"]["sampling_params"], entry["request"].get("stream_options") or {}
    gen = writer.synthetic_generation(
        src["rid"],
        src["n"],
        seed=src["seed"],
        prompt_tokens=src["prompt_tokens"],
        vocab=src["vocab"],
        top_p=src["top_p_rows"],
        expert_shape=tuple(src["expert_shape"]) if src["expert_shape"] else None,
        num_experts=server["num_experts"] or 128,
    )
    gen = dataclasses.replace(gen, rid=expect["request_id"])
    top = expect["top_logprobs"]
    shape = "0.32" if version >= (0, 32) else "0.31"
    common: dict[str, Any] = {
        "shape": shape,
        "logprobs": params.get("logprobs") is not None,
        "candidates": (lambda i: [tuple(c) for c in top[i]]) if top is not None else None,
        "num_experts": server["num_experts"],
        "sampling_mask": server["return_sampling_mask"] and shape == "0.32",  # the emulator's rule
        "continuous_usage": bool(options.get("include_usage") and options.get("continuous_usage_stats")),
    }
    finishing = engine["finish"] in ("stop", "eos", "length")
    routed = server["enable_return_routed_experts"]
    chunks, start = [], 0
    for k, size in enumerate(engine["steps"]):
        end, last = start + size, k == len(engine["steps"]) - 1
        if last and engine["finish"] == "error":
            break  # vLLM raises on the output that reports the engine's error: the error event instead
        chunks.append(
            writer_vllm.chunk(
                gen,
                start,
                end,
                finish=expect["finish_reason"] if last and finishing else None,
                stop_reason=expect["stop_reason"] if last and finishing else None,
                routed=routed and last and finishing,
                weight_versions=expect["weight_versions"] if last and finishing else None,
                prompt_token_ids=expect["prompt_token_ids"] if k == 0 else None,
                **common,
            )
        )
        start = end
    if engine["finish"] == "abort" and shape == "0.32":  # before 0.32 vLLM drops the abort's output
        chunks.append(writer_vllm.chunk(gen, start, start, finish="abort", routed=routed, **common))
    body = b"".join(writer_vllm.sse(_as_written_by(folder, chunk)) for chunk in chunks)
    if expect["error"] is not None:
        error = expect["error"]
        body += writer_vllm.error_chunk(error["message"], error["type"], error["code"])
    elif options.get("include_usage"):
        body += writer_vllm.sse(writer_vllm.usage_chunk(gen, start, shape=shape))
    return body + writer.DONE


@pytest.mark.parametrize(("folder", "entry"), _cases())
def test_emulator_writes_what_vllm_writes(folder: Path, entry: dict[str, Any]) -> None:
    """Every byte, chunk by chunk, but for what UNWRITTEN names."""
    ours = _emulated(folder, entry).split(b"\n\n")
    theirs = (folder / entry["file"]).read_bytes().split(b"\n\n")
    for index, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            near = slice(max(at - 80, 0), at + 80)
            pytest.fail(f"chunk {index}, byte {at}: {a[near]!r} (writer) != {b[near]!r} (vLLM)")
    assert len(ours) == len(theirs), f"{len(ours)} chunks (writer) != {len(theirs)} (vLLM)"


def test_unwritten_differences_are_versions_with_goldens() -> None:
    assert set(UNWRITTEN) <= {path.parent.name for path in GOLDEN.glob("vllm-*/manifest.json")}


def test_routed_experts_dtype_follows_the_models_expert_count() -> None:
    """vLLM's capturer allocates uint8 for a model of up to 256 experts and uint16 above, whatever
    the request routed to: a 384-expert model's rows that only hold experts below 256 are uint16."""
    rows = np.full((4, 2, 2), 5, dtype=np.int32)
    for num_experts, dtype in ((64, np.uint8), (256, np.uint8), (257, np.uint16), (384, np.uint16)):
        array = np.load(io.BytesIO(base64.b64decode(writer_vllm.encode_npy(rows, num_experts))))
        assert array.dtype == dtype and array.tolist() == rows.tolist()


# ---- regenerate from vLLM's code, in a venv built by hand --------------------------------------
def test_vllm_regenerates_committed_goldens(tmp_path: Path) -> None:
    """vLLM's own serving code, run now, writes the committed goldens byte for byte. The live vLLM
    tier runs this for 0.32 in its own venv (tests/live/test_regenerate.py); here, for the venv
    FASTACCUM_VLLM_PYTHON names (tools/vllm_ref/setup_venv.sh 0.27.0, 0.31.0 or 0.34.0 prints it)."""
    python = os.environ.get("FASTACCUM_VLLM_PYTHON")
    if not python:
        pytest.skip("FASTACCUM_VLLM_PYTHON is not set (tools/vllm_ref/setup_venv.sh prints it)")
    from live_helpers import regenerate_goldens

    generator = ROOT / "tools" / "vllm_ref" / "generate_goldens.py"
    version, differences = regenerate_goldens(python, generator, GOLDEN, tmp_path)
    assert not differences, f"{version} now writes:\n" + "\n".join(differences)
