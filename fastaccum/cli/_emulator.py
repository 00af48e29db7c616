"""``fastaccum emulator``: the emulator (SGLang, Dynamo or vLLM) served until interrupted (and the
demo's child). Ctrl-C ends it with status 130, as it ends every command (fastaccum.cli.main)."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any

from fastaccum.cli._common import ANNOUNCE, CommandError

__all__ = ("emulator_from", "run_emulator")


def emulator_from(args: argparse.Namespace, **overrides: Any) -> Any:
    from fastaccum.emulator import Emulator

    options: dict[str, Any] = dict(
        incremental_streaming_output=args.incremental_streaming_output,
        stream_interval=args.stream_interval,
        skip_tokenizer_init=args.skip_tokenizer_init,
        enable_return_routed_experts=args.enable_return_routed_experts,
        num_layers=args.num_layers,
        topk=args.topk,
        num_experts=args.num_experts,
        enable_return_indexer_topk=args.enable_return_indexer_topk,
        num_indexer_layers=args.num_indexer_layers,
        index_topk=args.index_topk,
        indexer_topk_num_layers=args.indexer_topk_num_layers,
        token_rate=args.token_rate or None,
        max_running_requests=args.max_running_requests,
        seed=args.seed,
        version=args.sglang_version,
        fault=args.fault,
        dialect=args.dialect,
        vllm_shape=args.vllm_shape,
        return_sampling_mask=args.return_sampling_mask,
    )
    options.update(overrides)
    try:
        return Emulator(**options)
    except ValueError as exc:  # e.g. an unknown fault kind
        raise CommandError(str(exc), status=2) from None


def run_emulator(args: argparse.Namespace) -> int:
    emulator = emulator_from(args, host=args.host, port=args.port)

    async def serve() -> None:
        try:
            url = await emulator.start()
            print(ANNOUNCE + url, flush=True)
            await asyncio.Event().wait()  # until Ctrl-C or SIGTERM
        finally:
            await emulator.stop()

    try:
        asyncio.run(serve())
    except BrokenPipeError:  # the announcement found no reader: not a listening problem
        raise
    except OSError as exc:  # address in use, a host that does not resolve, no permission
        # asyncio folds the address into strerror; the errno's own text reads better after ours.
        reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {reason}") from None
    return 0
