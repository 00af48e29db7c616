"""The engine-written goldens (tests/golden/live-*) are what the live engines write today.

Each scenario's request is sent again to the running server; its body must stream what the
committed one does: the same tokens, text, log-probs and closing events, however the engine
grouped the tokens into events, SGLang's wall-clock timings aside (tools/live/goldens.py,
``comparable``). The fast tier replays
the committed bodies on both twins (tests/test_golden_live.py); this is what keeps them true.

The engines' bytes hold within one CPU instruction set (tools/live/goldens.py, ``cpu_class``): a
machine is held to the goldens of its own class, and where none were written the check is skipped
with the command that writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from live_helpers import MISSING_GOLDENS, goldens

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def _manifest(engine: str) -> dict[str, Any]:
    path = goldens.folder(GOLDEN, engine) / "manifest.json"
    if not path.is_file():
        written = sorted(p.parent.name for p in GOLDEN.glob(f"live-{engine}-*/manifest.json"))
        why = (
            f"no {engine} goldens for this CPU ({goldens.cpu_class()}), only {', '.join(written)}: "
            f"python tools/live/goldens.py --engine {engine} writes them"
        )
        MISSING_GOLDENS.add(why)
        pytest.skip(why)
    return dict(json.loads(path.read_text()))


def _check(engine: str, server: Any, key: str) -> None:
    entry = _manifest(engine)["scenarios"][key]
    request = {k: v for k, v in entry["request"].items() if k not in ("stream", "stream_options")}
    status, body, answer_status, _ = goldens.fetch(engine, server.url, request)
    committed = (goldens.folder(GOLDEN, engine) / entry["file"]).read_bytes()
    assert (status, answer_status) == (entry["status"], entry["answer_status"])
    incremental = entry["incremental"]
    assert goldens.comparable(body, engine, incremental=incremental) == goldens.comparable(
        committed, engine, incremental=incremental
    )


@pytest.mark.live_vllm
@pytest.mark.parametrize("name", sorted(goldens.SCENARIOS["vllm"]))
def test_vllm_writes_its_committed_golden(vllm: Any, name: str) -> None:
    _check("vllm", vllm, name)


@pytest.mark.live_sglang
@pytest.mark.parametrize("name", sorted(goldens.SCENARIOS["sglang"]))
def test_sglang_writes_its_committed_golden(sglang: Any, sglang_mode: str, name: str) -> None:
    _check("sglang", sglang, f"{sglang_mode[:3]}_{name}")
