"""One list+watch loop per resource, with client-go reflector semantics.

    initial list (a WatchList stream, or a paged LIST) -> diff against the store (deletes for what
    vanished) -> WATCH from the list's resourceVersion with bookmarks and a randomized timeout ->
    on 410 Gone: relist and diff (never "watch from now") -> on a network error or a silent
    connection: jittered backoff, then watch again from the last resourceVersion.

The initial list, and every relist, is made one of these ways (``WatchSettings.initial_list``):

- ``watchlist``: a WatchList, ``watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan``
  without a resourceVersion (a consistent read): the state as ADDED events, then a BOOKMARK
  annotated ``k8s.io/initial-events-end: "true"`` carrying the snapshot's resourceVersion, then
  the same stream goes on as an ordinary watch. The initial events are applied like LIST pages
  and diffed against the store at that bookmark, which alone completes the sync (``synced``); a
  stream that breaks before it is started again from scratch. The server streams object by object
  from its watch cache: neither side ever holds the whole collection in one response.
- ``list``: paged LIST (``limit``/``continue``) without a resourceVersion, a consistent read
  (served from the watch cache by servers with ConsistentListFromCache and ListFromCacheSnapshot,
  1.34+; from etcd before). A page in protobuf is handed over object by object as its bytes come
  (protobuf.ListItems): this side never holds a page whole, so large pages cost it no memory.
- ``cache``: client-go's way without WatchList: the first LIST at ``resourceVersion=0`` (any age,
  from the watch cache; the server ignores ``limit``: one response with everything), each relist
  at ``resourceVersionMatch=NotOlderThan`` the last resourceVersion seen, so a relist never goes
  back in time from what the store holds. Not a consistent read: kept for comparison.
- ``auto``: ``list`` with a server that serves every page from its watch cache (1.34+), where
  pages of 20,000 cost it less CPU than a WatchList and a twenty-third of the bytes (gzip), and this
  side no more memory (docs/benchmarks.md); else ``watchlist``, and when the server refuses it
  (422 with its WatchList feature gate off), ``list``, remembered for that server
  (``ApiClient.watch_list_refused``) and logged once.

Pages hold ``WatchSettings.page_size`` objects, by default the server's (``ApiClient.page_size``:
20,000 from the watch cache, 500 where pages come from etcd).

Pods and nodes are asked for in protobuf (``WatchSettings.encoding``, kubeindex/client/protobuf.py), the
other kinds in JSON; each answer is read in the encoding the server chose (its Content-Type; a LIST
page too), so a server or proxy that answers JSON is still understood.

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
while they persist (throttle.py). Permanent-looking answers (Forbidden, NotFound: RBAC, a missing
CRD) are retried with the longer backoff cap, as access may be granted or the CRD installed later.

``run`` is client-go's loop: one pass (``_sync_and_watch``: the sync when due, then the watch)
after another; a failed pass backs off; a 410 Gone relists at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, Protocol, TypeVar

import msgspec

from ..client import protobuf
from ..client.api import (
    JSON,
    PARTIAL,
    PARTIAL_LIST,
    ApiError,
    Forbidden,
    Gone,
    NotFound,
    status_error,
)
from ..client.watchstream import Framing, Whole
from ..model.objects import Bookmark, ListMeta, ObjectMeta, RawEvent, Status, object_key
from ..runtime.backoff import BACKOFF_CAP, SLOW_BACKOFF_CAP, sleep_jittered
from ..runtime.clock import REAL, Clock
from ..runtime.logfields import fields, key_fields
from ..runtime.throttle import ThrottledLog

log = logging.getLogger(__name__)
T = TypeVar("T")
LIST_TIMEOUT = 120  # seconds for one LIST page, all of it



def _explain(err: Exception) -> str:
    if isinstance(err, NotFound):
        return "404 not found: the resource is not served (are this project's CRDs installed? kubectl apply -f crds/)"
    if isinstance(err, Forbidden):
        return f"{err.status} {err.reason}: check the credentials and RBAC ({err.message.strip()})"
    if isinstance(err, ApiError) and not err.status:
        return err.message  # no answer: the transport's own words
    return f"{type(err).__name__}: {str(err).strip()}"


def _reason(err: Exception) -> str:
    """The ``reason`` label of nws_watch_restarts_total for a failed request."""
    if isinstance(err, ApiError):
        return f"http_{err.status}" if err.status else err.reason  # "timeout", or the transport's error
    return type(err).__name__


class ListWatch(Protocol):
    """What a reflector needs of the API client (ApiClient; a scripted one in tests)."""

    watch_list_refused: str

    async def auto_initial_list(self) -> Literal["watchlist", "list"]: ...

    async def page_size(self) -> int: ...

    async def get_frames(self, path: str, params: dict[str, str] | None, accept: str,
                         framing: Callable[[str], Framing], on_frame: Callable[[bytes], None],
                         timeout: float = ...) -> None: ...

    async def watch(self, path: str, params: dict[str, str], accept: str, read_timeout: float,
                    on_frame: Callable[[bytes], None], connect_timeout: float = ...,
                    on_open: Callable[[str], None] | None = None,
                    gather: Callable[[], float] | None = None) -> None: ...


InitialList = Literal["auto", "watchlist", "list", "cache"]
Encoding = Literal["protobuf", "json"]
INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the bookmark annotation that ends a WatchList's state


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


class _Event(msgspec.Struct, Generic[T]):
    """A watch event decoded in one pass into the item type: half the CPU of RawEvent and then the
    object, which scans the object's bytes twice. BOOKMARK and ERROR events go the RawEvent way (a
    bookmark's annotations are not in the projection; a Status is no item)."""

    type: str
    object: T


