"""Who may read /metrics: the bearer token is authenticated with a TokenReview and its user
authorized with a SubjectAccessReview for `get` on the nonResourceURL /metrics, as the Kubernetes
API server's delegated authentication and authorization do (controller-runtime's
`--metrics-secure`).

Anyone who reaches the port can send tokens, so what a request may cost the API server is bounded:

- Decisions are cached per token (its SHA-256, never the token), bounded in time and in number,
  allowed and denied ones apart: denied ones live at most DENIED_TTL, and a flood of bad tokens
  evicts only other denials, never a reader.
- Concurrent requests with the same token share one review.
- A review for a token not cached takes a token from a bucket (``--metrics-auth-reviews-per-second``
  and ``--metrics-auth-review-burst``, as a client's QPS and burst); none left: 429 at once, with
  Retry-After, and no review is sent. A cached decision is never limited, and neither is the
  review of a token allowed before whose decision expired: an allowed decision is kept past its
  TTL (until the least recently used is dropped), so only tokens that passed a review go around
  the bound, and a reader is never refused because others flood the port.
- One client (a source address) may take at most a quarter of the bound (CLIENT_SHARE): a flood
  from one pod leaves the rest for the others, so a reader with a token new to the service (after
  a restart, a token rotated) is still reviewed; it takes floods from CLIENT_SHARE hosts at once to
  drain the bound."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kubeindex.model.resources import ACCESS_REVIEWS, TOKEN_REVIEWS, Resource
from kubeindex.runtime.ratelimit import TokenBucket
from kubeindex.runtime.throttle import ThrottledLog

log = logging.getLogger(__name__)
CACHE_TTL = 60.0  # seconds an allowed decision for a token is reused (--metrics-auth-cache-ttl)
CACHE_SIZE = 1024  # tokens whose decision is cached, allowed and denied each (--metrics-auth-cache-size)
# A denial (401, 403) is reused at most this long: a binding made for a refused reader works soon.
# The API server's delegated authentication and authorization (kube-rbac-proxy's, controller-runtime's)
# keep both 10 s; its webhook authorizer keeps denials 30 s against 5 min for allowed ones.
DENIED_TTL = 10.0
REVIEWS_PER_SECOND = 10.0  # reviews of new tokens a second (--metrics-auth-reviews-per-second)
REVIEW_BURST = 20  # reviews saved up for a burst (--metrics-auth-review-burst)
CLIENT_SHARE = 4  # one source address may take 1/CLIENT_SHARE of the rate and of the burst
REVIEW_TIMEOUT = 10.0


@dataclass(frozen=True)
class Decision:
    status: int  # 200 allowed, 401 unauthenticated, 403 forbidden, 429 beyond the bound, 503 could not ask
    reason: str
    retry_after: int = 0  # with 429: whole seconds until a review may be sent

    @property
    def allowed(self) -> bool:
        return self.status == 200


NO_TOKEN = Decision(401, "no bearer token")


def bearer_token(authorization: str) -> str:
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class Decisions:
    """Decisions by token digest, each with its expiry; at most ``size``, the least recently used
    dropped beyond that. An expired entry stays until it is dropped or replaced: the caller decides
    what an expired one is worth."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[bytes, tuple[float, Decision]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: bytes) -> tuple[float, Decision] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    def put(self, key: bytes, expiry: float, decision: Decision) -> None:
        self._entries[key] = (expiry, decision)
        self._entries.move_to_end(key)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def pop(self, key: bytes) -> None:
        self._entries.pop(key, None)


class ReviewApi(Protocol):
    """What the authorizer needs of the API client (ApiClient; a fake reviewer in tests)."""

    async def request(self, method: str, path: str, body: dict[str, Any], *, timeout: float) -> bytes: ...


