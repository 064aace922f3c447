"""The reconciler: a manager of small controllers, in controller-runtime's shape.

The ``Manager`` owns what its controllers share:

- **leadership**: before a new leader's first write every watch is relisted (bounded by
  ``relist_timeout``); losing the lease drops every queue. Only the leader's passes queue keys,
  and the ``Writer`` checks that this replica still leads before each request;
- **the service's own watches** (a controller's ``watches``), run, counted and relisted by the
  sources with every other watch; until they have synced this replica may not lead;
- **the token bucket** of every write (``--writes-per-second``) and the ``Writer`` (writer.py);
- **the loop**: a pass every ``interval`` in which each controller queues the keys of what
  changed, and each controller's workers.

A ``Controller`` is a small class: a ``name`` (its queue's, the ``name`` label of the
nws_workqueue_* metrics), ``queue_changes`` (the producer: it adds keys, each with the
controller's pacing policy) and ``reconcile(key) -> Result``, which decides when a worker takes
the key, from the state then, client-go style. A key is never on two workers at once. Adding one
is a class and a ``manager.add(...)`` (docs/architecture.md shows one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from kubeindex.client.api import ApiClient
from kubeindex.model.resources import Resource
from kubeindex.runtime.logfields import key_fields
from kubeindex.watch.reflector import Reflector
from kubeindex.watch.sources import Sources

from .leader import LeaderElector
from .ratelimit import TokenBucket
from .workqueue import WorkQueue
from .writer import Deposed, Writer

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (plural, "namespace/name" or name)


@dataclass
class ReconcilerSettings:
    debounce: float = 1.0  # seconds between two writes of one object
    pod_debounce: float = 5.0  # the same, for a summary whose pods alone changed
    writes_per_second: float = 50.0
    burst: int = 100
    concurrency: int = 8  # workers per controller
    interval: float = 0.2  # seconds between passes over the aggregates
    summarizer_interval: float = 1.0  # seconds between evaluations of the summarizers' status
    # Seconds a new leader waits for its relists before writing from the view it has: one stalled
    # relist (a WatchList whose initial-events-end bookmark is slow after an API server restart)
    # must not hold every write back; the late ones go on and their changes follow as they come.
    relist_timeout: float = 5.0


@dataclass(frozen=True)
class Result:
    """What a reconcile asks of its queue: ``requeue``, the key again with backoff (a write
    failed); ``requeue_after``, the key again after that many seconds (a timer due)."""

    requeue: bool = False
    requeue_after: float | None = None


DONE, RETRY = Result(), Result(requeue=True)


class Controller:
    """A controller: its keys' queue, what to queue on each pass, and what to do with a key."""

    name: ClassVar[str]  # its queue's, in the metrics
    resources: ClassVar[tuple[Resource, ...]]  # what its keys (plural, store key) name

    def __init__(self, debounce: float = 0.0) -> None:
        self.queue: WorkQueue[Key] = WorkQueue(debounce, name=self.name)
        self.watches: list[Reflector] = []  # its watches of the service's own objects
        self._resync = True  # queue every key on the next pass

    def resync(self) -> None:
        """Queue every key on the next pass: this replica has just started to lead."""
        self._resync = True

    def reset(self) -> None:
        """Leadership changed: nothing queued by a follower, or by a former leader, is done."""
        self.queue.clear()

    def queue_changes(self) -> None:
        """One pass (the leader's, every ``interval``): queue the keys of what changed."""

    def synced(self) -> str:
        """What the log says of it once the manager's watches have synced ("": nothing)."""
        return ""

    async def reconcile(self, key: Key) -> Result:
        raise NotImplementedError


C = TypeVar("C", bound=Controller)


