"""The ``fastaccum`` command: ``demo`` (emulator + client, every token verified), ``replay``, ``emulator``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

import numpy as np

from fastaccum import IMPLEMENTATION, __version__

__all__ = ("CommandError", "main")

# The emulator child prints this line, then its URL, so the demo knows where to connect.
_ANNOUNCE = "fastaccum emulator listening on "
_REPLAY_PIECE_BYTES = 64 * 1024  # a typical socket read; the accumulator accepts any split


class CommandError(Exception):
    """A mistake in how the command was used or what it was pointed at: reported in one line on
    stderr with exit status ``status``, never as a traceback."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def main(argv: Sequence[str] | None = None) -> int:
    parser = _build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        status = int(args.handler(args))
        sys.stdout.flush()  # a reader that left shows here, not in the interpreter's last flush
        return status
    except BrokenPipeError:
        # Whoever read the output left (`fastaccum replay x.sse | head -1`): stop as quietly as a
        # command that SIGPIPE ended, with stdout on /dev/null so that the last flush cannot fail.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except CommandError as exc:
        print(f"fastaccum {args.command}: error: {exc}", file=sys.stderr)
        return exc.status
    except KeyboardInterrupt:
        return 130  # the shell's code for SIGINT; Ctrl-C is how a user stops the demo early


# ---- argument parsing ---------------------------------------------------------------------------
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


_MODES = ("auto", "cumulative", "incremental")
_SGLANG_VERSIONS = ("0.5.23", "0.5.15")
_DESCRIPTION = (
    "Consume SGLang /generate streams with fastaccum: demo streams from an embedded SGLang emulator and "
    "verifies every token, replay accumulates a captured SSE stream and summarizes it, emulator serves "
    "the emulator until interrupted."
)


def _add_server_options(p: argparse.ArgumentParser) -> None:
    # Names follow SGLang's server flags where SGLang has one.
    add = p.add_argument
    add("--incremental-streaming-output", action="store_true", help="send only each event's new tokens, as in SGLang")
    add("--stream-interval", type=_positive, default=1, help="tokens per event, as in SGLang")
    add("--skip-tokenizer-init", action="store_true", help="send no text in events, as in SGLang")
    add("--enable-return-routed-experts", action="store_true", help="serve routed experts on request, as in SGLang")
    add("--num-layers", type=_positive, default=4, help="MoE layers behind routed experts")
    add("--topk", type=_positive, default=2, help="experts per token")
    add("--num-experts", type=_positive, default=16, help="experts per layer")
    add("--token-rate", type=_token_rate, default=0.0, help="tokens/s per request; 0: as fast as read")
    add("--max-running-requests", type=_positive, default=256, help="requests decoding at once; others queue")
    add("--random-seed", "--seed", dest="seed", type=int, default=0, help="token source seed: same seed, same tokens")
    rules = "SGLang release whose wire rules to follow"
    add("--sglang-version", choices=_SGLANG_VERSIONS, default=_SGLANG_VERSIONS[0], help=rules)
    # The old spelling read like the command's own --version; scripts that use it keep working.
    add("--version", dest="sglang_version", choices=_SGLANG_VERSIONS, action=_Renamed, new="--sglang-version")
    add(
        "--fault",
        type=_json_object,
        metavar="JSON",
        help='a fault for every request that names none, e.g. \'{"kind":"stall","seconds":2}\'; '
        "fastaccum.emulator's docstring lists the kinds (default: none)",
    )


