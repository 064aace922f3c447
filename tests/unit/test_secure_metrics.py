"""--metrics-secure: the authorizer, its cache and its bounds. Here, what needs no cluster; the
scenarios against one: tests/cluster/test_secure_metrics.py."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from exporter.auth import DENIED_TTL, Authorizer
from exporter.metrics import Renderer
from exporter.server import make_app
from exporter.tls import CertFiles, server_context
from kubeindex.client.api import error_from_body
from kubeindex.model.index import ClusterIndex
from kubeindex.runtime.ratelimit import TokenBucket
from tests.clock import FakeClock
from tests.support.secure_metrics import SCRAPES, openssl_cert


def test_changed_certificate_files_are_reloaded_and_broken_ones_ignored(tmp_path: Path) -> None:
    cert, key = openssl_cert(tmp_path, "one")
    files = CertFiles(server_context(), str(cert), str(key))
    assert not files.reload_if_changed()
    new_cert, new_key = openssl_cert(tmp_path, "two")
    new_cert.replace(cert)
    new_key.replace(key)
    assert files.reload_if_changed()
    cert.write_text("not a certificate")
    assert not files.reload_if_changed()  # logged; the loaded certificate stays


class FakeApi:
    """Answers TokenReviews (token "user-<name>" authenticates as <name>, unless revoked) and
    SubjectAccessReviews (only "alice" may), after ``delay`` seconds, counting each kind."""

    def __init__(self, delay: float = 0.05) -> None:
        self.calls: dict[str, int] = {"tokenreviews": 0, "subjectaccessreviews": 0}
        self.fail = False
        self.delay = delay
        self.revoked: set[str] = set()

    async def request(self, method: str, path: str, body: dict[str, Any], timeout: float) -> bytes:
        resource = path.rsplit("/", 1)[1]
        self.calls[resource] += 1
        await asyncio.sleep(self.delay)
        if self.fail:
            raise error_from_body(500, b"etcd is down")
        if resource == "tokenreviews":
            name = body["spec"]["token"].removeprefix("user-")
            ok = body["spec"]["token"].startswith("user-") and body["spec"]["token"] not in self.revoked
            return json.dumps({"status": {"authenticated": ok, "user": {"username": name}}}).encode()
        return json.dumps({"status": {"allowed": body["spec"]["user"] == "alice"}}).encode()


def _authorizer(api: FakeApi, ttl: float = 60, size: int = 10, rate: float = 1000, burst: int = 1000,
                clock: FakeClock | None = None) -> Authorizer:
    return Authorizer(api, "/metrics", ttl, size, rate, burst, **({"clock": clock.monotonic} if clock else {}))


def test_concurrent_requests_share_one_review_and_the_answer_is_cached() -> None:
    api = FakeApi()
    auth = _authorizer(api)

    async def storm() -> list[int]:
        decisions = await asyncio.gather(*(auth.decide("Bearer user-alice") for _ in range(SCRAPES)))
        return [d.status for d in decisions] + [(await auth.decide("bearer user-alice")).status]

    assert asyncio.run(storm()) == [200] * (SCRAPES + 1)
    assert api.calls == {"tokenreviews": 1, "subjectaccessreviews": 1}


def test_decisions_expire_are_bounded_and_failures_are_not_kept() -> None:
    api = FakeApi()

    async def run() -> None:
        short = _authorizer(api, ttl=0.2, size=2)
        assert (await short.decide("Bearer user-bob")).status == 403
        assert (await short.decide("Bearer nobody")).status == 401
        assert (await short.decide("")).status == 401 and api.calls["tokenreviews"] == 2
        await short.decide("Bearer user-carol")  # a third denial: bob's (the least recently used) is dropped
        await short.decide("Bearer user-bob")
        assert api.calls["tokenreviews"] == 4
        await asyncio.sleep(0.3)
        await short.decide("Bearer user-bob")  # expired
        assert api.calls["tokenreviews"] == 5
        api.fail = True
        assert (await short.decide("Bearer user-alice")).status == 503
        api.fail = False
        assert (await short.decide("Bearer user-alice")).status == 200  # asked again, not the cached failure

    asyncio.run(run())


def test_the_shared_token_bucket_gives_its_burst_then_its_rate() -> None:
    clock = FakeClock()
    bucket = TokenBucket(4, 2, clock.monotonic)
    assert [bucket.try_take() for _ in range(3)] == [True, True, False]
    assert bucket.delay() == 0.25
    clock.now += 0.25
    assert bucket.delay() == 0 and [bucket.try_take(), bucket.try_take()] == [True, False]
    clock.now += 3600  # a quiet hour buys the burst, never more
    assert [bucket.try_take() for _ in range(3)] == [True, True, False]


def test_reviews_beyond_the_bound_are_refused_at_once_and_cached_decisions_never_are() -> None:
    clock, api = FakeClock(), FakeApi(delay=0)
    auth = _authorizer(api, rate=2, burst=3, clock=clock)

    async def run() -> None:  # each made-up token from a host of its own: the bound, not a client's share
        assert (await auth.decide("Bearer user-alice")).status == 200
        assert [(await auth.decide(f"Bearer made-up-{i}", f"10.0.0.{i}")).status for i in range(5)] == [
            401, 401, 429, 429, 429]
        refused = await auth.decide("Bearer made-up-9", "10.0.0.9")
        assert (refused.status, refused.retry_after) == (429, 1), refused
        assert api.calls["tokenreviews"] == 3  # no review for a refused request
        # Cached decisions are never limited: the reader's, and a denial's.
        assert [(await auth.decide(t)).status for t in ("Bearer user-alice", "Bearer made-up-0")] == [200, 401]
        assert api.calls["tokenreviews"] == 3
        clock.now += 0.5  # rate 2: one more review
        assert [(await auth.decide(f"Bearer made-up-{i}", f"10.0.0.{i}")).status for i in (2, 3)] == [401, 429]
        assert (auth.reviews, auth.hits, auth.refused) == ({"allowed": 1, "denied": 3, "error": 0},
                                                           {"allowed": 1, "denied": 1}, 5)

    asyncio.run(run())


def test_a_flood_of_denials_never_pushes_a_reader_out() -> None:
    api = FakeApi(delay=0)
    auth = _authorizer(api, size=4)

    async def run() -> None:
        assert (await auth.decide("Bearer user-alice")).status == 200
        assert {(await auth.decide(f"Bearer made-up-{i}")).status for i in range(100)} == {401}
        assert (await auth.decide("Bearer user-alice")).status == 200
        assert api.calls["tokenreviews"] == 101 and auth.hits["allowed"] == 1  # alice: not reviewed again
        assert (len(auth.allowed), len(auth.denied)) == (1, 4)  # each bounded

    asyncio.run(run())


def test_denials_live_shorter_and_a_reader_whose_decision_expired_is_reviewed_beyond_the_bound() -> None:
    clock, api = FakeClock(), FakeApi(delay=0)
    auth = _authorizer(api, ttl=60, rate=0.01, burst=1, clock=clock)  # one review, then one per 100 s

    async def status(token: str) -> int:
        return (await auth.decide(f"Bearer {token}", token)).status  # each from a host of its own

    async def run() -> None:
        assert await status("user-alice") == 200  # the bucket is empty from here on
        assert await status("user-bob") == 429
        clock.now += 100
        assert await status("user-bob") == 403
        clock.now += DENIED_TTL - 1
        assert await status("user-bob") == 403 and api.calls["tokenreviews"] == 2  # the denial, cached
        clock.now += 2
        assert await status("user-bob") == 429  # expired after DENIED_TTL, not 60 s: a new review, bounded
        # alice's decision expired too: she passed a review before, so she is reviewed again at once.
        assert await status("user-alice") == 200 and auth.reviews["allowed"] == 2 and auth.refused == 2
        # Revoked, she is refused; from then on her token is reviewed within the bound like any other.
        api.revoked.add("user-alice")
        clock.now += 61
        assert await status("user-alice") == 401
        clock.now += DENIED_TTL + 1
        assert auth.bucket.tokens + (DENIED_TTL + 1) * auth.bucket.rate < 1  # no review left to spend
        assert await status("user-alice") == 429

    asyncio.run(run())


def test_one_client_takes_a_quarter_of_the_bound_and_a_new_reader_elsewhere_is_reviewed() -> None:
    """A flood from one host spends its share (a quarter of the rate and of the burst) and is
    refused beyond it, leaving the rest of the bound: a reader whose token is new to the service
    (a restart, a rotated token) is reviewed meanwhile. Floods from more hosts drain the bound (four
    at once keep it drained: their shares add up to its rate)."""
    clock, api = FakeClock(), FakeApi(delay=0)
    auth = _authorizer(api, rate=8, burst=20, clock=clock)  # a share: 2 a second, burst 5

    async def run() -> None:
        flood = [(await auth.decide(f"Bearer made-up-{i}", "10.1.0.1")).status for i in range(50)]
        assert flood == [401] * 5 + [429] * 45 and api.calls["tokenreviews"] == 5
        assert (await auth.decide("Bearer user-alice", "10.2.0.7")).status == 200  # the reader, another host
        clock.now += 1  # a second: two more for the flooding host, eight more in all
        flood = [(await auth.decide(f"Bearer again-{i}", "10.1.0.1")).status for i in range(10)]
        assert flood == [401] * 2 + [429] * 8
        refused = await auth.decide("Bearer again-10", "10.1.0.1")
        assert (refused.status, refused.retry_after) == (429, 1)  # its share's wait
        for host in ("10.1.0.2", "10.1.0.3", "10.1.0.4", "10.1.0.5"):  # four more hosts drain what is left
            assert {(await auth.decide(f"Bearer {host}-{i}", host)).status for i in range(20)} == {401, 429}
        assert (await auth.decide("Bearer user-bob", "10.2.0.8")).status == 429  # the bound, spent

    asyncio.run(run())


def test_one_review_per_token_in_flight_even_at_the_bound() -> None:
    api = FakeApi(delay=0.01)
    auth = _authorizer(api, rate=0.01, burst=1)

    async def storm() -> list[int]:
        decisions = await asyncio.gather(*(auth.decide("Bearer user-alice") for _ in range(SCRAPES)),
                                         auth.decide("Bearer user-bob"))
        return [d.status for d in decisions]

    assert asyncio.run(storm()) == [200] * SCRAPES + [429]
    assert api.calls["tokenreviews"] == 1 and auth.refused == 1


def test_a_refused_request_is_answered_429_with_retry_after() -> None:
    api = FakeApi(delay=0)
    auth = _authorizer(api, rate=0.5, burst=1)
    renderer = Renderer(ClusterIndex(), registry=CollectorRegistry())

    async def run() -> None:
        async with TestClient(TestServer(make_app(renderer, None, auth))) as client:
            first = await client.get("/metrics", headers={"Authorization": "Bearer made-up-1"})
            assert first.status == 401 and first.headers["WWW-Authenticate"] == 'Bearer realm="metrics"'
            second = await client.get("/metrics", headers={"Authorization": "Bearer made-up-2"})
            assert (second.status, second.headers["Retry-After"]) == (429, "2")
            assert await second.text() == "too many new tokens to review; retry in 2 s\n"

    asyncio.run(run())
