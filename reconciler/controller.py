"""Keeps NodeSummary / WorkloadSummary objects and the summarizers' status equal to the index.

Desired objects come from the aggregates (desired.py); actual ones from a watch on our own
outputs (label ux.sean.example.com/managed-by), run by the Sources with every other watch. The
summarizers' status is computed in summarizers.py. The write path is a keyed work queue
(workqueue.py), client-go style:

- producers only add keys: a pass every ``interval`` adds the keys of the node groups and
  workloads that changed (when each is due: ``_changed``), the watch of our objects adds the key
  of every object that changed (but not the echo of our own write: the resourceVersion our
  write's answer gave), a leadership gain adds all;
- a worker takes a key and decides then, from the current desired and actual state, what to do:
  nothing, a server-side apply (metadata+spec, status through the status subresource) or a delete
  (with a UID precondition). The desired object is made then too: a workload whose pods change in
  every pass is made once per write (one per ``debounce``), not once per pass;
- "differs" means differs on the fields this manager owns (read from managedFields): another
  manager's labels or annotations are never a reason to write, and a field of ours that someone
  else changed is taken back;
- before every request the worker checks that it still leads; losing the lease drops the queue.

The ClusterResourceClaims and the ClusterQueues they name go the same way: their keys are queued
by each pass, and a worker hands them to claims.py, which decides at take time and writes through
``_request``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn

import msgspec

from kubeindex.api import ApiClient, ApiError, Conflict, Forbidden, NotFound, Transient
from kubeindex.fleet import Fleet
from kubeindex.index import ClusterIndex
from kubeindex.logfields import key_fields, path_fields
from kubeindex.objects import API_VERSION, group_of, key_of, long_type, split_key
from kubeindex.reflector import Handler, Reflector
from kubeindex.sources import Sources

from . import fields
from .claims import CLAIMS, QUEUES, Claims, ClaimSettings
from .desired import (
    MANAGED_BY,
    MANAGER,
    Desired,
    Layout,
    Made,
    Naming,
    TypeInfo,
    desired_all,
    desired_one,
    label_claim,
    layout,
    made_from,
    node_claim,
    short_type,
    workload_claim,
)
from .events import EVENT_VERBS, EventRecorder
from .leader import LeaderElector, identity
from .names import Claim, NameAllocator
from .ratelimit import TokenBucket
from .summarizers import SummarizerStatuses
from .workqueue import WorkQueue

log = logging.getLogger(__name__)
APPLY = "application/apply-patch+yaml"  # JSON is YAML
WRITE_TIMEOUT = 10.0  # seconds: a write on a silently dead connection must not hold a worker long
SUMMARIES = ("nodesummaries", "workloadsummaries")
SUMMARIZERS = ("nodesummarizers", "workloadsummarizers")
KIND_OF = {"nodesummaries": "NodeSummary", "workloadsummaries": "WorkloadSummary",
           "nodesummarizers": "NodeSummarizer", "workloadsummarizers": "WorkloadSummarizer",
           CLAIMS: "ClusterResourceClaim", QUEUES: "ClusterQueue"}
Key = tuple[str, str]  # (plural, "namespace/name" or name)


class SummaryMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    annotations: dict[str, str] = msgspec.field(default_factory=dict)
    ownerReferences: list[dict[str, Any]] = msgspec.field(default_factory=list)
    managedFields: list[dict[str, Any]] = msgspec.field(default_factory=list)


class Version(msgspec.Struct):
    resourceVersion: str = ""


class Written(msgspec.Struct):
    """What the reconciler reads of a write's answer: the object's resourceVersion after it."""

    metadata: Version = msgspec.field(default_factory=Version)


class Summary(msgspec.Struct):
    """One of our output objects as the API server has it."""

    metadata: SummaryMeta = msgspec.field(default_factory=SummaryMeta)
    spec: dict[str, Any] = msgspec.field(default_factory=dict)
    status: dict[str, Any] = msgspec.field(default_factory=dict)

    def ours(self) -> dict[str, Any]:
        """The part of the object this service's applies own."""
        whole = {"metadata": {"labels": self.metadata.labels, "annotations": self.metadata.annotations,
                              "ownerReferences": self.metadata.ownerReferences},
                 "spec": self.spec, "status": self.status}
        return fields.project(whole, fields.owned(self.metadata.managedFields, MANAGER))


