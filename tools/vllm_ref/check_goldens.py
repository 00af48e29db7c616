"""Parse every golden stream independently and compare it with its manifest's ``expect`` block.

    python3 tools/vllm_ref/check_goldens.py tests/golden/vllm-0.34.0 [more dirs...]

Needs only the standard library and numpy (for the routed experts' .npy). It is a check of the
goldens against expectations computed from the scenarios, not of fastaccum: the accumulator's own
tests replay the same files.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np


def parse(data: bytes) -> list[Any]:
    text = data.decode("utf-8")
    assert text.endswith("\n\n"), "stream does not end with a blank line"
    events = []
    for block in text[:-2].split("\n\n"):
        assert block.startswith("data: ") and "\n" not in block, f"bad SSE block {block[:80]!r}"
        payload = block[len("data: ") :]
        events.append("[DONE]" if payload == "[DONE]" else json.loads(payload))
    return events


def accumulate(events: list[Any]) -> dict[str, Any]:
    got: dict[str, Any] = {
        "token_ids": [],
        "logprobs": None,
        "top_logprobs": None,
        "finish_reason": None,
        "stop_reason": None,
        "stop_reason_on_wire": False,
        "token_chunks": 0,
        "routed_experts": None,
        "sampling_mask": None,
        "weight_versions": None,
        "usage": None,
        "prompt_token_ids": None,
        "done": False,
        "error": None,
        "request_id": None,
        "continuous_usage": False,
    }
    for k, ev in enumerate(events):
        if ev == "[DONE]":
            assert k == len(events) - 1, "[DONE] is not last"
            got["done"] = True
            continue
        assert not got["done"]
        if "error" in ev:
            got["error"] = ev["error"]
            continue
        got["request_id"] = got["request_id"] or ev["request_id"]
        assert ev["request_id"] == got["request_id"]
        if ev.get("prompt_token_ids") is not None:
            assert got["prompt_token_ids"] is None and got["token_chunks"] == 0, "prompt ids not on the first chunk"
            got["prompt_token_ids"] = ev["prompt_token_ids"]
        if not ev["choices"]:
            got["usage"] = {k2: ev["usage"][k2] for k2 in ("prompt_tokens", "completion_tokens", "total_tokens")}
            continue
        (choice,) = ev["choices"]
        got["token_chunks"] += 1
        if ev.get("usage") is not None:
            got["continuous_usage"] = True
        got["token_ids"] += choice["token_ids"]
        if got["continuous_usage"]:
            assert ev["usage"]["completion_tokens"] == len(got["token_ids"])
        if choice.get("logprobs") is not None:
            got["logprobs"] = got["logprobs"] or []
            got["top_logprobs"] = got["top_logprobs"] or []
            for entry in choice["logprobs"]["content"]:
                got["logprobs"].append(entry["logprob"])
                if "token_id" in entry:  # 0.32+
                    top = [[t["token_id"], t["logprob"], t["rank"]] for t in entry["top_logprobs"]]
                else:  # "token_id:<id>" strings
                    assert entry["token"].startswith("token_id:") and entry["bytes"] is None
                    top = [[int(t["token"].split(":")[1]), t["logprob"], None] for t in entry["top_logprobs"]]
                got["top_logprobs"].append(top)
        if "stop_reason" in choice:
            got["stop_reason_on_wire"] = True
            if choice["finish_reason"] is not None:
                got["stop_reason"] = choice["stop_reason"]
            else:
                assert choice["stop_reason"] is None
        if choice["finish_reason"] is not None:
            assert got["finish_reason"] is None, "two finish reasons"
            got["finish_reason"] = choice["finish_reason"]
        if choice.get("routed_experts") is not None:
            assert choice["finish_reason"] is not None, "routed experts on a non-final chunk"
            arr = np.load(io.BytesIO(base64.b64decode(choice["routed_experts"])), allow_pickle=False)
            got["routed_experts"] = {
                "shape": list(arr.shape),
                "dtype": str(arr.dtype),
                "values": arr.reshape(-1).tolist(),
            }
        if choice.get("sampling_mask") is not None:
            got["sampling_mask"] = (got["sampling_mask"] or []) + choice["sampling_mask"]
            assert sum(len(r) > 0 for r in choice["sampling_mask"]) == len(choice["token_ids"])
        if choice.get("weight_versions") is not None:
            assert choice["finish_reason"] is not None
            got["weight_versions"] = choice["weight_versions"]
    return got


def check_dir(directory: Path) -> int:
    manifest = json.loads((directory / "manifest.json").read_text())
    bad = 0
    for name, entry in manifest["scenarios"].items():
        exp = entry["expect"]
        got = accumulate(parse((directory / entry["file"]).read_bytes()))
        problems = []
        for key, want in exp.items():
            if key == "outcome":
                continue
            have = got.get(key)
            if key == "routed_experts" and want is not None and have is not None:
                want = {k: want[k] for k in ("shape", "dtype", "values")}
            if have != want:
                problems.append(f"{key}: want {json.dumps(want)[:160]} got {json.dumps(have)[:160]}")
        status = "ok" if not problems else "MISMATCH"
        print(f"{directory.name}/{name}: {status}")
        for p in problems:
            print("   ", p)
        bad += bool(problems)
    return bad


if __name__ == "__main__":
    sys.exit(1 if sum(check_dir(Path(d)) for d in sys.argv[1:]) else 0)
