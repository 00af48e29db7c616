"""Smoke tests of the ``fastaccum`` command, run as ``python -m fastaccum`` in a subprocess."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import orjson
import pytest

from fastaccum import IMPLEMENTATION, StreamResult, __version__
from fastaccum.cli._demo import Outcome, verify
from fastaccum.cli._parser import build_parser
from fastaccum.emulator import Emulator, writer, writer_vllm

TIMEOUT_S = 120


def fastaccum(*args: str, prelude: str = "") -> subprocess.CompletedProcess[str]:
    if prelude:  # run main() after some setup, e.g. hiding tqdm
        code = f"{prelude}\nimport sys\nfrom fastaccum.cli import main\nsys.exit(main({list(args)!r}))"
        command = [sys.executable, "-P", "-c", code]
    else:
        command = [sys.executable, "-P", "-m", "fastaccum", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S)


def test_demo_verifies_every_token() -> None:
    done = fastaccum("demo", "--tokens", "3000", "--requests", "3", "--concurrency", "2", "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "9,000 verified" in done.stdout and "us/token" in done.stdout and done.stdout.endswith("OK\n")


def _wait_for_a_child_of(pid: int) -> int:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # gone meanwhile
                continue
            if int(fields[1]) == pid:
                return int(stat.parent.name)
        time.sleep(0.005)
    raise AssertionError(f"process {pid} started no child")


def _has_a_connection(pid: int) -> bool:
    """Process ``pid`` holds an established TCP connection (its sockets' inodes, looked up in the
    kernel's TCP tables)."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            for line in list(f)[1:]:
                fields = line.split()
                if fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
                    return True
    return False


@contextlib.contextmanager
def _sigint_left(state: str) -> Iterator[None]:
    """This process's SIGINT as a launcher may leave it to the tests (and they to their children)."""
    if state == "ignored":  # a job started with '&' from a script
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)
    elif state == "blocked":  # a launcher that blocks it, as the demo does for its own child
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    else:
        yield


