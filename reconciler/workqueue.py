"""A keyed, rate-limited work queue in the manner of client-go's workqueue.

- A key is queued at most once; a key being processed is never handed to a second worker, and
  if it is added meanwhile it is queued again when the worker is done (nothing is lost).
- Items carry no state: the worker computes what to do when it takes the key.
- ``add`` after a write of the same key waits until ``debounce`` seconds after that write (the
  first change goes out at once, a flapping object costs one write per debounce period). A
  change may carry a ``Pacing``, the controller's named policy for it: ``delay`` holds even the
  first change, so that a burst of changes is one write (the endpointslice controller's batch
  period; later adds never push it further off); ``debounce`` asks a longer debounce of this
  change (a change of less weight); ``beat`` rounds its time up to a whole multiple of ``beat`` on
  the queue's clock, so that such changes of many keys fall due together (one burst of writes,
  not a trickle).
- ``retry`` re-adds with a per-key exponential backoff; ``forget`` resets it.
- ``clear`` drops everything that waits (leadership lost): keys in flight finish, nothing more.

Its own metrics, client-go's (``workqueue_*``, labelled by the queue's ``name``), kept in O(1)
per key: ``depth`` (keys queued to be taken, client-go's count: a key re-added while in flight
included, keys waiting for a debounce or a backoff not yet), ``adds`` (keys queued, each time one
becomes due), ``retries``, ``queue_duration`` (from queued to taken) and ``work_duration`` (from
taken to done: deciding and writing, the token bucket's wait included).

Waiting costs O(1) per change, as client-go's: a key made ready wakes one idle worker (not all
of them), and one timer, for the earliest key that waits for its time, stands for every worker.

Time comes from an injectable ``Clock`` (kubeindex/runtime/clock.py): tests step a fake one.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from kubeindex.runtime.backoff import SLOW_BACKOFF_CAP, backoff
from kubeindex.runtime.clock import REAL, Clock
from kubeindex.runtime.histogram import QUEUE_BUCKETS, Histogram

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Pacing:
    """When a change falls due: ``delay`` after it, ``debounce`` after the key's last write (None:
    the queue's), rounded up to a multiple of ``beat`` (0: not rounded)."""

    delay: float = 0.0
    debounce: float | None = None
    beat: float = 0.0


AT_ONCE = Pacing()  # the queue's debounce after the last write, else now