def _build_parser() -> argparse.ArgumentParser:
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
    add("--tokens", type=_positive, default=50_000, help="tokens per request, sent as max_new_tokens")
    add("--requests", type=_positive, default=4, help="requests to stream")
    add("--concurrency", type=_positive, default=4, help="requests streaming at once")
    add("--mode", choices=_MODES, default="auto", help="accumulator mode; auto reads it from the stream")
    server_mode = "emulator streaming mode (default: cumulative with --mode cumulative, else incremental)"
    add("--server-mode", choices=_MODES[1:], help=server_mode)
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
    demo.set_defaults(handler=_demo)

    replay = command("replay", "feed a captured SSE byte stream and print what it holds")
    add = replay.add_argument
    add("file", metavar="FILE", help="the bytes of a /generate response body, as captured; - reads stdin")
    add("--mode", choices=_MODES, default="auto", help="accumulator mode; auto reads it from the stream")
    shape = "check routed experts against L layers, top-K and shape them (rows, L, K) (default: one flat array)"
    add("--expert-shape", type=_shape, metavar="LxK", help=shape)
    limit = "refuse an event whose data exceeds N bytes; 0: no limit (default: no limit)"
    add("--max-event-bytes", type=_event_limit, metavar="N", help=limit)
    replay.set_defaults(handler=_replay)

    emulator = command("emulator", "run the SGLang emulator until interrupted")
    emulator.add_argument("--host", default="127.0.0.1", help="address to listen on")
    port = "port to listen on; 0 picks a free one"
    emulator.add_argument("--port", type=_bounded_int(0, 65535), default=30000, help=port)
    _add_server_options(emulator)
    emulator.set_defaults(handler=_emulator)
    return parser


# ---- emulator -----------------------------------------------------------------------------------
def _emulator_from(args: argparse.Namespace, **overrides: Any) -> Any:
    from fastaccum.emulator import Emulator

    options: dict[str, Any] = dict(
        incremental_streaming_output=args.incremental_streaming_output,
        stream_interval=args.stream_interval,
        skip_tokenizer_init=args.skip_tokenizer_init,
        enable_return_routed_experts=args.enable_return_routed_experts,
        num_layers=args.num_layers,
        topk=args.topk,
        num_experts=args.num_experts,
        token_rate=args.token_rate or None,
        max_running_requests=args.max_running_requests,
        seed=args.seed,
        version=args.sglang_version,
        fault=args.fault,
    )
    options.update(overrides)
    try:
        return Emulator(**options)
    except ValueError as exc:  # e.g. an unknown fault kind
        raise CommandError(str(exc), status=2) from None


def _emulator(args: argparse.Namespace) -> int:
    emulator = _emulator_from(args, host=args.host, port=args.port)

    async def serve() -> None:
        try:
            url = await emulator.start()
            print(_ANNOUNCE + url, flush=True)
            await asyncio.Event().wait()  # until Ctrl-C or SIGTERM
        finally:
            await emulator.stop()

    try:
        asyncio.run(serve())
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:  # the announcement found no reader: not a listening problem
        raise
    except OSError as exc:  # address in use, a host that does not resolve, no permission
        # asyncio folds the address into strerror; the errno's own text reads better after ours.
        reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else exc.strerror or str(exc)
        raise CommandError(f"cannot listen on {args.host}:{args.port}: {reason}") from None
    return 0


# ---- replay -------------------------------------------------------------------------------------
def _replay(args: argparse.Namespace) -> int:
    from fastaccum import StreamAccumulator, StreamError

    try:
        accumulator = StreamAccumulator(
            mode=args.mode, expert_shape=args.expert_shape, max_event_bytes=args.max_event_bytes
        )
    except (ValueError, OverflowError) as exc:  # argparse checked each option; their product may not fit
        raise CommandError(str(exc), status=2) from None
    name = "<stdin>" if args.file == "-" else args.file
    size = 0
    started = time.perf_counter()
    try:
        with _open_input(args.file) as f:
            while piece := f.read(_REPLAY_PIECE_BYTES):
                size += len(piece)
                accumulator.feed(piece)
        result = accumulator.finish()
    except StreamError as exc:  # the core's messages name the event themselves
        print(f"error: {type(exc).__name__}: {exc}")
        try:
            prefix = accumulator.snapshot()
            print(f"prefix: {len(prefix)} tokens in {prefix.events} events (mode {prefix.mode})")
        except StreamError:
            pass
        return 1
    except OSError as exc:
        raise CommandError(f"cannot read {name}: {exc.strerror or exc}") from None
    elapsed = time.perf_counter() - started
    print(f"file:          {name} ({size / 1e6:.2f} MB, accumulated in {elapsed:.3f} s)")
    for line in _describe(result):
        print(line)
    return 0


