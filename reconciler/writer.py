"""Every write of the controllers, typed: a server-side apply (of an object or of its status), a
create, a delete with a UID precondition, an RFC 6902 JSON patch, and an Event's create and merge
patch. Each takes a token of the shared bucket (``--writes-per-second``) and checks that this
replica still leads, first.

What became of a write is a value: ``Done`` (with the answer's body), ``Skipped`` (nothing to do:
already gone, made meanwhile, the namespace being deleted, a status whose object was deleted
since our view of it) or ``Failed`` (worth a retry with backoff: the controller asks for one).
Losing the lease is no outcome but ``Deposed``, raised: nothing more is written.

Each write is counted by verb (the verbs are ``nws_reconciler_writes_total``'s label values), each
failure by HTTP status; a failure is logged here (a line each, an expected 409 or transient error
counted only), an Event's by its recorder (a line a minute at most, events.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubeindex.client.api import ApiError, Conflict, Forbidden, NotFound, Transient, path_fields

from .desired import MANAGER
from .ratelimit import TokenBucket

log = logging.getLogger(__name__)
APPLY = "application/apply-patch+yaml"  # JSON is YAML
JSON = "application/json"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
WRITE_TIMEOUT = 10.0  # seconds: a write on a silently dead connection must not hold a worker long
OWNED = {"fieldManager": MANAGER}
FORCED = {"fieldManager": MANAGER, "force": "true"}  # server-side apply: our fields are taken back


class WriteApi(Protocol):
    """What the writer needs of the API client (ApiClient; a scripted one in tests)."""

    async def request(self, method: str, path: str, body: object = None, *, params: dict[str, str] | None = None,
                      content_type: str = ..., timeout: float = ...) -> bytes: ...


class Deposed(Exception):
    """Leadership was lost: this replica writes nothing more."""


@dataclass(frozen=True)
class Done:
    answer: bytes


@dataclass(frozen=True)
class Skipped:
    """Nothing to do; ``why``, for whoever reads it."""

    why: str


@dataclass(frozen=True)
class Failed:
    error: ApiError


Outcome = Done | Skipped | Failed
GONE = Skipped("gone")  # a delete: 404, already gone; 409, the UID precondition failed (replaced since)
EXISTS = Skipped("exists")  # a create: 409 AlreadyExists, made meanwhile
NOT_FOUND = Skipped("not found")  # a status apply: deleted since our view of it; an Event's patch: expired
TERMINATING = Skipped("namespace terminating")  # expected while its workloads go away


@dataclass
class WriteStats:
    writes: dict[str, int] = field(default_factory=dict)  # verb -> count
    errors: dict[str, int] = field(default_factory=dict)  # http status (or transport error) -> count

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


class Writer:
    def __init__(self, api: WriteApi, bucket: TokenBucket | None = None,
                 leading: Callable[[], bool] = lambda: True) -> None:
        self.api = api
        self.bucket = bucket  # None: unthrottled
        self.leading = leading
        self.stats = WriteStats()

    async def apply(self, path: str, body: Any) -> Outcome:
        return await self._write("apply", "PATCH", path, body, FORCED, APPLY)

    async def apply_status(self, path: str, body: Any) -> Outcome:
        """Skipped when the object is not found: deleted since our view of it."""
        return await self._write("apply_status", "PATCH", f"{path}/status", body, FORCED, APPLY)

    async def create(self, path: str, body: Any) -> Outcome:
        """Skipped when it exists (made meanwhile)."""
        return await self._write("create", "POST", path, body, OWNED, JSON)

    async def delete(self, path: str, uid: str) -> Outcome:
        """Only the object of that UID; Skipped when it is gone or was replaced since."""
        body = {"preconditions": {"uid": uid}, "propagationPolicy": "Background"}
        return await self._write("delete", "DELETE", path, body, None, JSON)

    async def json_patch(self, path: str, patch: list[dict[str, Any]], verb: str = "patch_quota") -> Outcome:
        return await self._write(verb, "PATCH", path, patch, OWNED, JSON_PATCH)

    async def create_event(self, path: str, body: Any) -> Outcome:
        return await self._write("create_event", "POST", path, body, None, JSON)

    async def patch_event(self, path: str, body: Any) -> Outcome:
        """A merge patch; Skipped when the Event expired (--event-ttl): its recorder creates it again."""
        return await self._write("patch_event", "PATCH", path, body, None, MERGE_PATCH)

    async def _write(self, verb: str, method: str, path: str, body: Any, params: dict[str, str] | None,
                     content_type: str) -> Outcome:
        if self.bucket is not None:
            await self.bucket.take()
        if not self.leading():
            raise Deposed
        try:
            answer = await self.api.request(method, path, body, params=params, content_type=content_type,
                                            timeout=WRITE_TIMEOUT)
        except ApiError as err:
            return self._refused(verb, method, path, err)
        self.stats.count(self.stats.writes, verb)
        return Done(answer)

    def _refused(self, verb: str, method: str, path: str, err: ApiError) -> Skipped | Failed:
        if verb == "delete" and isinstance(err, (NotFound, Conflict)):
            return GONE
        if verb == "create" and isinstance(err, Conflict):
            return EXISTS
        if verb in ("apply_status", "patch_event") and isinstance(err, NotFound):
            return NOT_FOUND
        if isinstance(err, Forbidden) and "NamespaceTerminating" in err.causes:
            return TERMINATING
        self.stats.count(self.stats.errors, str(err.status) if err.status else err.reason)
        if verb in ("create_event", "patch_event"):
            pass  # its recorder logs it, a line a minute at most (events.py)
        elif not err.status:  # no answer: a line each, as the transport says
            log.warning("%s %s: %s", method, path, err, extra=path_fields(path, err))
        elif not isinstance(err, (Transient, Conflict)):  # those pass on their own: counted only
            log.error("%s %s: %s", method, path, err, extra=path_fields(path, err))
        return Failed(err)