_WRITTEN = msgspec.json.Decoder(Written)


def _version(answer: bytes | None) -> str | None:
    """The resourceVersion a write's answer gives (None: no answer, or not an object)."""
    try:
        return _WRITTEN.decode(answer).metadata.resourceVersion or None if answer else None
    except msgspec.DecodeError:
        return None


@dataclass
class ReconcilerSettings:
    debounce: float = 1.0  # seconds between two writes of one object
    pod_debounce: float = 5.0  # the same, for a summary whose pods alone changed
    writes_per_second: float = 50.0
    burst: int = 100
    concurrency: int = 8
    interval: float = 0.2  # seconds between passes over the aggregates
    summarizer_interval: float = 1.0  # seconds between evaluations of the summarizers' status
    # Seconds a new leader waits for its relists before writing from the view it has: one stalled
    # relist (a WatchList whose initial-events-end bookmark is slow after an API server restart)
    # must not hold every write back; the late ones go on and their changes follow as they come.
    relist_timeout: float = 5.0


@dataclass
class WriteStats:
    writes: dict[str, int] = field(default_factory=dict)  # "apply" / "apply_status" / "delete" -> count
    errors: dict[str, int] = field(default_factory=dict)  # http status (or transport error) -> count

    def count(self, table: dict[str, int], key: str) -> None:
        table[key] = table.get(key, 0) + 1


class Retry(Exception):
    """The write failed in a way worth retrying with backoff."""


class Deposed(Exception):
    """Leadership was lost: this replica writes nothing more."""


class Missing(Exception):
    """A status write found no object: it was deleted since our view of it."""


def _path(plural: str, namespace: str = "", name: str = "") -> str:
    base = f"/apis/{API_VERSION}"
    if namespace:
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


def claim_of_summary(plural: str, obj: Summary) -> Claim | None:
    """The claim an existing summary object holds, read back from its ownerReference and spec (its
    name may be plain or hashed); desired.claim_of_workload goes the other way, from a workload."""
    if plural == "nodesummaries":
        owner = next((r.get("name") for r in obj.metadata.ownerReferences if r.get("kind") == "NodeSummarizer"), None)
        labels = (obj.spec.get("selector") or {}).get("matchLabels") or {}
        return node_claim(owner, next(iter(labels.values()))) if owner and len(labels) == 1 else None
    ref = obj.spec.get("workloadRef") or {}
    if ref.get("labelKey") and ref.get("labelValue"):
        return label_claim(obj.metadata.namespace, ref["labelKey"], ref["labelValue"])
    if not ref.get("kind") or not ref.get("name"):
        return None
    group = group_of(str(ref.get("apiVersion", "")))
    return workload_claim(obj.metadata.namespace, group, ref["kind"], ref["name"])