def _open_input(path: str) -> contextlib.AbstractContextManager[BinaryIO]:
    if path != "-":
        return open(path, "rb")
    if sys.stdin is None:  # started with stdin closed
        raise CommandError("cannot read <stdin>: it is closed", status=2)
    if sys.stdin.isatty():  # someone typing, or waiting on a forgotten pipe: say how to end
        print("reading the stream from the terminal; end it with Ctrl-D", file=sys.stderr)
    # The caller's with-block must not close the process's stdin.
    return contextlib.nullcontext(sys.stdin.buffer)


def _describe(result: Any) -> list[str]:
    lines = [
        f"mode:          {result.mode}",
        f"events:        {result.events}",
        f"tokens:        {len(result)} (completion_tokens {result.completion_tokens})",
        f"finish_reason: {json.dumps(result.finish_reason)}",
    ]
    if result.text is not None:
        lines.append(f"text:          {len(result.text)} chars: {result.text[:60]!r}")
    if result.logprobs is not None:
        lines.append(f"logprobs:      {result.logprobs.shape[0]} ({int(np.isnan(result.logprobs).sum())} null)")
    if result.top_p_token_offsets is not None:
        lines.append(
            f"top-p rows:    {result.top_p_token_offsets.shape[0] - 1} ({result.top_p_token_ids.shape[0]} kept ids)"
        )
    if result.routed_experts is not None:
        lines.append(f"routed:        {tuple(result.routed_experts.shape)} int32")
    return lines


# ---- demo ---------------------------------------------------------------------------------------
@dataclass
class _Outcome:
    rid: str
    result: Any = None
    error: BaseException | None = None


def _demo(args: argparse.Namespace) -> int:
    return asyncio.run(_demo_async(args))


