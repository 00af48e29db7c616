"""Real SGLang and vLLM servers on the CPU for the live tiers: pinned venvs, the tiny model, servers.

    python tools/live/engines.py install sglang|vllm      # the engine's venv (cached); prints its python
    python tools/live/engines.py model sglang|vllm        # the tiny model (cached); prints its folder
    python tools/live/engines.py serve sglang|vllm [--incremental] [--stream-interval N] [--port P]  # until Ctrl-C

Everything is cached outside the checkout, under ``$FASTACCUM_LIVE_CACHE`` (default
``~/.cache/fastaccum/live``): each engine's venv keyed by its frozen requirements
(``tools/live/<engine>-requirements.txt``, installed with ``--no-deps``, so pip resolves nothing
and can never pull a CUDA torch), and the model keyed by its build script and the venv's torch
and tokenizers. A server runs pinned to one core (``taskset``; with two cores, the other is the
client's), in a session of its own, and is stopped by that session: every process the engine
spawned (scheduler, detokenizer, engine core, worker) goes with it, also when the caller dies.
tests/live/conftest.py drives this module; docs/live.md says what each tier covers.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# The engines' wheels are cp311 (and the CPU torch wheel pip finds here is too).
VENV_PYTHON = os.environ.get("FASTACCUM_LIVE_PYTHON", "python3.11")
TORCH = os.environ.get("FASTACCUM_TORCH", "torch==2.13.0")
SERVER_CORE = int(os.environ.get("FASTACCUM_LIVE_CORE", "0"))
READY_TIMEOUT_S = 600.0  # a cold start on a loaded 2-core machine; seen: 24-41 s idle
MODEL_NAME = "tiny"  # the name both servers serve the model under


def cache_root() -> Path:
    root = Path(os.environ.get("FASTACCUM_LIVE_CACHE", Path.home() / ".cache" / "fastaccum" / "live")).resolve()
    if root.is_relative_to(REPO):
        raise SystemExit(f"FASTACCUM_LIVE_CACHE must be outside the checkout, not {root}")
    root.mkdir(parents=True, exist_ok=True)
    return root


def _say(message: str) -> None:
    print(f"[live] {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One installer per cache entry at a time (parallel test workers, two terminals)."""
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


# ---- the engines ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    name: str
    module: str  # the server's entry module (python -m)
    env: dict[str, str] = field(default_factory=dict)
    ready_path: str = "/health"

    @property
    def requirements(self) -> Path:
        return HERE / f"{self.name}-requirements.txt"

    def arguments(self, model: Path, port: int, *, incremental: bool, stream_interval: int = 1) -> list[str]:
        if self.name == "vllm":
            # --enable-scale-out serves /inference/v1/generate and /inference/v1/abort_requests.
            # (--tokens-only serves them too, but an out-of-vocabulary id then kills the engine.)
            return [
                "--model", str(model), "--served-model-name", MODEL_NAME, "--host", "127.0.0.1",
                "--port", str(port), "--dtype", "bfloat16", "--max-model-len", "2048",
                "--max-num-seqs", "16", "--enforce-eager", "--seed", "0", "--enable-scale-out",
            ]  # fmt: skip
        arguments = [
            "--model-path", str(model), "--served-model-name", MODEL_NAME, "--device", "cpu",
            "--host", "127.0.0.1", "--port", str(port), "--attention-backend", "torch_native",
            "--disable-cuda-graph", "--stream-interval", str(stream_interval), "--random-seed", "0",
            "--mem-fraction-static", "0.05", "--max-total-tokens", "32768",
            "--max-running-requests", "64", "--enable-return-routed-experts",
        ]  # fmt: skip
        return arguments + (["--incremental-streaming-output"] if incremental else [])

    def server_env(self, core: int, run_dir: Path) -> dict[str, str]:
        # TMPDIR: SGLang leaves its IPC sockets' files there at every exit; the run folder goes.
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TMPDIR": str(run_dir), **self.env}
        if self.name == "vllm":
            env["VLLM_CPU_OMP_THREADS_BIND"] = str(core)
            env["PYTHONPATH"] = str(HERE / "vllm_cpu")  # AMX permission (its sitecustomize says why)
        else:
            # Logged but applied only by SGLang's AMX backend; taskset is what pins the server.
            env["SGLANG_CPU_OMP_THREADS_BIND"] = str(core)
            env["OMP_NUM_THREADS"] = "1"
            # The CPU stand-ins (tools/live/sglang_cpu/README.md) and the torchvision stub.
            paths = [str(HERE / "sglang_cpu"), str(REPO / "tools" / "sglang_ref" / "stubs")]
            env["PYTHONPATH"] = os.pathsep.join(paths)
        return env


