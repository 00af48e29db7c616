"""Golden streams from vLLM's own serving code: both twins read them as dialect "vllm".

The goldens in tests/golden/vllm-<version>/ were written by tools/vllm_ref/generate_goldens.py,
which posts each scenario's body through vLLM's own FastAPI route, request models, handler and
stream generator (vLLM 0.27, 0.31 and 0.34; only the engine is simulated: tools/vllm_ref/README.md).
Their manifest holds what each stream must read to, computed from the token source alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from fastaccum.emulator import writer
from fastaccum.errors import ServerError, StreamTruncatedError

GOLDEN = Path(__file__).resolve().parent / "golden"


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
    assert {"vllm-0.27.0", "vllm-0.31.0", "vllm-0.34.0"} <= versions