@dataclass
class Handler(Generic[T]):
    upsert: Callable[[T], object]  # what it returns is not used
    delete: Callable[[str], None]


@dataclass
class WatchSettings:
    page_size: int = 0  # objects per LIST page; 0: the server's (ApiClient.page_size)
    timeout_min: int = 300  # watch timeoutSeconds is drawn from [min, max] (spreads reconnects)
    timeout_max: int = 600
    read_timeout: float = 180.0  # silence longer than this means a dead connection (idle watches
    # get a bookmark from the API server about every minute, the first after about two)
    yield_every: int = 200  # objects decoded between event-loop yields during a LIST
    initial_list: InitialList = "auto"  # see the module docstring
    encoding: Encoding = "protobuf"  # of pods and nodes (other kinds are JSON): kubeindex/client/protobuf.py
    gather: float = 0.05  # seconds a watch leaves its socket unread after reading events (watchstream.py)


class Reflector(Generic[T]):
    def __init__(self, api: ListWatch, name: str, path: str, item_type: type[T], handler: Handler[T],
                 *, metadata_only: bool = False, settings: WatchSettings | None = None,
                 stats: SourceStats | None = None, label_selector: str = "", clock: Clock = REAL) -> None:
        self.api = api
        self.clock = clock
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
        self.failure: Exception | None = None  # what the last failed request raised (None since contact)
        self.last_error = ""  # the server's Status message, or what went wrong
        self.connected = False  # the last request was answered (see the module docstring)
        self.lost_at = 0.0  # self.clock.monotonic() when the connection was lost (while not connected)
        self._say = ThrottledLog(log, clock=clock.monotonic)
        self.lists = 0  # LISTs completed
        self._listing = False
        self._need_sync = True  # a LIST or WatchList is due
        self._streaming = False  # the pass under way began with a WatchList
        self._initial: dict[str, str] | None = None  # key -> version seen while a WatchList's state arrives
        # Requests to hand every object to the handler again; those the pass under way serves; the
        # last one a complete pass (LIST or WatchList) served.
        self._redeliver_requests = self._pass_requests = self._redelivered = 0
        self._relist_requested = asyncio.Event()
        self._reconnect_requested = asyncio.Event()
        self._watching = False  # watching past its sync: what reconnect() may end
        self._list_done = asyncio.Event()  # replaced after every completed LIST
        self._item = msgspec.json.Decoder(item_type)
        # _Page of the item type, made at run time; mypy takes a subscript by a variable for no type.
        self._list: msgspec.json.Decoder[_Page[T]] = msgspec.json.Decoder(_Page[item_type])  # type: ignore[valid-type]
        self._typed: msgspec.json.Decoder[_Event[T]] = msgspec.json.Decoder(_Event[item_type])  # type: ignore[valid-type]
        self._event = msgspec.json.Decoder(RawEvent)
        self._status = msgspec.json.Decoder(Status)
        self._bookmark = msgspec.json.Decoder(Bookmark)
        # Protobuf where the kind has it (pods, nodes); the server may still answer JSON.
        self._codec = None if metadata_only or self.settings.encoding != "protobuf" else protobuf.CODECS.get(item_type)
        self._frames_protobuf = False  # the watch under way is answered in protobuf

    # -- health -------------------------------------------------------------------------------

    @property
    def watch_encoding(self) -> Encoding:
        """The encoding the last watch was answered in."""
        return "protobuf" if self._frames_protobuf else "json"

    @property
    def forbidden(self) -> bool:
        """The last request was refused (401, 403): until someone changes RBAC or the credentials."""
        return isinstance(self.failure, Forbidden)

    @property
    def not_served(self) -> bool:
        """The last request found no resource (404): a CRD not (or no longer) installed."""
        return isinstance(self.failure, NotFound)

    @property
    def permanent(self) -> bool:
        """Failing in a way that repeats until someone acts (retried quietly, with the long backoff)."""
        return self.forbidden or self.not_served

    @property
    def last_error_status(self) -> int:
        """The HTTP status of the last failed request (0: none since contact, or no answer)."""
        return self.failure.status if isinstance(self.failure, ApiError) else 0

    def problem(self, grace: float) -> str | None:
        """Why this resource is not in sync (None: it is)."""
        now = self.clock.monotonic()  # the clock lost_at was read on
        if self.forbidden:
            return f"forbidden ({self.last_error})"
        if self.not_served:
            return f"not installed ({self.last_error}: the resource is not served; is its CRD installed?)"
        if not self.synced.is_set():
            return "initial sync in progress" + (f" (last error: {self.last_error})" if self.last_error else "")
        if not self.connected and now - self.lost_at > grace:
            return f"no contact with the API server for {now - self.lost_at:.0f}s (last error: {self.last_error})"
        return None

    def _contact(self) -> None:
        """The API server answered a LIST or WATCH with 200."""
        if self._say.clear("failure"):
            log.info("%s: API server reachable again after %.0fs", self.name, self.clock.monotonic() - self.lost_at,
                     extra=fields(self.name))
        self.connected = True
        self.failure = None
        self.last_error = ""

    def _failure(self, err: Exception, listing: bool) -> float:
        """Record and log a failed pass; the cap of the backoff before the next."""
        if self.connected or not self.lost_at:
            self.lost_at = self.clock.monotonic()
        self.connected = False
        self.failure = err
        self.last_error = err.message.strip() if isinstance(err, ApiError) and err.status else _explain(err)
        reason = _reason(err)
        self.stats.restart(reason)
        verb = "LIST" if listing else "WATCH"
        if isinstance(err, (ApiError, msgspec.DecodeError, protobuf.ProtobufError)):
            self._say("failure", reason, logging.WARNING, "%s: %s %s: %s; retrying with backoff", self.name, verb,
                      self.path, _explain(err), extra=fields(self.name, error=_explain(err)))
        else:  # a bug: start again from a LIST
            self._need_sync = True
            self._say("failure", reason, logging.ERROR, "%s: unexpected error in %s %s; relisting after backoff",
                      self.name, verb, self.path, exc_info=err, extra=fields(self.name, error=err))
        return SLOW_BACKOFF_CAP if self.permanent else BACKOFF_CAP

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
                async with asyncio.timeout(1.0):  # wake up to notice a failure meanwhile
                    await done.wait()

    async def redeliver(self) -> None:
        """Hand every object to the handler again: a relist whose diff skips nothing, for a
        handler that now keeps more of each object than before (a pod label key configured). A
        LIST under way when this is called may have passed objects already: the next one serves."""
        self._redeliver_requests += 1
        self._relist_requested.set()  # also when out of contact now: the LIST comes once it is back
        await self.relist()

    def reconnect(self) -> bool:
        """The watch's connection may be dead without a word (another request's went silent): end
        it and watch again, from the last resourceVersion, on a new connection. No LIST: the
        watch cache replays what the silence hid (or answers 410, and the relist follows). A
        watch that starts after this call is left alone; a sync under way goes on. True when a
        watch was ended."""
        if not self._watching or self._reconnect_requested.is_set():
            return False
        self.stats.restart("reconnect")
        self._reconnect_requested.set()
        return True

    def _listed(self) -> None:
        """A LIST or WatchList completed the store: in sync."""
        self._need_sync = False
        self.lists += 1
        done, self._list_done = self._list_done, asyncio.Event()
        done.set()
        self.synced.set()
        self.stats.synced = True

    async def _watch_unless_relist(self, stream: bool) -> bool:
        """Watch until the watch ends or a reconnect is requested (True), or a relist is requested
        (False)."""
        self._reconnect_requested.clear()  # this watch's connection is new: it serves earlier requests
        self._watching = not stream  # a WatchList is a sync: it completes first
        watch = asyncio.ensure_future(self._watch(stream))
        request = asyncio.ensure_future(self._relist_requested.wait())
        reconnect = asyncio.ensure_future(self._reconnect_requested.wait())
        try:
            await asyncio.wait({watch, request, reconnect}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self._watching = False
            for task in (watch, request, reconnect):
                task.cancel()
            # All end here; the watch's error is raised after, never in place of this task's own
            # cancellation (a watch failing in the turn that stop() cancelled us: lost, we went on).
            await asyncio.wait({watch, request, reconnect})
        if not watch.cancelled() and (error := watch.exception()) is not None:
            raise error
        return request.cancelled()

    async def _streams(self) -> bool:
        """The next sync is a WatchList (else a LIST)."""
        mode = self.settings.initial_list
        return (await self.api.auto_initial_list() if mode == "auto" else mode) == "watchlist"

    async def run(self) -> None:
        attempt = 0  # failed or short passes in a row: the backoff grows with it
        while True:
            try:
                ran_its_course = await self._sync_and_watch()
            except Gone:
                self.stats.restart("gone")
                log.info("%s: resourceVersion %s expired (410), relisting", self.name, self.resource_version,
                         extra=fields(self.name))
                if self._need_sync:  # the sync itself was answered 410: do not spin on it
                    await sleep_jittered(attempt, sleep=self.clock.sleep)
                    attempt += 1
                self._need_sync = True
                continue
            except Exception as err:
                cap = self._failure(err, self._need_sync and not self._streaming)
                await sleep_jittered(attempt, cap=cap, sleep=self.clock.sleep)
                attempt += 1
                continue
            if ran_its_course:
                attempt = 0
            else:  # closed at once: do not spin
                self.stats.restart("closed")
                await sleep_jittered(attempt, sleep=self.clock.sleep)
                attempt += 1

    async def _sync_and_watch(self) -> bool:
        """One pass: the sync when due (a LIST; a WatchList is the watch itself), then the watch
        until it ends or a relist is requested. False when it closed at once (back off)."""
        self._streaming = False
        if self._need_sync:
            self._relist_requested.clear()  # this sync serves any request made before it
            self._streaming = await self._streams()
            if not self._streaming:
                await self._sync_by_list()
        started = self.clock.monotonic()
        if not await self._watch_unless_relist(self._streaming):
            self._need_sync = True
            return True
        if self._reconnect_requested.is_set():
            return True  # ended on purpose: watch again at once
        if self._need_sync and self._streaming and self.settings.initial_list == "auto" and \
                self.api.watch_list_refused:
            return True  # the WatchList was refused: list at once
        if self._need_sync:  # a WatchList that ended before its state was complete: again
            log.warning("%s: WatchList of %s ended before its initial-events-end bookmark; again",
                        self.name, self.path, extra=fields(self.name))
            self.stats.restart("incomplete")
        elif self.failed:
            log.info("%s: relisting to retry %d objects whose handler failed", self.name, len(self.failed),
                     extra=fields(self.name))
            self._need_sync = True
        return self.clock.monotonic() - started > 1

    def _call(self, key: str, call: Callable[[Any], object], arg: Any) -> bool:
        """Run a handler call. A failure is logged with the key and counted, never raised: the
        loop goes on, and the caller leaves the key unrecorded so that a relist retries it."""
        try:
            call(arg)
        except Exception as err:
            self.stats.handler_errors += 1
            self.failed.add(key)
            log.error("%s: handler failed for %s: %r; a relist will retry it", self.name, key, err,
                      exc_info=self.stats.handler_errors == 1,  # the traceback once; then one line each
                      extra=key_fields(self.name, key, err))
            return False
        self.failed.discard(key)
        return True

    # -- LIST ---------------------------------------------------------------------------------

    async def _sync_by_list(self) -> None:
        self._listing = True
        try:
            await self._list_and_sync()
        finally:
            self._listing = False
        self._listed()

    def _list_version(self) -> dict[str, str]:
        """The resourceVersion parameters of a LIST (see the module docstring)."""
        if self.settings.initial_list != "cache":
            return {}  # a consistent read
        if not self.resource_version:
            return {"resourceVersion": "0"}  # never synced: any age will do
        return {"resourceVersion": self.resource_version, "resourceVersionMatch": "NotOlderThan"}

    async def _list_and_sync(self) -> None:
        self.stats.relists += 1
        self._pass_requests = self._redeliver_requests  # served only by a pass that completes
        seen: dict[str, str] = {}
        self.failed.clear()  # this pass retries them; what fails again is added back
        accept = PARTIAL_LIST if self.metadata_only else protobuf.ACCEPT if self._codec else JSON
        size = self.settings.page_size or await self.api.page_size()
        first = {"limit": str(size), **self._list_version(), **self.selector}
        params = first
        while True:
            try:
                meta = await self._list_page(params, accept, seen)
            except Gone:
                if "continue" in params:
                    # The snapshot was compacted between two pages: a fresh paged pass (see the
                    # module docstring for why this is correct and bounded).
                    log.info("%s: continue token expired after %d objects; listing again from the first page",
                             self.name, len(seen), extra=fields(self.name))
                    seen.clear()
                    self.failed.clear()
                    params = first
                    continue
                raise
            if not meta.continue_:
                self.resource_version = meta.resourceVersion
                break
            params = {**first, "continue": meta.continue_}
            if "resourceVersion" in first:  # the token holds it; the server refuses both
                params = {k: v for k, v in params.items() if not k.startswith("resourceVersion")}
        self._replace(seen)

    async def _list_page(self, params: dict[str, str], accept: str, seen: dict[str, str]) -> ListMeta:
        """One LIST page, its objects handed to the handler: in protobuf one by one as they come
        (the page is never held whole, nor its objects), in JSON once the page has all come."""
        codec = self._codec
        items: protobuf.ListItems | None = None
        whole: list[bytes] = []

        def framing(content_type: str) -> Framing:
            nonlocal items
            if codec is not None and content_type.startswith(protobuf.MEDIA_TYPE):
                items = protobuf.ListItems()
                return items
            return Whole()

        def on_frame(frame: bytes) -> None:
            if codec is not None and items is not None:
                self._apply_listed(codec.object(frame), seen)
            else:
                whole.append(frame)

        await self.api.get_frames(self.path, params, accept, framing, on_frame, timeout=LIST_TIMEOUT)
        self._contact()
        if items is not None:
            self.stats.last_event = time.time()
            return protobuf.list_meta(items.metadata)
        page = self._list.decode(whole[0])
        await self._apply_page(page.items or [], seen)
        return page.metadata

    def _replace(self, seen: dict[str, str]) -> None:
        """The store becomes what a complete LIST or WatchList saw: deletes for the rest."""
        for key in self.store.keys() - seen.keys():  # vanished while we were not watching
            if self._call(key, self.handler.delete, key):
                self.stats.count("DELETED")
            else:
                seen[key] = self.store[key]  # kept: the next relist's diff deletes it again
        self.store = seen
        self.stats.objects = len(seen)
        self._redelivered = self._pass_requests

    async def _apply_page(self, items: list[Any], seen: dict[str, str]) -> None:
        for i, obj in enumerate(items):
            self._apply_listed(obj, seen)
            if i % self.settings.yield_every == self.settings.yield_every - 1:
                await asyncio.sleep(0)  # decoding is CPU-bound: let /metrics and other loops run
        self.stats.last_event = time.time()

    def _apply_listed(self, obj: Any, seen: dict[str, str]) -> None:
        """One object of a LIST page or of a WatchList's initial state."""
        meta: ObjectMeta = obj.metadata
        key = object_key(meta)
        version = meta.resourceVersion
        unchanged = self.store.get(key) == version and self._pass_requests <= self._redelivered
        if unchanged or self._call(key, self.handler.upsert, obj):
            seen[key] = version
            # Recorded at once: if this LIST fails later, the retry's diff still deletes it.
            self.store[key] = version
        elif key in self.store:
            seen[key] = self.store[key]  # the index keeps the version it has; retried next relist

    # -- WATCH --------------------------------------------------------------------------------

    async def _watch(self, stream: bool = False) -> None:
        """A watch from the last resourceVersion or, with ``stream``, a WatchList (the state first)."""
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(random.randint(self.settings.timeout_min, self.settings.timeout_max)),
            **self.selector,
        }
        if stream:
            params |= {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
            self.stats.relists += 1
            self.failed.clear()  # this pass retries them; what fails again is added back
            self._pass_requests = self._redeliver_requests
            self._initial = {}
            self._listing = True
        else:
            params["resourceVersion"] = self.resource_version
        accept = PARTIAL if self.metadata_only else protobuf.ACCEPT_WATCH if self._codec else JSON
        try:
            # Each event is handled as it is read; a WatchList's state too, the event loop getting
            # its turn between reads (kubeindex/client/watchstream.py).
            await self.api.watch(self.path, params, accept, self.settings.read_timeout, self._on_frame,
                                 on_open=self._opened, gather=self._gather)
        except ApiError as err:
            if not (stream and err.status in (400, 422) and self._refused(err)):
                raise
        finally:
            self._initial = None
            self._listing = False

    def _gather(self) -> float:
        """A WatchList's state is read as fast as it comes; the events after it are gathered."""
        return 0.0 if self._initial is not None else self.settings.gather

    def _refused(self, err: ApiError) -> bool:
        """A WatchList refused (422 Invalid, "sendInitialEvents is forbidden for watch unless the
        WatchList feature gate is enabled"): in auto mode, list from now on with this server (True)."""
        if self.settings.initial_list != "auto":
            return False
        if not self.api.watch_list_refused:
            self.api.watch_list_refused = err.message.strip()
            log.warning("the API server refused a WatchList (%s %s); using paged LISTs with this server",
                        err.status, self.api.watch_list_refused, extra=fields(self.name, error=err))
        return True

    def _opened(self, content_type: str) -> None:
        """The watch was answered 200, in this encoding."""
        self._frames_protobuf = self._codec is not None and content_type.startswith(protobuf.MEDIA_TYPE)
        self._contact()

    def _on_frame(self, frame: bytes) -> None:
        if self._frames_protobuf:
            self._handle_protobuf(frame)
        else:
            self._handle(frame)

    def _handle_protobuf(self, frame: bytes) -> None:
        assert self._codec is not None
        kind, raw = protobuf.event(frame)
        if kind == "ERROR":
            status = protobuf.status(raw)
            raise status_error(status.code, status.reason, status.message)
        if kind == "BOOKMARK":
            self._bookmarked(protobuf.bookmark(raw))
            return
        self._handle_object(kind, self._codec.object(raw))

    def _handle(self, line: bytes) -> None:
        try:
            typed = self._typed.decode(line)
        except msgspec.ValidationError:  # an ERROR event's Status: not an item
            typed = None
        if typed is not None and typed.type not in ("BOOKMARK", "ERROR"):
            self._handle_object(typed.type, typed.object)
            return
        event = self._event.decode(line)
        kind = event.type
        if kind == "ERROR":
            status = self._status.decode(event.object)
            raise status_error(status.code, status.reason, status.message)
        if kind == "BOOKMARK":
            self._bookmarked(self._bookmark.decode(event.object))
            return
        self._handle_object(kind, self._item.decode(event.object))

    def _bookmarked(self, bookmark: Bookmark) -> None:
        self.stats.count("BOOKMARK")
        meta = bookmark.metadata
        if self._initial is None:
            self.resource_version = meta.resourceVersion
        elif meta.annotations.get(INITIAL_EVENTS_END) == "true":
            self._end_initial(meta.resourceVersion)

    def _handle_object(self, kind: str, obj: Any) -> None:
        if self._initial is not None and kind != "DELETED":  # a WatchList's state: like a LIST page
            self._apply_listed(obj, self._initial)
            self.stats.last_event = time.time()
            return
        self.stats.count(kind)
        meta: ObjectMeta = obj.metadata
        key = object_key(meta)
        self.resource_version = meta.resourceVersion
        if kind == "DELETED":
            if self._call(key, self.handler.delete, key):  # idempotent downstream
                self.store.pop(key, None)
                if self._initial is not None:  # not sent before initial-events-end; but never resurrect
                    self._initial.pop(key, None)
        elif self._call(key, self.handler.upsert, obj):
            self.store[key] = meta.resourceVersion
        self.stats.objects = len(self.store)

    def _end_initial(self, version: str) -> None:
        """A WatchList's initial-events-end bookmark: its state is complete, the watch goes on."""
        assert self._initial is not None
        seen, self._initial = self._initial, None
        self._replace(seen)
        self.resource_version = version
        self._listing = False
        self._watching = True
        self._listed()