class Reconciler:
    def __init__(self, api: ApiClient, index: ClusterIndex, sources: Sources, elector: LeaderElector | None,
                 settings: ReconcilerSettings | None = None, claims: ClaimSettings | None = None,
                 fleet: Fleet | None = None) -> None:
        self.api = api
        self.index = index
        self.sources = sources
        self.elector = elector
        self.settings = settings or ReconcilerSettings()
        self.stats = WriteStats()
        instance = elector.settings.identity if elector is not None else identity()
        self.claims = Claims(index.kueue, claims, fleet=fleet, recorder=EventRecorder(MANAGER, instance),
                             kueue_problem=sources.kueue_problem)
        self.actual: dict[str, dict[str, Summary]] = {p: {} for p in SUMMARIES}
        self.held: dict[str, dict[Claim, set[str]]] = {p: {} for p in SUMMARIES}  # claim -> names of objects
        self.desired: dict[Key, Desired] = {}
        self._redo: dict[Key, Made] = {}  # desired objects to make again when their key is taken
        self._writing: dict[Key, list[str]] = {}  # keys being applied: resourceVersions seen meanwhile
        self._synced: dict[Key, tuple[str, Desired]] = {}  # the version each key's last sync left, and what it held
        self.queue: WorkQueue[Key] = WorkQueue(self.settings.debounce)
        self.naming = Naming(NameAllocator(), NameAllocator(), self.held["nodesummaries"],
                             self.held["workloadsummaries"])
        self._desired_cache: dict = {}
        self._infos: dict[tuple[str, str], TypeInfo] = {}  # the kinds whose summaries can be written
        self.summarizer_statuses = SummarizerStatuses(index, sources.summarizers, sources.kind_problem)
        self._bucket = TokenBucket(self.settings.writes_per_second, self.settings.burst)
        self._resync = True  # add every key on the next pass (start, leadership gained)
        self._fresh = elector is None  # a new leader writes only from a view relisted since it won
        self._relisting: asyncio.Task | None = None
        self._next_summarizers = 0.0
        self._uids: dict[str, str] = {}  # the NodeSummarizers' UIDs the layout was made with
        self._layout: Layout | None = None  # names and types of every object, from the last full pass
        self.reflectors = [
            Reflector(api, f"own-{plural}", _path(plural), Summary,
                      Handler(partial(self._seen, plural), partial(self._gone, plural)),
                      settings=sources.settings, label_selector=f"{MANAGED_BY}={MANAGER}")
            for plural in SUMMARIES
        ]
        for reflector in self.reflectors:
            sources.add_watch(reflector)  # run, counted and relisted with every other watch
        self.ready = asyncio.Event()
        if elector is not None:
            elector.on_change(self._leadership)

    # -- our objects as they are ------------------------------------------------------------------

    def _seen(self, plural: str, obj: Summary) -> None:
        key = key_of(obj.metadata.namespace, obj.metadata.name)
        old = self.actual[plural].get(key)
        if old is not None:
            self._unhold(plural, old, key)
        self.actual[plural][key] = obj
        claim = claim_of_summary(plural, obj)
        if claim is not None:
            self.held[plural].setdefault(claim, set()).add(obj.metadata.name)
        version = obj.metadata.resourceVersion
        if (writing := self._writing.get((plural, key))) is not None:
            writing.append(version)  # the write's answer may come after its echo: it decides then
            return
        if (last := self._synced.get((plural, key))) is not None and last[0] == version:
            return  # our own write coming back (or the object as our last sync found it): decided on
        self.queue.add((plural, key))

    def _gone(self, plural: str, key: str) -> None:
        self._synced.pop((plural, key), None)
        old = self.actual[plural].pop(key, None)
        if old is not None:
            self._unhold(plural, old, key)
        self.queue.add((plural, key))

    def _unhold(self, plural: str, obj: Summary, key: str) -> None:
        claim = claim_of_summary(plural, obj)
        if claim is None:
            return
        names = self.held[plural].get(claim)
        if names is not None:
            names.discard(obj.metadata.name)
            if not names:
                del self.held[plural][claim]

    # -- leadership ------------------------------------------------------------------------------

    @property
    def leading(self) -> bool:
        return self.elector is None or (self.elector.is_leader and self._fresh)

    def not_ready(self) -> list[str]:
        """Why this replica's view is not current enough to write ([] when it is)."""
        reasons = self.sources.sync_problems()
        reasons += [f"{r.name}: initial sync in progress" for r in self.reflectors if not r.synced.is_set()]
        return reasons

    def _leadership(self, leader: bool) -> None:
        if self._relisting is not None:
            self._relisting.cancel()
        self._fresh = False
        self.queue.clear()  # nothing queued by a follower, or by a former leader, is done
        self._synced.clear()
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
        self._fresh, self._resync = True, True
        if late:
            log.warning("leading: writing after %.2fs; still relisting: %s", time.monotonic() - started,
                        ", ".join(sorted(relisting[t] for t in late)))
        else:
            log.info("leading: every watch relisted in %.2fs; writing", time.monotonic() - started)

    # -- loop -----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Our watches are run by the sources; this waits for their sync, then writes."""
        tasks: list[asyncio.Task] = []
        try:
            await self.sources.ready.wait()
            for r in self.reflectors:
                await r.synced.wait()
            self.ready.set()
            log.info("reconciler synced: %d NodeSummaries, %d WorkloadSummaries exist",
                     len(self.actual["nodesummaries"]), len(self.actual["workloadsummaries"]))
            tasks += [asyncio.create_task(self._worker()) for _ in range(self.settings.concurrency)]
            while True:
                if self.leading:
                    try:
                        self.queue_changes()
                    except Exception:  # a bug must not stop the loop for good: log it, go on
                        log.exception("reconcile pass failed")
                await asyncio.sleep(self.settings.interval)
        finally:
            for t in tasks:
                t.cancel()

    def type_infos(self) -> dict[tuple[str, str], TypeInfo]:
        """How each configured kind is written; kinds that cannot be (not served at the configured
        version, forbidden, cluster-scoped) are left out: the summarizer's status says why."""
        infos = {}
        for gk, t in self.index.workload_types.items():
            resource = self.sources.owner_resources.get(gk)
            if resource is None or self.sources.kind_problem(t.group, t.kind, t.version) is not None:
                continue
            version = t.version or resource.version
            infos[gk] = TypeInfo(resource.api_version, short_type(t.group, t.kind, t.short_type),
                                 long_type(t.group, t.kind, version))
        return infos

    def queue_changes(self) -> None:
        """One pass: recompute the desired objects of what changed and queue the keys whose desired
        object is new, changed or gone. O(touched aggregates) between changes to the sets of node
        groups and workloads (the index says which); a full pass, O(all), after those."""
        uids = {name: s.metadata.uid for name, s in self.sources.summarizers.node.items()}
        infos = self.type_infos()
        if infos != self._infos:
            self._infos = infos
            self._resync = True  # kept summaries of a kind that was not usable may now be stale
        for key in self.claims.changed_keys(everything=self._resync):
            self.queue.add(key)
        changes = self.index.take_changes()
        try:
            if changes.structure or self._resync or uids != self._uids or self._layout is None:
                self._full_pass(uids, infos)
            else:  # made when taken: a key touched in every pass is made once per write, not per pass
                for key, made in made_from(self.index, self._layout, changes.node_groups,
                                           changes.workloads).items():
                    self._redo[key] = made
                    news = changes.workload_news if isinstance(made, str) else changes.node_news
                    self._changed(key, news=made in news)
        except Exception:
            self._layout = None  # what was taken is lost with this pass: the next one redoes everything
            raise
        self._summarizers_due()

    def _full_pass(self, uids: dict[str, str], infos: dict[tuple[str, str], TypeInfo]) -> None:
        plan = layout(self.index, uids, infos, self.naming)
        desired = {(d.plural, d.key): d for d in desired_all(self.index, plan, self._desired_cache)}
        self._uids, self._layout = uids, plan
        self._redo.clear()  # every object was made just now
        previous, self.desired = self.desired, desired
        if self._resync:
            self._resync = False
            for key in [*desired, *((p, k) for p in SUMMARIES for k in self.actual[p])]:
                self.queue.add(key)
            return
        for key, d in desired.items():
            if previous.get(key) is not d:
                self._changed(key)
        for key in previous.keys() - desired.keys():
            self._changed(key)

    def _changed(self, key: Key, news: bool = True) -> None:
        """Queue a summary the index changed.

        - A WorkloadSummary waits the debounce from its first change, so a burst of pod changes (a
          rollout, a gang starting, a Job finishing) is one write, not a first write and the rest.
        - A NodeSummary whose nodes changed (``news``: a node going NotReady) goes out at once,
          the debounce after its last write; a WorkloadSummary whose nodes did, the debounce
          after its last write too.
        - Either, its pods alone changed, waits ``pod_debounce`` after its last write: under churn
          the pod counts change all the time, and they need not cost a write a second. Such writes
          go out on the debounce's beat (whole seconds, by default), many objects in one burst:
          a trickle of writes cost the service a wake-up (the timer, the answer, the echo) each.
        """
        if news:
            debounce, beat = None, 0.0
        else:  # on the debounce's beat: the pod changes of many objects go out in one burst
            debounce, beat = max(self.settings.pod_debounce, self.settings.debounce), self.settings.debounce
        if key[0] == "workloadsummaries":
            self.queue.add(key, delay=self.settings.debounce, debounce=debounce, beat=beat)
        else:
            self.queue.add(key, debounce=debounce, beat=beat)

    def _summarizers_due(self) -> None:
        now = time.monotonic()
        if now >= self._next_summarizers:
            self._next_summarizers = now + self.settings.summarizer_interval
            for plural, name in self.summarizer_statuses.stale(self._infos):
                self.queue.add((plural, name))

    # -- workers --------------------------------------------------------------------------------

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                if self.leading:
                    await self._sync(key)
                    self.queue.forget(key)
            except (Deposed, Missing):
                pass
            except Retry:
                if self.leading:
                    self.queue.retry(key)
            except Exception as err:
                log.exception("sync of %s %s failed", KIND_OF[key[0]], key[1], extra=key_fields(key[0], key[1], err))
                if self.leading:
                    self.queue.retry(key)
            finally:
                self.queue.done(key)

    async def _sync_summarizer(self, plural: str, name: str) -> None:
        status = self.summarizer_statuses.status_to_write(plural, name, self._infos)
        if status is None:
            return
        self.queue.wrote((plural, name))
        await self._request("apply_status", "PATCH", _path(plural, name=name) + "/status",
                            self._status_body(KIND_OF[plural], "", name, status),
                            {"fieldManager": MANAGER, "force": "true"})

    async def _sync(self, key: Key) -> None:
        plural, name = key
        if plural in SUMMARIZERS:
            await self._sync_summarizer(plural, name)
            return
        if plural in (CLAIMS, QUEUES):
            again = await self.claims.sync(key, self._request)
            if again is not None:
                self.queue.add_after(key, again)
            return
        desired = self._desired_now(key)
        actual = self.actual[plural].get(name)
        if desired is None:
            if actual is not None and not self._unknown(actual):
                await self._delete(key, actual)
            return
        if actual is not None and actual.spec.get("selector") not in (None, desired.body["spec"].get("selector")):
            await self._delete(key, actual)  # an immutable field differs: recreate
            actual = None
        main_same, status_same = self._compare(key, desired, actual)
        version: str | None = actual.metadata.resourceVersion if actual is not None else ""
        if not main_same:
            self.queue.wrote(key)
            if (version := await self._apply(key, desired.body)) is None:
                return
        if not status_same:
            self.queue.wrote(key)
            status = self._status_body(desired.body["kind"], desired.namespace, desired.name, desired.status)
            try:
                version = await self._apply(key, status, status=True)
            except Missing:  # deleted after our view of it: create it again, at once
                version = None
                if await self._apply(key, desired.body) is not None:
                    version = await self._apply(key, status, status=True)
        if version:
            self._synced[key] = (version, desired)

    def _compare(self, key: Key, desired: Desired, actual: Summary | None) -> tuple[bool, bool]:
        """Whether the object's metadata+spec, and its status, are as desired (on our fields). An
        object still at the version our last sync of it left is compared with what that sync
        applied, which is its content on our fields: no projection of its managedFields."""
        if actual is None:
            return False, False
        last = self._synced.get(key)
        if last is not None and last[0] == actual.metadata.resourceVersion:
            return desired.body == last[1].body, desired.status == last[1].status
        ours = actual.ours()
        return self._main_equal(desired, ours), fields.same(desired.status, ours.get("status", {}))

    def _desired_now(self, key: Key) -> Desired | None:
        """The key's desired object, made now if a pass saw its aggregate change."""
        made = self._redo.pop(key, None)
        if made is not None and self._layout is not None:
            desired = desired_one(self.index, self._layout, self._desired_cache, made)
            if desired is not None:  # None: its aggregate went, and the full pass that follows decides
                self.desired[key] = desired
        return self.desired.get(key)

    @staticmethod
    def _main_equal(desired: Desired, ours: dict[str, Any]) -> bool:
        meta = desired.body["metadata"]
        want = {"metadata": {k: meta[k] for k in ("labels", "annotations", "ownerReferences") if meta.get(k)},
                "spec": desired.body["spec"]}
        have = {"metadata": ours.get("metadata", {}), "spec": ours.get("spec", {})}
        return fields.same(want, have)

    def _unknown(self, obj: Summary) -> bool:
        """A WorkloadSummary of a configured kind that cannot be read now (not yet discovered,
        forbidden): kept rather than deleted on what may be a transient failure."""
        ref = obj.spec.get("workloadRef") or {}
        gk = (group_of(str(ref.get("apiVersion", ""))), str(ref.get("kind", "")))
        return gk in self.index.workload_types and gk not in self._infos

    @staticmethod
    def _status_body(kind: str, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": kind,
                "metadata": {"name": name, **({"namespace": namespace} if namespace else {})}, "status": status}

    # -- requests -------------------------------------------------------------------------------

    async def _request(self, verb: str, method: str, path: str, body: Any, params: dict[str, str] | None = None,
                       content_type: str = APPLY) -> bool:
        """True when done; False when there is nothing to do (already deleted, namespace being
        deleted). Raises Retry on any other failure (the queue retries with backoff) and Deposed
        when this replica no longer leads."""
        return await self._write(verb, method, path, body, params, content_type) is not None

    async def _write(self, verb: str, method: str, path: str, body: Any, params: dict[str, str] | None = None,
                     content_type: str = APPLY) -> bytes | None:
        """``_request``, with the answer's body when done (None: nothing to do)."""
        await self._bucket.take()
        if not self.leading:
            raise Deposed
        try:
            answer = await self.api.request(method, path, body, params=params, content_type=content_type,
                                            timeout=WRITE_TIMEOUT)
        except (NotFound, Conflict) as err:
            if verb == "delete":
                return None  # 404: already gone; 409: the UID precondition failed (replaced since)
            if verb == "create" and isinstance(err, Conflict):
                return None  # 409 AlreadyExists: made meanwhile
            if verb == "patch_event" and isinstance(err, NotFound):
                return None  # the Event expired (--event-ttl): the recorder creates it again
            if verb == "apply_status" and isinstance(err, NotFound):
                raise Missing from None
            self._failed(verb, method, path, err)
        except Forbidden as err:
            if "NamespaceTerminating" in err.causes:
                return None  # the namespace is being deleted: expected while its workloads go away
            self._failed(verb, method, path, err)
        except ApiError as err:
            self._failed(verb, method, path, err)
        self.stats.count(self.stats.writes, verb)
        return answer

    def _failed(self, verb: str, method: str, path: str, err: ApiError) -> NoReturn:
        """Count and log a failed write, and have the queue retry it."""
        self.stats.count(self.stats.errors, str(err.status) if err.status else err.reason)
        if verb in EVENT_VERBS:  # its recorder logs it, a line a minute at most (events.py)
            raise Retry from err
        if not err.status:  # no answer: a line each, as the transport says
            log.warning("%s %s: %s", method, path, err, extra=path_fields(path, err))
        elif not isinstance(err, (Transient, Conflict)):  # those pass on their own: counted only
            log.error("%s %s: %s", method, path, err, extra=path_fields(path, err))
        raise Retry from err

    async def _apply(self, key: Key, body: dict[str, Any], status: bool = False) -> str | None:
        """Apply: the resourceVersion it made ("" when the answer does not say), None when there
        was nothing to do. An event on our watch while it is under way waits for the answer: the
        write's echo (at the version it made) queues nothing, any other change queues the key."""
        namespace, name = split_key(key[1])
        path = _path(key[0], namespace, name) + ("/status" if status else "")
        seen = self._writing[key] = []
        version = None
        try:
            answer = await self._write("apply_status" if status else "apply", "PATCH", path, body,
                                       {"fieldManager": MANAGER, "force": "true"})
            version = _version(answer)
        finally:
            del self._writing[key]
            if any(v != version for v in seen):
                self.queue.add(key)
        return None if answer is None else version or ""

    async def _delete(self, key: Key, obj: Summary) -> None:
        meta = obj.metadata
        await self._request("delete", "DELETE", _path(key[0], meta.namespace, meta.name),
                            {"preconditions": {"uid": meta.uid}, "propagationPolicy": "Background"},
                            content_type="application/json")