async def _demo_async(args: argparse.Namespace) -> int:
    import aiohttp

    from fastaccum.aiohttp_stream import STREAM_TIMEOUT, GenerateStream

    server_mode = args.server_mode or ("cumulative" if args.mode == "cumulative" else "incremental")
    # Cumulative events repeat the whole response (O(N^2) bytes): a wider interval keeps the
    # default run short; incremental at 4 keeps the emulator (not the client) from dominating.
    interval = args.stream_interval or (64 if server_mode == "cumulative" else 4)
    layers, topk = args.routed_experts or (4, 2)
    server_args = argparse.Namespace(
        incremental_streaming_output=server_mode == "incremental",
        stream_interval=interval,
        skip_tokenizer_init=False,
        enable_return_routed_experts=args.routed_experts is not None,
        num_layers=layers,
        topk=topk,
        num_experts=128,
        token_rate=args.token_rate,
        max_running_requests=args.concurrency,
        seed=args.seed,
        sglang_version=_SGLANG_VERSIONS[0],
        fault=None,
    )
    truth = _emulator_from(server_args)  # never started: expected() is a pure function
    print(
        f"fastaccum demo: {args.requests} x {args.tokens} tokens, concurrency {args.concurrency}, "
        f"server {server_mode} (interval {interval}), accumulator {args.mode} [{IMPLEMENTATION}]"
        + (f", routed experts {layers}x{topk}" if args.routed_experts else "")
    )
    prompt = list(range(1, 17))
    streams: list[GenerateStream] = []
    outcomes: list[_Outcome] = []
    limit = asyncio.Semaphore(args.concurrency)

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        rid = f"demo-{i:05d}-"  # the trailing '-' keeps rids prefix-free: /abort_request matches by prefix
        outcome = _Outcome(rid)
        outcomes.append(outcome)
        payload = {
            "input_ids": prompt,
            "rid": rid,
            "return_logprob": True,
            "return_routed_experts": args.routed_experts is not None,
            "sampling_params": {"max_new_tokens": args.tokens, "temperature": 1.0},
        }
        async with limit:
            stream = GenerateStream(
                session, f"{url}/generate", payload, mode=args.mode, expert_shape=args.routed_experts
            )
            streams.append(stream)
            after = args.abort_after
            timer = None if after is None else asyncio.get_running_loop().call_later(after, stream.abort)
            try:
                outcome.result = await stream.run()
            except Exception as exc:  # reported with the others below
                outcome.error = exc
            finally:
                if timer is not None:
                    timer.cancel()

    child: subprocess.Popen[str] | None = None
    embedded = None
    died: int | None = None
    if args.in_process:
        embedded = truth
        url = await embedded.start()
    else:
        child, url = await _spawn_emulator(server_args)
    try:  # from the moment the child runs: a second Ctrl-C may come anywhere
        progress = _Progress(args.requests * args.tokens, enabled=not args.no_progress)
        cpu0, wall0 = time.process_time(), time.perf_counter()
        async with aiohttp.ClientSession(timeout=STREAM_TIMEOUT) as session:
            ticker = asyncio.create_task(progress.follow(streams))
            await asyncio.gather(*(one(session, i) for i in range(args.requests)))
            ticker.cancel()
    finally:
        if embedded is not None:
            await embedded.stop()
        if child is not None:
            # A child that died (a crash, the OOM killer) cut every stream, and its death is the news,
            # not the cut streams. Its sockets close just before its exit status can be read.
            if any(o.error is not None for o in outcomes):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    child.wait(timeout=1)
                died = child.poll()
            _stop(child)
    if died is not None:
        progress.close(sum(s.tokens for s in streams))
        hint = ": out of memory? It computes each request's tokens up front; try fewer --tokens"
        hint = hint if died == -signal.SIGKILL else ""
        raise CommandError(f"the emulator child died during the run ({_ended(died)}){hint}")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    progress.close(sum(s.tokens for s in streams))

    failures = []
    for outcome in outcomes:
        failures += _verify(truth, outcome, len(prompt), args)
    tokens = sum(len(o.result) for o in outcomes if o.result is not None)
    events = sum(s.events for s in streams)
    wire_mb = sum(s.bytes_received for s in streams) / 1e6
    aborted = sum(1 for o in outcomes if o.result is not None and o.result.aborted)
    print(
        f"tokens:        {tokens:,} verified against the emulator's truth"
        + (f" ({aborted} requests aborted, prefixes checked)" if aborted else "")
    )
    print(f"events:        {events:,}")
    print(f"on the wire:   {wire_mb:,.1f} MB")
    # A run aborted before its first token has no per-token figures: any number would be noise.
    rate = f" ({tokens / max(wall, 1e-9):,.0f} tokens/s)" if tokens else ""
    per_token = f"{cpu / tokens * 1e6:.2f} us/token" if tokens else "no token arrived"
    print(f"wall time:     {wall:.2f} s{rate}")
    print(f"client CPU:    {cpu:.2f} s ({per_token}" + (", emulator included)" if args.in_process else ")"))
    for line in failures[:20]:
        print(f"MISMATCH {line}")
    if failures:
        print(f"FAILED: {len(failures)} mismatches")
        return 1
    print("OK")
    return 0


