"""A request and its answer on a kept-alive connection of our own (HTTP/1.1).

Writes are small and many: under churn the reconciler applies about 30 summaries a second.
Through aiohttp one cost the service 496 µs of CPU (the request and response objects, the URL,
timers, the stream reader, then TLS); written and read here, 369 µs (`bench.write_cost`,
docs/benchmarks.md, "Writes on connections of our own"). So ``ApiClient.request`` comes here;
reads that may be large (LISTs, which aiohttp asks gzip-compressed) stay on aiohttp. The
connection, its TLS and the answer's head and body are watchstream's.

One request at a time per connection; an idle connection is kept for the next request, the most
recently used first. A kept connection the server (or a load balancer) closed meanwhile is found
out before the request, when the idle socket has something to read (an idle HTTP/1.1 connection
has nothing to say but its end), or at it, when the connection ends before any byte of the
answer: the request is then sent once more on a new connection if repeating it is harmless, as
Go's net/http does (idempotent methods; and apply patches, which state a whole intent).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass

from .watchstream import (
    MAX_ERROR_BODY,
    MAX_FRAME,
    MAX_HEAD,
    Endpoint,
    StreamError,
    Unanswered,
    body_of,
    connect,
    read_head,
    recv,
    recv_now,
    send_all,
    truncated,
)

APPLY_PATCH = "application/apply-patch+yaml"
IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})  # RFC 9110, 9.2.2


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes


def replayable(method: str, headers: dict[str, str]) -> bool:
    """Whether sending the request twice does what sending it once does."""
    return method in IDEMPOTENT or (method == "PATCH" and headers.get("Content-Type") == APPLY_PATCH)


class ConnectionPool:
    """At most ``limit`` connections to ``endpoint`` at once, each kept alive between requests (a
    burst of ``limit`` requests leaves ``limit`` idle: the next burst opens none)."""

    def __init__(self, endpoint: Endpoint, limit: int, on_silent: Callable[[], None] | None = None) -> None:
        self.endpoint = endpoint
        self._slots = asyncio.Semaphore(limit)
        self._idle: list[socket.socket] = []
        self._busy: set[socket.socket] = set()  # carrying a request now
        self._generation = 0  # a connection taken before a renew is not kept after it
        # Called when a request went out and its timeout passed with no complete answer (not a
        # wait for a connection or a slot): the connection, and maybe the path, went silent.
        self.on_silent = on_silent

    async def request(self, method: str, path: str, params: dict[str, str] | None, headers: dict[str, str],
                      body: bytes | None, timeout: float) -> Answer:
        """The answer (any status), within ``timeout`` seconds in all (the wait for a connection
        too). OSError, ssl.SSLError, StreamError or TimeoutError when none came."""
        data = self.endpoint.request(path, params, headers, method, body)
        sent = False  # our timeout passed after the request went out: the connection was silent
        try:
            async with asyncio.timeout(timeout), self._slots:
                while True:
                    sock, generation, sent = self._take(), self._generation, False
                    reused = sock is not None
                    if sock is None:
                        sock = await connect(self.endpoint)
                    self._busy.add(sock)
                    try:
                        sent = True
                        answer, keep = await _exchange(sock, data, method == "HEAD")
                    except Unanswered:
                        sock.close()
                        if reused and replayable(method, headers):
                            continue  # the server closed it while idle: once more, on a new connection
                        raise
                    except BaseException:
                        sock.close()  # mid-answer: never reused
                        raise
                    finally:
                        self._busy.discard(sock)
                    if keep and generation == self._generation:  # at most ``limit``: one per slot
                        self._idle.append(sock)
                    else:
                        sock.close()
                    return answer
        except TimeoutError:
            if sent and self.on_silent is not None:
                self.on_silent()
            raise

    def renew(self) -> None:
        """Requests from now on go on new connections; those under way finish on theirs."""
        self._generation += 1
        self.close()

    def abandon(self) -> None:
        """As ``renew``, and the requests under way end at once, unanswered (their connections are
        shut down under them: a silent one would hold its request until the timeout)."""
        self.renew()
        for sock in list(self._busy):
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)  # the TCP connection, not a TLS close

    def close(self) -> None:
        """Closes the idle connections."""
        idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()

    def _take(self) -> socket.socket | None:
        """An idle connection that is still open, or None."""
        while self._idle:
            sock = self._idle.pop()
            try:
                if recv_now(sock) is None:  # nothing to read: still open
                    return sock
            except OSError:
                pass
            sock.close()  # its end (or bytes no request asked for)
        return None


async def _exchange(sock: socket.socket, request: bytes, head_only: bool) -> tuple[Answer, bool]:
    """Sends ``request`` and reads its answer: the answer, and whether the connection may carry
    another request."""
    loop = asyncio.get_running_loop()
    try:
        await send_all(loop, sock, request)
    except (BrokenPipeError, ConnectionResetError) as err:  # closed before the request was out
        raise Unanswered(str(err)) from err
    head, rest = await read_head(loop, sock)
    if head_only or head.status in (204, 304):  # RFC 9112, 6.3: no body, whatever the headers say
        return Answer(head.status, b""), not rest and _keeps_alive(head.headers)
    body, payload = body_of(head), bytearray()
    limit = MAX_FRAME if head.status < 300 else MAX_ERROR_BODY
    data = rest
    while True:
        payload += body.feed(data)
        if len(payload) > limit:
            raise StreamError("bad answer", f"an answer longer than {limit} bytes")
        if body.done:
            break
        data = await recv(loop, sock)
        if not data:
            if body.until_close:
                return Answer(head.status, bytes(payload)), False
            raise truncated("the connection closed inside an answer")
    keep = _keeps_alive(head.headers) and await _trailer_read(loop, sock, getattr(body, "trailer", None))
    return Answer(head.status, bytes(payload)), keep


def _keeps_alive(headers: dict[str, str]) -> bool:
    return "close" not in headers.get("connection", "").lower()


async def _trailer_read(loop: asyncio.AbstractEventLoop, sock: socket.socket, trailer: bytes | None) -> bool:
    """Reads a chunked answer's trailer (RFC 9112, 7.1.2) to its end; True when the connection is
    then where the next answer starts. ``None``: a body without one (Content-Length)."""
    if trailer is None:
        return True
    while True:
        if trailer.startswith(b"\r\n"):
            return trailer == b"\r\n"  # an empty trailer; bytes after it: no request asked for them
        end = trailer.find(b"\r\n\r\n")
        if end >= 0:
            return end + 4 == len(trailer)
        if len(trailer) > MAX_HEAD:
            return False
        data = await recv(loop, sock)
        if not data:
            return False
        trailer += data
