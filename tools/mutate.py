"""A mutation run: one-line mutations of behaviours that matter, each applied to a scratch copy of
the tree, and whether the fast tier kills it.

Each mutation replaces one exact piece of one file (it must occur there exactly once, so a
mutation that no longer applies fails loudly instead of testing nothing). The fast tier runs on the
pure twin (``FASTACCUM_NO_EXTENSIONS=1``, ``--no-c-extensions``): the compiled twin is built from
most of the same sources (``python/chunked.py`` and ``python/lengths.py`` are compiled as they
are), and a rebuild per mutant would cost minutes. A mutant is killed when a test fails; the first
failing test is reported. Every run starts with the tree unmutated, which must pass.

    python tools/mutate.py                      # every mutation (about 1 to 3 minutes each)
    python tools/mutate.py --list
    python tools/mutate.py --only rid-random-part chunk-size-upper-f
    python tools/mutate.py --independent        # without the twin-agreement tests
    nox -s mutate                               # the same, in nox's venv

The scratch copy holds the working tree's files (tracked and untracked, not ignored), so a run
judges what you have, committed or not. Tests that start ``python -P`` subprocesses read the
scratch copy too (``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    before: str
    after: str
    breaks: str  # the behaviour the mutant breaks


MUTATIONS = (
    # ---- the five the audit found alive --------------------------------------------------------
    Mutation(
        "request-sent-after-early-abort",
        "fastaccum/transport/consumer.py",
        "return dataclasses.replace(self.snapshot(), request_sent=False)",
        "return self.snapshot()",
        "an abort before run() says the request was never sent",
    ),
    Mutation(
        "vime-update-response-length",
        "fastaccum/vime/_commit.py",
        "    sample.response_length += len(tokens)\n",
        "    sample.response_length += len(tokens) + 1\n",
        "the update line's commit counts the tokens it wrote",
    ),
    Mutation(
        "vime-idle-wait-returns-at-once",
        "fastaccum/vime/_pools.py",
        "        busy = list(urls)\n        while busy:\n            loads = await asyncio.gather(*(self.load(",
        "        busy: list[str] = []\n        while busy:\n            loads = await asyncio.gather(*(self.load(",
        "a server-wide abort returns only once the workers are idle",
    ),
    Mutation(
        "chunk-size-upper-f",
        "python/chunked.py",
        "    if 0x41 <= byte <= 0x46:",
        "    if 0x41 <= byte <= 0x45:",
        "every hex digit, in either case, is a chunk size",
    ),
    Mutation(
        "rid-random-part",
        "fastaccum/slime/_generate.py",
        'return f"fastaccum-{sample.index}-{uuid.uuid4().hex}"',
        'return f"fastaccum-{sample.index}"',
        "each call's rid is its own and never a prefix of another",
    ),
    # ---- the core's rules (both twins share them) ---------------------------------------------
    Mutation(
        "routed-experts-rows",
        "fastaccum/_core/policy.py",
        "    rows = max(prompt + done - 1 - start, 0)",
        "    rows = max(prompt + done - start, 0)",
        "routed experts have prompt + completion - 1 - start rows",
    ),
    Mutation(
        "incremental-length-rule",
        "python/lengths.py",
        "    incremental_fits = held + listed == reported",
        "    incremental_fits = held + listed >= reported",
        "an incremental event's count adds up to the reported total",
    ),
    Mutation(
        "cumulative-total-decreases",
        "python/lengths.py",
        "    if reported < newest:",
        "    if reported < newest - 1:",
        "a cumulative total never goes down",
    ),
    Mutation(
        "logprobs-switch",
        "python/lengths.py",
        "    if had is not None and has != had:",
        "    if had is not None and has != had and has:",
        "a stream carries log-probs on every event or on none",
    ),
    Mutation(
        "null-logprob-is-nan",
        "python/fields.py",
        "            logprobs.append(math.nan)",
        "            logprobs.append(0.0)",
        "a null log-prob is NaN, never a made-up number",
    ),
    Mutation(
        "sse-cr-line-end",
        "python/framing.py",
        "            if buf[end] == _CR:",
        "            if buf[end] == _CR and False:",
        "a bare CR ends an SSE line, as the specification says",
    ),
    Mutation(
        "top-p-rows-replace",
        "fastaccum/_core/base.py",
        "            if replace or self._top_p is None or self._top_p_rows is None:",
        "            if True:",
        "an event's top-p rows are appended, a snapshot of all rows replaces",
    ),
    Mutation(
        "lengths-disagree",
        "python/lengths.py",
        "    if logprobs_length >= 0 and completion_tokens >= 0 and logprobs_length != completion_tokens:",
        "    if logprobs_length >= 0 and completion_tokens >= 0 and logprobs_length < completion_tokens:",
        "output_token_logprobs_length and completion_tokens must agree when both are sent",
    ),
    Mutation(
        "cumulative-text-replaces",
        "python/lengths.py",
        "        replaces = mode == CUMULATIVE",
        "        replaces = False",
        "cumulative text is the newest event's, incremental text the deltas joined",
    ),
    Mutation(
        "echo-text-incremental",
        "fastaccum/_core/policy.py",
        "    if echoed.startswith(text):\n        return echoed",
        "    if echoed.startswith(text):\n        return None",
        "an abort echo's whole text replaces the held one",
    ),
    Mutation(
        "data-after-terminal",
        "fastaccum/_core/policy.py",
        '    if mid_event and not b"[DONE]".startswith(data):',
        "    if False:",
        "bytes after the terminal event other than [DONE] are an error",
    ),
    Mutation(
        "base64-validated",
        "fastaccum/_core/policy.py",
        "        return pybase64.b64decode_as_bytearray(source, validate=True)",
        "        return pybase64.b64decode_as_bytearray(source, validate=False)",
        "base64 that is not base64 is a format error, not silently skipped",
    ),
    Mutation(
        "b64-escaped-value-left-to-orjson",
        "fastaccum/_core/spans.py",
        r'        if data.find(b"\\", start, end) < 0:',
        "        if True:",
        "a base64 value holding a JSON escape is parsed by orjson, not cut raw",
    ),
    Mutation(
        "chunk-extension-token",
        "python/chunked.py",
        "        or 0x61 <= byte <= 0x7A\n",
        "        or 0x61 <= byte <= 0x79\n",
        "chunk-extension names are RFC 9110 tokens",
    ),
    Mutation(
        "required-routed-experts",
        "fastaccum/_core/policy.py",
        '    missing = not (replay and "routed_experts" in replay) and (finish or {}).get("type") != "abort"',
        "    missing = False",
        "require_routed_experts refuses a finished stream without them",
    ),
    # ---- transports ------------------------------------------------------------------------------
    Mutation(
        "drain-resend-at-first-event",
        "fastaccum/transport/request.py",
        "                    self._drain.resend(self._server_ids())",
        "                    pass",
        "an abort sent before the server held the request is sent again at its first event",
    ),
    Mutation(
        "kept-aborted-meaning",
        "fastaccum/transport/consumer.py",
        "return self._stamped(self._as_asked(self._accumulator.finish()))",
        "return self._stamped(self._accumulator.finish())",
        "kept() after a drained abort says aborted, as run() does",
    ),
    Mutation(
        "retry-after-an-event",
        "fastaccum/transport/retry.py",
        "        if self.done >= self.retries or events or not transient(exc):",
        "        if self.done >= self.retries or not transient(exc):",
        "a request is never sent again once an event arrived",
    ),
    Mutation(
        "retry-any-status",
        "fastaccum/transport/retry.py",
        "        return exc.event_index is None and exc.status in RETRY_STATUSES",
        "        return exc.event_index is None",
        "a status that judges the request (4xx) is never retried",
    ),
    Mutation(
        "fanout-ended-rid-still-sent",
        "fastaccum/transport/abort_sender.py",
        "                    window = [(key, body) for key, body in window if wanted(key)]",
        "                    window = list(window)",
        "behind a router, the abort of a stream that already ended is left out of the fan-out",
    ),
    Mutation(
        "fanout-one-start-for-every-worker",
        "fastaccum/transport/abort_sender.py",
        "            turn = k * len(items) // len(servers)",
        "            turn = 0",
        "behind a router, each worker takes the rids from another start",
    ),
    Mutation(
        "body-batch-last-answer-dropped",
        "fastaccum/transport/body.py",
        "                    self._results.append(self._event.end())\n                    self._event = None",
        "                    self._event.end()\n                    self._event = None",
        "a batch body gives one result per request",
    ),
    Mutation(
        "resume-start-not-sent",
        "fastaccum/_core/resume.py",
        '    if start:\n        if where == "payload":',
        '    if False:\n        if where == "payload":',
        "a resumed request asks only for the routed-experts rows the sample does not hold",
    ),
    # ---- the rollout skeleton and the adapters ---------------------------------------------------
    Mutation(
        "slime-resume-asks-every-row",
        "fastaccum/slime/_generate.py",
        "    if start:  # the rows the sample holds are not sent again",
        "    if False:  # the rows the sample holds are not sent again",
        "a resumed slime call asks only for the routing the sample does not hold",
    ),
    Mutation(
        "commit-rule",
        "fastaccum/_rollout/endings.py",
        "        (terminal if result.finished else prefix)(result)",
        "        (terminal if result.finished or result.aborted else prefix)(result)",
        "a cut prefix is committed as a prefix, never with terminal bookkeeping",
    ),
    Mutation(
        "buffer-only-groups-with-a-prefix",
        "fastaccum/_rollout/lifecycle.py",
        "    return any(s.status == aborted and s.response_length > 0 for s in leaves(group))",
        "    return any(s.status == aborted for s in leaves(group))",
        "only groups that kept a prefix are buffered",
    ),
    Mutation(
        "slime-prefix-aborted",
        "fastaccum/slime/_commit.py",
        "    sample.status = modules().Sample.Status.ABORTED",
        "    pass",
        "a cut sample is ABORTED",
    ),
    Mutation(
        "unknown-settings-key",
        "fastaccum/_rollout/settings.py",
        '    unknown = sorted(name for name in names if name.startswith("fastaccum_") and name not in known)',
        "    unknown: list[str] = []",
        "an unknown fastaccum_* key is refused",
    ),
)


# The tests that hold one twin to the other (or one path of the compiled twin to another): equal
# outcomes, never an expected value of their own.
TWIN_AGREEMENT = (
    "--deselect=tests/test_differential.py",
    "--deselect=tests/test_fuzz_corpus.py",
    "--deselect=tests/test_scanner_equivalence.py",
)


def scratch_copy(into: Path) -> None:
    """The working tree's files (tracked and untracked, not ignored), symlinks kept as links."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        source, target = ROOT / rel, into / rel
        if not source.exists() and not source.is_symlink():
            continue  # deleted in the working tree
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            target.symlink_to(os.readlink(source))
        else:
            shutil.copy2(source, target)