class WorkQueue(Generic[K]):
    def __init__(self, debounce: float = 1.0, base_delay: float = 0.2, max_delay: float = SLOW_BACKOFF_CAP,
                 clock: Clock = REAL, name: str = "") -> None:
        self.name = name  # the controller's: its metrics' label
        self.debounce = debounce
        self.clock = clock
        self.base_delay, self.max_delay = base_delay, max_delay
        self._queue: deque[K] = deque()
        self._dirty: set[K] = set()  # queued or to be queued again after processing
        self._processing: set[K] = set()
        self._waiting: list[tuple[float, int, K]] = []  # (when, serial, key): a heap
        self._waiting_at: dict[K, float] = {}  # the earliest time each waiting key is due
        self._serial = 0
        self._failures: dict[K, int] = {}
        self._done_at: dict[K, float] = {}  # last write, for the debounce (pruned as it ages)
        self._longest = debounce  # the longest debounce asked: marks younger than it are kept
        self._idle: deque[asyncio.Future[None]] = deque()  # workers waiting in get(), each woken alone
        self._timer: asyncio.Task[None] | None = None  # sleeps until the earliest waiting key is due
        self._timer_due = 0.0
        self._queued_at: dict[K, float] = {}  # when each dirty key was queued (pruned when taken or cleared)
        self._taken_at: dict[K, float] = {}  # when each key in flight was taken
        self.adds = 0
        self.retries = 0
        self.queue_duration = Histogram(QUEUE_BUCKETS)
        self.work_duration = Histogram(QUEUE_BUCKETS)

    @property
    def depth(self) -> int:
        return len(self._dirty)

    def __len__(self) -> int:
        return len(self._dirty | self._waiting_at.keys())

    def add(self, key: K, pacing: Pacing = AT_ONCE) -> None:
        now = self.clock.monotonic()
        due = now + pacing.delay
        debounce = self.debounce if pacing.debounce is None else pacing.debounce
        self._longest = max(self._longest, debounce)
        written = self._done_at.get(key)
        if written is not None and now < written + debounce:
            due = max(due, written + debounce)
        if pacing.beat > 0:
            due = math.ceil(due / pacing.beat) * pacing.beat
        if key in self._dirty:
            return
        if due > now:
            self._add_at(key, due)
            return
        self._waiting_at.pop(key, None)  # due now: a later time it waited for is void
        self._mark_dirty(key)
        if key not in self._processing:
            self._ready(key)

    def _mark_dirty(self, key: K) -> None:
        self._dirty.add(key)
        self.adds += 1
        self._queued_at.setdefault(key, self.clock.monotonic())

    def add_after(self, key: K, delay: float) -> None:
        """Add ``key`` once ``delay`` seconds have passed (client-go's AddAfter)."""
        self._add_at(key, self.clock.monotonic() + max(delay, 0.0))

    def retry(self, key: K) -> None:
        """Again after an error, with backoff: base * 2^failures, capped."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        self.retries += 1
        self._add_at(key, self.clock.monotonic() + backoff(failures, self.base_delay, self.max_delay))

    def retry_now(self) -> None:
        """Every key waiting out a retry's backoff is due now: the API server answers again, and
        what failed while it did not (a restart's refused connections and 503s) need not wait out
        backoffs grown meanwhile. The failure counts stay: a key that fails again backs off on."""
        now = self.clock.monotonic()
        for key in [k for k in self._failures if k in self._waiting_at]:
            self._add_at(key, now)

    def forget(self, key: K) -> None:
        self._failures.pop(key, None)

    def wrote(self, key: K) -> None:
        """Mark a write of ``key`` now: later adds wait for the debounce."""
        if self.debounce > 0:
            self._done_at[key] = self.clock.monotonic()

    def done(self, key: K) -> None:
        taken = self._taken_at.pop(key, None)
        if taken is not None:
            self.work_duration.observe(self.clock.monotonic() - taken)
        self._processing.discard(key)
        if key in self._dirty:
            self._ready(key)

    def clear(self) -> None:
        self._queue.clear()
        self._dirty.clear()
        self._waiting.clear()
        self._waiting_at.clear()
        self._failures.clear()
        self._done_at.clear()
        self._queued_at.clear()

    async def get(self) -> K:
        while True:
            self._promote_waiting()
            if self._queue:
                key = self._queue.popleft()
                self._dirty.discard(key)
                self._processing.add(key)
                now = self.clock.monotonic()
                self.queue_duration.observe(now - self._queued_at.pop(key, now))
                self._taken_at[key] = now
                return key
            idle: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._idle.append(idle)
            self._arm_timer()
            try:
                await idle
            except asyncio.CancelledError:
                if idle.done() and not idle.cancelled():
                    self._wake_one()  # woken and cancelled at once: the wake goes to another
                raise

    def _ready(self, key: K) -> None:
        self._queue.append(key)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._idle:
            idle = self._idle.popleft()
            if not idle.done():
                idle.set_result(None)
                return

    def _add_at(self, key: K, when: float) -> None:
        if self._waiting_at.get(key, float("inf")) <= when:
            return  # already due as early
        self._waiting_at[key] = when
        self._serial += 1
        heapq.heappush(self._waiting, (when, self._serial, key))
        self._arm_timer()

    def _promote_waiting(self) -> None:
        now = self.clock.monotonic()
        while self._waiting and self._waiting[0][0] <= now:
            when, _, key = heapq.heappop(self._waiting)
            if self._waiting_at.get(key) != when:
                continue  # superseded by an earlier entry
            del self._waiting_at[key]
            if key not in self._dirty:
                self._mark_dirty(key)
                if key not in self._processing:
                    self._ready(key)
        if len(self._done_at) > 1024:  # drop debounce marks that no longer delay anything
            horizon = now - self._longest
            self._done_at = {k: t for k, t in self._done_at.items() if t > horizon}

    def _arm_timer(self) -> None:
        """One sleep, for the earliest waiting key; a key due earlier than it replaces it. Needs a
        running event loop: without one (keys added before the workers start) the first get()
        arms it."""
        if not self._waiting:
            return
        due = self._waiting[0][0]
        if self._timer is not None and not self._timer.done():
            if self._timer_due <= due:
                return
            self._timer.cancel()
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer_due = due
        self._timer = asyncio.ensure_future(self._fire(due))

    async def _fire(self, due: float) -> None:
        await self.clock.sleep(due - self.clock.monotonic())
        self._timer = None
        self._promote_waiting()  # wakes a worker for each key it makes ready
        self._arm_timer()
