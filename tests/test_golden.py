"""Golden streams from SGLang's own output code: both twins parse them, the emulator's writer matches them.

The goldens in tests/golden/<sglang version>/ were produced by tools/sglang_ref/generate_goldens.py
running SGLang's real tokenizer manager, detokenizer and HTTP app (see tools/sglang_ref/README.md).
Their manifest holds what each stream must parse to, computed from the token source alone. The
live SGLang tier regenerates 0.5.23's from the SGLang it installs and fails on any byte of
difference (tests/live/test_regenerate.py); the ``sglang_live`` test here does the same for any
version's venv built by hand (0.5.15.post1: tools/sglang_ref/setup_venv.sh), and runs only when
FASTACCUM_SGLANG_PYTHON names that venv's python.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import orjson
import pytest

from fastaccum.emulator import writer
from fastaccum.errors import ServerError, StreamTruncatedError

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
GENERATOR = ROOT / "tools" / "sglang_ref" / "generate_goldens.py"


def _load_scenarios() -> ModuleType:
    # tools/ is not a package: load the scenario table (stdlib only) by path, as the generator does.
    spec = importlib.util.spec_from_file_location("fastaccum_sglang_scenarios", GENERATOR.with_name("scenarios.py"))
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


scenarios = _load_scenarios()
SCENARIOS = {sc.name: sc for sc in scenarios.SCENARIOS}


def _load_cases() -> list[tuple[str, str, dict[str, Any]]]:
    cases = []
    for manifest_path in sorted(GOLDEN.glob("*/manifest.json")):
        if manifest_path.parent.name.startswith(("vllm-", "live-")):
            continue  # vLLM's own goldens and the live engines': test_golden_vllm.py, test_golden_live.py
        manifest = json.loads(manifest_path.read_text())
        for name, entry in manifest["scenarios"].items():
            cases.append((manifest["sglang_version"], name, entry))
    return cases


# Real differences found against SGLang's bytes, keyed by scenario name. Strict xfail: each one
# turns into a failure once fixed, so the entry must then go.
WIRE_DIFFERENCES: dict[str, str] = {
    # fastaccum.emulator.writer (the emulator's writer) against SGLang: none known. (A first-event echo's
    # response_sent_to_client_ts, found by this tier, is written since.)
}
ACCUMULATOR_DIFFERENCES: dict[str, str] = {
    # the accumulator (both twins) against SGLang: none known. (The text of an incremental echo
    # coalesced behind an unread delta, found by this tier, is reconciled since.)
}


def _params(cases: list[tuple[str, str, dict[str, Any]]], known: dict[str, str]) -> list[Any]:
    params = []
    for version, name, entry in cases:
        marks = [pytest.mark.xfail(strict=True, reason=known[name])] if name in known else []
        params.append(pytest.param(version, name, entry, id=f"{version}/{name}", marks=marks))
    return params


ALL_CASES = _load_cases()
CASES = _params(ALL_CASES, ACCUMULATOR_DIFFERENCES)
MANIFEST_CASES = _params(ALL_CASES, {})
COMPARABLE = [case for case in ALL_CASES if case[2]["emulator_comparable"]]
EMULATOR_CASES = _params(COMPARABLE, WIRE_DIFFERENCES)
PARSE_CASES = _params(COMPARABLE, {})


# Where the goldens' stream counts are written down: each "`tests/golden/<folder>/` (<n> streams)"
# (or "(<n>)") must be the number of .sse files in that folder.
COUNTED_IN = (
    ROOT / "tools" / "sglang_ref" / "README.md",
    ROOT / "tools" / "vllm_ref" / "README.md",
    ROOT / "docs" / "live.md",
    *sorted(GOLDEN.glob("*/README*")),
)
_COUNT = re.compile(r"`tests/golden/([^`/]+)/`\s*\((\d+)(?: streams?)?\)")


@pytest.mark.parametrize("doc", COUNTED_IN, ids=lambda p: str(p.relative_to(ROOT)))
def test_documented_golden_counts_are_the_files(doc: Path) -> None:
    counts = _COUNT.findall(doc.read_text())
    assert counts or doc.parent.parent == GOLDEN, f"{doc.relative_to(ROOT)} counts no goldens any more"
    wrong = [
        f"{folder}: {n} written, {len(list((GOLDEN / folder).glob('*.sse')))} files"
        for folder, n in counts
        if len(list((GOLDEN / folder).glob("*.sse"))) != int(n)
    ]
    assert not wrong, f"{doc.relative_to(ROOT)} miscounts: {wrong}"


def test_reference_readmes_count_every_golden_folder() -> None:
    """Each generator's README counts the streams of every version folder it wrote."""
    for readme, prefix in (("sglang_ref", r"\d"), ("vllm_ref", "vllm-")):
        counted = {folder for folder, _ in _COUNT.findall((ROOT / "tools" / readme / "README.md").read_text())}
        folders = {p.name for p in GOLDEN.iterdir() if p.is_dir() and re.match(prefix, p.name)}
        assert folders and folders <= counted, f"tools/{readme}/README.md counts no streams for {folders - counted}"