def run_tier(tree: Path, extra: list[str]) -> tuple[int, str, float]:
    """The fast tier on the pure twin in ``tree``: (exit status, first failing test, seconds)."""
    env = {**os.environ, "FASTACCUM_NO_EXTENSIONS": "1", "PYTHONPATH": str(tree)}
    env.pop("FASTACCUM_REQUIRE_EXTENSIONS", None)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-x",
        "-q",
        "-p",
        "no:cacheprovider",
        "--no-c-extensions",
        "-m",
        "not slow",
        "tests",
        # It checks that every mutation applies to the tree, which a mutated copy never passes:
        # it would kill every mutant and hide what the behaviour tests do.
        "--ignore=tests/test_mutations.py",
        *extra,
    ]
    started = time.monotonic()
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
    first = next((line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("FAILED ")), "")
    return done.returncode, first.split(" - ")[0], time.monotonic() - started


def apply(tree: Path, mutation: Mutation) -> str:
    """Mutate the scratch copy; returns the original text to restore."""
    path = tree / mutation.path
    text = path.read_text(encoding="utf-8")
    count = text.count(mutation.before)
    if count != 1:
        raise SystemExit(f"mutate: {mutation.name}: {mutation.before!r} occurs {count} times in {mutation.path}")
    path.write_text(text.replace(mutation.before, mutation.after), encoding="utf-8")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run these mutations only")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    parser.add_argument("--check", action="store_true", help="check that every mutation applies, and exit")
    parser.add_argument(
        "--independent",
        action="store_true",
        help="judge without the tests that hold one twin to the other (they cannot see a bug in "
        "code both twins share): what kills a mutant then has its own oracle",
    )
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --), e.g. -n 2")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    unknown = set(args.only or ()) - {m.name for m in MUTATIONS}
    if unknown:
        parser.error(f"unknown mutations {sorted(unknown)}; --list names them")
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:36} {m.path}: {m.breaks}")
        return 0
    if args.check:
        for m in MUTATIONS:
            count = (ROOT / m.path).read_text(encoding="utf-8").count(m.before)
            if count != 1:
                print(f"{m.name}: {m.before!r} occurs {count} times in {m.path}")
                return 1
        print(f"all {len(MUTATIONS)} mutations apply")
        return 0
    with tempfile.TemporaryDirectory(prefix="fastaccum-mutate-") as scratch:
        tree = Path(scratch)
        scratch_copy(tree)
        extra = [*args.pytest_args, *(TWIN_AGREEMENT if args.independent else ())]
        status, first, seconds = run_tier(tree, extra)
        if status != 0 or first:
            print(f"the unmutated tree fails the fast tier ({first or f'exit {status}'}): nothing to judge")
            return 2
        print(f"unmutated: passes ({seconds:.0f} s)\n")
        print("| mutation | file | breaks | result | first failing test | s |")
        print("|---|---|---|---|---|---|")
        alive = 0
        for mutation in chosen:
            original = apply(tree, mutation)
            try:
                status, first, seconds = run_tier(tree, extra)
            finally:
                (tree / mutation.path).write_text(original, encoding="utf-8")
            # -x under xdist ends an interrupted run with status 2: a failed test is what kills.
            result = "killed" if first else ("ALIVE" if status == 0 else f"error (exit {status})")
            alive += status == 0
            print(f"| {mutation.name} | {mutation.path} | {mutation.breaks} | {result} | {first} | {seconds:.0f} |")
            sys.stdout.flush()
        print(f"\n{len(chosen) - alive} of {len(chosen)} killed")
        return 1 if alive else 0


if __name__ == "__main__":
    sys.exit(main())
