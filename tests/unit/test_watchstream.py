"""A watch's connection against loopback servers that misbehave on purpose (a real API server's
watches: test_reflector.py, test_faults.py): events over TLS come out whole and in order, a
silent connection is noticed by the read timeout, an answer cut short is a transport error, an
error answer is typed, and what the handler raises ends the watch with it."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from kubernetes import client as k8s_client

from kubeindex.client import protobuf, watchstream
from kubeindex.client.api import NO_ANSWER, ApiClient, Connection, Forbidden, Gone, Transient
from kubeindex.model.resources import PODS

Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
WATCH_HEAD = (b"HTTP/1.1 200 OK\r\nContent-Type: " + protobuf.MEDIA_TYPE.encode() + b";stream=watch\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(4, "big") + payload


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def answer_head(reader: asyncio.StreamReader) -> None:
    await reader.readuntil(b"\r\n\r\n")


def watch(serve: Serve, tls: ssl.SSLContext | None = None, client_tls: ssl.SSLContext | bool = False,
          read_timeout: float = 5, on_frame: Callable[[list[bytes], bytes], None] = list.append,
          gather: float = 0.0) -> tuple[list[bytes], BaseException | None, ApiClient]:
    """Runs one watch through ApiClient against ``serve``: the frames it gave (``on_frame`` adds
    each), how it ended."""
    async def main() -> tuple[list[bytes], BaseException | None, ApiClient]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls)
        port = server.sockets[0].getsockname()[1]
        url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        got: list[bytes] = []
        failure: BaseException | None = None
        async with server, ApiClient(Connection(url, client_tls, k8s_client.Configuration())) as api:
            try:
                await api.watch(PODS.path(), {"watch": "1"}, protobuf.ACCEPT_WATCH, read_timeout,
                                lambda frame: on_frame(got, frame), gather=lambda: gather)
            except Exception as err:
                failure = err
        return got, failure, api
    return asyncio.run(main())



@pytest.mark.parametrize("gather", [0.0, 0.01], ids=["each-read", "gathered"])
def test_events_over_tls_come_out_whole_in_order_however_they_are_written(
        tls: tuple[ssl.SSLContext, ssl.SSLContext], gather: float) -> None:
    events = [b"e%d-" % i * (1 + i * 37 % 900) for i in range(300)]  # up to 5 KB
    body = b"".join(frame(e) for e in events)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD)
        cut = 0
        for i, size in enumerate([1, 3, 700, 5000, 20000, 65536, 1 << 20] * 40):
            piece, cut = body[cut:cut + size], cut + size
            if piece:
                writer.write(chunk(piece))
                if i % 3 == 0:
                    await writer.drain()
                    await asyncio.sleep(0.001)  # apart: one read each
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()  # until the client closes

    got, failure, api = watch(serve, *tls, gather=gather)
    assert failure is None and got == events
    assert api.metrics.requests == {("200", "GET"): 1}


def test_a_silent_connection_is_noticed_by_the_read_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD + chunk(frame(b"one")))
        await writer.drain()
        await reader.read()  # then nothing, the connection open

    got, failure, _ = watch(serve, read_timeout=0.3)
    assert got == [b"one"]
    assert isinstance(failure, Transient) and failure.reason == "timeout"


@pytest.mark.parametrize("wire", [
    WATCH_HEAD + chunk(frame(b"one")) + b"40\r\n" + frame(b"two")[:5],  # closed inside a chunk
    WATCH_HEAD + chunk(frame(b"one")),  # closed between chunks, without the last one
    WATCH_HEAD + chunk(frame(b"one") + frame(b"two")[:5]) + b"0\r\n\r\n",  # last chunk inside an event
])
@pytest.mark.parametrize("gather", [0.0, 0.01], ids=["each-read", "gathered"])
def test_an_answer_cut_short_is_a_transport_error_after_what_came_whole(wire: bytes, gather: float) -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(wire)
        await writer.drain()
        writer.close()

    got, failure, _ = watch(serve, gather=gather)
    assert got == [b"one"]
    assert isinstance(failure, Transient) and failure.reason == "truncated"


def test_an_error_answer_is_typed_and_counted() -> None:
    status = b'{"kind":"Status","status":"Failure","message":"pods is forbidden","reason":"Forbidden","code":403}'

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (len(status), status))
        await writer.drain()
        await reader.read()  # kept open: the length ends the body

    got, failure, api = watch(serve)
    assert not got and isinstance(failure, Forbidden) and failure.message == "pods is forbidden"
    assert api.metrics.requests == {("403", "GET"): 1}


def test_no_answer_is_a_transport_error_counted_as_such() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.close()  # closed before answering

    got, failure, api = watch(serve)
    assert not got and isinstance(failure, Transient) and failure.reason == "unanswered"
    assert api.metrics.requests == {(NO_ANSWER, "GET"): 1}


def test_what_the_handler_raises_ends_the_watch_and_its_connection() -> None:
    """An ERROR event's Status, say: raised from the watch after the events before it, the
    events after it never handed over."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD + chunk(frame(b"one") + frame(b"gone") + frame(b"three")))
        await writer.drain()
        await reader.read()  # until the client closes

    def on_frame(got: list[bytes], event: bytes) -> None:
        if event == b"gone":
            raise Gone(410, "Expired", "too old")
        got.append(event)

    got, failure, _ = watch(serve, on_frame=on_frame)
    assert got == [b"one"]
    assert isinstance(failure, Gone) and failure.message == "too old"