class Manager:
    def __init__(self, api: ApiClient, sources: Sources, elector: LeaderElector | None,
                 settings: ReconcilerSettings | None = None) -> None:
        self.api = api
        self.sources = sources
        self.elector = elector
        self.settings = settings or ReconcilerSettings()
        self.writer = Writer(api, TokenBucket(self.settings.writes_per_second, self.settings.burst),
                             lambda: self.leading)
        self.controllers: list[Controller] = []
        self.watches: list[Reflector] = []
        self.ready = asyncio.Event()
        self._fresh = elector is None  # a new leader writes only from a view relisted since it won
        self._relisting: asyncio.Task | None = None
        if elector is not None:
            elector.on_change(self._leadership)

    def add(self, controller: C) -> C:
        for reflector in controller.watches:
            self.sources.add_watch(reflector)  # run, counted and relisted with every other watch
        self.watches += controller.watches
        self.controllers.append(controller)
        return controller

    # -- leadership ------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.elector is None or (self.elector.is_leader and self._fresh)

    def not_ready(self) -> list[str]:
        """Why this replica's view is not current enough to write ([] when it is)."""
        reasons = self.sources.sync_problems()
        reasons += [f"{r.name}: initial sync in progress" for r in self.watches if not r.synced.is_set()]
        return reasons

    def _leadership(self, leader: bool) -> None:
        if self._relisting is not None:
            self._relisting.cancel()
        self._fresh = False
        for controller in self.controllers:
            controller.reset()
        if leader:
            self._relisting = asyncio.get_running_loop().create_task(self._relist_before_leading())

    async def _relist_before_leading(self) -> None:
        """Before a new leader's first write: relist every watch, for at most ``relist_timeout``.
        A replica may win the lease while a watch connection is silently dead (a load balancer
        that drops flows without a reset goes unnoticed until the read timeout); a fresh LIST
        makes its view current. Past the bound the leader writes from the view it has, as any
        client-go controller does, and names the watches still relisting."""
        started = time.monotonic()
        retired = self.api.renew_pool()  # the pooled connections may be as dead as the watches
        relisting = {asyncio.ensure_future(r.relist()): r.name for r in self.sources.watches()}
        try:
            _, late = await asyncio.wait(relisting, timeout=self.settings.relist_timeout) if relisting else ((), ())
        finally:
            for task in relisting:
                task.cancel()  # only the waits: the relists themselves go on in their reflectors
            if retired is not None:
                await retired.close()  # a late relist still on it breaks and starts again on the new pool
        self._fresh = True
        for controller in self.controllers:
            controller.resync()
        if late:
            log.warning("leading: writing after %.2fs; still relisting: %s", time.monotonic() - started,
                        ", ".join(sorted(relisting[t] for t in late)))
        else:
            log.info("leading: every watch relisted in %.2fs; writing", time.monotonic() - started)

    # -- loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """The watches are run by the sources; this waits for their sync, then writes."""
        tasks: list[asyncio.Task] = []
        try:
            await self.sources.ready.wait()
            for reflector in self.watches:
                await reflector.synced.wait()
            self.ready.set()
            log.info("reconciler synced: %s", "; ".join(filter(None, (c.synced() for c in self.controllers))))
            tasks += [asyncio.create_task(self._worker(c)) for c in self.controllers
                      for _ in range(self.settings.concurrency)]
            in_contact = 0
            while True:
                in_contact, was = sum(r.contact.connected for r in self.sources.watches()), in_contact
                if self.leading:
                    if in_contact > was:  # the API server answers again: retry what failed meanwhile
                        for controller in self.controllers:
                            controller.queue.retry_now()
                    self.queue_changes()
                await asyncio.sleep(self.settings.interval)
        finally:
            for t in tasks:
                t.cancel()

    def queue_changes(self) -> None:
        """One pass of every controller; a bug in one must not stop the loop for good: logged."""
        for controller in self.controllers:
            try:
                controller.queue_changes()
            except Exception:
                log.exception("reconcile pass of %s failed", controller.name)

    async def _worker(self, controller: Controller) -> None:
        queue = controller.queue
        while True:
            key = await queue.get()
            try:
                result = await controller.reconcile(key) if self.leading else DONE
                if result.requeue:
                    if self.leading:
                        queue.retry(key)
                else:
                    queue.forget(key)
                    if result.requeue_after is not None:
                        queue.add_after(key, result.requeue_after)
            except Deposed:
                pass
            except Exception as err:
                kind = next((r.kind for r in controller.resources if r.plural == key[0]), key[0])
                log.exception("sync of %s %s failed", kind, key[1],
                              extra=key_fields(key[0], key[1], err))
                if self.leading:
                    queue.retry(key)
            finally:
                queue.done(key)

