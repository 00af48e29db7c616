"""Control requests for ``fastaccum.Client``: the drain abort's ``POST /abort_request`` (SGLang),
or vLLM's ``POST /inference/v1/abort_requests``.

SGLang finishes a request aborted by rid through its normal output path, so a client that keeps
reading gets a terminal event with what the server collected (routed experts, top-p rows, indexer
top-k). ``AbortSender`` sends those aborts for one client: every abort asked for in one loop
iteration goes out together, over at most ``PARALLEL`` keep-alive connections per server, never a
connection per stream. A router (sglang-router, the model gateway) has no ``/abort_request``; it
lists its workers at ``GET /workers``, and the abort goes to each of them (a worker ignores a rid
it does not hold). vLLM (``VllmAbortSender``) takes every request id of a batch in one request,
at ``/inference/v1/abort_requests`` (0.32 on) or ``/abort_requests`` (a ``--tokens-only`` server
before that); a server with neither is found out by the first abort, whose streams are then cut,
as every later one is at once.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Any

import httptools
import orjson

from fastaccum.errors import ServerError, StreamConnectionError, StreamError, StreamTimeoutError
from fastaccum.transport.http1 import header_lines, status_error

__all__ = ("PARALLEL", "AbortSender", "VllmAbortSender", "Drain", "worker_urls")

# Connections per server for one batch of aborts.
PARALLEL = 4
# A control request that takes longer than this, or than the longest drain deadline of its batch
# (a loaded server answers late, and its streams wait that long anyway), has failed.
CONTROL_TIMEOUT_S = 10.0


class _Reply:
    """One response read by httptools: status and body."""

    def __init__(self) -> None:
        self.status = 0
        self.body = bytearray()
        self.complete = False
        self.keep_alive = False
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        self.complete = True
        self.status = self.parser.get_status_code()
        self.keep_alive = self.parser.should_keep_alive()  # the parser forgets it after this call


class _Server:
    """Where control requests go: one http:// base URL."""

    def __init__(self, url: str, extra_headers: bytes = b"") -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise StreamConnectionError(f"cannot send an abort to {url!r}: Client speaks plain http://")
        self.url = url.rstrip("/")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.head = header_lines({"Host": parts.netloc.rsplit("@", 1)[-1]}) + extra_headers

    def request(self, method: str, path: str, body: Any = None) -> bytes:
        data = b"" if body is None else orjson.dumps(body)
        kind = b"Content-Type: application/json\r\n" if body is not None else b""
        return b"%s %s HTTP/1.1\r\n%s%sContent-Length: %d\r\n\r\n%s" % (
            method.encode(),
            (self.prefix + path).encode("ascii"),
            self.head,
            kind,
            len(data),
            data,
        )

    async def exchange(self, requests: list[bytes], timeout: float = CONTROL_TIMEOUT_S) -> list[_Reply]:
        """Send the requests one after another on one keep-alive connection (a new one where the
        server closed it); the replies in order. Each exchange has ``timeout``: a long batch on a
        loaded server is slow as a whole, not stuck."""
        replies: list[_Reply] = []
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        try:
            for request in requests:
                async with asyncio.timeout(timeout):
                    if writer is None or reader is None or reader.at_eof():
                        if writer is not None:
                            writer.close()
                        reader, writer = await asyncio.open_connection(self.host, self.port)
                    writer.write(request)
                    reply = _Reply()
                    while not reply.complete:
                        data = await reader.read(65536)
                        if not data:
                            raise StreamConnectionError(f"{self.url} closed the connection before answering")
                        reply.parser.feed_data(data)
                if not reply.keep_alive:
                    writer.close()
                    writer = None
                replies.append(reply)
        except TimeoutError:
            raise StreamConnectionError(f"{self.url} did not answer within {timeout} s") from None
        except (OSError, httptools.HttpParserError) as exc:
            raise StreamConnectionError(f"control request to {self.url} failed: {exc}") from None
        finally:
            if writer is not None:
                writer.close()
        return replies


class Drain:
    """One stream's drain abort: the abort request, and the deadline after which ``cut()`` runs.
    ``error`` says why a drain fell back to a cut, whenever it did."""

    def __init__(self, sender: AbortSender, seconds: float, cut: Callable[[], None]) -> None:
        self._sender, self._seconds, self._cut = sender, seconds, cut
        self._timer: asyncio.TimerHandle | None = None
        self._ids: tuple[str, ...] = ()
        self.error: BaseException | None = None

    def start(self, ids: tuple[str, ...]) -> None:
        """Ask the server to abort the request it runs under ``ids``; cut at the deadline."""
        if not ids:
            self.error = StreamError(
                "the request has no id of its own (a batch's list of ids): it cannot be aborted alone"
            )
            self._cut()
            return
        self._ids = ids
        self._timer = asyncio.get_running_loop().call_later(self._seconds, self._expired)
        self._sender.add(ids, self._failed, self._seconds)

    def resend(self, ids: tuple[str, ...]) -> None:
        """The abort again, once the first event shows that the server holds the request: sent
        before that, it may have arrived first, and SGLang and vLLM ignore an id they do not hold
        (a second abort of a held id is a no-op on both)."""
        if self._timer is not None:
            self._ids = ids
            self._sender.add(ids, self._failed, self._seconds)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        self.error = StreamTimeoutError(
            f"the server did not end request {self._ids[0]} within abort_drain_s={self._seconds} s of its abort: "
            "the stream was cut"
        )
        self._cut()

    def _failed(self, exc: BaseException) -> None:
        if self._timer is None:  # the stream already ended: nothing to fall back from
            return
        self.cancel()
        self.error = exc
        self._cut()


