"""Client CPU per token: fastaccum.areal's engine against AReaL's own RemoteSGLangEngine.

Both engines run in this process, each ``agenerate`` call awaited on one event loop as AReaL's
workflow threads await them, against the same emulator answers served from another process
(SGLang's incremental stream mode, greedy, routed experts on as routing replay asks, 4 layers x
top-2), so that this process's CPU is the client's alone. AReaL's engine reads one non-streaming
answer per request (``json`` + base64 + numpy); fastaccum's reads the stream. AReaL's code is
the double (tests/areal_double) unless ``--areal PATH`` or ``FASTACCUM_AREAL_PATH`` names a
checkout. Each engine runs ``--rounds`` times per size, interleaved, and the best round counts;
CPU comes from ``getrusage``, user and system apart, and the ratio is against AReaL's engine in
the same run.

    python -P benchmarks/areal.py --areal ~/areal-cbff54d6
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
KINDS = ("areal", "fastaccum")  # AReaL's own engine, then fastaccum's
SIZES = ((1, 16000), (16, 4000), (64, 1000))  # (concurrent calls, tokens each)
PROMPT = 256
_ANNOUNCE = "emulator at "


def serve() -> None:
    """The emulator, in this (child) process, until stdin closes."""
    from fastaccum.emulator import Emulator

    async def main() -> None:
        emulator = Emulator(
            greedy=True, incremental_streaming_output=True, enable_return_routed_experts=True, num_layers=4, topk=2
        )
        await emulator.start()
        print(_ANNOUNCE + emulator.url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await emulator.stop()

    asyncio.run(main())


def _harness() -> ModuleType:
    sys.path.insert(0, str(HERE.parent / "tests"))
    import framework_harness  # the AReaL double's harness, loaded once under the name tests use

    return framework_harness.areal()


def _cpu() -> tuple[float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime


def one_round(env: Any, kind: str, server: Any, streams: int, tokens: int) -> tuple[float, float]:
    """µs of user and system CPU per token received for ``streams`` concurrent calls of
    ``tokens`` tokens each on a fresh engine."""
    import fastaccum.areal as fa

    engine = env.engine(kind, [server], return_routed_experts=True)
    requests = [env.request(tokens, prompt=[11 + i % 4000 for i in range(j, j + PROMPT)]) for j in range(streams)]

    async def run_all() -> list[Any]:
        try:
            return list(await asyncio.gather(*(engine.agenerate(req) for req in requests)))
        finally:
            if kind == "fastaccum":
                await fa.close_session(engine)
            else:
                await (await env.workflow_context.get_aiohttp_session()).close()

    user0, sys0 = _cpu()
    answers = asyncio.run(run_all())
    user1, sys1 = _cpu()
    total = sum(len(resp.output_tokens) for resp in answers)
    assert total == streams * tokens, (kind, total)
    assert all(resp.routed_experts.shape[0] == PROMPT + tokens - 1 for resp in answers), kind
    engine.destroy()
    return (user1 - user0) / total * 1e6, (sys1 - sys0) / total * 1e6


def measure(kind_root: tuple[str, str], rounds: int) -> dict[tuple[int, int], dict[str, tuple[float, float]]]:
    harness = _harness()
    logging.disable(logging.WARNING)  # AReaL logs each engine's start
    child = subprocess.Popen(
        [sys.executable, "-P", __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    best: dict[tuple[int, int], dict[str, tuple[float, float]]] = {}
    try:
        assert child.stdout is not None
        server = SimpleNamespace(url=child.stdout.readline().strip().removeprefix(_ANNOUNCE))
        with harness.areal_env(*kind_root) as env:
            for size in SIZES:
                found = best.setdefault(size, {})
                for _ in range(rounds):
                    for kind in KINDS:
                        figures = one_round(env, kind, server, *size)
                        if kind not in found or sum(figures) < sum(found[kind]):
                            found[kind] = figures
    finally:
        if child.stdin is not None:
            child.stdin.close()
        child.wait(30)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--areal", default=os.environ.get("FASTACCUM_AREAL_PATH", ""), help="an AReaL checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        serve()
        return 0
    kind_root = ("real", str(Path(options.areal).resolve())) if options.areal else ("double", _harness().DOUBLE_ROOT)
    import fastaccum

    print(
        f"client CPU per token, best of {options.rounds}; AReaL: {kind_root[0]} {kind_root[1]}; "
        f"fastaccum {fastaccum.IMPLEMENTATION}; python {sys.version.split()[0]}"
    )
    print(f"{'calls x tokens':>15} {'engine':<10} {'user us':>8} {'sys us':>7} {'total us':>9} {'vs AReaL':>9}")
    for size, found in measure(kind_root, options.rounds).items():
        base = sum(found["areal"])
        for kind in KINDS:
            user, system = found[kind]
            print(
                f"{f'{size[0]} x {size[1]}':>15} {kind:<10} {user:8.1f} {system:7.1f} {user + system:9.1f} "
                f"{(user + system) / base:9.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
