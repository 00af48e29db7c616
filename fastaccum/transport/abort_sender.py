"""Control requests for ``fastaccum.Client``: the drain abort's ``POST /abort_request`` (SGLang),
or vLLM's ``POST /inference/v1/abort_requests``.

SGLang finishes a request aborted by rid through its normal output path, so a client that keeps
reading gets a terminal event with what the server collected (routed experts, top-p rows, indexer
top-k). ``AbortSender`` sends those aborts for one client: every abort asked for in one loop
iteration goes out together, over at most ``PARALLEL`` keep-alive connections per server, never a
connection per stream, ``WINDOW`` requests per write with the replies read back in order (HTTP/1.1
pipelining: SGLang takes one rid per request, so a rollout abort is one request per stream). A
router (sglang-router, the model gateway) has no ``/abort_request``; it lists its workers at ``GET
/workers``, and the abort goes to each of them (a worker ignores a rid it does not hold; no router
says which worker serves a request). Each worker takes the rids in another order, and a rid whose
stream has ended is left out of every window not yet written: its holder has ended it, or the
stream was cut. vLLM (``VllmAbortSender``) takes every request id of a batch in one request,
at ``/inference/v1/abort_requests`` (0.32 on) or ``/abort_requests`` (a ``--tokens-only`` server
before that); a server with neither is found out by the first abort, whose streams are then cut,
as every later one is at once.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Any

import httptools
import orjson

from fastaccum.errors import ServerError, StreamConnectionError, StreamError, StreamTimeoutError
from fastaccum.transport.http1 import header_lines, status_error

__all__ = ("DEPTH", "MAX_CONNECTIONS", "PARALLEL", "WINDOW", "AbortSender", "VllmAbortSender", "Drain", "worker_urls")

# Connections per server for one batch of aborts.
PARALLEL = 4
# Connections for one batch across a router's workers, each having at least one: at 32 workers,
# one each drained no slower than two or four each in benchmarks/abort_fanout.py, for fewer system
# calls in the client.
MAX_CONNECTIONS = 32
# Abort requests per write on one connection, leaving out the rids whose streams have ended. 32 left
# out more than 64-256 did in benchmarks/abort_fanout.py, for one write per 32 requests.
WINDOW = 32
# Windows awaiting their replies on one connection: the server has the next while the client reads
# the replies to the last.
DEPTH = 2
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


class _Replies:
    """The replies to pipelined requests, read off one connection in order: how many came, and
    the first that was not 2xx."""

    def __init__(self) -> None:
        self.count = 0
        self.refusal: tuple[int, bytes] | None = None
        self.closing = False  # a reply said the server closes the connection after it
        self._body = bytearray()
        self.parser = httptools.HttpResponseParser(self)

    def on_body(self, body: bytes) -> None:
        self._body += body

    def on_message_complete(self) -> None:
        status = self.parser.get_status_code()
        if not 200 <= status < 300 and self.refusal is None:
            self.refusal = (status, bytes(self._body))
        self.closing = self.closing or not self.parser.should_keep_alive()
        self._body.clear()
        self.count += 1


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

    async def post_each(
        self, path: str, items: list[tuple[str, bytes]], wanted: Callable[[str], bool], timeout: float
    ) -> int:
        """POST each ``(key, JSON body)`` to ``path`` on one keep-alive connection, ``WINDOW``
        requests per write, ``DEPTH`` windows awaiting their replies, which come in order; an
        item whose key is no longer ``wanted`` when its window is written is left out. Raises at
        the first reply that is not 2xx; returns how many requests were written."""
        head = b"POST %s HTTP/1.1\r\n%sContent-Type: application/json\r\nContent-Length: " % (
            (self.prefix + path).encode("ascii"),
            self.head,
        )
        written = 0
        todo: deque[tuple[str, bytes]] = deque(items)
        waiting: deque[list[tuple[str, bytes]]] = deque()  # written windows, oldest first
        reader: asyncio.StreamReader | None = None
        writer: asyncio.StreamWriter | None = None
        replies, fresh = _Replies(), True  # fresh: no window answered yet on this connection
        try:
            while True:
                while len(waiting) < DEPTH and todo:
                    window = [todo.popleft() for _ in range(min(WINDOW, len(todo)))]
                    window = [(key, body) for key, body in window if wanted(key)]
                    if not window:
                        continue
                    if writer is None or reader is None:
                        async with asyncio.timeout(timeout):
                            reader, writer = await asyncio.open_connection(self.host, self.port)
                        replies, fresh = _Replies(), True
                    writer.write(b"".join(b"%s%d\r\n\r\n%s" % (head, len(body), body) for _, body in window))
                    written += len(window)
                    waiting.append(window)
                if not waiting:
                    return written
                assert reader is not None and writer is not None
                ended = False
                async with asyncio.timeout(timeout):
                    try:
                        while replies.count < len(waiting[0]) and not replies.closing:
                            data = await reader.read(65536)
                            if not data:
                                ended = True
                                break
                            replies.parser.feed_data(data)
                    except ConnectionError:
                        if fresh:
                            raise
                        ended = True
                if replies.refusal is not None:
                    status, body = replies.refusal
                    text = body.decode("utf-8", errors="replace")
                    raise status_error(f"{self.url}{path}", status, "", text, None)
                while waiting and replies.count >= len(waiting[0]):
                    replies.count -= len(waiting.popleft())
                    fresh = False
                if ended or replies.closing:
                    # The server closed the connection (after a reply that said so, or idle): what
                    # it did not answer goes again on a new one, less what is no longer wanted.
                    if fresh and not replies.count:
                        raise StreamConnectionError(f"{self.url} closed the connection before answering")
                    if waiting:
                        waiting[0] = waiting[0][replies.count :]
                    todo.extendleft(reversed([item for window in waiting for item in window]))
                    waiting.clear()
                    writer.close()
                    reader = writer = None
        except TimeoutError:
            raise StreamConnectionError(f"{self.url} did not answer within {timeout} s") from None
        except (OSError, httptools.HttpParserError) as exc:
            raise StreamConnectionError(f"control request to {self.url} failed: {exc}") from None
        finally:
            if writer is not None:
                writer.close()

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
        self._waiting: list[str] = []  # the ids the sender knows this stream waits for
        self.error: BaseException | None = None

    def start(self, ids: tuple[str, ...]) -> None:
        """Ask the server to abort the request it runs under ``ids``; cut at the deadline."""
        if not ids:
            self.error = StreamError(
                "the request has no id of its own (a batch's list of ids): it cannot be aborted alone"
            )
            self._cut()
            return
        self._timer = asyncio.get_running_loop().call_later(self._seconds, self._expired)
        self._ask(ids)

    def resend(self, ids: tuple[str, ...]) -> None:
        """The abort again, once the first event shows that the server holds the request: sent
        before that, it may have arrived first, and SGLang and vLLM ignore an id they do not hold
        (a second abort of a held id is a no-op on both)."""
        if self._timer is not None:
            self._ask(ids)

    def _ask(self, ids: tuple[str, ...]) -> None:
        self._ids = ids
        new = [name for name in ids if name not in self._waiting]
        self._waiting += new
        self._sender.wait(new)
        self._sender.add(ids, self._failed, self._seconds)

    def cancel(self) -> None:
        """The stream ended (its terminal event, a cut, a close): aborts of its ids not yet
        written are left out. A cut reaches the server as it did without them: at once when
        direct, through a router at the worker's next write."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting:
            self._sender.forget(self._waiting)
            self._waiting = []

    def interrupted(self, exc: BaseException) -> None:
        """The connection went before the server ended the request (the client closed, the
        server left): a cut, for ``exc``'s reason."""
        if self._timer is not None:
            self.cancel()
            self.error = exc

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
        # Ids whose streams wait for their abort, with how many do: the others' are left out.
        self._waiting: Counter[str] = Counter()
        self.sent = 0  # abort requests sent (each worker's count once); benchmarks read it

    def add(self, ids: tuple[str, ...], failed: Callable[[BaseException], None], deadline_s: float) -> None:
        """Abort the request its server knows by ``ids``; ``failed(exc)`` if that cannot be done.
        ``deadline_s``: how long its stream waits for the abort to take."""
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        for name in ids:
            self._pending[name] = failed
        self._timeout = max(self._timeout, deadline_s)

    def wait(self, ids: Iterable[str]) -> None:
        """A stream waits for the abort of ``ids`` (until ``forget``)."""
        self._waiting.update(ids)

    def forget(self, ids: Iterable[str]) -> None:
        """The stream waiting for the abort of ``ids`` ended: aborts of them not yet written are
        left out."""
        for name in ids:
            left = self._waiting[name] - 1
            if left > 0:
                self._waiting[name] = left
            else:
                del self._waiting[name]

    @property
    def sending(self) -> bool:
        """Aborts asked for are still being sent (or answered); benchmarks and tests wait on it."""
        return bool(self._pending or self._tasks)

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
                base = self._base
                (reply,) = await base.exchange([base.request("POST", "/abort_request", {"rid": rids[0]})], timeout)
                self.sent += 1
                self._router = reply.status in (404, 405)  # a router lists the workers instead
                if not self._router:
                    _check(base, [reply])
                    rids = rids[1:]
            await self._post(await self._workers() if self._router else [self._base], rids, timeout)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            for failed in set(batch.values()):
                failed(exc)

    async def _post(self, servers: list[_Server], rids: list[str], timeout: float) -> None:
        """Every rid to every server, one request each (SGLang takes one rid per request). Each
        server takes the rids from another start, so that every rid soon reaches some server
        early: once its holder has ended it, its stream ends and the rid is left out of the
        windows still to be written."""
        if not rids:
            return
        items = [(rid, orjson.dumps({"rid": rid})) for rid in rids]
        connections = max(1, min(PARALLEL, MAX_CONNECTIONS // len(servers), -(-len(items) // WINDOW)))
        share = -(-len(items) // connections)
        parts = []
        for k, server in enumerate(servers):
            turn = k * len(items) // len(servers)
            order = items[turn:] + items[:turn]
            parts += [self._post_part(server, order[i : i + share], timeout) for i in range(0, len(order), share)]
        await asyncio.gather(*parts)

    async def _post_part(self, server: _Server, items: list[tuple[str, bytes]], timeout: float) -> None:
        written = await server.post_each("/abort_request", items, self._waiting.__contains__, timeout)
        self.sent += written  # not `self.sent += await ...`: that reads the count before the wait

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