def test_a_body_whole_with_the_head_ends_the_watch_at_once() -> None:
    """Content-Length: 0 (or a short body that came with the head): done, not a wait for the read
    timeout."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        await reader.read()  # kept open: the length ends the body

    got, failure, _ = watch(serve, read_timeout=30)
    assert got == [] and failure is None


def connections(port: int) -> int:
    """This process's TCP sockets to or from ``port`` (its listener left out): other tests' sockets
    closing meanwhile do not count."""
    ours = {str(fd.readlink()) for fd in Path("/proc/self/fd").iterdir() if fd.is_symlink()}
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        ports = {int(fields[1].rsplit(":", 1)[1], 16), int(fields[2].rsplit(":", 1)[1], 16)}
        if port in ports and fields[3] != "0A" and f"socket:[{fields[9]}]" in ours:  # 0A: LISTEN
            count += 1
    return count


def test_a_failed_handshake_leaves_no_connection_open(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """A server whose certificate the client does not trust: a transport error each time, and
    the sockets closed although the errors (and their tracebacks) are kept."""
    untrusted = ssl.create_default_context()  # the system's CAs: not the test CA

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    async def main() -> tuple[list[BaseException], int, int]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=tls[0])
        port = server.sockets[0].getsockname()[1]
        endpoint = watchstream.Endpoint(f"https://127.0.0.1:{port}", untrusted)
        kept: list[BaseException] = []
        async with server:
            counts = []
            for _ in range(6):
                try:
                    await watchstream.open_stream(endpoint, PODS.path(), {}, {}, 5, 5)
                except ssl.SSLError as err:
                    kept.append(err)
                await asyncio.sleep(0.05)  # the server's side of it closed too
                counts.append(connections(port))
            return kept, counts[0], counts[-1]

    kept, before, after = asyncio.run(main())
    assert len(kept) == 6 and all("CERTIFICATE_VERIFY_FAILED" in str(err) for err in kept)
    assert after <= before  # one descriptor more per failure before the fix


@pytest.mark.parametrize("token", ["abc\r\nX-Injected: 1", "abc\ndef", "abc\0", "tök"])
def test_a_header_value_that_would_break_the_request_is_refused(token: str) -> None:
    endpoint = watchstream.Endpoint("https://127.0.0.1:6443", False)
    with pytest.raises(watchstream.StreamError, match="header 'Authorization'"):
        endpoint.request(PODS.path(), {}, {"Authorization": f"Bearer {token}"})
    assert endpoint.request(PODS.path(), {"watch": "1"}, {"Authorization": "Bearer abc"}) == (
        b"GET /api/v1/pods?watch=1 HTTP/1.1\r\nHost: 127.0.0.1:6443\r\nAuthorization: Bearer abc\r\n\r\n")


def test_an_os_error_of_the_handler_is_its_own_not_the_connections() -> None:
    """What on_frame raises comes out as it was, never as a transport error (Transient), whatever
    its type: an OSError of the handler's is a bug to see, not a connection to retry."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD + chunk(frame(b"one")))
        await writer.drain()
        await reader.read()

    def on_frame(got: list[bytes], event: bytes) -> None:
        raise FileNotFoundError("the handler's own")

    _, failure, api = watch(serve, on_frame=on_frame)
    assert type(failure) is FileNotFoundError and str(failure) == "the handler's own"
    assert api.metrics.requests == {("200", "GET"): 1}