def test_goldens_present_and_small() -> None:
    versions = {json.loads(p.read_text()).get("sglang_version") for p in GOLDEN.glob("*/manifest.json")}
    assert "0.5.23" in versions
    total = sum(p.stat().st_size for p in GOLDEN.rglob("*") if p.is_file())
    assert total < 2_000_000, f"tests/golden holds {total} bytes; keep it under 2 MB"
    for manifest_path in GOLDEN.glob("*/manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        listed = {entry["file"] for entry in manifest["scenarios"].values()}
        assert listed == {p.name for p in manifest_path.parent.glob("*.sse")}


# ---- replay: both twins parse every golden to the expected result -----------------------------
def _expected_logprobs(values: list[float | None]) -> np.ndarray:
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def _replay_options(src: dict[str, Any]) -> dict[str, Any]:
    """The replay-array arguments of a golden's token source (synthetic_generation's names); the
    manifest has ``indexer_shape`` / ``routed_start`` only where a scenario uses them."""
    return {
        "expert_shape": tuple(src["expert_shape"]) if src["expert_shape"] else None,
        "indexer_shape": tuple(src["indexer_shape"]) if src.get("indexer_shape") else None,
        "routed_start": src.get("routed_start", 0),
    }


def _check_array(array: Any, expected: dict[str, Any] | None) -> None:
    if expected is None:
        assert array is None
    else:
        assert array.shape == tuple(expected["shape"])
        assert array.reshape(-1).tolist() == expected["values"]


def _check_result(result: Any, expect: dict[str, Any], entry: dict[str, Any]) -> None:
    assert result.token_ids.tolist() == expect["token_ids"]
    assert result.completion_tokens == expect["completion_tokens"]
    assert result.finish_reason == expect["finish_reason"]
    assert result.text == expect["text"]
    if expect["logprobs"] is None:
        assert result.logprobs is None
    else:
        np.testing.assert_array_equal(result.logprobs, _expected_logprobs(expect["logprobs"]))
    _check_array(result.routed_experts, expect["routed_experts"])
    _check_array(result.indexer_topk, expect.get("indexer_topk"))


def _dialect(version: str) -> str:
    """Dynamo's goldens (tests/golden/dynamo-<version>/) are read as dialect "dynamo"."""
    return "dynamo" if version.startswith("dynamo-") else "sglang"


def _accumulate(impl: ModuleType, pieces: list[bytes], entry: dict[str, Any], mode: str, version: str) -> Any:
    return impl.accumulate(pieces, mode=mode, dialect=_dialect(version), **_replay_options(entry["source"]))


@pytest.mark.parametrize(("version", "name", "entry"), CASES)
@pytest.mark.parametrize("piece_size", [0, 7, 1021], ids=["whole", "7B", "1021B"])
def test_golden_replays_to_expected_result(
    impl: ModuleType, version: str, name: str, entry: dict[str, Any], piece_size: int
) -> None:
    data = (GOLDEN / version / entry["file"]).read_bytes()
    pieces = writer.split_pieces(data, [piece_size]) if piece_size else [data]
    expect = entry["expect"]
    if expect["outcome"] == "ok":
        for mode in (expect["mode"], "auto"):
            result = _accumulate(impl, pieces, entry, mode, version)
            assert result.mode in (expect["mode"], "auto") if mode == "auto" else result.mode == mode
            _check_result(result, expect, entry)
        return
    acc = impl.StreamAccumulator(mode="auto", dialect=_dialect(version))
    if expect["outcome"] == "server_error":
        with pytest.raises(ServerError) as info:
            for piece in pieces:
                acc.feed(piece)
            acc.finish()
        assert info.value.status == expect["status"]
        assert info.value.message == expect["message"]
    else:
        assert expect["outcome"] == "truncated"
        # Dynamo's two early ends say which they are (docs/dialects.md)
        why = {"killed": "Dynamo ends a request it killed", "stopped": "Dynamo stopped the request"}
        with pytest.raises(StreamTruncatedError, match=why.get(entry.get("end", {}).get("kind"))):
            for piece in pieces:
                acc.feed(piece)
            acc.finish()
    assert len(acc.snapshot()) == expect["prefix_tokens"]


@pytest.mark.parametrize(("version", "name", "entry"), MANIFEST_CASES)
def test_manifest_matches_token_source(version: str, name: str, entry: dict[str, Any]) -> None:
    """The expectations were computed from the token source, not read back from SGLang's bytes."""
    src = entry["source"]
    gen = writer.synthetic_generation(
        src["rid"],
        src["n"],
        seed=src["seed"],
        prompt_tokens=src["prompt_tokens"],
        null_logprob_every=src["null_logprob_every"],
        **_replay_options(src),
    )
    expect = entry["expect"]
    if expect["outcome"] != "ok":
        return
    held = expect["completion_tokens"]
    assert expect["token_ids"] == list(gen.token_ids[:held])
    if expect["logprobs"] is not None:
        assert expect["logprobs"] == list(gen.logprobs[:held])
    for key, array in (("routed_experts", gen.routed_experts), ("indexer_topk", gen.indexer_topk)):
        if expect.get(key) is not None:  # terminal arrays: whole, SGLang's row rule (routed: from start)
            start = src.get("routed_start", 0) if key == "routed_experts" else 0
            assert expect[key]["shape"][0] == gen.replay_rows(held, start=start)
            _check_array(array, expect[key])


# ---- the emulator's writer against SGLang's bytes ---------------------------------------------
_VOLATILE = ("e2e_latency", "response_sent_to_client_ts")


def _normalized(event: dict[str, Any]) -> dict[str, Any]:
    """Timing values differ by construction (SGLang's clock vs fixed constants); keys stay in place."""
    meta = event.get("meta_info")
    if meta is None:
        return event
    meta = {k: ("<time>" if k in _VOLATILE else v) for k, v in meta.items()}
    return {k: (meta if k == "meta_info" else v) for k, v in event.items()}


def _golden_events(data: bytes) -> tuple[list[dict[str, Any]], bool]:
    events, done = [], False
    for block in data.split(b"\n\n"):
        if not block:
            continue
        assert block.startswith(b"data: ") and b"\n" not in block
        payload = block[len(b"data: ") :]
        if payload == b"[DONE]":
            done = True
        else:
            events.append(orjson.loads(payload))
    return events, done


def _emulated_events(version: str, name: str, entry: dict[str, Any]) -> list[dict[str, Any]]:
    """What fastaccum.emulator.writer writes for the same token source, emission points and reads."""
    sc = SCENARIOS[name]
    src, sched = entry["source"], entry["scheduler"]
    finish = entry["expect"].get("finish_reason") if sc.kind != "echo" else None
    gen = writer.synthetic_generation(
        src["rid"],
        src["n"],
        seed=src["seed"],
        prompt_tokens=src["prompt_tokens"],
        null_logprob_every=src["null_logprob_every"],
        finish_reason=finish if entry["expect"]["outcome"] == "ok" else None,
        **_replay_options(src),
    )
    opts = writer.WireOptions(
        incremental=sc.incremental,
        return_logprob=sc.logprob,
        logprob_text=sc.logprob_text,
        skip_tokenizer_init=sc.skip_tokenizer_init,
        version="0.5.15" if version.startswith("0.5.15") else "0.5.23",
    )
    points = sched["emission_points"]
    events = []
    for index, (group, with_echo) in enumerate(scenarios.read_plan(sc, points)):
        chunks = []
        for j, k in enumerate(group):
            start = points[k - 1] if k else 0
            terminal = k == len(points) - 1 and sc.kind != "echo"
            # SGLang stamps response_sent_to_client_ts on the first event it sends (after coalescing).
            first = index == 0 and j == len(group) - 1 and not with_echo
            chunks.append(writer.normal_event(gen, opts, start, points[k], terminal=terminal, first=first))
        if with_echo:
            chunks.append(writer.echo_event(gen, opts, points[-1] if points else 0, first=index == 0))
        events.append(writer.coalesce(chunks) if opts.incremental and len(chunks) > 1 else chunks[-1])
    if sc.error_after is not None:
        events.append(writer.error_event(sc.error_message))
    return events


def _first_difference(ours: Any, theirs: Any, path: str = "$") -> str | None:
    if isinstance(ours, dict) and isinstance(theirs, dict):
        if list(ours) != list(theirs):
            return f"{path}: keys {list(ours)} (wire) != {list(theirs)} (SGLang)"
        for key in ours:
            found = _first_difference(ours[key], theirs[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(ours, list) and isinstance(theirs, list) and len(ours) == len(theirs):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            found = _first_difference(a, b, f"{path}[{i}]")
            if found:
                return found
        return None
    if orjson.dumps(ours) != orjson.dumps(theirs):
        return f"{path}: {orjson.dumps(ours)[:200]!r} (wire) != {orjson.dumps(theirs)[:200]!r} (SGLang)"
    return None


@pytest.mark.parametrize(("version", "name", "entry"), EMULATOR_CASES)
def test_emulator_writes_what_sglang_writes(version: str, name: str, entry: dict[str, Any]) -> None:
    """Same keys, key order, values and chunking per event (timings aside), and [DONE] at the end."""
    golden, done = _golden_events((GOLDEN / version / entry["file"]).read_bytes())
    emulated = _emulated_events(version, name, entry)
    assert done, "SGLang ended this stream with [DONE]"
    assert len(emulated) == len(golden), f"{len(emulated)} events (wire) != {len(golden)} (SGLang)"
    for index, (ours, theirs) in enumerate(zip(emulated, golden)):
        difference = _first_difference(_normalized(ours), _normalized(theirs))
        assert difference is None, f"event {index}: {difference}"


@pytest.mark.parametrize(("version", "name", "entry"), PARSE_CASES)
def test_emulator_stream_parses_like_golden(impl: ModuleType, version: str, name: str, entry: dict[str, Any]) -> None:
    expect = entry["expect"]
    emulated = writer.stream_bytes(_emulated_events(version, name, entry))
    if expect["outcome"] != "ok":
        with pytest.raises(ServerError):
            impl.accumulate([emulated])
        return
    ours = _accumulate(impl, [emulated], entry, expect["mode"], version)
    theirs = _accumulate(impl, [(GOLDEN / version / entry["file"]).read_bytes()], entry, expect["mode"], version)
    assert ours.token_ids.tolist() == theirs.token_ids.tolist()
    assert ours.text == theirs.text
    assert ours.finish_reason == theirs.finish_reason
    assert ours.completion_tokens == theirs.completion_tokens
    if theirs.logprobs is None:
        assert ours.logprobs is None
    else:
        np.testing.assert_array_equal(ours.logprobs, theirs.logprobs)
    for key in ("routed_experts", "indexer_topk"):
        if getattr(theirs, key) is None:
            assert getattr(ours, key) is None
        else:
            np.testing.assert_array_equal(getattr(ours, key), getattr(theirs, key))


# ---- regenerate from SGLang's code, in a venv built by hand ------------------------------------
@pytest.mark.sglang_live
def test_sglang_regenerates_committed_goldens(tmp_path: Path) -> None:
    """SGLang's own code, run now, writes the committed goldens byte for byte. The live SGLang
    tier runs this for 0.5.23 in its own venv (tests/live/test_regenerate.py); here, for the venv
    FASTACCUM_SGLANG_PYTHON names (tools/sglang_ref/setup_venv.sh 0.5.15.post1 prints it)."""
    python = os.environ.get("FASTACCUM_SGLANG_PYTHON")
    if not python:
        pytest.skip("FASTACCUM_SGLANG_PYTHON is not set (tools/sglang_ref/setup_venv.sh prints it)")
    from live_helpers import regenerate_goldens

    stubs = ROOT / "tools" / "sglang_ref" / "stubs"
    version, differences = regenerate_goldens(python, GENERATOR, GOLDEN, tmp_path, pythonpath=(stubs,))
    assert not differences, f"SGLang {version} now writes:\n" + "\n".join(differences)


def test_dynamo_goldens_regenerate_byte_for_byte() -> None:
    """Dynamo's goldens are SGLang's incremental goldens with Dynamo's side applied
    (tools/sglang_ref/dynamo_goldens.py, stdlib only): a rerun writes the committed bytes."""
    script = ROOT / "tools" / "sglang_ref" / "dynamo_goldens.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--out", str(GOLDEN), "--check"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
