"""A watch's HTTP/1.1 answer, read straight off its socket.

A watch is one GET whose answer is a stream of small events, each flushed on its own by the API
server. Through aiohttp each of them took asyncio's TLS protocol (Python, a new buffer per read),
aiohttp's stream reader, a task wake-up and a read timer re-armed per read: under churn the
service spent 168.5 ms of CPU per 1,000 pod events that way and 117.4 ms on this path
(docs/benchmarks.md, "A watch read off its own socket"). So a watch gets a
connection of its own, non-blocking, read by the event loop's selector callback, which decrypts
what came, undoes the chunked transfer coding, cuts the events out and hands each to the watch's
handler, in one pass: no task wakes up per event. Writes go on kept-alive connections of their
own (exchange.py, built on this module's connection and answer parsing); reads on aiohttp.

One connection per watch, closed when the watch ends: a watch lasts minutes, and the server
would keep an idle pooled connection for nothing in between.
"""

from __future__ import annotations

import asyncio
import re
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlencode, urlsplit

READ_SIZE = 65536  # one recv: a TLS record holds at most 16 KiB
# A read this large (a full TLS record) is a bulk transfer, a WatchList's initial state: read on,
# up to READS_PER_TURN reads, before the event loop's other work gets its turn.
BULK_READ = 16384
READS_PER_TURN = 16
FRAMES_PER_TURN = 200  # events handed over before the event loop's other work gets its turn
MAX_HEAD = 65536  # the status line and headers
MAX_LINE = 4096  # a chunk's size line
MAX_FRAME = 64 << 20  # no object the API server stores comes near (etcd's limit is 1.5 MiB)
MAX_ERROR_BODY = 1 << 20  # of a non-2xx answer: the Status in it is a few hundred bytes


class StreamError(Exception):
    """An answer that broke off or is not what a watch sends; ``reason`` is short, for a label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def truncated(message: str) -> StreamError:
    return StreamError("truncated", message)


class Framing(Protocol):
    """Cuts a body's bytes into events."""

    def feed(self, data: bytes) -> list[bytes]: ...

    def end(self) -> list[bytes]: ...


class LengthPrefixed:
    """Protobuf watch events: each after its length, 4 bytes big-endian."""

    def __init__(self) -> None:
        self._rest = bytearray()  # the start of an event whose end has not come yet
        self._need = 0  # bytes ``_rest`` must reach before a read can complete it

    def feed(self, data: bytes) -> list[bytes]:
        # Most reads hold whole events: sliced straight out of them, each copied once. An event
        # larger than a read grows in a bytearray, so its bytes are copied a bounded number of times.
        if self._rest:
            self._rest += data
            if len(self._rest) < self._need:
                return []
            data, self._rest = bytes(self._rest), bytearray()
        elif len(data) >= 4 and len(data) - 4 == int.from_bytes(data[:4], "big") <= MAX_FRAME:
            return [data[4:]]  # one whole event: the common read under churn
        frames, start, size_of = [], 0, int.from_bytes
        while len(data) - start >= 4:
            size = size_of(data[start:start + 4], "big")
            if size > MAX_FRAME:
                raise StreamError("bad frame", f"a watch event of {size} bytes: not a protobuf watch stream")
            end = start + 4 + size
            if end > len(data):
                self._need = 4 + size
                break  # an event larger than what came so far: keep collecting
            frames.append(data[start + 4:end])
            start = end
        else:
            self._need = 4
        if start < len(data):
            self._rest = bytearray(data[start:])
        return frames

    def end(self) -> list[bytes]:
        if self._rest:
            raise truncated(f"the watch stream ended inside an event ({len(self._rest)} bytes of it)")
        return []


class JsonLines:
    """JSON watch events: one per line."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        if b"\n" not in data:
            self._buffer += data  # an event larger than one read: keep collecting
            if len(self._buffer) > MAX_FRAME:
                raise StreamError("bad frame", f"a line of over {MAX_FRAME} bytes: not a JSON watch stream")
            return []
        *lines, rest = (bytes(self._buffer) + bytes(data)).split(b"\n")
        self._buffer = bytearray(rest)
        return [line for line in lines if line]

    def end(self) -> list[bytes]:
        rest, self._buffer = bytes(self._buffer), bytearray()
        return [rest] if rest.strip() else []


class Whole:
    """An answer that is one document (a JSON LIST page): its bytes in one frame, at its end."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def feed(self, data: bytes) -> list[bytes]:
        self._parts.append(data)
        return []

    def end(self) -> list[bytes]:
        whole, self._parts = b"".join(self._parts), []
        return [whole]


