"""Client CPU per token: fastaccum.vime.generate against vime's own streaming reader.

Both generate functions run in this process, driven as vime's rollout loop drives them (vime's
``generate_and_rm`` on vime's background loop, from a vime tree: ``--vime PATH`` or
``FASTACCUM_VIME_PATH``), against the same vLLM ``/inference/v1/generate`` streams served from
another process (tests/vime_double/vllm_server.py, keyed by prompt so both readers get the same
stream), so that this process's CPU is the client's alone. The tokenizer is a real byte-level BPE
(the ``tokenizers`` package), trained here on local text (Python sources and docs) to
``--vocab`` entries, since none can be downloaded; token ids are drawn below that size. Each
function runs ``--rounds`` times per length, interleaved, and the best round counts; CPU comes
from ``getrusage``, user and system apart. The results of both readers are compared field by
field (docs/vime.md, "Why fastaccum instead of vime's streaming reader").

    python -P benchmarks/vime_streaming.py --vime ~/vime-2b83ea20
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import importlib.util
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
IN_TREE = "vime.rollout.vllm_streaming_rollout.generate_streaming"
FASTACCUM = "fastaccum.vime.generate"
FUNCTIONS = (("vime", IN_TREE), ("fastaccum", FASTACCUM))
_ANNOUNCE = "server at "
CORPUS = ("/usr/lib/python3*/**/*.py", f"{sys.prefix}/lib/python3*/site-packages/**/*.py", "/usr/share/doc/**/*.txt")


def serve(vocab: int) -> None:
    """The vLLM server double, in this (child) process, until stdin closes."""
    server_module = _load("fastaccum_vime_server", HERE.parent / "tests" / "vime_double" / "vllm_server.py")

    async def main() -> None:
        server = server_module.VllmDouble(key_by_prompt=True, vocab=vocab)
        await server.start()
        print(_ANNOUNCE + server.url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop()

    asyncio.run(main())


def _load(name: str, path: Path) -> ModuleType:
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


class BpeTokenizer:
    """A ``tokenizers`` byte-level BPE behind the two calls vime makes (HF's signatures)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Any, skip_special_tokens: bool = True, **options: Any) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


def _utf8(name: str) -> bool:
    try:
        Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    return True


def train_bpe(vocab: int, corpus_mib: int, cache: Path) -> tuple[Any, str]:
    """A byte-level BPE of ``vocab`` entries trained on local text (cached), and how it was made."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path = cache / f"bpe-{vocab}-{corpus_mib}mib.json"
    if not path.exists():
        files, total = [], 0
        for pattern in CORPUS:
            for name in sorted(glob.glob(pattern, recursive=True)):
                if os.path.isfile(name) and total < corpus_mib << 20 and _utf8(name):
                    files.append(name)
                    total += os.path.getsize(name)
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        trainer = trainers.BpeTrainer(
            vocab_size=vocab,
            min_frequency=2,
            special_tokens=special,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train(files, trainer)
        cache.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(path))
    tokenizer = Tokenizer.from_file(str(path))
    import tokenizers

    size = tokenizer.get_vocab_size()
    version = tokenizers.__version__
    how = f"byte-level BPE, tokenizers {version}, {size} entries, trained on {corpus_mib} MiB of local text"
    return tokenizer, how


def measure(env: Any, args: Any, path: str, streams: int, length: int) -> tuple[float, float, list[Any]]:
    """One round: ``streams`` samples through vime's generate_and_rm at once; client CPU seconds."""
    args.custom_generate_function_path = path
    args.rollout_max_response_len = length
    env.reset()
    samples = [env.Sample(index=i, prompt=f"request {i}: tell a long story about streams") for i in range(streams)]

    async def run() -> None:
        params = env.rollout.GenerateState(args).sampling_params
        await asyncio.gather(*(env.rollout.generate_and_rm(args, s, params.copy()) for s in samples))

    env.run(asyncio.sleep(0))  # the loop thread exists before the clock starts
    before = resource.getrusage(resource.RUSAGE_SELF)
    env.run(run())
    after = resource.getrusage(resource.RUSAGE_SELF)
    assert all(s.response_length == length for s in samples), [s.response_length for s in samples]
    return after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vime", default=os.environ.get("FASTACCUM_VIME_PATH"), help="a vime tree (2b83ea20)")
    parser.add_argument("--lengths", default="1000,8000,32000")
    parser.add_argument(
        "--tokens", type=int, default=64_000, help="fastaccum's tokens per round (streams = tokens / length)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--vime-tokens", type=int, default=16_000, help="vime's tokens per round (its reader is quadratic)"
    )
    parser.add_argument("--vime-rounds", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=151_000)
    parser.add_argument("--corpus-mib", type=int, default=150)
    parser.add_argument("--cache", default=str(Path.home() / ".cache" / "fastaccum-bench"))
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        serve(options.vocab)
        return
    if not options.vime:
        sys.exit("needs a vime tree: --vime PATH or FASTACCUM_VIME_PATH (docs/vime.md, 'Testing inside vime')")
    logging.disable(logging.WARNING)
    started = time.time()
    tokenizer, how = train_bpe(options.vocab, options.corpus_mib, Path(options.cache))
    print(f"tokenizer: {how} (ready in {time.time() - started:.0f} s)", flush=True)
    harness = _load("fastaccum_vime_harness", HERE.parent / "tests" / "vime_double" / "harness.py")
    harness.TOKENIZER = BpeTokenizer(tokenizer)
    command = [sys.executable, "-P", __file__, "--serve", "--vocab", str(tokenizer.get_vocab_size())]
    server = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        url = line.strip().removeprefix(_ANNOUNCE)
        host, port = url.removeprefix("http://").split(":")
        fake_server = type("Server", (), {"host": host, "port": int(port), "expert_shape": (4, 2)})()
        with harness.vime_env("real", str(Path(options.vime).resolve())) as env:
            args = harness.make_args(env, fake_server, rollout_skip_special_tokens=True)
            env.http_utils.init_http_client(args)
            for length in (int(x) for x in options.lengths.split(",")):
                budget = {"vime": options.vime_tokens, "fastaccum": options.tokens}
                rounds = {"vime": options.vime_rounds, "fastaccum": options.rounds}
                best: dict[str, tuple[float, float, int]] = {}
                first: dict[str, Any] = {}
                for i in range(max(rounds.values())):
                    for label, path in FUNCTIONS:
                        if i >= rounds[label]:
                            continue
                        streams = max(1, budget[label] // length)
                        user, system, samples = measure(env, args, path, streams, length)
                        first.setdefault(label, samples[0])  # prompt 0: the same stream for both
                        if label not in best or (user + system) / streams < sum(best[label][:2]) / best[label][2]:
                            best[label] = (user, system, streams)
                same = harness.comparable(first["vime"]) == harness.comparable(first["fastaccum"])
                print_row(length, best, same)
    finally:
        if server.stdin:
            server.stdin.close()
        server.wait(10)


def print_row(length: int, best: dict[str, tuple[float, float, int]], same: bool) -> None:
    """A table row: client CPU per token (user + system microseconds) of each reader."""
    cells, totals = [], []
    for label in ("vime", "fastaccum"):
        user, system, streams = best[label]
        user, system = user * 1e6 / (length * streams), system * 1e6 / (length * streams)
        totals.append(user + system)
        cells.append(f"{streams} x: {user:.2f} + {system:.2f} = {user + system:.2f}")
    verdict = "identical" if same else "DIFFER"
    print(f"| {length:,} | {cells[0]} | {cells[1]} ({totals[1] / totals[0]:.4f}x) | {verdict} |", flush=True)


if __name__ == "__main__":
    main()
