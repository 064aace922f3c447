"""Kubernetes Events on the objects the reconciler acts for (a ClusterResourceClaim whose quota was
written), rate-limited and deduplicated as client-go's event recorder does.

- **The API.** events.k8s.io/v1, the one client-go's current recorder (tools/events) writes:
  ``regarding`` (the object), ``related`` (the other one, e.g. the ClusterQueue written), ``reason``,
  ``action``, ``note``, ``reportingController`` and ``reportingInstance`` (this replica), and a
  ``series`` counting repeats. ``kubectl get events`` and ``kubectl describe`` show them as they
  show core v1 Events (the same objects).
- **Where.** An Event lives in the namespace of the object it regards; for a cluster-scoped one,
  in ``default``, as client-go puts it (the API server accepts only ``default`` or ``kube-system``
  for those).
- **Spam filter** (client-go's EventSourceObjectSpamFilter): a token bucket per source and object
  (and type), 25 at once, then one every 5 minutes; an Event beyond it is dropped. The log line of
  what happened carries the same facts, every time.
- **Identical events** (the same object, related object, reason, action, type and note: client-go's
  EventCorrelator's "identical") are one Event that counts them: each repeat is counted, and a
  repeat that passes the spam filter patches the Event's ``series`` (``count``,
  ``lastObservedTime``; a JSON merge patch) instead of creating another. An Event gone meanwhile
  (the API server's ``--event-ttl``, an hour by default) is created again.
- Both caches keep the 4096 most recently used keys (client-go's ``maxLruCacheEntries``).
- **Writes** go through the manager's writer: its token bucket and its leadership check, so only
  the leader records. A failed write is logged (once a minute at most, per object) and the Event
  dropped: an Event is never a reason to retry the write it reports.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kubeindex.model.resources import EVENTS
from kubeindex.runtime.logfields import fields
from kubeindex.runtime.throttle import ThrottledLog

from .ratelimit import TokenBucket
from .writer import NOT_FOUND, Done, Failed, Outcome

log = logging.getLogger(__name__)
NORMAL, WARNING = "Normal", "Warning"
CLUSTER_SCOPED_NAMESPACE = "default"  # where client-go records the Events of cluster-scoped objects
SPAM_BURST = 25  # client-go's defaultSpamBurst
SPAM_REFILL = 300.0  # seconds per token: client-go's defaultSpamQPS, 1/300
CACHE_SIZE = 4096  # client-go's maxLruCacheEntries
NOTE_LIMIT = 1024  # bytes: the API server refuses a longer note
INSTANCE_LIMIT = 128  # characters of reportingInstance
NAME_LIMIT = 253  # characters of an Event's name (a DNS-1123 subdomain)


class EventWriter(Protocol):
    """The writes of an Event (writer.Writer)."""

    async def create_event(self, path: str, body: Any) -> Outcome: ...

    async def patch_event(self, path: str, body: Any) -> Outcome: ...


@dataclass(frozen=True)
class Ref:
    """An object an Event names (an ObjectReference)."""

    api_version: str
    kind: str
    name: str
    uid: str = ""
    namespace: str = ""

    def body(self) -> dict[str, str]:
        out = {"apiVersion": self.api_version, "kind": self.kind, "namespace": self.namespace, "name": self.name,
               "uid": self.uid}
        return {k: v for k, v in out.items() if v}


@dataclass(frozen=True)
class Event:
    regarding: Ref
    reason: str  # CamelCase, why: e.g. QuotaWritten
    action: str  # CamelCase, what was done: e.g. WriteQuota
    note: str  # the facts, for people
    type: str = NORMAL
    related: Ref | None = None


@dataclass
class _Recorded:
    """An Event on the server, and how many times it happened."""

    namespace: str
    name: str
    count: int = 1


def micro_time(seconds: float) -> str:
    """A metav1.MicroTime: microseconds, UTC."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _note(text: str) -> str:
    """At most NOTE_LIMIT bytes of UTF-8, cut on a character."""
    return text.encode()[:NOTE_LIMIT].decode(errors="ignore")