def worker_urls(answer: bytes) -> list[str]:
    """The worker URLs in a router's ``GET /workers`` answer."""
    try:
        data = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return []
    items = data.get("workers", data.get("urls", [])) if isinstance(data, dict) else data
    urls = []
    for item in items if isinstance(items, list) else []:
        url = item.get("url") if isinstance(item, dict) else item
        if isinstance(url, str) and url.startswith("http://"):
            urls.append(url)
    return urls


class AbortSender:
    """The drain aborts of one client, sent in batches (one per loop iteration)."""

    def __init__(self, base_url: str, extra_headers: bytes = b"") -> None:
        self._base = _Server(base_url, extra_headers)
        self._router: bool | None = None  # None until the first abort says which
        self._pending: dict[str, Callable[[BaseException], None]] = {}
        self._timeout = CONTROL_TIMEOUT_S  # the pending batch's
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0  # abort requests sent (each worker's count once); benchmarks read it

    def add(self, ids: tuple[str, ...], failed: Callable[[BaseException], None], deadline_s: float) -> None:
        """Abort the request its server knows by ``ids``; ``failed(exc)`` if that cannot be done.
        ``deadline_s``: how long its stream waits for the abort to take."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        for name in ids:
            self._pending[name] = failed
        self._timeout = max(self._timeout, deadline_s)

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _flush(self) -> None:
        batch, self._pending = self._pending, {}
        timeout, self._timeout = self._timeout, CONTROL_TIMEOUT_S
        if batch:
            task = asyncio.get_running_loop().create_task(self._send(batch, timeout))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, batch: dict[str, Callable[[BaseException], None]], timeout: float) -> None:
        try:
            rids = list(batch)
            if self._router is None:  # the first abort says which: one rid asked, the rest wait
                replies = await self._post(self._base, rids[:1], timeout)
                self._router = replies[0].status in (404, 405)  # a router lists the workers instead
                if not self._router:
                    _check(self._base, replies)
                    rids = rids[1:]
            if not self._router:
                if rids:
                    _check(self._base, await self._post(self._base, rids, timeout))
                return
            workers = await self._workers()
            await asyncio.gather(*(self._post_checked(worker, rids, timeout) for worker in workers))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for failed in set(batch.values()):
                failed(exc)

    async def _post(self, server: _Server, rids: Iterable[str], timeout: float) -> list[_Reply]:
        requests = [server.request("POST", "/abort_request", {"rid": rid}) for rid in rids]
        if not requests:
            return []
        share = -(-len(requests) // PARALLEL)
        parts = await asyncio.gather(
            *(server.exchange(requests[i : i + share], timeout) for i in range(0, len(requests), share))
        )
        self.sent += len(requests)
        return [reply for part in parts for reply in part]

    async def _post_checked(self, server: _Server, rids: Iterable[str], timeout: float) -> None:
        _check(server, await self._post(server, rids, timeout))

    async def _workers(self) -> list[_Server]:
        (reply,) = await self._base.exchange([self._base.request("GET", "/workers")])
        urls = worker_urls(bytes(reply.body)) if reply.status == 200 else []
        if not urls:
            raise ServerError(
                f"{self._base.url} has no /abort_request and lists no workers at /workers "
                f"(HTTP {reply.status}): cannot abort by rid",
                status=reply.status,
            )
        return [_Server(url) for url in urls]


class VllmAbortSender(AbortSender):
    """vLLM's aborts: one ``POST {"request_ids": [...]}`` per batch and server, to the first of
    vLLM's two paths the server has (none once it is known to have neither). Behind a router,
    to each worker it lists: vllm-router takes the abort path too, but hands it to one worker of
    its own choosing, not to the one running the request. The first abort finds out which
    (``GET /workers``, which vLLM itself does not serve)."""

    _PATHS = ("/inference/v1/abort_requests", "/abort_requests")

    def __init__(self, base_url: str, extra_headers: bytes = b"") -> None:
        super().__init__(base_url, extra_headers)
        self._targets: list[_Server] | None = None  # the server, or a router's workers
        self._paths: dict[str, tuple[str, ...]] = {}  # by server: the path it has, () for neither

    async def _send(self, batch: dict[str, Callable[[BaseException], None]], timeout: float) -> None:
        try:
            if self._targets is None:
                (reply,) = await self._base.exchange([self._base.request("GET", "/workers")])
                urls = worker_urls(bytes(reply.body)) if reply.status == 200 else []
                self._targets = [_Server(url) for url in urls] or [self._base]
            ids = list(batch)
            await asyncio.gather(*(self._abort_on(server, ids, timeout) for server in self._targets))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for failed in set(batch.values()):
                failed(exc)

    async def _abort_on(self, server: _Server, ids: list[str], timeout: float) -> None:
        for path in self._paths.get(server.url, self._PATHS):
            (reply,) = await server.exchange([server.request("POST", path, {"request_ids": ids})], timeout)
            self.sent += 1
            if reply.status not in (404, 405):
                self._paths[server.url] = (path,)
                _check(server, [reply], path)
                return
        self._paths[server.url] = ()
        raise ServerError(
            f"{server.url} has neither {' nor '.join(self._PATHS)} (vLLM before 0.32 without "
            "--tokens-only): its requests are aborted by closing the connection",
            status=404,
        )


def _check(server: _Server, replies: list[_Reply], path: str = "/abort_request") -> None:
    for reply in replies:
        if not 200 <= reply.status < 300:
            body = reply.body.decode("utf-8", errors="replace")
            raise status_error(f"{server.url}{path}", reply.status, "", body, None)
