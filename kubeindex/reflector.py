"""One list+watch loop per resource, with client-go reflector semantics.

    paged LIST -> diff against the store (deletes for what vanished) -> WATCH from the list's
    resourceVersion with bookmarks and a randomized timeout -> on 410 Gone: relist and diff (never
    "watch from now") -> on a network error or a silent connection: jittered backoff, then watch
    again from the last resourceVersion.

The store keeps only key -> resourceVersion (resourceVersions are opaque strings, only compared
for equality) of what the handler has accepted; the objects themselves live in the index. A
resourceVersion is recorded only after the handler succeeded. A handler that raises is logged
with the object's key and counted (``SourceStats.handler_errors``), never fatal to the loop; the
object stays unrecorded (or at the version the handler last accepted), so the next relist hands
it to the handler again. A relist is due when a watch ends while such objects are outstanding
(a later event for the object retries it sooner).

Continue token expired (410 during a paged LIST, the snapshot was compacted between two pages):
the LIST starts again from the first page with the same page size, at the newest snapshot. The
memory bound stays one page, never the whole collection. Correctness: objects applied from the
abandoned pass stay in the store with the version seen, so the fresh pass upserts only what
changed since; deletes for vanished objects are emitted only after a complete pass from one
snapshot (the diff of the store against that pass), and the watch starts at that snapshot's
resourceVersion, so nothing between the two snapshots is lost. (Continuing with the token the 410
carries would be cheaper but reads keys before and after the break at different snapshots: a
create or delete among the keys already read would be lost for good.) A complete pass must fit
in etcd's compaction interval (5 minutes by default), which a page size of 500 meets by far.

Connection state (for readiness): a LIST page or a WATCH answered with 200 is contact; an error
or a read timeout marks the reflector disconnected since that moment, until the next contact.
An idle healthy watch stays connected however long no event comes.

Errors are logged when their reason first appears and then at most every ``LOG_EVERY`` seconds
while they persist. Permanent-looking answers (401, 403, 404: RBAC, a missing CRD) are retried
with a longer backoff cap, as access may be granted or the CRD installed later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import aiohttp
import msgspec

from .api import JSON, PARTIAL, PARTIAL_LIST, ApiClient, ApiError, sleep_jittered
from .objects import Bookmark, ListMeta, ObjectMeta, RawEvent, Status, object_key

log = logging.getLogger(__name__)
T = TypeVar("T")

PERMANENT = (401, 403, 404)  # answers that repeat until someone changes RBAC or installs a CRD
PERMANENT_BACKOFF_CAP = 60.0  # seconds; other errors back off up to sleep_jittered's default cap
LOG_EVERY = 300.0  # seconds between repeats of the same failure in the log


def _explain(err: Exception) -> str:
    if isinstance(err, ApiError) and err.status == 404:
        return "404 not found: the resource is not served (are this project's CRDs installed? kubectl apply -f crds/)"
    if isinstance(err, ApiError) and err.status in (401, 403):
        return f"{err.status} {err.reason}: check the credentials and RBAC ({err.message.strip()})"
    if isinstance(err, TimeoutError):
        return "no data within the read timeout (connection presumed dead)"
    return f"{type(err).__name__}: {str(err).strip()}"


class Gone(Exception):
    """410: the resourceVersion is too old (compacted); only a relist recovers."""


@dataclass
class SourceStats:
    """Self-metrics of one reflector, read by the exporter."""

    events: dict[str, int] = field(default_factory=dict)  # ADDED / MODIFIED / DELETED / BOOKMARK
    relists: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # reason -> watch restarts
    last_event: float = 0.0  # time.time() of the last event or list page
    objects: int = 0
    synced: bool = False
    handler_errors: int = 0  # handler calls that raised (the object is retried by a relist)

    def count(self, kind: str) -> None:
        self.events[kind] = self.events.get(kind, 0) + 1
        self.last_event = time.time()

    def restart(self, reason: str) -> None:
        self.restarts[reason] = self.restarts.get(reason, 0) + 1


class _Page(msgspec.Struct, Generic[T]):
    """A LIST page decoded in one pass into the item type."""

    metadata: ListMeta = msgspec.field(default_factory=ListMeta)
    items: list[T] | None = None  # an empty metadata-only list comes as "items": null


@dataclass
class Handler(Generic[T]):
    upsert: Callable[[T], None]
    delete: Callable[[str], None]


@dataclass
class WatchSettings:
    page_size: int = 500
    timeout_min: int = 300  # watch timeoutSeconds is drawn from [min, max] (spreads reconnects)
    timeout_max: int = 600
    read_timeout: float = 180.0  # silence longer than this means a dead connection (idle watches
    # get a bookmark from the API server about every minute, the first after about two)
    yield_every: int = 200  # objects decoded between event-loop yields during a LIST


class Reflector(Generic[T]):
    def __init__(self, api: ApiClient, name: str, path: str, item_type: type[T], handler: Handler[T],
                 *, metadata_only: bool = False, settings: WatchSettings | None = None,
                 stats: SourceStats | None = None, label_selector: str = "") -> None:
        self.api = api
        self.name = name
        self.path = path
        self.handler = handler
        self.metadata_only = metadata_only
        self.selector = {"labelSelector": label_selector} if label_selector else {}
        self.settings = settings or WatchSettings()
        self.stats = stats or SourceStats()
        self.store: dict[str, str] = {}  # key -> resourceVersion the handler accepted
        self.failed: set[str] = set()  # keys whose last handler call raised: a relist is due
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.last_error_status = 0  # HTTP status of the last failed request (0: none, or not HTTP)
        self.last_error = ""  # the server's Status message, or what went wrong
        self.connected = False  # the last request was answered (see the module docstring)
        self.lost_at = 0.0  # time.monotonic() when the connection was lost (while not connected)
        self._logged_reason = ""  # the failure last logged ("": none since the last contact)
        self._logged_at = 0.0
        self.lists = 0  # LISTs completed
        self._listing = False
        # Requests to hand every object to the handler again, and the last one a complete LIST served.
        self._redeliver_requests = self._redelivered = 0
        self._relist_requested = asyncio.Event()
        self._list_done = asyncio.Event()  # replaced after every completed LIST
        self._item = msgspec.json.Decoder(item_type)
        self._list = msgspec.json.Decoder(_Page[item_type])  # type: ignore[valid-type]
        self._event = msgspec.json.Decoder(RawEvent)
        self._status = msgspec.json.Decoder(Status)
        self._bookmark = msgspec.json.Decoder(Bookmark)

    # -- health -------------------------------------------------------------------------------

    def problem(self, grace: float, now: float) -> str | None:
        """Why this resource is not in sync (None: it is). ``now`` is time.monotonic()."""
        if self.last_error_status in (401, 403):
            return f"forbidden ({self.last_error})"
        if self.last_error_status == 404:
            return f"not installed ({self.last_error}: the resource is not served; is its CRD installed?)"
        if not self.synced.is_set():
            return "initial sync in progress" + (f" (last error: {self.last_error})" if self.last_error else "")
        if not self.connected and now - self.lost_at > grace:
            return f"no contact with the API server for {now - self.lost_at:.0f}s (last error: {self.last_error})"
        return None

    def _contact(self) -> None:
        """The API server answered a LIST or WATCH with 200."""
        if self._logged_reason:
            log.info("%s: API server reachable again after %.0fs", self.name, time.monotonic() - self.lost_at)
            self._logged_reason = ""
        self.connected = True
        self.last_error_status = 0
        self.last_error = ""

    def _failure(self, err: Exception, reason: str, listing: bool) -> None:
        now = time.monotonic()
        if self.connected or not self.lost_at:
            self.lost_at = now
        self.connected = False
        self.last_error_status = err.status if isinstance(err, ApiError) else 0
        self.last_error = err.message.strip() if isinstance(err, ApiError) else _explain(err)
        self.stats.restart(reason)
        if reason == self._logged_reason and now - self._logged_at < LOG_EVERY:
            return  # said already: retry quietly
        self._logged_reason, self._logged_at = reason, now
        verb = "LIST" if listing else "WATCH"
        if isinstance(err, (TimeoutError, aiohttp.ClientError, ApiError, OSError, msgspec.DecodeError)):
            log.warning("%s: %s %s: %s; retrying with backoff", self.name, verb, self.path, _explain(err))
        else:
            log.error("%s: unexpected error in %s %s; relisting after backoff", self.name, verb, self.path,
                      exc_info=err)

    # -- the loop -------------------------------------------------------------------------------

    async def relist(self) -> None:
        """Return once a LIST that started after this call has completed: the store then equals
        the server as of now, whatever the watch connection was doing (a silently dead one
        included), and the watch goes on from a new connection. A resource that is failing
        (forbidden, not installed, unreachable) returns at once: it has nothing fresher to give."""
        if not self.connected:
            return
        target = self.lists + (2 if self._listing else 1)  # a LIST already under way started too early
        self._relist_requested.set()
        while self.lists < target and self.connected:
            done = self._list_done
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 1.0)  # wake up to notice a failure meanwhile

    async def redeliver(self) -> None:
        """Hand every object to the handler again: a relist whose diff skips nothing, for a
        handler that now keeps more of each object than before (a pod label key configured). A
        LIST under way when this is called may have passed objects already: the next one serves."""
        self._redeliver_requests += 1
        self._relist_requested.set()  # also when out of contact now: the LIST comes once it is back
        await self.relist()

    def _listed(self) -> None:
        self.lists += 1
        done, self._list_done = self._list_done, asyncio.Event()
        done.set()

    async def _watch_unless_relist(self) -> bool:
        """Watch until the watch ends (True) or a relist is requested (False)."""
        watch = asyncio.ensure_future(self._watch())
        request = asyncio.ensure_future(self._relist_requested.wait())
        try:
            await asyncio.wait({watch, request}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (watch, request):
                task.cancel()
            for task in (watch, request):
                with contextlib.suppress(asyncio.CancelledError):
                    await task  # re-raises the watch's own error, if it ended with one
        return not request.done() or request.cancelled()

    async def run(self) -> None:
        attempt = 0
        need_list = True
        while True:
            try:
                if need_list:
                    self._relist_requested.clear()  # this LIST serves any request made before it
                    self._listing = True
                    try:
                        await self._list_and_sync()
                    finally:
                        self._listing = False
                    self._listed()
                    need_list = False
                    self.synced.set()
                    self.stats.synced = True
                started = time.monotonic()
                if not await self._watch_unless_relist():
                    need_list = True
                    continue
                if self.failed:
                    log.info("%s: relisting to retry %d objects whose handler failed", self.name, len(self.failed))
                    need_list = True
                if time.monotonic() - started > 1:
                    attempt = 0  # a watch that ran its course: start the next one at once
                else:  # closed at once: do not spin
                    self.stats.restart("closed")
                    await sleep_jittered(attempt)
                    attempt += 1
            except Gone:
                self.stats.restart("gone")
                log.info("%s: resourceVersion %s expired (410), relisting", self.name, self.resource_version)
                need_list = True
            except asyncio.CancelledError:
                raise
            except Exception as err:
                expected = (TimeoutError, aiohttp.ClientError, ApiError, OSError, msgspec.DecodeError)
                reason = "timeout" if isinstance(err, TimeoutError) else type(err).__name__
                if isinstance(err, ApiError):
                    reason = f"http_{err.status}"
                self._failure(err, reason, need_list)
                if not isinstance(err, expected):
                    need_list = True
                cap = PERMANENT_BACKOFF_CAP if isinstance(err, ApiError) and err.status in PERMANENT else 10.0
                await sleep_jittered(attempt, cap=cap)
                attempt += 1

    def _call(self, key: str, call: Callable[[Any], None], arg: Any) -> bool:
        """Run a handler call. A failure is logged with the key and counted, never raised: the
        loop goes on, and the caller leaves the key unrecorded so that a relist retries it."""
        try:
            call(arg)
        except Exception as err:
            self.stats.handler_errors += 1
            self.failed.add(key)
            log.error("%s: handler failed for %s: %r; a relist will retry it", self.name, key, err,
                      exc_info=self.stats.handler_errors == 1)  # the traceback once; then one line each
            return False
        self.failed.discard(key)
        return True

    # -- LIST ---------------------------------------------------------------------------------

    async def _list_and_sync(self) -> None:
        self.stats.relists += 1
        requests = self._redeliver_requests  # served only by a pass that completes
        upsert_all = requests > self._redelivered
        seen: dict[str, str] = {}
        self.failed.clear()  # this pass retries them; what fails again is added back
        accept = PARTIAL_LIST if self.metadata_only else JSON
        first = {"limit": str(self.settings.page_size), **self.selector}
        params = first
        while True:
            try:
                body = await self.api.get(self.path, params, accept=accept, timeout=120)
            except ApiError as err:
                if err.status == 410 and "continue" in params:
                    # The snapshot was compacted between two pages: a fresh paged pass (see the
                    # module docstring for why this is correct and bounded).
                    log.info("%s: continue token expired after %d objects; listing again from the first page",
                             self.name, len(seen))
                    seen.clear()
                    self.failed.clear()
                    params = first
                    continue
                raise
            self._contact()
            page = self._list.decode(body)
            await self._apply_page(page.items or [], seen, upsert_all)
            if not page.metadata.continue_:
                self.resource_version = page.metadata.resourceVersion
                break
            params = {**first, "continue": page.metadata.continue_}
        for key in self.store.keys() - seen.keys():  # vanished while we were not watching
            if self._call(key, self.handler.delete, key):
                self.stats.count("DELETED")
            else:
                seen[key] = self.store[key]  # kept: the next relist's diff deletes it again
        self.store = seen
        self.stats.objects = len(seen)
        self._redelivered = requests

    async def _apply_page(self, items: list[Any], seen: dict[str, str], upsert_all: bool = False) -> None:
        for i, obj in enumerate(items):
            meta: ObjectMeta = obj.metadata
            key = object_key(meta)
            version = meta.resourceVersion
            if (self.store.get(key) == version and not upsert_all) or self._call(key, self.handler.upsert, obj):
                seen[key] = version
                # Recorded at once: if this LIST fails later, the retry's diff still deletes it.
                self.store[key] = version
            elif key in self.store:
                seen[key] = self.store[key]  # the index keeps the version it has; retried next relist
            if i % self.settings.yield_every == self.settings.yield_every - 1:
                await asyncio.sleep(0)  # decoding is CPU-bound: let /metrics and other loops run
        self.stats.last_event = time.time()

    # -- WATCH --------------------------------------------------------------------------------

    async def _watch(self) -> None:
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(random.randint(self.settings.timeout_min, self.settings.timeout_max)),
            **self.selector,
        }
        accept = PARTIAL if self.metadata_only else JSON
        try:
            async for line in self.api.stream_lines(self.path, params, accept, self.settings.read_timeout,
                                                    on_open=self._contact):
                self._handle(line)
        except ApiError as err:
            if err.status == 410:
                raise Gone from err
            raise

    def _handle(self, line: bytes) -> None:
        event = self._event.decode(line)
        kind = event.type
        if kind == "ERROR":
            status = self._status.decode(event.object)
            if status.code == 410:
                raise Gone(status.message)
            raise ApiError(status.code, status.reason, status.message)
        self.stats.count(kind)
        if kind == "BOOKMARK":
            self.resource_version = self._bookmark.decode(event.object).metadata.resourceVersion
            return
        obj: Any = self._item.decode(event.object)
        meta: ObjectMeta = obj.metadata
        key = object_key(meta)
        self.resource_version = meta.resourceVersion
        if kind == "DELETED":
            if self._call(key, self.handler.delete, key):  # idempotent downstream
                self.store.pop(key, None)
        elif self._call(key, self.handler.upsert, obj):
            self.store[key] = meta.resourceVersion
        self.stats.objects = len(self.store)
