"""The record of what differs per framework: everything else about a rollout is the skeleton's."""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Callable
from types import ModuleType, SimpleNamespace
from typing import Any

import aiohttp

from fastaccum._impl import IMPLEMENTATION
from fastaccum._rollout.settings import RolloutSettings
from fastaccum._version import __version__

__all__ = ("Framework", "import_framework", "framework_missing", "CONTROL_TIMEOUT")

# Control calls (/workers, /server_info, loads, aborts, /pause, /resume) answer at once on a live server.
CONTROL_TIMEOUT = aiohttp.ClientTimeout(total=10)


class Framework:
    """One framework (slime, vime, Miles) as the skeleton drives it: an adapter subclasses it and
    fills in what is its own. vime and Miles are slime's offspring, so all keep one module layout
    and one flag naming (``--{flags}-router-ip``, ``--{flags}-server-concurrency``)."""

    # With --partial-rollout, a rollout abort buffers the pending groups that kept a prefix (slime
    # with request-level abort and vime 2b83ea20 do), or every pending group (Miles does).
    buffers_every_group = False

    def __init__(
        self,
        name: str,
        flags: str,
        dialect: str,
        generate_path: str,
        modules: Callable[[], Any],
        settings: Callable[[Any], RolloutSettings],
    ) -> None:
        self.name = name  # in messages and the logger: "slime", "vime"
        self.flags = flags  # the prefix of the framework's server flags: "sglang", "vllm"
        self.dialect = dialect  # the Client's dialect for the router's generate route
        self.generate_path = generate_path  # the router's generate route, for the aiohttp transport
        # modules(): the framework's modules, imported on first use: at least ``rollout``
        # (``GenerateState``, a module-level ``abort``, ``generate_rollout``), ``misc``
        # (``load_function``), ``http_utils`` (``get``, ``get_rollout_num_engines``) and ``Sample``.
        self.modules = modules
        self.settings = settings
        self._announced = False

    def announce(self, settings: RolloutSettings) -> None:
        """Say once, at first use, what runs and how it is set: a fallback to the pure twin (many
        times slower on long streams) must not go unseen."""
        if self._announced:
            return
        self._announced = True
        mode = getattr(settings, "stream_mode", None)
        drain = "cut (no drain)" if settings.abort_drain_s is None else f"{settings.abort_drain_s:g} s"
        shards = settings.shards if settings.shards is not None else settings.shards_per_node
        where = "none" if shards is None else f"{shards}{' per node' if settings.shards is None else ''}"
        self.logger.info(
            "fastaccum %s (%s core) for %s: %stransport %s, abort %s, drain %s, retries %d (up to %g s apart), "
            "shards %s",
            __version__,
            IMPLEMENTATION,
            self.name,
            f"stream mode {mode}, " if mode else "",
            settings.transport,
            settings.abort_mode,
            drain,
            settings.retries,
            settings.retry_max_delay_s,
            where,
        )
        if IMPLEMENTATION != "cython":
            self.logger.warning(
                "fastaccum runs its pure-Python core: results are the same, but long streams cost many times "
                'the CPU (docs/install.md, "Which core is running"); install the wheel built for this Python '
                "and machine, or set FASTACCUM_REQUIRE_EXTENSIONS=1 to make this an import error"
            )

    @property
    def logger(self) -> logging.Logger:
        return logging.getLogger(f"fastaccum.{self.name}")

    def router_url(self, args: Any) -> str:
        return f"http://{getattr(args, f'{self.flags}_router_ip')}:{getattr(args, f'{self.flags}_router_port')}"

    def connection_limit(self, args: Any) -> int:
        """The pool size, as the framework sizes its own client (0: unknown)."""
        engines = int(self.modules().http_utils.get_rollout_num_engines(args))
        return int(getattr(args, f"{self.flags}_server_concurrency", 0) or 0) * engines

    async def worker_urls(self, args: Any) -> list[str]:
        response = await self.modules().http_utils.get(f"{self.router_url(args)}/workers")
        return [worker["url"] for worker in response["workers"]]

    async def server_abort(self, args: Any, urls: list[str]) -> None:
        """End every request on these workers and return when they are idle: the idle wait's
        fallback, and how calls that need their terminal event end under ``request_abort``."""
        raise NotImplementedError

    async def load(self, args: Any, url: str) -> Any:
        """A worker's load answer (``running`` counts its requests)."""
        raise NotImplementedError

    def running(self, load: Any) -> int:
        raise NotImplementedError

    async def after_cut(self, args: Any, settings: RolloutSettings) -> None:
        """After fastaccum cut its streams, before the idle wait (vime names them to a cancel
        endpoint); nothing by default."""

    async def before_collecting(self, args: Any) -> None:
        """After fastaccum stopped its streams, before it waits for the pending groups: whatever
        else runs the samples stops too (Miles' agent plugins); nothing by default."""


def import_framework(package: str, rollout: str, home: str, **extra: ModuleType | None) -> SimpleNamespace:
    """``package``'s rollout module (``{package}.rollout.{rollout}``), its utilities and
    ``Sample``, plus ``extra`` modules the adapter imported itself. ``home``: the framework's
    repository, for the message when it is not there (frameworks install from source, and PyPI
    names like ``slime`` belong to unrelated projects)."""
    try:
        utils = {
            name: importlib.import_module(f"{package}.utils.{name}") for name in ("async_utils", "http_utils", "misc")
        }
        return SimpleNamespace(
            rollout=importlib.import_module(f"{package}.rollout.{rollout}"),
            Sample=importlib.import_module(f"{package}.utils.types").Sample,
            **utils,
            **extra,
        )
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != package:
            raise  # the framework is there; something it imports is not
        raise framework_missing(package, home, exc) from exc


def framework_missing(package: str, home: str, exc: ModuleNotFoundError) -> ImportError:
    """The error for a framework that is not importable, or a package of its name that is not it."""
    found = importlib.util.find_spec(package)
    where = (
        ""
        if found is None
        else f" (the {package!r} found at {found.origin or found.submodule_search_locations} is not it)"
    )
    return ImportError(
        f"fastaccum.{package} runs inside {home}, which is not importable here{where}: {exc}. Run it in "
        f"{package}'s own environment, or put a {home} checkout on PYTHONPATH; a PyPI package named "
        f"{package!r} is another project",
        name=exc.name,
    )