class Body(Protocol):
    """Undoes a transfer coding: the payload in the bytes as they come."""

    done: bool
    until_close: bool  # the body ends with the connection (no length, not chunked)

    def feed(self, data: bytes) -> bytes: ...


# A chunk's size line: its size in hex, extensions (ignored), CRLF.
_SIZE_LINE = re.compile(rb"([0-9a-fA-F]{1,15})[ \t]*(?:;[^\r\n]*)?\r\n")


class ChunkedBody:
    """HTTP/1.1's chunked transfer coding (RFC 9112, 7.1), undone as the bytes come. Chunk
    extensions are ignored. The body is done at the last chunk; what came after it, the start of
    the trailer, is kept in ``trailer`` (a kept-alive connection reads the trailer to its end, a
    watch's is closed)."""

    def __init__(self) -> None:
        self._rest = b""  # a chunk size line, or a CRLF, cut by the end of a read
        self._left = 0  # of the chunk under way
        self._crlf = False  # the CRLF after a chunk's data is next
        self.done = False
        self.until_close = False
        self.trailer = b""

    def feed(self, data: bytes) -> bytes:
        # A watch event is mostly one chunk in one read: its data is then sliced out, one copy.
        if self.done:
            return b""
        if self._rest:
            data, self._rest = self._rest + data, b""
        elif not self._left and not self._crlf and (line := _SIZE_LINE.match(data)) is not None:
            start = line.end()
            if len(data) - start - 2 == int(line[1], 16) > 0 and data.endswith(b"\r\n"):
                return data[start:-2]  # one whole chunk: the common read of a watch
        parts, pos, end, left, crlf = [], 0, len(data), self._left, self._crlf
        while pos < end:
            if left:
                take = min(left, end - pos)
                parts.append(data[pos:pos + take])
                pos += take
                left -= take
            elif crlf:
                if end - pos < 2:
                    break
                if data[pos:pos + 2] != b"\r\n":
                    raise StreamError("bad chunk", "a chunk's data not followed by CRLF")
                pos += 2
                crlf = False
            elif line := _SIZE_LINE.match(data, pos):
                left, crlf, pos = int(line[1], 16), True, line.end()
                if not left:
                    self.done, self.trailer = True, data[pos:]  # the last chunk
                    break
                if pos + left + 2 <= end:  # the whole chunk is here (gathered reads): in one step
                    if data[pos + left:pos + left + 2] != b"\r\n":
                        raise StreamError("bad chunk", "a chunk's data not followed by CRLF")
                    parts.append(data[pos:pos + left])
                    pos += left + 2
                    left, crlf = 0, False
            elif data.find(b"\r\n", pos) >= 0:
                raise StreamError("bad chunk", f"not a chunk size line: {data[pos:pos + 40]!r}")
            elif end - pos > MAX_LINE:
                raise StreamError("bad chunk", "a chunk size line longer than 4 KiB")
            else:
                break  # the size line's end has not come yet
        self._left, self._crlf = left, crlf
        if pos < end and not self.done:
            self._rest = data[pos:]
        return parts[0] if len(parts) == 1 else b"".join(parts)


class PlainBody:
    """A body without transfer coding: ``length`` bytes, or (None) up to the connection's end."""

    def __init__(self, length: int | None) -> None:
        self._left = length
        self.done = length == 0
        self.until_close = length is None

    def feed(self, data: bytes) -> bytes:
        if self._left is None:
            return data
        data = data[:self._left]
        self._left -= len(data)
        self.done = self._left == 0
        return data


@dataclass
class Head:
    status: int
    reason: str
    headers: dict[str, str]  # names in lower case


