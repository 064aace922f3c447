"""One list+watch loop per resource, with client-go reflector semantics.

    initial list (a WatchList stream, or a paged LIST) -> diff against the store (deletes for what
    vanished) -> WATCH from the list's resourceVersion with bookmarks and a randomized timeout ->
    on 410 Gone: relist and diff (never "watch from now") -> on a network error or a silent
    connection: jittered backoff, then watch again from the last resourceVersion.

As client-go keeps the lister/watcher and the store outside its reflector, collaborators hold
what is not the loop: the wire (``EventDecoder``, decode.py: what to ask for, events and pages into
projections), the paged LIST (``Pager``, pager.py: pages of one snapshot, again from the first
when a continue token expires), the store (``SyncStore``, store.py: what the handler accepted, the
diff of a pass, redelivery, handler failures retried), and the contact with the API server
(``Contact``, contact.py: connected or since when not, the last failure, logged and explained for
readiness).

The initial list, and every relist, is made one of these ways (``WatchSettings.initial_list``):

- ``watchlist``: a WatchList, ``watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan``
  without a resourceVersion (a consistent read): the state as ADDED events, then a BOOKMARK
  annotated ``k8s.io/initial-events-end: "true"`` carrying the snapshot's resourceVersion, then
  the same stream goes on as an ordinary watch. The initial events are applied like LIST pages
  and diffed against the store at that bookmark, which alone completes the sync (``synced``); a
  stream that breaks before it is started again from scratch. The server streams object by object
  from its watch cache: neither side ever holds the whole collection in one response.
- ``list``: paged LIST (``limit``/``continue``, pager.py) without a resourceVersion, a consistent read
  (served from the watch cache by servers with ConsistentListFromCache and ListFromCacheSnapshot,
  1.34+; from etcd before). A page in protobuf is handed over object by object as its bytes come
  (decode.py): this side never holds a page whole, so large pages cost it no memory.
- ``cache``: client-go's way without WatchList: the first LIST at ``resourceVersion=0`` (any age,
  from the watch cache; the server ignores ``limit``: one response with everything), each relist
  at ``resourceVersionMatch=NotOlderThan`` the last resourceVersion seen, so a relist never goes
  back in time from what the store holds. Not a consistent read: kept for comparison.
- ``auto``: ``list`` with a server that serves every page from its watch cache (1.34+), where
  pages of 20,000 cost it less CPU than a WatchList and a twenty-third of the bytes (gzip), and this
  side no more memory (docs/benchmarks.md); else ``watchlist``, and when the server refuses it
  (422 with its WatchList feature gate off), ``list``, remembered for that server
  (``ApiClient.watch_list_refused``) and logged once.

A handler call that raises leaves its object ``failed`` in the store (store.py): a relist is due
when a watch ends while such objects are outstanding.

A failed pass is recorded and logged by the contact (contact.py) and backs off, with the longer
cap when the failure is permanent-looking (Forbidden, NotFound: until someone acts).

``run`` is client-go's loop: one pass (``_sync_and_watch``: the sync when due, then the watch)
after another; a failed pass backs off; a 410 Gone relists at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

from ..client import protobuf
from ..client.api import ApiError, Gone
from ..model.objects import Bookmark
from ..runtime.backoff import BACKOFF_CAP, SLOW_BACKOFF_CAP, sleep_jittered
from ..runtime.clock import REAL, Clock
from ..runtime.logfields import fields
from .contact import FAILURES, Contact, reason
from .decode import Encoding, EventDecoder
from .pager import Lister, Pager, list_version
from .store import Handler, SourceStats, SyncStore

log = logging.getLogger(__name__)
T = TypeVar("T")


class ListWatch(Lister, Protocol):
    """What a reflector needs of the API client (ApiClient; a scripted one in tests)."""

    watch_list_refused: str

    async def auto_initial_list(self) -> Literal["watchlist", "list"]: ...

    async def watch(self, path: str, params: dict[str, str], accept: str, read_timeout: float,
                    on_frame: Callable[[bytes], None], connect_timeout: float = ...,
                    on_open: Callable[[str], None] | None = None,
                    gather: Callable[[], float] | None = None) -> None: ...


InitialList = Literal["auto", "watchlist", "list", "cache"]
INITIAL_EVENTS_END = "k8s.io/initial-events-end"  # the bookmark annotation that ends a WatchList's state


@dataclass
class WatchSettings:
    page_size: int = 0  # objects per LIST page; 0: the server's (ApiClient.page_size)
    timeout_min: int = 300  # watch timeoutSeconds is drawn from [min, max] (spreads reconnects)
    timeout_max: int = 600
    read_timeout: float = 180.0  # silence longer than this means a dead connection (idle watches
    # get a bookmark from the API server about every minute, the first after about two)
    yield_every: int = 200  # objects decoded between event-loop yields during a LIST
    initial_list: InitialList = "auto"  # see the module docstring
    encoding: Encoding = "protobuf"  # of pods and nodes (other kinds are JSON): kubeindex/watch/decode.py
    gather: float = 0.05  # seconds a watch leaves its socket unread after reading events (watchstream.py)


class Reflector(Generic[T]):
    def __init__(self, api: ListWatch, name: str, path: str, item_type: type[T], handler: Handler[T],
                 *, metadata_only: bool = False, settings: WatchSettings | None = None,
                 stats: SourceStats | None = None, label_selector: str = "", field_selector: str = "",
                 clock: Clock = REAL) -> None:
        self.api, self.clock, self.name, self.path = api, clock, name, path
        self.selector = {"labelSelector": label_selector} if label_selector else {}
        if field_selector:
            self.selector["fieldSelector"] = field_selector
        self.settings = settings or WatchSettings()
        self.stats = stats or SourceStats()
        self.decode = EventDecoder(item_type, metadata_only=metadata_only, encoding=self.settings.encoding)
        self._now = clock.time  # wall time, of the stats
        self.store = SyncStore(name, handler, self.stats, self._now)
        self.contact = Contact(name, path, clock)
        self.pager = Pager(api, name, path, self.decode, self.store, self.contact, self.stats, self._now)
        self.synced = asyncio.Event()
        self.resource_version = ""
        self.lists = 0  # LISTs completed
        self._need_sync = True  # a LIST or WatchList is due
        self._streaming = False  # the pass under way began with a WatchList
        self._relist_requested, self._reconnect_requested = asyncio.Event(), asyncio.Event()
        self._watching = False  # watching past its sync: what reconnect() may end
        self._list_done = asyncio.Event()  # replaced after every completed LIST
        self._frames_protobuf = False  # the watch under way is answered in protobuf

    @property
    def watch_encoding(self) -> Encoding:
        """The encoding the last watch was answered in."""
        return "protobuf" if self._frames_protobuf else "json"

    def problem(self, grace: float) -> str | None:
        """Why this resource is not in sync (None: it is)."""
        return self.contact.problem(grace, self.synced.is_set())

    # -- the loop -------------------------------------------------------------------------------

    async def relist(self) -> None:
        """Return once a LIST that started after this call has completed: the store then equals
        the server as of now, whatever the watch connection was doing (a silently dead one
        included), and the watch goes on from a new connection. A resource that is failing
        (forbidden, not installed, unreachable) returns at once: it has nothing fresher to give."""
        if not self.contact.connected:
            return
        target = self.lists + (2 if self.store.seen is not None else 1)  # a LIST under way started too early
        self._relist_requested.set()
        while self.lists < target and self.contact.connected:
            done = self._list_done
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):  # wake up to notice a failure meanwhile
                    await done.wait()

    async def redeliver(self) -> None:
        """Hand every object to the handler again: a relist whose diff skips nothing, for a
        handler that now keeps more of each object than before (a pod label key configured). A
        LIST under way when this is called may have passed objects already: the next one serves."""
        self.store.redeliver()
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
        """Watch until it ends or a reconnect is requested (True), or a relist is requested (False)."""
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
                self.stats.restart(reason(err))
                self.contact.lost(err, "LIST" if self._need_sync and not self._streaming else "WATCH")
                if not isinstance(err, FAILURES):  # a bug: start again from a LIST
                    self._need_sync = True
                cap = SLOW_BACKOFF_CAP if self.contact.permanent else BACKOFF_CAP
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
            mode = self.settings.initial_list  # a WatchList, or a LIST
            self._streaming = (await self.api.auto_initial_list() if mode == "auto" else mode) == "watchlist"
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
        elif self.store.failed:
            log.info("%s: relisting to retry %d objects whose handler failed", self.name, len(self.store.failed),
                     extra=fields(self.name))
            self._need_sync = True
        return self.clock.monotonic() - started > 1

    async def _sync_by_list(self) -> None:
        """A paged LIST, its pages into the store, which then becomes what it saw."""
        self.store.begin()
        try:
            since = list_version(self.settings.initial_list, self.resource_version)
            self.resource_version = await self.pager.list({**since, **self.selector}, self.settings.page_size,
                                                          self.settings.yield_every)
            self.store.complete()
        finally:
            self.store.abandon()
        self._listed()

    # -- WATCH --------------------------------------------------------------------------------

    async def _watch(self, stream: bool = False) -> None:
        """A watch from the last resourceVersion or, with ``stream``, a WatchList (the state first)."""
        params = {"watch": "1", "allowWatchBookmarks": "true",
                  "timeoutSeconds": str(random.randint(self.settings.timeout_min, self.settings.timeout_max)),
                  **self.selector}
        if stream:
            params |= {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan"}
            self.store.begin()
        else:
            params["resourceVersion"] = self.resource_version
        try:
            # Each event is handled as it is read; a WatchList's state too, the event loop getting
            # its turn between reads (kubeindex/client/watchstream.py).
            await self.api.watch(self.path, params, self.decode.watch_accept, self.settings.read_timeout,
                                 self._on_frame, on_open=self._opened, gather=self._gather)
        except ApiError as err:
            if not (stream and err.status in (400, 422) and self._refused(err)):
                raise
        finally:
            self.store.abandon()

    def _gather(self) -> float:
        """A WatchList's state is read as fast as it comes; the events after it are gathered."""
        return 0.0 if self.store.seen is not None else self.settings.gather

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
        self._frames_protobuf = self.decode.answers_protobuf(content_type)
        self.contact.made()

    def _on_frame(self, frame: bytes) -> None:
        if self._frames_protobuf:
            self._handle_protobuf(frame)
        else:
            self._handle(frame)

    def _handle_protobuf(self, frame: bytes) -> None:
        event_type, raw = protobuf.event(frame)
        self._event(event_type, self.decode.protobuf_object(event_type, raw))

    def _handle(self, line: bytes) -> None:
        event = self.decode.json_event(line)
        self._event(event.type, event.object)

    def _event(self, event_type: str, obj: Any) -> None:
        if event_type == "BOOKMARK":
            self._bookmarked(obj)
        elif self.store.seen is not None and event_type != "DELETED":  # a WatchList's state: like a LIST page
            self.store.listed(obj)
            self.stats.last_event = self._now()
        else:
            self.stats.count(event_type, self._now())
            self.resource_version = obj.metadata.resourceVersion
            self.store.watched(event_type, obj)

    def _bookmarked(self, bookmark: Bookmark) -> None:
        self.stats.count("BOOKMARK", self._now())
        meta = bookmark.metadata
        if self.store.seen is None:
            self.resource_version = meta.resourceVersion
        elif meta.annotations.get(INITIAL_EVENTS_END) == "true":  # a WatchList's state is complete
            self.store.complete()
            self.resource_version = meta.resourceVersion
            self._watching = True
            self._listed()
