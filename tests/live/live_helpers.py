"""What the live tiers share: the engines module (tools/live/engines.py), the one running server,
and plain HTTP for the servers' own answers."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = (
    "MISSING_GOLDENS",
    "MODEL",
    "LiveServers",
    "ModelTokenizer",
    "engines",
    "get_json",
    "goldens",
    "in_thread",
    "post_json",
    "post_raw",
    "regenerate_goldens",
)

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "live"
# Why an engine's goldens were not checked on this machine (its CPU class has none): the tier says
# so once, at the end of the run (tests/live/conftest.py).
MISSING_GOLDENS: set[str] = set()


def _load(name: str, path: Path) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


engines = _load("fastaccum_live_engines", TOOLS / "engines.py")
sys.modules.setdefault("engines", engines)  # tools/live/goldens.py imports it by that name
goldens = _load("fastaccum_live_goldens", TOOLS / "goldens.py")
MODEL = engines.MODEL_NAME


class LiveServers:
    """The one running server, started on first use and replaced when a test needs another."""

    def __init__(self) -> None:
        self.current: Any = None
        self.key: tuple[str, bool] | None = None
        self.started: list[tuple[str, bool, float]] = []  # (engine, incremental, start seconds)

    def get(self, engine: str, *, incremental: bool = False) -> Any:
        key = (engine, incremental)
        if self.current is not None and (
            self.key != key or self.current.proc is None or self.current.proc.poll() is not None
        ):
            self.current.stop()
            self.current = None
        if self.current is None:
            server = engines.Server(engine, incremental=incremental)
            server.start()
            self.current, self.key = server, key
            self.started.append((engine, incremental, server.start_s))
        return self.current

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None


# ---- plain HTTP, for the servers' own answers -------------------------------------------------


def post_json(url: str, body: dict[str, Any], *, headers: dict[str, str] | None = None, timeout: float = 300) -> Any:
    """The server's non-streaming answer (the reference every stream is held to)."""
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json", **(headers or {})}
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


def post_raw(url: str, body: dict[str, Any], *, timeout: float = 300) -> tuple[int, bytes]:
    """Status and body bytes, also for an error status (a captured stream, a refusal)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def get_json(url: str, *, timeout: float = 30) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


async def in_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(function, *args, **kwargs)


# ---- goldens re-derived by the engines' own output code ---------------------------------------


def regenerate_goldens(
    python: Path | str, generator: Path, golden: Path, out: Path, *, pythonpath: tuple[Path, ...] = ()
) -> tuple[str, list[str]]:
    """Run a golden generator (tools/sglang_ref or tools/vllm_ref ``generate_goldens.py``) with an
    engine venv's ``python``, writing under ``out``; return the folder it wrote (named after the
    engine's version) and why that folder is not ``golden``'s of that name byte for byte: each
    file only one of them has, and each file that differs, with the bytes around its first
    difference. The generator's ``PYTHONPATH`` is ``pythonpath`` alone (not this process's), and
    it leaves no bytecode in the checkout."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(str(path) for path in pythonpath)
    command = [str(python), str(generator), "--out", str(out)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900, check=False)
    assert proc.returncode == 0, f"{' '.join(command)} failed:\n{proc.stderr[-4000:]}"
    (fresh,) = [path for path in out.iterdir() if path.is_dir()]
    committed = golden / fresh.name
    if not committed.is_dir():
        return fresh.name, [f"no committed {committed}: {python} {generator} --out {golden} writes it"]
    new = {path.name: path.read_bytes() for path in fresh.iterdir() if path.is_file()}
    old = {path.name: path.read_bytes() for path in committed.iterdir() if path.is_file()}
    found = [f"{name}: written now, not committed" for name in sorted(new.keys() - old.keys())]
    found += [f"{name}: committed, not written now" for name in sorted(old.keys() - new.keys())]
    for name in sorted(new.keys() & old.keys()):
        a, b = new[name], old[name]
        if a != b:
            at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            near = slice(max(at - 60, 0), at + 60)
            found.append(f"{name}, byte {at}: {a[near]!r} (now) != {b[near]!r} (committed)")
    return fresh.name, found


# ---- the model's own tokenizer, for the frameworks' rollout loops ------------------------------


class ModelTokenizer:
    """The tiny model's byte-level BPE (``tokenizer.json`` in its folder, read with the
    ``tokenizers`` package; ``transformers`` is not installed) with what slime's and vime's rollout
    code and the adapters call on a Hugging Face tokenizer: ``encode(text, add_special_tokens=False)``
    (``_prepare_prompt_ids``) and ``decode(ids, skip_special_tokens=...)`` (fastaccum.vime's text;
    fastaccum.slime's only for servers that send none). The harnesses' ``AutoTokenizer`` stand-ins
    return fake ids (1,000 to 151,000) the model does not have; these are below its 4,096. Ids 0
    to 2 are special (``<|endoftext|>``, the EOS, and the chat markers)."""

    chat_template = None  # vime's load_tokenizer reads it (and reads no chat_template.json here)

    def __init__(self, model: Path) -> None:
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(Path(model) / "tokenizer.json"))
        self.vocab_size = int(self._tokenizer.get_vocab_size())

    def __len__(self) -> int:
        return self.vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Any, skip_special_tokens: bool = False, **options: Any) -> str:
        return str(self._tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))
