"""Client CPU per token: fastaccum.slime.generate against slime's in-tree streaming generate.

Both generate functions run in this process, on slime's own rollout loop (a real slime checkout
with request-level abort: ``--slime PATH`` or ``FASTACCUM_SLIME_PATH``), against the same emulator
streams served from another process, so that this process's CPU is the client's alone. The
emulator sends plain text (no U+2028, U+2029 or U+0085), which slime's line reader needs; each
function runs ``--rounds`` times, interleaved, and the best round counts. CPU comes from
``getrusage``, user and system apart (docs/slime.md, "Why fastaccum instead of slime's in-tree
streaming", has the figures).

    python -P benchmarks/slime_streaming.py --slime ~/slime-4d39b5a6
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve().parent
IN_TREE = "slime.rollout.sglang_streaming_rollout.generate_streaming"
FASTACCUM = "fastaccum.slime.generate"
# (label, generate function, its settings): fastaccum on each of its transports
FUNCTIONS = (
    ("in-tree", IN_TREE, {}),
    ("fastaccum", FASTACCUM, {"fastaccum_transport": "client"}),
    ("fastaccum-aiohttp", FASTACCUM, {"fastaccum_transport": "aiohttp"}),
)
_ANNOUNCE = "emulator at "


def serve(incremental: bool, interval: int) -> None:
    """The emulator, in this (child) process, until stdin closes."""
    from fastaccum.emulator import Emulator

    async def main() -> None:
        emulator = Emulator(incremental_streaming_output=incremental, stream_interval=interval, plain_text=True)
        await emulator.start()
        print(_ANNOUNCE + emulator.url, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await emulator.stop()

    asyncio.run(main())


def _harness() -> ModuleType:
    name = "fastaccum_slime_harness"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, HERE.parent / "tests" / "slime_double" / "harness.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def _cpu() -> tuple[float, float, float]:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime, usage.ru_stime, time.perf_counter()


def measure(
    slime_root: str, incremental: bool, interval: int, streams: int, tokens: int, rounds: int
) -> dict[str, Any]:
    harness = _harness()
    logging.disable(logging.WARNING)  # slime warns once per rollout state that the stub has no processor
    server = subprocess.Popen(
        [sys.executable, "-P", __file__, "--serve", "--interval", str(interval)]
        + (["--incremental"] if incremental else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip().removeprefix(_ANNOUNCE)
        host, port = url.removeprefix("http://").split(":")
        emu = SimpleNamespace(host=host, port=int(port), expert_shape=(4, 2), incremental_streaming_output=incremental)
        with harness.slime_env("real", slime_root) as env:
            best: dict[str, tuple[float, float, float]] = {}
            for _ in range(rounds):
                for label, path, settings in FUNCTIONS:
                    env.reset()
                    args = harness.make_args(
                        env,
                        emu,
                        rollout_max_response_len=tokens,
                        custom_generate_function_path=path,
                        sglang_server_concurrency=streams,
                        fastaccum_check_server_mode=False,
                        **settings,
                    )
                    env.http_utils.init_http_client(args)
                    fn = env.misc.load_function(path)
                    samples = [harness.new_sample(env, i) for i in range(streams)]

                    async def run_all(fn: Any = fn, args: Any = args, samples: list[Any] = samples) -> None:
                        params = harness.sampling_params(env, args)
                        await asyncio.gather(*(fn(args, s, dict(params)) for s in samples))

                    user0, sys0, wall0 = _cpu()
                    env.run(run_all())
                    user1, sys1, wall1 = _cpu()
                    total = sum(s.response_length for s in samples)
                    assert total == streams * tokens, (label, total)
                    figures = ((user1 - user0) / total * 1e6, (sys1 - sys0) / total * 1e6, (wall1 - wall0))
                    if label not in best or sum(figures[:2]) < sum(best[label][:2]):
                        best[label] = figures
            env.run(_close(env))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)
    return best


async def _close(env: Any) -> None:
    import fastaccum.slime as fs

    await fs.close_session()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--slime",
        default=os.environ.get("FASTACCUM_SLIME_PATH", "").split(os.pathsep)[0],
        help="a slime checkout whose generate_streaming is request-abortable",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--incremental", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=int, default=1, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.serve:
        serve(options.incremental, options.interval)
        return 0
    if not options.slime or not (Path(options.slime) / "slime" / "rollout" / "streaming_utils.py").exists():
        print("slime_streaming.py: needs --slime PATH, a slime checkout with request-level abort", file=sys.stderr)
        return 2
    print(f"client CPU per token, best of {options.rounds}; slime at {options.slime}; python {sys.version.split()[0]}")
    print(
        f"{'mode':<12} {'streams x tokens':>17} {'function':<18} {'user us':>8} {'sys us':>7} {'total us':>9} "
        f"{'vs in-tree':>10}"
    )
    for incremental, streams, tokens in ((True, 64, 1000), (False, 16, 400)):
        best = measure(options.slime, incremental, 1, streams, tokens, options.rounds)
        base = sum(best["in-tree"][:2])
        for label, _, _ in FUNCTIONS:
            user, system, _ = best[label]
            print(
                f"{'incremental' if incremental else 'cumulative':<12} {f'{streams} x {tokens}':>17} {label:<18} "
                f"{user:8.1f} {system:7.1f} {user + system:9.1f} {(user + system) / base:10.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
