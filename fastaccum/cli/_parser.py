"""The command line: each command's options, their types and their help."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from fastaccum import IMPLEMENTATION, __version__
from fastaccum.cli._common import DIALECTS, MODES, SGLANG_VERSIONS, VLLM_SHAPES
from fastaccum.cli._demo import run_demo
from fastaccum.cli._emulator import run_emulator
from fastaccum.cli._replay import run_replay

__all__ = ("build_parser",)


def _bounded_int(low: int, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"expected an integer from {low} to {high}, got {value}"
                if high is not None
                else f"expected an integer >= {low}, got {value}"
            )
        return value

    return parse


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f'expected a JSON object such as \'{{"kind":"stall"}}\', got {text!r}')
    return value


_positive = _bounded_int(1)


def _token_rate(text: str) -> float:
    value = _non_negative_float(text)
    if math.isinf(value):  # the emulator paces by multiplying by the rate; unlimited is spelled 0
        raise argparse.ArgumentTypeError(f"expected a finite number (0: unlimited), got {text}")
    return value


def _event_limit(text: str) -> int | None:
    # The core's "no cap" is None, which a command line cannot spell; 0 is how the CLI says it, as
    # --token-rate 0 says "unlimited". A literal cap of 0 would refuse every event with data.
    return _bounded_int(0)(text) or None


def _shape(text: str) -> tuple[int, int]:
    try:
        layers, topk = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected LAYERSxTOPK such as 48x8, got {text!r}") from None
    if layers < 1 or topk < 1:
        raise argparse.ArgumentTypeError("layers and topk must be positive")
    return layers, topk


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each default worth showing: a flag's False or an absent option's None says nothing, so
    those options say in their help what leaving them out means."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        hidden = action.default is None or action.default is False  # `in (None, False)` would catch 0
        return action.help if hidden else super()._get_help_string(action)


class _Renamed(argparse.Action):
    """An option's old spelling: hidden from --help, stores like the new one, says on stderr to use that."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **{**kwargs, "default": argparse.SUPPRESS, "help": argparse.SUPPRESS})
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, ns: argparse.Namespace, values: Any, flag: Any = None) -> None:
        print(f"{parser.prog}: warning: {flag} is deprecated, use {self.new}", file=sys.stderr)
        setattr(ns, self.dest, values)


_DESCRIPTION = (
    "Consume SGLang /generate streams (and Dynamo's, and vLLM's /inference/v1/generate) with fastaccum: "
    "demo streams from an embedded emulator and verifies every token, replay accumulates a captured SSE "
    "stream and summarizes it, emulator serves the emulator until interrupted."
)
_DIALECT_HELP = "the server: SGLang, Dynamo's frontend before SGLang workers, or vLLM (docs/dialects.md)"
_VLLM_SHAPE_HELP = "vLLM's chunk shape: 0.32 on, or 0.31 (vLLM 0.24 to 0.31: an abort ends with [DONE] alone)"


def _add_server_options(p: argparse.ArgumentParser) -> None:
    # Names follow SGLang's server flags where SGLang has one.
    add = p.add_argument
    add("--dialect", choices=DIALECTS, default=DIALECTS[0], help=_DIALECT_HELP + "; dynamo is always incremental")
    add("--vllm-shape", choices=VLLM_SHAPES, default=VLLM_SHAPES[0], help=_VLLM_SHAPE_HELP)
    add("--incremental-streaming-output", action="store_true", help="send only each event's new tokens, as in SGLang")
    add("--stream-interval", type=_positive, default=1, help="tokens per event, as in SGLang")
    add("--skip-tokenizer-init", action="store_true", help="send no text in events, as in SGLang")
    routed = "serve routed experts, as in SGLang (on request) and vLLM (always)"
    add("--enable-return-routed-experts", action="store_true", help=routed)
    add("--return-sampling-mask", action="store_true", help="vLLM: send each token's sampling mask, as in vLLM")
    add("--num-layers", type=_positive, default=4, help="MoE layers behind routed experts")
    add("--topk", type=_positive, default=2, help="experts per token")
    add("--num-experts", type=_positive, default=16, help="experts per layer")
    add("--enable-return-indexer-topk", action="store_true", help="serve the indexer top-k on request, as in SGLang")
    add("--num-indexer-layers", type=_positive, default=2, help="layers with a sparse-attention indexer")
    add("--index-topk", type=_positive, default=8, help="KV positions the indexer keeps per token")
    add("--indexer-topk-num-layers", action="store_true", help="send the indexer's layer count, as sglang-miles does")
    add("--token-rate", type=_token_rate, default=0.0, help="tokens/s per request; 0: as fast as read")
    add("--max-running-requests", type=_positive, default=256, help="requests decoding at once; others queue")
    add("--random-seed", "--seed", dest="seed", type=int, default=0, help="token source seed: same seed, same tokens")
    rules = "SGLang release whose wire rules to follow"
    add("--sglang-version", choices=SGLANG_VERSIONS, default=SGLANG_VERSIONS[0], help=rules)
    # The old spelling read like the command's own --version; scripts that use it keep working.
    add("--version", dest="sglang_version", choices=SGLANG_VERSIONS, action=_Renamed, new="--sglang-version")
    add(
        "--fault",
        type=_json_object,
        metavar="JSON",
        help='a fault for every request that names none, e.g. \'{"kind":"stall","seconds":2}\'; '
        "fastaccum.emulator's docstring lists the kinds (default: none)",
    )