ENGINES = {
    "vllm": Engine(
        "vllm",
        "vllm.entrypoints.openai.api_server",  # `vllm serve` fails: the package's metadata is vllm-cpu
        {
            "VLLM_NO_USAGE_STATS": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
            # /pause and /resume (the newest vime line's abort) exist only in the dev server.
            "VLLM_SERVER_DEV_MODE": "1",
        },
    ),
    "sglang": Engine(
        "sglang",
        "sglang.launch_server",
        {"SGLANG_USE_CPU_ENGINE": "1"},
    ),
}


def engine(name: str) -> Engine:
    if name not in ENGINES:
        raise SystemExit(f"unknown engine {name!r}: one of {', '.join(ENGINES)}")
    return ENGINES[name]


# ---- the venv ---------------------------------------------------------------------------------


def venv_python(name: str) -> Path:
    """The engine's venv python, installing the venv first if it is not cached."""
    spec = engine(name)
    frozen = spec.requirements.read_bytes()
    version = subprocess.run(
        [VENV_PYTHON, "-c", "import sys; print(sys.version.split()[0])"], capture_output=True, text=True, check=True
    ).stdout.strip()
    key = hashlib.sha256(frozen + TORCH.encode() + version.encode()).hexdigest()[:12]
    venv = cache_root() / f"{name}-{key}"
    python = venv / "bin" / "python"
    with _locked(venv):
        if (venv / ".complete").is_file():
            return python
        shutil.rmtree(venv, ignore_errors=True)  # an install that did not finish
        _say(f"installing the {name} venv into {venv} (first run only: about 2 minutes and 3.5 GB)")
        start = time.monotonic()
        subprocess.run([VENV_PYTHON, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        # --no-deps: the frozen list is the whole venv; pip resolves nothing, so nothing else comes.
        subprocess.run([*pip, "--no-deps", TORCH, "-r", str(spec.requirements)], check=True)
        (venv / ".complete").write_text(f"{time.monotonic() - start:.0f} s\n")
        _say(f"{name} venv installed in {time.monotonic() - start:.0f} s")
    return python


# ---- the model --------------------------------------------------------------------------------


def model_dir(python: Path, seed: str = "") -> Path:
    """The tiny model, built by tools/live/build_tiny_moe.py with ``python`` (an engine venv's);
    ``seed``: another checkpoint of it (other weights), for weight updates."""
    script = HERE / "build_tiny_moe.py"
    versions = subprocess.run(
        [str(python), "-c", "import torch, tokenizers; print(torch.__version__, tokenizers.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    key = hashlib.sha256(script.read_bytes() + versions.encode()).hexdigest()[:12]
    out = cache_root() / (f"tiny-moe-{key}" + (f"-{seed}" if seed else ""))
    with _locked(out):
        if not (out / "config.json").is_file():
            partial = out.with_name(out.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run([str(python), str(script), str(partial), *(["--seed", seed] if seed else [])], check=True)
            partial.rename(out)
    return out


# ---- the server -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # PR_SET_PDEATHSIG: if the test process dies without its cleanup (SIGKILL), the server's
    # leader gets SIGTERM and takes its engine processes down with it.
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def _session_members(sid: int) -> list[int]:
    """Every live process of session ``sid`` (an engine's children stay in the leader's session,
    even those that change their process group)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) == sid and fields[0] != "Z":  # fields after the name: state, ppid, pgrp, session
                members.append(int(entry.name))
    return members


def _mapped_shm_files() -> set[tuple[int, int, int]]:
    """(major, minor, inode) of every /dev/shm file some process has mapped. By inode, not name:
    glibc's sem_open maps a temporary file and links it to the semaphore's name afterwards, so the
    maps show the temporary name, deleted."""
    mapped = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for line in (entry / "maps").read_text(errors="replace").splitlines():
                fields = line.split(maxsplit=5)  # address, perms, offset, major:minor, inode, path
                if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                    major, minor = (int(part, 16) for part in fields[3].split(":"))
                    mapped.add((major, minor, int(fields[4])))
    return mapped


def remove_shm_leftovers(before: set[str], shm: Path = Path("/dev/shm")) -> list[str]:
    """Remove what a stopped server left in /dev/shm since ``before`` was listed; return the names.

    SGLang's load slots (``sglang_loads_<random>.shm``) always outlive it. So does a
    multiprocessing semaphore (``sem.mp-<random>``): on SIGTERM SGLang SIGKILLs its children
    (``kill_process_tree``), multiprocessing's resource tracker among them, which would otherwise
    unlink it. A semaphore goes only when no process maps it: another program may have made one
    meanwhile, and a process that holds one may still hand its name to a child."""
    if not shm.is_dir():
        return []
    new = set(os.listdir(shm)) - before
    mapped = _mapped_shm_files() if any(name.startswith("sem.mp-") for name in new) else set()
    removed = []
    for name in sorted(new):
        with contextlib.suppress(OSError):
            if name.startswith("sem.mp-"):
                st = os.stat(shm / name)
                if (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) in mapped:
                    continue
            elif not name.startswith("sglang"):
                continue
            os.unlink(shm / name)
            removed.append(name)
    return removed


class Server:
    """One engine server on a free port, pinned to one core, in a session of its own.

    ``with Server("vllm") as server: server.url`` starts it and waits until it answers (and has
    served one warm-up request); leaving the block stops every process of its session."""

    def __init__(
        self, name: str, *, incremental: bool = False, port: int | None = None, stream_interval: int = 1
    ) -> None:
        self.engine = engine(name)
        self.incremental = incremental
        self.stream_interval = stream_interval  # SGLang's --stream-interval (vLLM streams every token)
        self.python = venv_python(name)
        self.model = model_dir(self.python)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        mode = "-incremental" if incremental else ""
        self.run_dir = cache_root() / "runs" / f"{name}{mode}-{self.port}"
        self.log_path = cache_root() / "runs" / f"{name}{mode}-{self.port}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._shm_before: set[str] = set()
        self.start_s: float | None = None  # from exec to the warm-up request's answer

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        command = ["taskset", "-c", str(SERVER_CORE), str(self.python), "-m", self.engine.module]
        command += self.engine.arguments(
            self.model, self.port, incremental=self.incremental, stream_interval=self.stream_interval
        )
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir.mkdir(parents=True)
        env = {**os.environ, **self.engine.server_env(SERVER_CORE, self.run_dir)}
        env.pop("PYTHONHOME", None)
        self._shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
        _say(f"starting {self.engine.name} on {self.url} (log: {self.log_path})")
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        try:
            self._wait_ready(started + READY_TIMEOUT_S)
            self.warm_up()
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        _say(f"{self.engine.name} ready in {self.start_s:.0f} s")

    def _wait_ready(self, deadline: float) -> None:
        assert self.proc is not None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.engine.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                # SGLang answers 503 until its own warm-up request is done.
                with urllib.request.urlopen(self.url + self.engine.ready_path, timeout=5) as response:
                    if response.status == 200:
                        return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.engine.name} not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")
            time.sleep(0.5)

    def warm_up(self) -> None:
        """One short request: the first after start pays for lazy set-up (seen: 2.5 s on vLLM)."""
        if self.engine.name == "vllm":
            path = "/inference/v1/generate"
            body = {"model": MODEL_NAME, "token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2, "temperature": 0}}
        else:
            path = "/generate"
            body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        request = urllib.request.Request(
            self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            response.read()

    def log_tail(self, lines: int = 60) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        """SIGTERM to every process of the server's session, SIGKILL to what is left after 20 s."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        sid = proc.pid
        for sig, grace in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 5.0)):
            members = _session_members(sid)
            if not members:
                break
            for pid in members:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _session_members(sid):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.1)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)
        shutil.rmtree(self.run_dir, ignore_errors=True)
        remove_shm_leftovers(self._shm_before)


# ---- command line -----------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in ("install", "model", "serve"):
        one = sub.add_parser(command)
        one.add_argument("engine", choices=sorted(ENGINES))
        if command == "serve":
            one.add_argument("--incremental", action="store_true", help="SGLang: --incremental-streaming-output")
            one.add_argument("--stream-interval", type=int, default=1, help="SGLang: --stream-interval")
            one.add_argument("--port", type=int, default=None)
    args = parser.parse_args()
    if args.command == "install":
        print(venv_python(args.engine))
    elif args.command == "model":
        print(model_dir(venv_python(args.engine)))
    else:
        # `kill` and a closed terminal stop the server as Ctrl-C does, leftovers removed.
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.default_int_handler)
        try:
            with Server(
                args.engine, incremental=args.incremental, port=args.port, stream_interval=args.stream_interval
            ) as server:
                print(server.url, flush=True)
                signal.pause()
        except KeyboardInterrupt:
            _say(f"{args.engine} stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
