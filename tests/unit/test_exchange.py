"""Requests on kept-alive connections (kubeindex/client/exchange.py) against loopback servers that
misbehave on purpose (a real API server's writes: test_reconciler.py, test_leader.py and every
test that writes): a connection carries request after request, whatever framing its answers
have; one the server closed while idle, or closes at the next request, costs no request that is
safe to repeat and repeats none that is not; a silent server is a timeout; renewing the pool
drops every connection it had."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from kubernetes import client as k8s_client

from kubeindex.client.api import NO_ANSWER, SILENCE_EVERY, ApiClient, Connection, NotFound, Transient
from kubeindex.client.exchange import replayable

APPLY = "application/apply-patch+yaml"
T = TypeVar("T")


SILENT = b""  # an answer never written


class Server:
    """A loopback HTTP/1.1 server that reads requests one by one off each connection and answers
    each as ``answer`` says: bytes to write (the connection closed after them when they ask for
    it or have neither a length nor chunks), SILENT, or None (closed without answering)."""

    def __init__(self, answer: Callable[[int, int, bytes], bytes | None], tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer  # (connection number, request number on it, request) -> answer
        self.tls = tls
        self.connections = 0
        self.requests: list[tuple[int, bytes]] = []  # (connection number, request line and body)
        self.pause = 0.0  # seconds between the two halves of every answer
        self.close_idle = False  # close each connection after its first answer (an idle timeout)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number, on_it = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                request = head.split(b"\r\n")[0] + b" " + await reader.readexactly(length)
                self.requests.append((number, request))
                on_it += 1
                answer = self.answer(number, on_it, request)
                if answer is None:
                    break
                if answer == SILENT:
                    await reader.read()  # until the client gives up
                    break
                half = len(answer) // 2
                writer.write(answer[:half])
                await writer.drain()
                await asyncio.sleep(self.pause)
                writer.write(answer[half:])
                await writer.drain()
                head = answer.partition(b"\r\n\r\n")[0]
                framed = b"Content-Length" in head or b"chunked" in head or b" 204 " in head
                if self.close_idle or b"Connection: close" in head or not framed:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    def run(self, client: Callable[[ApiClient], Awaitable[T]], client_tls: ssl.SSLContext | bool = False,
            limit: int = 8) -> T:
        async def main() -> T:
            server = await asyncio.start_server(self.serve, "127.0.0.1", 0, ssl=self.tls)
            port = server.sockets[0].getsockname()[1]
            url = f"{'https' if self.tls else 'http'}://127.0.0.1:{port}"
            async with server, ApiClient(Connection(url, client_tls, k8s_client.Configuration()), limit) as api:
                return await client(api)
        return asyncio.run(main())


def plain(body: bytes, status: str = "200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %s\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s" % (
        status.encode(), extra, len(body), body)


def chunked(body: bytes, trailer: bytes = b"") -> bytes:
    """``body`` in chunks of 1,000 bytes, then the last chunk and ``trailer`` (field lines)."""
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(body[i:i + 1000]), body[i:i + 1000]) for i in range(0, len(body), 1000))
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunks + b"0\r\n" + trailer + b"\r\n")


def obj(n: int, size: int = 10) -> bytes:
    return json.dumps({"n": n, "pad": "x" * size}).encode()


def apply(api: ApiClient, n: int) -> Awaitable[bytes]:
    return api.request("PATCH", f"/apis/x/v1/things/t{n}", {"n": n}, {"fieldManager": "m"}, content_type=APPLY)



@pytest.mark.parametrize("framing", ["length", "chunked", "chunked with trailer fields", "no content"])
def test_one_connection_carries_request_after_request(framing: str, tls: tuple[ssl.SSLContext, ssl.SSLContext],
                                                      ) -> None:
    def answer(conn: int, n: int, request: bytes) -> bytes:
        body = obj(n, size=5000)  # above the 2 KiB past which the API server answers in chunks
        if framing == "length":
            return plain(body)
        if framing == "no content":
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        return chunked(body, b"X-Check: 1\r\nX-More: 2\r\n" if "trailer" in framing else b"")

    server = Server(answer, tls[0])
    server.pause = 0.01  # every answer in two reads at least

    async def client(api: ApiClient) -> list[bytes]:
        return [await apply(api, i) for i in range(5)]

    got = server.run(client, client_tls=tls[1])
    expected = [b""] * 5 if framing == "no content" else [obj(n, size=5000) for n in range(1, 6)]
    assert got == expected
    assert server.connections == 1
    assert server.requests[0][1] == b'PATCH /apis/x/v1/things/t0?fieldManager=m HTTP/1.1 {"n":0}'


def test_an_idle_connection_the_server_closed_is_not_used() -> None:
    server = Server(lambda conn, n, request: plain(obj(n)))
    server.close_idle = True

    async def client(api: ApiClient) -> list[bytes]:
        first = await api.request("POST", "/apis/x/v1/things", {"a": 1})
        await asyncio.sleep(0.1)  # the server closes the connection after its first answer
        return [first, await api.request("POST", "/apis/x/v1/things", {"a": 2})]

    assert server.run(client) == [obj(1), obj(1)]
    assert server.connections == 2 and len(server.requests) == 2  # the POST went once, on a new connection


def test_closed_at_the_next_request_a_request_safe_to_repeat_is_sent_again() -> None:
    """The connection ends as the second request arrives (an idle timeout's race): an apply is
    sent again on a new connection, a POST is not and fails as a transport error."""
    server = Server(lambda conn, n, request: None if (conn, n) in ((1, 2), (2, 2)) else plain(obj(n)))

    async def client(api: ApiClient) -> tuple[bytes, bytes, BaseException]:
        first, second = await apply(api, 1), await apply(api, 2)
        try:
            await api.request("POST", "/apis/x/v1/things", {"a": 3})
        except Transient as err:
            return first, second, err
        raise AssertionError("a POST the server never answered succeeded")

    first, second, failure = server.run(client)
    assert first == second == obj(1)
    assert isinstance(failure, Transient) and failure.reason == "unanswered"
    assert [(conn, r.split(b" ")[0]) for conn, r in server.requests] == [
        (1, b"PATCH"), (1, b"PATCH"), (2, b"PATCH"), (2, b"POST")]


def test_connection_close_and_an_answer_up_to_the_end_are_not_reused() -> None:
    answers = {1: plain(obj(1), extra=b"Connection: close\r\n"),
               2: b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + obj(2)}  # up to the close
    server = Server(lambda conn, n, request: answers.get(conn, plain(obj(conn))))

    async def client(api: ApiClient) -> list[bytes]:
        return [await api.request("GET", "/x") for _ in range(4)]

    assert server.run(client) == [obj(1), obj(2), obj(3), obj(3)]
    assert server.connections == 3


def test_an_error_answer_is_typed_and_the_connection_kept() -> None:
    status = json.dumps({"kind": "Status", "reason": "NotFound", "message": 'things "t" not found'}).encode()
    server = Server(lambda conn, n, request: plain(status, "404 Not Found") if n == 1 else plain(obj(n)))

    async def client(api: ApiClient) -> tuple[BaseException, bytes, dict]:
        try:
            await api.request("DELETE", "/apis/x/v1/things/t")
        except NotFound as err:
            return err, await api.request("GET", "/apis/x/v1/things/u"), api.metrics.requests
        raise AssertionError("a 404 succeeded")

    failure, second, counted = server.run(client)
    assert str(failure) == '404 NotFound: things "t" not found' and second == obj(2)
    assert counted == {("404", "DELETE"): 1, ("200", "GET"): 1}
    assert server.connections == 1


def test_a_silent_server_is_a_timeout_and_its_connection_is_dropped() -> None:
    server = Server(lambda conn, n, request: SILENT if conn == 1 else plain(obj(conn)))

    async def client(api: ApiClient) -> tuple[BaseException, bytes]:
        with pytest.raises(Transient) as failure:
            await api.request("GET", "/x", timeout=0.3)
        return failure.value, await api.request("GET", "/x")

    failure, second = server.run(client)
    assert isinstance(failure, Transient) and failure.reason == "timeout" and second == obj(2)
    assert server.connections == 2


def test_a_silent_connection_drops_the_idle_ones_and_tells_the_watches_once_in_a_while() -> None:
    """A request that went out and got no answer: the connections opened before it may be as dead
    (a path that drops flows without a reset), so the idle ones go and ApiClient.on_silence's
    listeners (the watches) are told, at most every SILENCE_EVERY seconds."""
    server = Server(lambda conn, n, request: SILENT if b"/silent" in request else plain(obj(conn)))
    told: list[str] = []

    async def client(api: ApiClient) -> list[bytes]:
        api.on_silence.append(lambda: told.append("silent"))
        answers = list(await asyncio.gather(api.request("GET", "/a"), api.request("GET", "/b")))  # 2 idle after
        for _ in range(2):
            with pytest.raises(Transient):
                await api.request("GET", "/silent", timeout=0.3)  # on an idle one, which goes silent
            answers.append(await api.request("GET", "/c"))  # the other idle one dropped: a new connection
        return answers

    assert server.run(client) == [obj(1), obj(2), obj(3), obj(4)]
    assert told == ["silent"]  # silent twice within SILENCE_EVERY: told once
    assert SILENCE_EVERY >= 5


@pytest.mark.parametrize("method", ["GET", "PATCH"])
def test_abandoning_ends_the_requests_under_way_at_once(method: str) -> None:
    """Another client's connection went silent (ApiClient.abandon): a request waiting on a silent
    connection of this one ends now, not at its timeout; one safe to repeat (a GET) is sent again
    on a new connection, any other (a PATCH) is unanswered, for its caller to retry."""
    server = Server(lambda conn, n, request: SILENT if conn == 1 and n > 1 else plain(obj(conn)))

    async def client(api: ApiClient) -> tuple[bytes | BaseException, float]:
        await api.request("GET", "/a")  # connection 1, idle after; silent from now on
        loop = asyncio.get_running_loop()
        started = loop.time()
        waiting = asyncio.ensure_future(api.request(method, "/b", body={} if method == "PATCH" else None,
                                                    timeout=30))  # on connection 1
        await asyncio.sleep(0.2)
        api.abandon()
        outcome = (await asyncio.gather(waiting, return_exceptions=True))[0]
        return outcome, loop.time() - started

    outcome, took = server.run(client)
    assert took < 5  # not its 30 s timeout
    if method == "GET":
        assert outcome == obj(2)
    else:
        assert isinstance(outcome, Transient) and outcome.reason == "unanswered", outcome


def test_renewing_the_pool_drops_its_connections_idle_and_busy() -> None:
    server = Server(lambda conn, n, request: plain(obj(conn)))

    async def client(api: ApiClient) -> list[bytes]:
        await api.request("GET", "/a")  # connection 1, idle after
        busy = asyncio.ensure_future(api.request("GET", "/b"))  # on connection 1 while renewed
        await asyncio.sleep(0)
        api.renew_pool()
        first = await busy
        return [first, await api.request("GET", "/c")]  # neither connection 1 kept: a new one

    assert server.run(client) == [obj(1), obj(2)]
    assert server.connections == 2


def test_at_most_the_limit_of_connections_at_once() -> None:
    server = Server(lambda conn, n, request: plain(obj(conn)))
    server.pause = 0.05

    async def client(api: ApiClient) -> int:
        await asyncio.gather(*(api.request("GET", f"/x{i}") for i in range(12)))
        return len(server.requests)

    assert server.run(client, limit=3) == 12
    assert server.connections == 3


def test_a_burst_leaves_its_connections_for_the_next() -> None:
    """A client that sends the limit's worth at once (the churn, a populate) reconnects never."""
    server = Server(lambda conn, n, request: plain(obj(conn)))
    server.pause = 0.05

    async def client(api: ApiClient) -> None:
        for _ in range(3):
            await asyncio.gather(*(api.request("GET", f"/x{i}") for i in range(20)))

    server.run(client, limit=20)
    assert server.connections == 20 and len(server.requests) == 60


def test_what_may_be_repeated() -> None:
    assert replayable("PATCH", {"Content-Type": APPLY}) and replayable("DELETE", {}) and replayable("PUT", {})
    assert not replayable("POST", {}) and not replayable("PATCH", {"Content-Type": "application/merge-patch+json"})


def test_an_unanswered_request_is_counted_as_no_answer() -> None:
    server = Server(lambda conn, n, request: None)

    async def client(api: ApiClient) -> dict:
        with pytest.raises(Transient):
            await api.request("POST", "/x", {"a": 1})
        return api.metrics.requests

    assert server.run(client) == {(NO_ANSWER, "POST"): 1}