class Authorizer:
    """Decides whether a bearer token may `get` ``path``, through the service's API client.

    ``reviews`` (by outcome: allowed, denied, error), ``refused`` and ``hits`` (allowed, denied)
    count what became of the requests that carried a token."""

    def __init__(self, api: ReviewApi, path: str = "/metrics", ttl: float = CACHE_TTL,
                 max_entries: int = CACHE_SIZE, rate: float = REVIEWS_PER_SECOND, burst: int = REVIEW_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api, self.path, self.ttl, self.clock = api, path, ttl, clock
        self.denied_ttl = min(ttl, DENIED_TTL)
        self.allowed = Decisions(max_entries)  # kept past the TTL: a token that passed a review
        self.denied = Decisions(max_entries)  # apart: denials never push a reader out
        self.bucket = TokenBucket(rate, burst, clock)
        self._clients: OrderedDict[str, TokenBucket] = OrderedDict()  # source address -> its share, LRU
        self._clients_size = max_entries
        self._pending: dict[bytes, asyncio.Task[Decision]] = {}
        self.reviews = {"allowed": 0, "denied": 0, "error": 0}
        self.hits = {"allowed": 0, "denied": 0}
        self.refused = 0
        self._say = ThrottledLog(log, clock=clock)

    async def decide(self, authorization: str, client: str = "") -> Decision:
        """``client``: the caller's source address (its share of the bound)."""
        token = bearer_token(authorization)
        if not token:
            return NO_TOKEN
        key = hashlib.sha256(token.encode()).digest()  # the token itself is never kept
        now = self.clock()
        known = self.allowed.get(key)
        if known is not None and known[0] > now:
            self.hits["allowed"] += 1
            return known[1]
        denied = self.denied.get(key)
        if denied is not None:
            if denied[0] > now:
                self.hits["denied"] += 1
                return denied[1]
            self.denied.pop(key)
        task = self._pending.get(key)
        if task is None:  # else the same token is being reviewed: share that answer
            if known is None:  # a reader seen before is never refused
                if self.bucket.delay():  # the bound: looked at first, so a refusal spends no share
                    return self._refuse(self.bucket)
                share = self._share(client)
                if not share.try_take():
                    return self._refuse(share)
                self.bucket.try_take()
            # A task of its own: a caller that hangs up does not cancel the others' review.
            task = asyncio.create_task(self._review(token))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(task)

    def _share(self, client: str) -> TokenBucket:
        """The client's share of the bound, the least recently seen client's dropped beyond the
        cache size (it starts afresh: no more than a new client gets)."""
        share = self._clients.get(client)
        if share is None:
            share = self._clients[client] = TokenBucket(self.bucket.rate / CLIENT_SHARE,
                                                        max(1, self.bucket.burst // CLIENT_SHARE), self.clock)
            if len(self._clients) > self._clients_size:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(client)
        return share

    def _refuse(self, bucket: TokenBucket) -> Decision:
        self.refused += 1
        wait = max(1, math.ceil(bucket.delay()))
        self._say("bound", "refused", logging.WARNING, "metrics authentication: new tokens beyond %g reviews/s "
                  "(burst %d, --metrics-auth-reviews-per-second): answering 429 without a review "
                  "(nws_metrics_auth_reviews_refused_total counts them)", self.bucket.rate, self.bucket.burst)
        return Decision(429, f"too many new tokens to review; retry in {wait} s", wait)

    def _settle(self, key: bytes, task: asyncio.Task[Decision]) -> None:
        del self._pending[key]
        if task.cancelled():
            return
        decision = task.result()
        if decision.status == 503:  # a failure to ask is not remembered
            return
        now = self.clock()
        if decision.allowed:
            self.allowed.put(key, now + self.ttl, decision)
        else:
            self.allowed.pop(key)  # refused now (an expired token, a binding removed): reviewed within the bound
            if self.denied_ttl > 0:
                self.denied.put(key, now + self.denied_ttl, decision)

    async def _review(self, token: str) -> Decision:
        try:
            user = await self._authenticate(token)
            decision = user if isinstance(user, Decision) else await self._authorize(user)
        except Exception as err:  # the API server cannot be asked: refuse now, ask again next time
            log.warning("metrics authentication: cannot ask the API server: %r", err)
            self.reviews["error"] += 1
            return Decision(503, "cannot verify the token now")
        self.reviews["allowed" if decision.allowed else "denied"] += 1
        return decision

    async def _authenticate(self, token: str) -> dict | Decision:
        body = await self._create(TOKEN_REVIEWS, {"token": token})
        status = body.get("status", {})
        if not status.get("authenticated"):
            return Decision(401, "invalid bearer token")
        return status.get("user", {})

    async def _authorize(self, user: dict) -> Decision:
        spec = {"user": user.get("username", ""), "uid": user.get("uid", ""), "groups": user.get("groups", []),
                "extra": user.get("extra", {}), "nonResourceAttributes": {"path": self.path, "verb": "get"}}
        body = await self._create(ACCESS_REVIEWS, spec)
        if body.get("status", {}).get("allowed"):
            return Decision(200, "")
        return Decision(403, f"{spec['user']} may not get {self.path}")

    async def _create(self, review: Resource, spec: dict) -> dict:
        body = await self.api.request("POST", review.path(), {"apiVersion": review.api_version, "kind": review.kind,
                                                              "spec": spec}, timeout=REVIEW_TIMEOUT)
        return json.loads(body)


class AuthCollector(Collector):
    """The Authorizer's reviews, refusals, cache hits and cache sizes (``nws_metrics_auth_*``)."""

    def __init__(self, authorizer: Authorizer) -> None:
        self.authorizer = authorizer

    def collect(self) -> Iterator[Metric]:
        auth = self.authorizer
        reviews = CounterMetricFamily(
            "nws_metrics_auth_reviews", "Token reviews sent to the API server for /metrics (a TokenReview, then a "
            "SubjectAccessReview when authenticated), by outcome: allowed, denied (401, 403), error (no answer).",
            labels=["decision"])
        for decision, n in auth.reviews.items():
            reviews.add_metric([decision], n)
        refused = CounterMetricFamily(
            "nws_metrics_auth_reviews_refused", "Requests to /metrics answered 429 because their token would "
            "need a review beyond --metrics-auth-reviews-per-second and its burst; no review was sent.",
            value=auth.refused)
        hits = CounterMetricFamily("nws_metrics_auth_cache_hits", "Requests to /metrics answered from a cached "
                                   "decision, without a review, by decision: allowed, denied.", labels=["decision"])
        entries = GaugeMetricFamily("nws_metrics_auth_cache_entries", "Token decisions cached, by decision: "
                                    "allowed (expired ones included, kept until dropped), denied; each at most "
                                    "--metrics-auth-cache-size.", labels=["decision"])
        for decision, cache in (("allowed", auth.allowed), ("denied", auth.denied)):
            hits.add_metric([decision], auth.hits[decision])
            entries.add_metric([decision], len(cache))
        yield from (reviews, refused, hits, entries)