def build_parser() -> argparse.ArgumentParser:
    # --help is read in a terminal: plain text, not the module docstring's reST markup.
    parser = argparse.ArgumentParser(
        prog="fastaccum",
        description=_DESCRIPTION,
        epilog="Run 'fastaccum COMMAND --help' for its options.",
        formatter_class=_HelpFormatter,
    )
    version = f"%(prog)s {__version__} ({IMPLEMENTATION} core)"
    parser.add_argument("--version", action="version", version=version, help="print the version and the core in use")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")

    def command(name: str, summary: str) -> argparse.ArgumentParser:
        described = summary[0].upper() + summary[1:] + "."
        return sub.add_parser(name, help=summary, description=described, formatter_class=_HelpFormatter)

    demo = command("demo", "stream from the embedded emulator and verify every token")
    add = demo.add_argument
    add("--dialect", choices=DIALECTS, default=DIALECTS[0], help=_DIALECT_HELP + "; the client streams it too")
    add("--vllm-shape", choices=VLLM_SHAPES, default=VLLM_SHAPES[0], help=_VLLM_SHAPE_HELP)
    add("--tokens", type=_positive, default=50_000, help="tokens per request, sent as max_new_tokens (max_tokens)")
    add("--requests", type=_positive, default=4, help="requests to stream")
    add("--concurrency", type=_positive, default=4, help="requests streaming at once")
    add("--mode", choices=MODES, default="auto", help="accumulator mode; auto reads it from the stream")
    server_mode = "SGLang's streaming mode (default: cumulative with --mode cumulative, else incremental)"
    add("--server-mode", choices=MODES[1:], help=server_mode)
    interval = "tokens per event (default: 4 incremental, 64 cumulative; 1 is the worst case)"
    add("--stream-interval", type=_positive, help=interval)
    routed = "request routed experts from a model with L layers, top-K (default: none)"
    add("--routed-experts", type=_shape, metavar="LxK", help=routed)
    abort = "abort each request S seconds after it starts, and verify the prefix (default: run to the end)"
    add("--abort-after", type=_non_negative_float, metavar="S", help=abort)
    add("--token-rate", type=_token_rate, default=0.0, help="tokens/s per request; 0: unlimited")
    add("--seed", type=int, default=0, help="the emulator's token source seed")
    in_process = "run the emulator in this process (default: a child, so CPU numbers are the client's)"
    add("--in-process", action="store_true", help=in_process)
    add("--no-progress", action="store_true", help="draw no progress bar on stderr")
    demo.set_defaults(handler=run_demo)

    replay = command("replay", "feed a captured SSE byte stream and print what it holds")
    add = replay.add_argument
    add("file", metavar="FILE", help="the bytes of a /generate response body, as captured; - reads stdin")
    add("--dialect", choices=DIALECTS, default=DIALECTS[0], help=_DIALECT_HELP + " whose body the file holds")
    add("--mode", choices=MODES, default="auto", help="accumulator mode; auto reads it from the stream")
    shape = "check routed experts against L layers, top-K and shape them (rows, L, K) (default: one flat array)"
    add("--expert-shape", type=_shape, metavar="LxK", help=shape)
    limit = "refuse an event whose data exceeds N bytes; 0: no limit (default: no limit)"
    add("--max-event-bytes", type=_event_limit, metavar="N", help=limit)
    replay.set_defaults(handler=run_replay)

    emulator = command("emulator", "run the emulator (SGLang, Dynamo or vLLM) until interrupted")
    emulator.add_argument("--host", default="127.0.0.1", help="address to listen on")
    port = "port to listen on; 0 picks a free one"
    emulator.add_argument("--port", type=_bounded_int(0, 65535), default=30000, help=port)
    _add_server_options(emulator)
    emulator.set_defaults(handler=run_emulator)
    return parser