def test_a_turn_of_the_event_loop_hands_over_a_bounded_number_of_events() -> None:
    """3,000 events sent at once: handed over in turns of the event loop of about FRAMES_PER_TURN
    (and one read more at most), so a WatchList's state leaves the loop to its other work."""
    events = [b"%04d" % i * 150 for i in range(3000)]  # 600 bytes each

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD + chunk(b"".join(frame(e) for e in events)) + b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    async def main() -> tuple[list[bytes], list[int]]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        loop, turn, got, turns = asyncio.get_running_loop(), [0], [], []

        def tick() -> None:  # runs once per turn of the loop
            turn[0] += 1
            loop.call_soon(tick)

        def on_frame(event: bytes) -> None:
            got.append(event)
            turns.append(turn[0])

        async with server:
            endpoint = watchstream.Endpoint(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", False)
            stream = await watchstream.open_stream(endpoint, PODS.path(), {}, {}, 5, 5)
            tick()
            try:
                await stream.deliver(watchstream.LengthPrefixed(), on_frame)
            finally:
                stream.close()
        return got, turns

    got, turns = asyncio.run(main())
    assert got == events
    per_turn = max(turns.count(t) for t in set(turns))
    assert per_turn <= watchstream.FRAMES_PER_TURN + watchstream.READ_SIZE // 604 + 1
    assert len(set(turns)) >= len(events) // (watchstream.FRAMES_PER_TURN + watchstream.READ_SIZE // 604 + 1)


def test_a_watch_cancelled_while_it_waits_closes_its_connection() -> None:
    """The reflector's task cancelled mid-watch (a shutdown, a lost lease): the socket is closed
    and the event loop reads it no more."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD + chunk(frame(b"one")))
        await writer.drain()
        await reader.read()  # then quiet, until the client closes
        writer.close()

    async def main() -> tuple[list[bytes], int, int]:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        got: list[bytes] = []
        port = server.sockets[0].getsockname()[1]
        async with server, ApiClient(Connection(f"http://127.0.0.1:{port}", False,
                                                k8s_client.Configuration())) as api:
            before = connections(port)
            task = asyncio.ensure_future(api.watch(PODS.path(), {"watch": "1"}, protobuf.ACCEPT_WATCH, 30,
                                                   got.append))
            while not got:
                await asyncio.sleep(0.01)
            during = connections(port)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)
            return got, during - before, connections(port) - before

    got, during, after = asyncio.run(main())
    assert got == [b"one"]
    assert during == 2 and after == 0  # the two ends of the connection, then neither


def test_an_event_in_two_tls_records_is_handed_over_in_one_turn(tls: tuple[ssl.SSLContext, ssl.SSLContext],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The API server writes an event over 2 KiB as two chunks (Go's net/http buffers 2,048 bytes
    before it writes one), each a TLS record, and a read of a TLS socket returns one record: the
    watch reads the second in the turn that read the first, not in a turn of its own."""
    events = [b"%03d" % i * 1000 for i in range(50)]  # 3,000 bytes each

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD)
        for event in events:
            wire = frame(event)
            writer.write(chunk(wire[:2048]))  # one record each, sent together
            writer.write(chunk(wire[2048:]))
            await writer.drain()
            await asyncio.sleep(0.01)  # apart: each event read on its own
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    turns = [0]
    readable = watchstream.Stream._readable

    def counted(self: watchstream.Stream) -> None:
        turns[0] += 1
        readable(self)

    monkeypatch.setattr(watchstream.Stream, "_readable", counted)
    got, failure, _ = watch(serve, *tls)
    assert failure is None and got == events
    assert turns[0] <= len(events) + 5, turns[0]  # the last chunk and the close: a turn or two more