def parse_head(raw: bytes) -> Head:
    """The status line and headers of an answer (without the blank line that ends them)."""
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not code.isdigit() or len(code) != 3:
        raise StreamError("bad answer", f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            name = name.strip().lower()
            headers[name] = f"{headers[name]}, {value.strip()}" if name in headers else value.strip()
    return Head(int(code), reason.strip(), headers)


def body_of(head: Head) -> Body:
    """How this answer's body is sent (a watch: chunked, as the API server streams it)."""
    encoding = head.headers.get("content-encoding", "identity").lower()
    if encoding != "identity":  # never asked for: no Accept-Encoding is sent
        raise StreamError("bad answer", f"a watch answer in Content-Encoding {encoding}, which was not asked for")
    if "chunked" in head.headers.get("transfer-encoding", "").lower():
        return ChunkedBody()
    length = head.headers.get("content-length")
    return PlainBody(int(length) if length and length.isdigit() else None)


class Endpoint:
    """Where a connection's requests go: scheme, host, port and path prefix of the server's URL,
    and the TLS context (None: plain HTTP)."""

    def __init__(self, url: str, tls: ssl.SSLContext | bool) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) server URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.authority = parts.netloc.rpartition("@")[2]  # the Host header, as written in the URL
        self.tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            self.tls = tls if isinstance(tls, ssl.SSLContext) else _unverified()

    def request(self, path: str, params: dict[str, str] | None, headers: dict[str, str], method: str = "GET",
                body: bytes | None = None) -> bytes:
        """The request's bytes: its head and ``body`` (None: no body)."""
        target = self.prefix + path + (f"?{urlencode(params)}" if params else "")
        for name, value in headers.items():  # a token from a file or Secret, say: never a header of its own
            if _UNSAFE.search(name) or _UNSAFE.search(value) or not value.isascii():
                raise StreamError("bad request", f"header {name[:40]!r}: a line break, NUL or non-ASCII in it")
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.authority}", *(f"{k}: {v}" for k, v in headers.items())]
        if body is not None or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body or b'')}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("ascii") + (body or b"")


_UNSAFE = re.compile(r"[\r\n\0]")


def _unverified() -> ssl.SSLContext:
    """TLS without checking the server (aiohttp's ``ssl=False``: insecure-skip-tls-verify)."""
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    return context


_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError)


async def _ready(loop: asyncio.AbstractEventLoop, sock: socket.socket, write: bool) -> None:
    """Until ``sock`` can be read (or written)."""
    ready: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    add, remove = (loop.add_writer, loop.remove_writer) if write else (loop.add_reader, loop.remove_reader)
    add(sock.fileno(), wake)
    try:
        await ready
    finally:
        remove(sock.fileno())


async def connect(endpoint: Endpoint) -> socket.socket:
    """A non-blocking connection, its TLS handshake done."""
    loop = asyncio.get_running_loop()
    addresses = await loop.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    failure: OSError = OSError(f"no address for {endpoint.host}")
    for family, kind, proto, _, address in addresses:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as err:
            sock.close()
            failure = err
            continue
        except BaseException:
            sock.close()
            raise
        if endpoint.tls is None:
            return sock
        try:
            tls_sock = endpoint.tls.wrap_socket(sock, server_hostname=endpoint.host, do_handshake_on_connect=False)
        except BaseException:
            sock.close()
            raise
        try:  # the descriptor is the TLS socket's now: closing ``sock`` would leave it open
            return await _handshake(loop, tls_sock)
        except BaseException:
            tls_sock.close()
            raise
    raise failure


async def _handshake(loop: asyncio.AbstractEventLoop, sock: ssl.SSLSocket) -> ssl.SSLSocket:
    while True:
        try:
            sock.do_handshake()
            return sock
        except ssl.SSLWantReadError:
            await _ready(loop, sock, write=False)
        except ssl.SSLWantWriteError:
            await _ready(loop, sock, write=True)