async def _spawn_emulator(a: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    # -P: run from a source checkout, "-m" would otherwise import the checkout's fastaccum/ (which
    # holds no compiled core) instead of the installed package.
    values = ("stream_interval", "num_layers", "topk", "num_experts", "seed", "max_running_requests", "token_rate")
    flags = ("incremental_streaming_output", "enable_return_routed_experts")
    command = [sys.executable, "-P", "-m", "fastaccum", "emulator", "--port=0"]
    command += [f"--{name.replace('_', '-')}={getattr(a, name)}" for name in values]
    command += [f"--{name.replace('_', '-')}" for name in flags if getattr(a, name)]
    # A terminal's Ctrl-C signals the whole process group. The demo stops its child itself, so the
    # child starts with SIGINT blocked (the mask survives exec): interrupted while importing, it
    # would print a traceback, and the demo would take its death for a failure to start.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        child = subprocess.Popen(
            command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    assert child.stdout is not None
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # runs the handler of a Ctrl-C that came meanwhile
        # In a thread, so that Ctrl-C (which cancels this task) need not wait for the child.
        line = await asyncio.to_thread(child.stdout.readline)
    except BaseException:
        _stop(child)
        raise
    if not line.startswith(_ANNOUNCE):
        status = _stop(child)
        said = f"it said {line.strip()!r}" if line else "its error, if any, is above"
        raise CommandError(f"the emulator child did not start ({_ended(status)}; {said})")
    return child, line[len(_ANNOUNCE) :].strip()


def _stop(child: subprocess.Popen[str]) -> int:
    child.terminate()
    try:
        return child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()
        return child.wait()


def _ended(status: int) -> str:
    if status < 0:
        return f"killed by {signal.Signals(-status).name}"
    return f"exit status {status}"


def _verify(truth: Any, outcome: _Outcome, prompt_tokens: int, args: argparse.Namespace) -> list[str]:
    if outcome.error is not None:
        return [f"{outcome.rid}: {type(outcome.error).__name__}: {outcome.error}"]
    result = outcome.result
    n = len(result)
    routed = args.routed_experts is not None
    expected = truth.expected(outcome.rid, n, prompt_tokens=prompt_tokens, routed_experts=routed)
    problems = []
    if not np.array_equal(result.token_ids, np.asarray(expected.token_ids, dtype=np.int32)):
        problems.append("token ids differ")
    # Before the first event nothing says whether logprobs or text will come, so an empty prefix
    # holds None for both: that is the empty truth, not a mismatch.
    if n > 0 or result.logprobs is not None:
        if result.logprobs is None or not np.array_equal(
            result.logprobs, np.asarray(expected.logprobs, dtype=np.float64)
        ):
            problems.append("logprobs differ")
    if (n > 0 or result.text is not None) and result.text != expected.text(0, n):
        problems.append("text differs")
    if result.aborted:
        if n > args.tokens:
            problems.append(f"aborted prefix of {n} tokens exceeds max_new_tokens")
    else:
        if n != args.tokens:
            problems.append(f"{n} tokens, expected {args.tokens}")
        if result.finish_reason != {"type": "length", "length": args.tokens}:
            problems.append(f"finish_reason {result.finish_reason}")
        if routed and not np.array_equal(result.routed_experts, expected.routed_experts):
            problems.append("routed experts differ")
    return [f"{outcome.rid}: {p}" for p in problems]


class _Progress:
    """A tqdm bar over all tokens, or a plain line per second when tqdm is not installed."""

    def __init__(self, total: int, *, enabled: bool, out: TextIO = sys.stderr) -> None:
        self._total, self._enabled, self._out = total, enabled, out
        self._bar: Any = None
        self._last_line = 0.0
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                self._bar = None
            else:
                self._bar = tqdm(total=total, unit="tok", unit_scale=True, file=out, dynamic_ncols=True)

    async def follow(self, streams: list[Any]) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.update(sum(s.tokens for s in streams))

    def update(self, done: int) -> None:
        if not self._enabled:
            return
        if self._bar is not None:
            self._bar.update(done - self._bar.n)
        elif time.monotonic() - self._last_line >= 1.0:
            self._last_line = time.monotonic()
            print(f"tokens {done:,}/{self._total:,} ({100 * done / max(self._total, 1):.0f}%)", file=self._out)

    def close(self, done: int) -> None:
        self.update(done)
        if self._bar is not None:
            self._bar.close()