class _Lru(OrderedDict[Any, Any]):
    """At most ``size`` entries: the least recently used go first."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def get_recent(self, key: Any) -> Any:
        """The value of ``key`` (None if absent), made the most recent."""
        if key not in self:
            return None
        self.move_to_end(key)
        return self[key]

    def put(self, key: Any, value: Any) -> Any:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.size:
            self.popitem(last=False)
        return value


class EventRecorder:
    """Records Events as ``controller`` (reportingController) on replica ``instance``
    (reportingInstance). ``counts``: what became of each, by result."""

    def __init__(self, controller: str, instance: str, clock: Callable[[], float] = time.time,
                 burst: int = SPAM_BURST, refill: float = SPAM_REFILL, cache_size: int = CACHE_SIZE) -> None:
        self.controller = controller
        self.instance = instance[:INSTANCE_LIMIT]
        self.clock = clock  # wall time: eventTime and lastObservedTime are read by people
        self.burst, self.refill = burst, refill
        self._buckets = _Lru(cache_size)  # (type, regarding) -> TokenBucket
        self._recorded = _Lru(cache_size)  # identity of an Event -> _Recorded
        self._last_name = 0  # the nanoseconds in the last Event's name: each name is new
        self._failures = ThrottledLog(log)
        self.counts: dict[str, int] = {}  # "created" / "patched" / "throttled" / "failed" -> Events

    def _count(self, result: str) -> str:
        self.counts[result] = self.counts.get(result, 0) + 1
        return result

    def _allowed(self, event: Event) -> bool:
        key = (event.type, event.regarding)
        bucket = self._buckets.get_recent(key) or self._buckets.put(
            key, TokenBucket(1 / self.refill, self.burst, self.clock))
        return bool(bucket.try_take())

    async def record(self, event: Event, writer: EventWriter, times: int = 1) -> str:
        """Create the Event, or count a repeat of an identical one: "created", "patched",
        "throttled" (the spam filter dropped it) or "failed" (logged). ``times``: it happened that
        many times at once (one write, its series counting them all)."""
        identity = (event.regarding, event.related, event.reason, event.action, event.type, event.note)
        recorded: _Recorded | None = self._recorded.get_recent(identity)
        if recorded is not None:
            recorded.count += times  # counted even when the filter drops it: the next patch says how many
        if not self._allowed(event):
            return self._count("throttled")
        now = self.clock()
        try:
            outcome = await self._patch(recorded, now, writer) if recorded is not None else NOT_FOUND
            if isinstance(outcome, Done):
                return self._count("patched")
            if not isinstance(outcome, Failed):  # none yet, or expired: created
                created, outcome = await self._create(event, now, writer, times)
                self._recorded.put(identity, created)
            error: Exception | None = outcome.error if isinstance(outcome, Failed) else None
        except Exception as err:  # Deposed: dropped
            error = err
        if error is None:
            return self._count("created")
        self._recorded.pop(identity, None)  # the next identical one is created afresh, not patched
        regarding = event.regarding
        self._failures(f"{regarding.kind}/{regarding.namespace}/{regarding.name}", type(error).__name__,
                       logging.WARNING, "Event %s on %s %s not recorded: %s", event.reason, regarding.kind,
                       regarding.name, error, extra=fields(EVENTS.name, regarding.namespace,
                                                           regarding.name, error))
        return self._count("failed")

    def _name(self, regarding: str, now: float) -> str:
        """client-go's: the object's name and the time; new for each Event, and within 253 characters."""
        nanos = max(int(now * 1e9), self._last_name + 1)
        self._last_name = nanos
        suffix = f".{nanos:x}"
        return regarding[:NAME_LIMIT - len(suffix)].rstrip(".-") + suffix

    async def _create(self, event: Event, now: float, writer: EventWriter,
                      times: int = 1) -> tuple[_Recorded, Outcome]:
        namespace = event.regarding.namespace or CLUSTER_SCOPED_NAMESPACE
        name = self._name(event.regarding.name, now)
        body: dict[str, Any] = {
            "apiVersion": EVENTS.api_version, "kind": EVENTS.kind, "metadata": {"name": name, "namespace": namespace},
            "eventTime": micro_time(now), "reportingController": self.controller,
            "reportingInstance": self.instance, "action": event.action, "reason": event.reason,
            "regarding": event.regarding.body(), "note": _note(event.note), "type": event.type}
        if event.related is not None:
            body["related"] = event.related.body()
        if times > 1:  # a series from the start (the API server wants a count of 2 or more there)
            body["series"] = {"count": times, "lastObservedTime": micro_time(now)}
        outcome = await writer.create_event(EVENTS.path(namespace), body)
        return _Recorded(namespace, name, times), outcome

    async def _patch(self, recorded: _Recorded, now: float, writer: EventWriter) -> Outcome:
        """The repeat on the Event's series; NOT_FOUND when the Event is gone (expired)."""
        series = {"series": {"count": recorded.count, "lastObservedTime": micro_time(now)}}
        return await writer.patch_event(EVENTS.path(recorded.namespace, recorded.name),
                                        series)
