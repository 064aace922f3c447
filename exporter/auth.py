"""Who may read /metrics: the bearer token is authenticated with a TokenReview and its user
authorized with a SubjectAccessReview for `get` on the nonResourceURL /metrics, as the Kubernetes
API server's delegated authentication and authorization do (controller-runtime's
`--metrics-secure`).

Decisions are cached per token, bounded in time and in number, and concurrent requests with the
same token share one review: a scrape storm stays one pair of API calls per token and TTL."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)
TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
CACHE_TTL = 60.0  # seconds a decision for a token is reused (--metrics-auth-cache-ttl)
CACHE_SIZE = 1024  # tokens whose decision is cached (--metrics-auth-cache-size)
REVIEW_TIMEOUT = 10.0


@dataclass(frozen=True)
class Decision:
    status: int  # 200 allowed, 401 unauthenticated, 403 forbidden, 503 could not ask
    reason: str

    @property
    def allowed(self) -> bool:
        return self.status == 200


NO_TOKEN = Decision(401, "no bearer token")


def bearer_token(authorization: str) -> str:
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class ReviewApi(Protocol):
    """What the authorizer needs of the API client (ApiClient; a fake reviewer in tests)."""

    async def request(self, method: str, path: str, body: dict[str, Any], *, timeout: float) -> bytes: ...


class Authorizer:
    """Decides whether a bearer token may `get` ``path``, through the service's API client."""

    def __init__(self, api: ReviewApi, path: str = "/metrics", ttl: float = CACHE_TTL,
                 max_entries: int = CACHE_SIZE) -> None:
        self.api, self.path, self.ttl, self.max_entries = api, path, ttl, max_entries
        self._cache: OrderedDict[str, tuple[float, Decision]] = OrderedDict()  # token digest -> (expiry, decision)
        self._pending: dict[str, asyncio.Task[Decision]] = {}

    async def decide(self, authorization: str) -> Decision:
        token = bearer_token(authorization)
        if not token:
            return NO_TOKEN
        key = hashlib.sha256(token.encode()).hexdigest()  # the token itself is never kept
        cached = self._cached(key)
        if cached is not None:
            return cached
        task = self._pending.get(key)
        if task is None:  # else the same token is being reviewed: share that answer
            # A task of its own: a caller that hangs up does not cancel the others' review.
            task = asyncio.create_task(self._review(token))
            self._pending[key] = task
            task.add_done_callback(lambda done: self._settle(key, done))
        return await asyncio.shield(task)

    def _settle(self, key: str, task: asyncio.Task[Decision]) -> None:
        del self._pending[key]
        if not task.cancelled() and task.result().status != 503:  # a failure to ask is not remembered
            self._remember(key, task.result())

    def _cached(self, key: str) -> Decision | None:
        entry = self._cache.get(key)
        if entry is None:
            return None
        expiry, decision = entry
        if expiry <= time.monotonic():
            del self._cache[key]
            return None
        self._cache.move_to_end(key)
        return decision

    def _remember(self, key: str, decision: Decision) -> None:
        if self.ttl <= 0:
            return
        self._cache[key] = (time.monotonic() + self.ttl, decision)
        self._cache.move_to_end(key)
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)

    async def _review(self, token: str) -> Decision:
        try:
            user = await self._authenticate(token)
            if isinstance(user, Decision):
                return user
            return await self._authorize(user)
        except Exception as err:  # the API server cannot be asked: refuse now, ask again next time
            log.warning("metrics authentication: cannot ask the API server: %r", err)
            return Decision(503, "cannot verify the token now")

    async def _authenticate(self, token: str) -> dict | Decision:
        body = await self._create(TOKEN_REVIEWS, "authentication.k8s.io/v1", "TokenReview", {"token": token})
        status = body.get("status", {})
        if not status.get("authenticated"):
            return Decision(401, "invalid bearer token")
        return status.get("user", {})

    async def _authorize(self, user: dict) -> Decision:
        spec = {"user": user.get("username", ""), "uid": user.get("uid", ""), "groups": user.get("groups", []),
                "extra": user.get("extra", {}), "nonResourceAttributes": {"path": self.path, "verb": "get"}}
        body = await self._create(ACCESS_REVIEWS, "authorization.k8s.io/v1", "SubjectAccessReview", spec)
        if body.get("status", {}).get("allowed"):
            return Decision(200, "")
        return Decision(403, f"{spec['user']} may not get {self.path}")

    async def _create(self, path: str, api_version: str, kind: str, spec: dict) -> dict:
        body = await self.api.request("POST", path, {"apiVersion": api_version, "kind": kind, "spec": spec},
                                      timeout=REVIEW_TIMEOUT)
        return json.loads(body)
