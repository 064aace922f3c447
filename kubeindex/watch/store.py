"""A reflector's store: what its handler has accepted, kept in sync with the server by passes
(a LIST's pages, or a WatchList's initial state) and by the watch's events after them.

The store keeps only key -> resourceVersion (resourceVersions are opaque strings, only compared
for equality) of what the handler has accepted; the objects themselves live in the index. A
resourceVersion is recorded only after the handler succeeded. A handler that raises is logged
with the object's key and counted (``SourceStats.handler_errors``), never fatal to the loop; the
object stays unrecorded (or at the version the handler last accepted) and ``failed``, so the next
pass hands it to the handler again (a later event for the object retries it sooner).

A pass (``begin``, ``listed`` for each object, ``complete``) hands the handler only what changed
since the store last saw it: an object at the version the store holds is skipped, unless
``redeliver`` asked, before the pass began, for every object again. An object is recorded as soon
as the handler took it, so a pass that breaks off (a lost connection, a continue token expired
between two pages: ``again``) leaves what it applied in the store, and the next pass upserts only
what changed since. Deletes for vanished objects are emitted only by a complete pass (the diff of
the store against what that pass saw), so a pass that broke off deletes nothing. A delete that
fails keeps its key, and the next pass's diff deletes it again. A DELETED event during a WatchList's
initial state (not sent before initial-events-end, but possible) removes the object from what the
pass saw, so that pass's end never resurrects it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..model.objects import ObjectMeta, object_key
from ..runtime.logfields import key_fields

log = logging.getLogger("kubeindex.watch.reflector")  # a reflector's lines, whichever part says them
T = TypeVar("T")


@dataclass
class SourceStats:
    """Self-metrics of one reflector, read by the exporter."""

    events: dict[str, int] = field(default_factory=dict)  # ADDED / MODIFIED / DELETED / BOOKMARK
    relists: int = 0
    restarts: dict[str, int] = field(default_factory=dict)  # reason -> watch restarts
    last_event: float = 0.0  # wall time (Clock.time) of the last event or list page
    objects: int = 0
    synced: bool = False
    handler_errors: int = 0  # handler calls that raised (the object is retried by a relist)

    def count(self, event_type: str, now: float) -> None:
        self.events[event_type] = self.events.get(event_type, 0) + 1
        self.last_event = now

    def restart(self, reason: str) -> None:
        self.restarts[reason] = self.restarts.get(reason, 0) + 1


@dataclass
class Handler(Generic[T]):
    upsert: Callable[[T], object]  # what it returns is not used
    delete: Callable[[str], None]


class SyncStore(Generic[T]):
    def __init__(self, name: str, handler: Handler[T], stats: SourceStats, now: Callable[[], float]) -> None:
        self.name = name  # the reflector's, in the log
        self.handler = handler
        self.stats = stats
        self._now = now  # wall time, of a delete's count
        self.versions: dict[str, str] = {}  # key -> resourceVersion the handler accepted
        self.failed: set[str] = set()  # keys whose last handler call raised: a pass is due
        self.seen: dict[str, str] | None = None  # the pass under way: key -> version seen (None: none)
        # Requests to hand every object to the handler again; those the pass under way serves; the
        # last one a complete pass served.
        self._redeliver_requests = self._pass_requests = self._redelivered = 0

    def redeliver(self) -> None:
        """The next pass hands every object to the handler, unchanged ones too."""
        self._redeliver_requests += 1

    def begin(self) -> None:
        """A pass starts: it retries what failed (what fails again is added back)."""
        self.stats.relists += 1
        self._pass_requests = self._redeliver_requests  # served only by a pass that completes
        self.failed.clear()
        self.seen = {}

    def again(self) -> None:
        """The pass under way starts over (from a newer snapshot); what it applied stays recorded."""
        assert self.seen is not None
        self.seen.clear()
        self.failed.clear()

    def listed(self, obj: Any) -> None:
        """One object of the pass under way."""
        seen = self.seen
        assert seen is not None
        meta: ObjectMeta = obj.metadata
        key = object_key(meta)
        version = meta.resourceVersion
        unchanged = self.versions.get(key) == version and self._pass_requests <= self._redelivered
        if unchanged or self._call(key, self.handler.upsert, obj):
            seen[key] = version
            # Recorded at once: if this pass breaks off later, the next one's diff still deletes it.
            self.versions[key] = version
        elif key in self.versions:
            seen[key] = self.versions[key]  # the index keeps the version it has; retried next pass

    def complete(self) -> None:
        """The pass under way saw everything: the store becomes what it saw, deletes for the rest."""
        seen, self.seen = self.seen, None
        assert seen is not None
        for key in self.versions.keys() - seen.keys():  # vanished while we were not watching
            if self._call(key, self.handler.delete, key):
                self.stats.count("DELETED", self._now())
            else:
                seen[key] = self.versions[key]  # kept: the next pass's diff deletes it again
        self.versions = seen
        self.stats.objects = len(seen)
        self._redelivered = self._pass_requests

    def abandon(self) -> None:
        """The pass under way (if any) ended before it was complete: it deletes nothing."""
        self.seen = None

    def watched(self, event_type: str, obj: Any) -> None:
        """An object's watch event (ADDED, MODIFIED, DELETED)."""
        meta: ObjectMeta = obj.metadata
        key = object_key(meta)
        if event_type == "DELETED":
            if self._call(key, self.handler.delete, key):  # idempotent downstream
                self.versions.pop(key, None)
                if self.seen is not None:  # in a WatchList's state: never resurrected by its end
                    self.seen.pop(key, None)
        elif self._call(key, self.handler.upsert, obj):
            self.versions[key] = meta.resourceVersion
        self.stats.objects = len(self.versions)

    def _call(self, key: str, call: Callable[[Any], object], arg: Any) -> bool:
        """Run a handler call. A failure is logged with the key and counted, never raised: the
        loop goes on, and the caller leaves the key unrecorded so that a pass retries it."""
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