async def send_all(loop: asyncio.AbstractEventLoop, sock: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[sock.send(view):]
        except (BlockingIOError, InterruptedError, ssl.SSLWantWriteError):
            await _ready(loop, sock, write=True)
        except ssl.SSLWantReadError:
            await _ready(loop, sock, write=False)


async def recv(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> bytes:
    while True:
        try:
            return sock.recv(READ_SIZE)
        except _WOULD_BLOCK:
            await _ready(loop, sock, write=False)
        except ssl.SSLWantWriteError:
            await _ready(loop, sock, write=True)


class Unanswered(ConnectionResetError):
    """The connection ended before any byte of an answer."""


async def read_head(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[Head, bytes]:
    """An answer's head, and the bytes of its body that came with it."""
    raw = b""
    while (end := raw.find(b"\r\n\r\n")) < 0:
        if len(raw) > MAX_HEAD:
            raise StreamError("bad answer", f"an answer's head longer than {MAX_HEAD} bytes")
        try:
            data = await recv(loop, sock)
        except ConnectionResetError as err:
            if raw:
                raise
            raise Unanswered(str(err)) from err
        if not data:
            if raw:
                raise truncated("the connection closed inside an answer's head")
            raise Unanswered("the server closed the connection without answering")
        raw += data
    return parse_head(raw[:end]), raw[end + 4:]


class Stream:
    """An answered GET on its own connection: its head, then its body's events, each handed to
    ``on_frame`` by the event loop's selector callback as it is read. ``close`` whenever done
    with it."""

    def __init__(self, sock: socket.socket, head: Head, rest: bytes, read_timeout: float) -> None:
        self.head = head
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._rest = rest  # body bytes that came with the head
        self._read_timeout = read_timeout
        self._done: asyncio.Future[None] = self._loop.create_future()
        self._reading = False
        self._idle: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._body: Body = PlainBody(0)
        self._framing: Framing = JsonLines()
        self._on_frame: Callable[[bytes], None] = _nothing
        self._gather: Callable[[], float] = _at_once
        self._resume: asyncio.TimerHandle | None = None

    async def read_all(self, limit: int = MAX_ERROR_BODY) -> bytes:
        """The whole body (an error answer's), at most ``limit`` bytes of it."""
        body, payload = body_of(self.head), bytearray()
        data = self._rest
        async with asyncio.timeout(self._read_timeout):
            while True:
                payload += body.feed(data)
                if body.done or len(payload) >= limit:
                    return bytes(payload[:limit])
                data = await recv(self._loop, self._sock)
                if not data:
                    return bytes(payload)

    async def deliver(self, framing: Framing, on_frame: Callable[[bytes], None],
                      gather: Callable[[], float] | None = None) -> None:
        """Hands the body's events to ``on_frame`` as they come, until the body ends. What
        ``on_frame`` raises ends the stream with it. A connection silent for ``read_timeout`` is
        dead (TimeoutError); one closed inside the answer is ``truncated``.

        Called in the selector's callback, ``on_frame`` costs no task wake-up and no turn of the
        event loop of its own; the loop gets its turn between reads (READS_PER_TURN reads or about
        FRAMES_PER_TURN events at most; gathering, READ_SIZE bytes at most). What on_frame raised
        comes out as ``Raised``.

        ``gather`` (asked after each turn that handed events and read all there was): seconds to
        leave the socket unread, so the events meanwhile are read in one turn. Under churn events
        come one by one, and a wake-up per event costs several times the event's own work (the
        selector, a read per TLS record, every cache cold again); an event after a quiet spell is
        still read at once."""
        self._body, self._framing, self._on_frame = body_of(self.head), framing, on_frame
        self._gather = gather or _at_once
        self._last_read = self._loop.time()
        self._idle = self._loop.call_at(self._last_read + self._read_timeout, self._check_idle)
        try:  # the body bytes that came with the head; a body already whole ends here
            self._take(self._rest)
        except Exception as err:
            self._finish(err)
        self._start_reading()
        await self._done

    def close(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._stop_reading()
        self._sock.close()

    # -- the selector's side -------------------------------------------------------------------

    def _stop_reading(self) -> None:
        if self._resume is not None:
            self._resume.cancel()
            self._resume = None
        if self._reading:
            self._loop.remove_reader(self._sock.fileno())
            self._reading = False

    def _start_reading(self) -> None:
        self._resume = None
        if not self._done.done():
            self._loop.add_reader(self._sock.fileno(), self._readable)
            self._reading = True

    def _readable(self) -> None:
        if self._done.done():
            return  # ended (or cancelled) by another callback of this loop turn
        gather = self._gather()
        if gather > 0:
            self._read_gathered(gather)
        else:
            self._read_each()

    def _read_gathered(self, gather: float) -> None:
        """Under churn: every read this turn has (up to READ_SIZE bytes), cut and handed in one go,
        then the socket left for ``gather`` seconds. The server flushes each event as a chunk or
        two (Go's net/http chunks an event over 2 KiB in two), each a TLS record of its own: one
        pass over their bytes costs less than a pass per record."""
        sock, size, rest = self._sock, 0, True
        parts: list[bytes] = []
        try:
            while size < READ_SIZE:
                data = recv_now(sock)
                if data is None:
                    break  # all read
                if not data:
                    if parts:
                        self._take(b"".join(parts))
                    if not self._done.done():
                        self._finish(self._eof())
                    return
                parts.append(data)
                size += len(data)
            else:
                rest = False  # a turn's worth: the rest in the next turn, without a rest
                if isinstance(sock, ssl.SSLSocket) and sock.pending():  # held by OpenSSL: no selector wakes
                    self._loop.call_soon(self._readable)
            if not parts:
                return
            self._last_read = self._loop.time()
            handed = self._take(parts[0] if len(parts) == 1 else b"".join(parts))
            if rest and handed and not self._done.done():  # all read: leave the socket for a while
                self._stop_reading()
                self._resume = self._loop.call_later(gather, self._start_reading)
        except Exception as err:  # a reset, a TLS alert, a bad chunk, what on_frame raised
            self._finish(err)

    def _read_each(self) -> None:
        """Each read's events handed as it comes: a WatchList's initial state, node events."""
        sock, handed = self._sock, 0
        try:
            for _ in range(READS_PER_TURN):
                data = recv_now(sock)
                if data is None:
                    break
                self._last_read = self._loop.time()
                if not data:
                    self._finish(self._eof())
                    return
                took = self._take(data)
                # Decrypted bytes OpenSSL holds beyond this read: the selector would not say so.
                while isinstance(sock, ssl.SSLSocket) and sock.pending() and not self._done.done():
                    more = recv_now(sock)
                    if not more:
                        break
                    took += self._take(more)
                handed += took
                if self._done.done() or handed >= FRAMES_PER_TURN:
                    break  # enough for one turn
                if len(data) < BULK_READ and took:
                    break  # an event or a few: a read more would find nothing
                # A bulk transfer, or the start of an event: the server writes one larger than 2 KiB
                # as two chunks (Go's net/http buffers 2 KiB before chunking), each a TLS record of
                # its own, and the second is most often here already: read on in this turn.
        except Exception as err:  # a reset, a TLS alert, a bad chunk, what on_frame raised
            self._finish(err)

    def _take(self, data: bytes) -> int:
        """Hands the events ``data`` completes to on_frame; how many."""
        payload = self._body.feed(data)
        handed = self._hand(self._framing.feed(payload)) if payload else 0
        if self._body.done and not self._done.done():
            handed += self._hand(self._framing.end())  # after those: a truncated event raises here
            self._finish(None)
        return handed

    def _hand(self, frames: list[bytes]) -> int:
        on_frame = self._on_frame
        for frame in frames:
            if self._done.done():
                return 0  # on_frame ended the watch (or had it cancelled): nothing more for it
            try:
                on_frame(frame)
            except Exception as err:
                raise Raised(err) from err
        return len(frames)

    def _eof(self) -> Exception | None:
        """The connection's end: the body's too, or a truncated answer."""
        if not self._body.until_close:
            return truncated("the connection closed inside the watch's answer")
        try:
            self._hand(self._framing.end())
        except Exception as err:  # a truncated event, or what on_frame raised
            return err
        return None

    def _finish(self, failure: BaseException | None) -> None:
        self._stop_reading()
        if self._idle is not None:
            self._idle.cancel()
        if self._done.done():
            return
        if failure is None:
            self._done.set_result(None)
        else:
            self._done.set_exception(failure)

    def _check_idle(self) -> None:
        silent = self._loop.time() - self._last_read
        if silent >= self._read_timeout:
            self._finish(TimeoutError(f"no data for {silent:.0f}s"))
        else:
            self._idle = self._loop.call_at(self._last_read + self._read_timeout, self._check_idle)


def _nothing(frame: bytes) -> None:
    """No consumer yet."""


def _at_once() -> float:
    return 0.0


def recv_now(sock: socket.socket) -> bytes | None:
    """What the socket has now; None when that is nothing yet."""
    try:
        return sock.recv(READ_SIZE)
    except _WOULD_BLOCK:
        return None
    except ssl.SSLWantWriteError:
        return None  # a renegotiation's write: the next readable turn retries


class Raised(Exception):
    """What the watch's consumer (on_frame) raised, carried out of the stream apart from the
    connection's own errors: ``error``."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def open_stream(endpoint: Endpoint, path: str, params: dict[str, str], headers: dict[str, str],
                      connect_timeout: float, read_timeout: float) -> Stream:
    """Connects (within ``connect_timeout``), sends the GET and reads the answer's head (within
    ``read_timeout``). OSError, ssl.SSLError or TimeoutError when no answer came."""
    async with asyncio.timeout(connect_timeout):
        sock = await connect(endpoint)
    try:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(read_timeout):
            await send_all(loop, sock, endpoint.request(path, params, headers))
            head, rest = await read_head(loop, sock)
        return Stream(sock, head, rest, read_timeout)
    except BaseException:
        sock.close()
        raise