def _foreground_job(*args: str) -> subprocess.Popen[str]:
    """``fastaccum ARGS`` as a terminal's shell starts it: its own process group, which Ctrl-C
    signals as a whole, with SIGINT at its default and unblocked. Both an ignored and a blocked
    SIGINT survive fork and exec, so without the reset a Ctrl-C would depend on how the tests were
    launched (from a CI script's background job, it would never reach the demo)."""
    reset = (
        "import signal\n"
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})\n"
    )
    code = f"{reset}import sys\nfrom fastaccum.cli import main\nsys.exit(main({list(args)!r}))"
    return subprocess.Popen(
        [sys.executable, "-P", "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child in /proc")
@pytest.mark.parametrize("launcher_sigint", ["default", "ignored", "blocked"])
def test_ctrl_c_while_the_demo_starts_its_emulator_ends_quietly_with_no_process_left(launcher_sigint: str) -> None:
    with _sigint_left(launcher_sigint):
        demo = _foreground_job("demo", "--tokens", "10000000", "--token-rate", "1000", "--no-progress")
    try:
        assert demo.stdout is not None
        assert demo.stdout.readline().startswith("fastaccum demo: ")  # printed just before the child starts
        _wait_for_a_child_of(demo.pid)  # the emulator, still importing: it takes a few hundred ms
        os.killpg(demo.pid, signal.SIGINT)
        status = demo.wait(timeout=TIMEOUT_S)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the emulator child goes with the demo
            try:
                os.killpg(demo.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the emulator child outlived the demo")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(demo.pid, signal.SIGKILL)  # whatever failed, leave no process behind
    out, err = demo.communicate(timeout=TIMEOUT_S)
    assert status == 130, out + err
    assert "Traceback" not in err and "error" not in err, err


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the child in /proc")
def test_demo_whose_emulator_dies_says_so_instead_of_reporting_mismatches() -> None:
    demo = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "fastaccum",
            "demo",
            "--tokens",
            "100000",
            "--token-rate",
            "1000",
            "--no-progress",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        child = _wait_for_a_child_of(demo.pid)
        deadline = time.monotonic() + TIMEOUT_S
        while not _has_a_connection(child):  # the demo streams from it now
            assert time.monotonic() < deadline, "the demo never connected to its emulator"
            time.sleep(0.01)
        os.kill(child, signal.SIGKILL)  # as the kernel's OOM killer would
        out, err = demo.communicate(timeout=TIMEOUT_S)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 1 and "MISMATCH" not in out, out + err
    assert err.startswith("fastaccum demo: error: the emulator child ") and "killed by SIGKILL" in err, err
    assert err.count("\n") == 1, err


def test_demo_cumulative_with_routed_experts_in_process() -> None:
    done = fastaccum(
        "demo", "--tokens", "600", "--requests", "2", "--mode", "cumulative", "--routed-experts", "8x2", "--in-process"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "routed experts 8x2" in done.stdout and "OK" in done.stdout
    assert "tok" in done.stderr  # the tqdm bar


def test_demo_abort_after_keeps_verified_prefixes_without_tqdm() -> None:
    done = fastaccum(
        "demo",
        "--tokens",
        "100000",
        "--requests",
        "2",
        "--token-rate",
        "5000",
        "--abort-after",
        "0.3",
        "--in-process",
        prelude="import sys; sys.modules['tqdm'] = None  # ImportError on import",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 requests aborted" in done.stdout and "OK" in done.stdout


def test_demo_aborted_before_any_token_verifies_the_empty_prefix() -> None:
    # Aborted at once, no event arrives: text and logprobs are unknown (None), which is no mismatch.
    done = fastaccum("demo", "--tokens", "100000", "--requests", "2", "--abort-after", "0", "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "MISMATCH" not in done.stdout and done.stdout.endswith("OK\n"), done.stdout


def test_demo_without_a_token_prints_no_per_token_figures() -> None:
    # Aborted when it starts: the request is cancelled before its first byte can arrive.
    done = fastaccum("demo", "--tokens", "1000", "--requests", "2", "--abort-after", "0", "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tokens:        0 verified" in done.stdout, done.stdout
    assert "/token" not in done.stdout and "tokens/s" not in done.stdout, done.stdout
    assert "no token arrived" in done.stdout, done.stdout


def test_demo_verification_accepts_an_empty_prefix_and_still_flags_missing_logprobs() -> None:
    truth = Emulator(incremental_streaming_output=True, stream_interval=4)
    args = argparse.Namespace(tokens=100, routed_experts=None)
    empty = StreamResult(mode="incremental", token_ids=np.empty(0, dtype=np.int32), aborted=True)
    assert verify(truth, Outcome("demo-00000-", empty), 16, args) == []
    expected = truth.expected("demo-00000-", 3, prompt_tokens=16)
    silent = StreamResult(mode="incremental", token_ids=np.asarray(expected.token_ids, dtype=np.int32), aborted=True)
    assert verify(truth, Outcome("demo-00000-", silent), 16, args) == [
        "demo-00000-: logprobs differ",
        "demo-00000-: text differs",
    ]


def test_replay_prints_a_summary(tmp_path: Path) -> None:
    gen = writer.synthetic_generation("rep-1", 50, expert_shape=(3, 2), top_p=True)
    path = tmp_path / "stream.sse"
    path.write_bytes(writer.stream_bytes(writer.stream_events(gen, writer.WireOptions(incremental=True), interval=4)))
    done = fastaccum("replay", str(path), "--expert-shape", "3x2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "mode:          incremental" in done.stdout
    assert "tokens:        50" in done.stdout and "routed:        (65, 3, 2) int32" in done.stdout


def test_replay_dash_reads_the_stream_from_stdin() -> None:
    gen = writer.synthetic_generation("rep-3", 40, expert_shape=(3, 2))
    body = writer.stream_bytes(writer.stream_events(gen, writer.WireOptions(incremental=True), interval=4))
    done = subprocess.run(
        [sys.executable, "-P", "-m", "fastaccum", "replay", "-", "--expert-shape", "3x2"],
        input=body,
        capture_output=True,
        timeout=TIMEOUT_S,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert b"tokens:        40" in done.stdout and b"routed:        (55, 3, 2) int32" in done.stdout
    assert b"<stdin>" in done.stdout


def test_replay_max_event_bytes_zero_means_no_limit(tmp_path: Path) -> None:
    gen = writer.synthetic_generation("rep-4", 20)
    path = tmp_path / "stream.sse"
    path.write_bytes(writer.stream_bytes(writer.stream_events(gen, writer.WireOptions(incremental=True), interval=4)))
    unlimited = fastaccum("replay", str(path), "--max-event-bytes", "0")
    assert unlimited.returncode == 0, unlimited.stdout + unlimited.stderr
    assert "tokens:        20" in unlimited.stdout
    limited = fastaccum("replay", str(path), "--max-event-bytes", "10")
    assert limited.returncode == 1 and "StreamLimitError" in limited.stderr, limited.stderr
    assert "0: no limit" in _help_entries(_subcommands()["replay"].format_help())["--max-event-bytes"]


def test_replay_reports_the_typed_error_and_event_index(tmp_path: Path) -> None:
    gen = writer.synthetic_generation("rep-2", 30)
    body = writer.stream_bytes(writer.stream_events(gen, writer.WireOptions()), done=False)
    path = tmp_path / "cut.sse"
    path.write_bytes(body[: len(body) - 40])
    done = fastaccum("replay", str(path))
    assert done.returncode == 1
    # The error is one line on stderr, as every command's; the prefix it kept is the output.
    assert done.stderr == f"fastaccum replay: error: StreamTruncatedError: event 29: {done.stderr.split(': ', 4)[4]}"
    assert done.stderr.count("\n") == 1 and done.stdout.startswith("prefix: "), done.stdout
    missing = fastaccum("replay", str(tmp_path / "nope.sse"))
    assert missing.returncode == 1 and "cannot read" in missing.stderr


@pytest.mark.parametrize(
    ("body", "kind"),
    [(b'{"text":"hi","meta_info":{}}', "a JSON object"), (b"<html><body>502</body></html>", "an HTML page")],
    ids=["json", "html"],
)
def test_replay_of_a_body_that_is_no_event_stream_says_what_it_is(tmp_path: Path, body: bytes, kind: str) -> None:
    path = tmp_path / "answer"
    path.write_bytes(body)
    done = fastaccum("replay", str(path))
    assert done.returncode == 1
    assert f"error: StreamFormatError: the response is not an event stream: {kind}" in done.stderr


def test_replay_error_names_the_event_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.sse"
    path.write_bytes(b"data: {not json\n\n")
    done = fastaccum("replay", str(path))
    assert done.returncode == 1
    first = done.stderr.splitlines()[0]
    assert first.startswith("fastaccum replay: error: StreamFormatError: event 0: ") and first.count("event 0") == 1


def test_emulator_command_serves_until_terminated() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-P",
            "-m",
            "fastaccum",
            "emulator",
            "--port",
            "0",
            "--incremental-streaming-output",
            "--stream-interval",
            "4",
            "--sglang-version",
            "0.5.15",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()
        assert line.startswith("fastaccum emulator listening on http://127.0.0.1:"), line
        url = line.rsplit(" ", 1)[1].strip()
        with urllib.request.urlopen(f"{url}/server_info", timeout=10) as resp:
            info = orjson.loads(resp.read())
        assert info["incremental_streaming_output"] is True and info["stream_interval"] == 4
        assert info["version"] == "0.5.15"
    finally:
        child.terminate()
        child.wait(timeout=10)


def test_ctrl_c_ends_the_emulator_with_status_130() -> None:
    """As the README promises for every command: 130 on Ctrl-C, nothing on stderr."""
    emulator = _foreground_job("emulator", "--port", "0")
    try:
        assert emulator.stdout is not None
        assert emulator.stdout.readline().startswith("fastaccum emulator listening on ")
        os.killpg(emulator.pid, signal.SIGINT)
        status = emulator.wait(timeout=TIMEOUT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(emulator.pid, signal.SIGKILL)
    _, err = emulator.communicate(timeout=TIMEOUT_S)
    assert status == 130 and err == "", err


@pytest.mark.parametrize(
    "arguments",
    [["replay", "STREAM"], ["demo", "--tokens", "100", "--no-progress"], ["emulator", "--port", "0"]],
    ids=["replay", "demo", "emulator"],
)
def test_output_into_a_closed_pipe_ends_quietly(arguments: list[str], tmp_path: Path) -> None:
    # As in `fastaccum replay x.sse | head -1`: the reader is gone before the command writes.
    stream = tmp_path / "stream.sse"
    stream.write_bytes(
        writer.stream_bytes(writer.stream_events(writer.synthetic_generation("pipe", 20), writer.WireOptions()))
    )
    command = [sys.executable, "-P", "-m", "fastaccum", *(str(stream) if a == "STREAM" else a for a in arguments)]
    done = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert done.stdout is not None and done.stderr is not None
    done.stdout.close()
    try:
        err = done.stderr.read()
        done.wait(timeout=TIMEOUT_S)
    finally:
        if done.poll() is None:
            done.kill()
    assert done.returncode == 141 and err == "", err  # 141: what a shell reports for SIGPIPE


def test_no_command_prints_help() -> None:
    done = fastaccum()
    assert done.returncode == 2 and "demo" in done.stdout


def test_help_describes_the_command_in_plain_text() -> None:
    done = fastaccum("--help")
    assert done.returncode == 0, done.stderr
    description = " ".join(done.stdout.split("\n\n")[1].split())
    assert "``" not in done.stdout and description.startswith("Consume SGLang /generate streams"), description


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {"": parser, **sub.choices}


def _help_entries(text: str) -> dict[str, str]:
    """Each option's entry in --help output, keyed by its first spelling, whitespace collapsed."""
    entries: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            key = line.split()[0].rstrip(",")
            current = entries.setdefault(key, [])
            current.append(line)
        elif line.startswith("   ") and current is not None:
            current.append(line)
        else:
            current = None
    return {key: " ".join(" ".join(lines).split()) for key, lines in entries.items()}


@pytest.mark.parametrize("command", ["", "demo", "replay", "emulator"])
def test_every_option_has_help_and_shows_its_default(command: str) -> None:
    parser = _subcommands()[command]
    entries = _help_entries(parser.format_help())
    shown = {a.dest for a in parser._actions if a.help != argparse.SUPPRESS}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if action.help == argparse.SUPPRESS:  # only an old spelling of an option that is shown
            assert action.dest in shown, action.option_strings
            continue
        key = action.option_strings[0] if action.option_strings else str(action.metavar or action.dest)
        entry = entries[key]
        assert action.help and action.help.split()[0] in entry, f"{key} has no help: {entry!r}"
        if not (action.default is None or action.default is False or action.default == argparse.SUPPRESS):
            assert f"(default: {action.default})" in entry, f"{key} hides its default: {entry!r}"


def test_emulator_sglang_version_selects_the_flavour_and_leaves_version_to_the_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    assert parser.parse_args(["emulator", "--sglang-version", "0.5.15"]).sglang_version == "0.5.15"
    assert parser.parse_args(["emulator"]).sglang_version == "0.5.23"
    assert capsys.readouterr().err == ""
    # the old spelling still works, says it is deprecated, and is no longer offered
    assert parser.parse_args(["emulator", "--version", "0.5.15"]).sglang_version == "0.5.15"
    assert "--version is deprecated" in capsys.readouterr().err
    usage = _subcommands()["emulator"].format_help()
    assert "--sglang-version" in usage and " --version" not in usage and "[--version" not in usage


def test_version_names_the_release_and_the_core() -> None:
    done = fastaccum("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"fastaccum {__version__} ({IMPLEMENTATION} core)\n"


@pytest.fixture()
def busy_port() -> Iterator[int]:
    """A loopback port something already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


MISUSE = {
    # name: (arguments, exit status, words the error line must hold)
    "negative-max-event-bytes": (["replay", "x.sse", "--max-event-bytes", "-5"], 2, "--max-event-bytes"),
    "unknown-fault-kind": (["emulator", "--fault", '{"kind":"nonsense"}'], 2, "unknown fault kind 'nonsense'"),
    "fault-not-json": (["emulator", "--fault", "stall"], 2, "not JSON"),
    "fault-not-an-object": (["emulator", "--fault", "[1]"], 2, "expected a JSON object"),
    "port-in-use": (["emulator", "--port", "BUSY_PORT"], 1, "Address already in use"),
    "unresolvable-host": (["emulator", "--host", "256.1.1.1", "--port", "0"], 1, "cannot listen on 256.1.1.1:0"),
    "port-out-of-range": (["emulator", "--port", "70000"], 2, "from 0 to 65535"),
    "zero-stream-interval": (["emulator", "--stream-interval", "0"], 2, "--stream-interval"),
    "negative-token-rate": (["emulator", "--token-rate", "-1"], 2, "--token-rate"),
    "infinite-token-rate": (["emulator", "--token-rate", "inf"], 2, "--token-rate"),
    "infinite-demo-token-rate": (["demo", "--token-rate", "inf"], 2, "--token-rate"),
    "unknown-sglang-version": (["emulator", "--sglang-version", "0.4"], 2, "invalid choice"),
    "unknown-version-old-spelling": (["emulator", "--version", "0.4"], 2, "invalid choice"),
    "replay-missing-file": (["replay", "/nonexistent/stream.sse"], 1, "cannot read /nonexistent/stream.sse"),
    "replay-directory": (["replay", "/"], 1, "cannot read /"),
    "bad-expert-shape": (["replay", "x.sse", "--expert-shape", "3x2x1"], 2, "LAYERSxTOPK"),
    "zero-tokens": (["demo", "--tokens", "0"], 2, "--tokens"),
    "negative-abort-after": (["demo", "--abort-after", "-1"], 2, "--abort-after"),
    "unknown-command": (["serve"], 2, "invalid choice"),
    "unknown-option": (["demo", "--fast"], 2, "unrecognized arguments"),
    "unknown-dialect": (["emulator", "--dialect", "trtllm"], 2, "invalid choice"),
    "unknown-vllm-shape": (["demo", "--vllm-shape", "0.30"], 2, "invalid choice"),
    "cumulative-dynamo-demo": (["demo", "--dialect", "dynamo", "--mode", "cumulative"], 2, "incremental"),
    "cumulative-vllm-replay": (["replay", "x.sse", "--dialect", "vllm", "--mode", "cumulative"], 2, "incremental"),
    "another-servers-fault": (
        ["emulator", "--dialect", "vllm", "--fault", '{"kind":"dynamo_killed"}'],
        2,
        "not one a vllm server produces",
    ),
}


@pytest.mark.parametrize("case", sorted(MISUSE))
def test_misuse_ends_in_one_error_line_without_a_traceback(case: str, busy_port: int) -> None:
    arguments, status, words = MISUSE[case]
    done = fastaccum(*(a.replace("BUSY_PORT", str(busy_port)) for a in arguments))
    assert done.returncode == status, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    last = done.stderr.rstrip("\n").splitlines()[-1]
    assert last.startswith("fastaccum") and ": error: " in last, done.stderr
    assert words in last, last
    # argparse puts its usage lines before a usage error; anything else is the one line alone
    if status != 2:
        assert done.stderr.count("\n") == 1, done.stderr


# ---- the other servers: --dialect dynamo|vllm ----------------------------------------------------


@pytest.mark.parametrize("dialect", ["dynamo", "vllm"])
def test_demo_streams_each_dialect_through_the_client(dialect: str) -> None:
    # The emulator child serves the dialect, the demo's Client streams it, every token is checked.
    done = fastaccum("demo", "--dialect", dialect, "--tokens", "500", "--requests", "2", "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert {"dynamo": "Dynamo", "vllm": "vLLM 0.32"}[dialect] in done.stdout
    assert "1,000 verified" in done.stdout and done.stdout.endswith("OK\n")


def test_demo_aborts_a_vllm_0_31_stream_and_verifies_the_prefix_in_process() -> None:
    server = ["--dialect", "vllm", "--vllm-shape", "0.31", "--routed-experts", "4x2", "--in-process"]
    run = ["--tokens", "100000", "--requests", "2", "--token-rate", "5000", "--abort-after", "0.2", "--no-progress"]
    done = fastaccum("demo", *server, *run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 requests aborted" in done.stdout and "OK" in done.stdout


def test_emulator_command_serves_vllm_in_the_shape_asked_for() -> None:
    command = ["emulator", "--port", "0", "--dialect", "vllm", "--vllm-shape", "0.31", "--stream-interval", "4"]
    child = subprocess.Popen([sys.executable, "-P", "-m", "fastaccum", *command], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        url = child.stdout.readline().rsplit(" ", 1)[1].strip()
        with urllib.request.urlopen(f"{url}/load?include_inflight=true&inflight_limit=100", timeout=10) as resp:
            assert orjson.loads(resp.read()) == {"server_load": 0}
        body = {"token_ids": [1, 2, 3], "request_id": "cli-1", "sampling_params": {"max_tokens": 9, "logprobs": 0}}
        post = urllib.request.Request(f"{url}/inference/v1/generate", data=orjson.dumps({**body, "stream": True}))
        with urllib.request.urlopen(post, timeout=10) as resp:
            stream = resp.read()
    finally:
        child.terminate()
        child.wait(timeout=10)
    gen = Emulator().expected("cli-1", 9, prompt_tokens=3, finish_reason={"type": "length"})
    gen = dataclasses.replace(gen, rid="generate-tokens-cli-1")  # vLLM's own id on the wire
    chunks = writer_vllm.stream_chunks(gen, shape="0.31", interval=4, usage=False)
    assert stream == writer_vllm.stream_bytes(chunks)


def test_replay_reads_a_vllm_body(tmp_path: Path) -> None:
    gen = writer.synthetic_generation("rep-v", 30, expert_shape=(3, 2), num_experts=8, finish_reason={"type": "length"})
    path = tmp_path / "vllm.sse"
    path.write_bytes(writer_vllm.stream_bytes(writer_vllm.stream_chunks(gen, interval=4, routed=True)))
    done = fastaccum("replay", str(path), "--dialect", "vllm", "--expert-shape", "3x2")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "tokens:        30 (completion_tokens 30)" in done.stdout and '"type": "length"' in done.stdout
    assert "routed:        (45, 3, 2) uint8" in done.stdout
    wrong = fastaccum("replay", str(path))  # read as SGLang: the first event names both servers
    assert wrong.returncode == 1 and "vLLM" in wrong.stderr, wrong.stderr