def gathered_watch(tls: tuple[ssl.SSLContext, ssl.SSLContext], gather: float,
                   send: Callable[[asyncio.StreamWriter], Awaitable[None]],
                   monkeypatch: pytest.MonkeyPatch) -> tuple[list[bytes], list[float], int]:
    """A watch over TLS whose events ``send`` writes: the events, when each was handed over (the
    loop's clock), and how many times the selector woke the stream."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await answer_head(reader)
        writer.write(WATCH_HEAD)
        await send(writer)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        await reader.read()

    at: list[float] = []
    wakes = [0]
    readable = watchstream.Stream._readable

    def woken(self: watchstream.Stream) -> None:
        wakes[0] += 1
        readable(self)

    def handed(got: list[bytes], event: bytes) -> None:
        got.append(event)
        at.append(asyncio.get_running_loop().time())

    with monkeypatch.context() as patch:
        patch.setattr(watchstream.Stream, "_readable", woken)
        got, failure, _ = watch(serve, *tls, on_frame=handed, gather=gather)
    assert failure is None
    return got, at, wakes[0]


def test_events_under_churn_are_gathered_between_reads(tls: tuple[ssl.SSLContext, ssl.SSLContext],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """60 events 5 ms apart, each as the API server writes one (two TLS records): read one by one
    without gathering, and in a few wake-ups gathering 100 ms, every event whole and in order."""
    events = [b"%03d" % i * 1000 for i in range(60)]

    async def churn(writer: asyncio.StreamWriter) -> None:
        for event in events:
            wire = frame(event)
            writer.write(chunk(wire[:2048]))
            writer.write(chunk(wire[2048:]))
            await writer.drain()
            await asyncio.sleep(0.005)

    got, _, one_by_one = gathered_watch(tls, 0.0, churn, monkeypatch)
    assert got == events and one_by_one >= 40, one_by_one
    got, _, gathered = gathered_watch(tls, 0.1, churn, monkeypatch)
    assert got == events and gathered <= 12, gathered  # about 0.4 s of events: a wake-up per 0.1 s, and the end


def test_an_event_after_a_quiet_spell_is_read_at_once(tls: tuple[ssl.SSLContext, ssl.SSLContext],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Gathering 0.5 s: an event written while the socket is left unread waits for the rest of
    that time; the first after a quiet spell longer than it is handed over as it comes."""
    sent: list[float] = []

    async def quiet(writer: asyncio.StreamWriter) -> None:
        for pause in (0.0, 0.05, 1.5):  # the second comes while the socket rests; the third after
            await asyncio.sleep(pause)
            writer.write(chunk(frame(b"event")))
            await writer.drain()
            sent.append(asyncio.get_running_loop().time())

    got, at, _ = gathered_watch(tls, 0.5, quiet, monkeypatch)
    assert len(got) == 3
    waited = [handed - written for handed, written in zip(at, sent, strict=True)]
    assert waited[1] > 0.3, waited  # held until the 0.5 s after the first ended
    assert waited[0] < 0.45 and waited[2] < 0.45, waited  # not held for the 0.5 s: only holding breaks it
