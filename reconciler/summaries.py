"""The summary controller: keeps NodeSummary / WorkloadSummary objects equal to the index.

Desired objects come from the aggregates (desired.py); actual ones from a watch on our own
outputs (label ux.sean.example.com/managed-by), run by the manager with every other watch.

- Its pass (the leader's, every ``interval``) queues the keys of the node groups and workloads
  that changed (its cursor on the index says which), each when it is due (``SummaryPacing``); the
  watch of our objects queues the key of every object that changed (but not the echo of our own
  write: the resourceVersion our write's answer gave); leadership gained queues all.
- ``reconcile`` decides then, from the current desired and actual state, what to do: nothing, a
  server-side apply (metadata+spec, status through the status subresource) or a delete (with a
  UID precondition). The desired object is made then too: a workload whose pods change in every
  pass is made once per write (one per debounce), not once per pass.
- "Differs" means differs on the fields this manager owns (read from managedFields): another
  manager's labels or annotations are never a reason to write, and a field of ours that someone
  else changed is taken back.
"""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import msgspec

from kubeindex.client.api import ApiClient
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import API_VERSION, group_of, key_of, long_type, split_key
from kubeindex.model.resources import BY_PLURAL, NODE_SUMMARIES, SUMMARIES, WORKLOAD_SUMMARIES
from kubeindex.model.revision import Stamped
from kubeindex.watch.reflector import Handler, Reflector
from kubeindex.watch.sources import Sources

from . import fields
from .desired import (
    MANAGED_BY,
    MANAGER,
    Cache,
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
from .disruptions import SummaryRef
from .manager import DONE, RETRY, Controller, Key, ReconcilerSettings, Result
from .names import Claim, NameAllocator
from .workqueue import AT_ONCE, Pacing
from .writer import NOT_FOUND, Done, Failed, Outcome, Writer

log = logging.getLogger(__name__)

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


def _version(outcome: Outcome | None) -> str | None:
    """The resourceVersion a write's answer gives (None: not done, no answer, or not an object)."""
    try:
        return _WRITTEN.decode(outcome.answer).metadata.resourceVersion or None \
            if isinstance(outcome, Done) and outcome.answer else None
    except msgspec.DecodeError:
        return None


def claim_of_summary(plural: str, obj: Summary) -> Claim | None:
    """The claim an existing summary object holds, read back from its ownerReference and spec (its
    name may be plain or hashed); desired.claim_of_workload goes the other way, from a workload."""
    if plural == NODE_SUMMARIES.plural:
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


class SummaryPacing:
    """When a changed summary falls due, as the queue's ``Pacing``:

    - A WorkloadSummary waits the debounce from its first change, so a burst of pod changes (a
      rollout, a gang starting, a Job finishing) is one write, not a first write and the rest.
    - A NodeSummary whose nodes changed (``news``: a node going NotReady) goes out at once, the
      debounce after its last write; a WorkloadSummary whose nodes did, the debounce after its
      last write too.
    - Either, its pods alone changed, waits ``pod_debounce`` after its last write: under churn the
      pod counts change all the time, and they need not cost a write a second. Such writes go out
      on the debounce's beat (whole seconds, by default), many objects in one burst: a trickle of
      writes cost the service a wake-up (the timer, the answer, the echo) each.
    """

    def __init__(self, debounce: float, pod_debounce: float) -> None:
        pods = Pacing(debounce=max(pod_debounce, debounce), beat=debounce)
        self._node = {True: AT_ONCE, False: pods}
        self._workload = {True: Pacing(delay=debounce), False: Pacing(debounce, pods.debounce, pods.beat)}

    def __call__(self, plural: str, news: bool) -> Pacing:
        return (self._workload if plural == WORKLOAD_SUMMARIES.plural else self._node)[news]


class SummaryController(Controller):
    name = "summaries"
    resources = SUMMARIES

    def __init__(self, api: ApiClient, index: ClusterIndex, sources: Sources, writer: Writer,
                 settings: ReconcilerSettings | None = None) -> None:
        self.settings = settings or ReconcilerSettings()
        super().__init__(self.settings.debounce)
        self.index = index
        self.sources = sources
        self.writer = writer
        self.pacing = SummaryPacing(self.settings.debounce, self.settings.pod_debounce)
        self.actual: dict[str, dict[str, Summary]] = {r.plural: {} for r in SUMMARIES}
        self.held: dict[str, dict[Claim, set[str]]] = {r.plural: {} for r in SUMMARIES}  # claim -> names of objects
        self.desired: dict[Key, Desired] = {}
        self._redo: dict[Key, Made] = {}  # desired objects to make again when their key is taken
        self._writing: dict[Key, list[str]] = {}  # keys being applied: resourceVersions seen meanwhile
        self._synced: dict[Key, tuple[str, Desired]] = {}  # the version each key's last sync left, and what it held
        self.naming = Naming(NameAllocator(), NameAllocator(), self.held[NODE_SUMMARIES.plural],
                             self.held[WORKLOAD_SUMMARIES.plural])
        self._desired_cache: Cache = Stamped()
        self.infos: dict[tuple[str, str], TypeInfo] = {}  # the kinds whose summaries can be written
        self._uids: dict[str, str] = {}  # the NodeSummarizers' UIDs the layout was made with
        self._layout: Layout | None = None  # names and types of every object, from the last full pass
        self._changes = index.cursor()  # what the index changed since the last pass
        self.watches = [
            Reflector(api, f"own-{r.plural}", r.path(), Summary,
                      Handler(partial(self._seen, r.plural), partial(self._gone, r.plural)),
                      settings=sources.settings, label_selector=f"{MANAGED_BY}={MANAGER}")
            for r in SUMMARIES
        ]

    def synced(self) -> str:
        return (f"{len(self.actual[NODE_SUMMARIES.plural])} NodeSummaries, "
                f"{len(self.actual[WORKLOAD_SUMMARIES.plural])} WorkloadSummaries exist")

    def reset(self) -> None:
        super().reset()
        self._synced.clear()

    def summary_of(self, uid: str) -> SummaryRef | None:
        """The WorkloadSummary of a workload (its UID), as it exists now; None: not written (yet)."""
        how = self._layout.workloads.get(uid) if self._layout is not None else None
        workload = self.index.workloads.get(uid)
        if how is None or workload is None:
            return None
        obj = self.actual[WORKLOAD_SUMMARIES.plural].get(key_of(workload.namespace, how[0]))
        return SummaryRef(workload.namespace, how[0], obj.metadata.uid) if obj is not None else None

    def usable(self) -> dict[tuple[str, str], TypeInfo]:
        """The kinds whose summaries can be written, as of the last pass."""
        return self.infos

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
        groups and workloads (its cursor says which); a full pass, O(all), after those."""
        uids = {name: s.metadata.uid for name, s in self.sources.summarizers.node.items()}
        infos = self.type_infos()
        if infos != self.infos:
            self.infos = infos
            self._resync = True  # kept summaries of a kind that was not usable may now be stale
        changes = self._changes.take()
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

    def _full_pass(self, uids: dict[str, str], infos: dict[tuple[str, str], TypeInfo]) -> None:
        plan = layout(self.index, uids, infos, self.naming)
        desired = {(d.plural, d.key): d for d in desired_all(self.index, plan, self._desired_cache)}
        self._uids, self._layout = uids, plan
        self._redo.clear()  # every object was made just now
        previous, self.desired = self.desired, desired
        if self._resync:
            self._resync = False
            for key in [*desired, *((p, k) for p in self.actual for k in self.actual[p])]:
                self.queue.add(key)
            return
        for key, d in desired.items():
            if previous.get(key) is not d:
                self._changed(key)
        for key in previous.keys() - desired.keys():
            self._changed(key)

    def _changed(self, key: Key, news: bool = True) -> None:
        self.queue.add(key, self.pacing(key[0], news))

    # -- at take time ------------------------------------------------------------------------------

    async def reconcile(self, key: Key) -> Result:
        plural, name = key
        desired = self._desired_now(key)
        actual = self.actual[plural].get(name)
        if desired is None:
            if actual is None or self._unknown(actual):
                return DONE
            return RETRY if isinstance(await self._delete(key, actual), Failed) else DONE
        if actual is not None and actual.spec.get("selector") not in (None, desired.body["spec"].get("selector")):
            if isinstance(await self._delete(key, actual), Failed):  # an immutable field differs: recreate
                return RETRY
            actual = None
        main_same, status_same = self._compare(key, desired, actual)
        version: str | None = actual.metadata.resourceVersion if actual is not None else ""
        if not main_same:
            self.queue.wrote(key)
            outcome = await self._apply(key, desired.body)
            if not isinstance(outcome, Done):
                return RETRY if isinstance(outcome, Failed) else DONE
            version = _version(outcome)
        if not status_same:
            self.queue.wrote(key)
            status = {"apiVersion": API_VERSION, "kind": desired.body["kind"],
                      "metadata": {"name": desired.name, **({"namespace": desired.namespace} if desired.namespace
                                                            else {})}, "status": desired.status}
            outcome = await self._apply(key, status, status=True)
            if outcome == NOT_FOUND:  # deleted after our view of it: create it again, at once
                outcome = await self._apply(key, desired.body)
                if isinstance(outcome, Done):
                    outcome = await self._apply(key, status, status=True)
            if isinstance(outcome, Failed):
                return RETRY
            version = _version(outcome)
        if version:
            self._synced[key] = (version, desired)
        return DONE

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
        return gk in self.index.workload_types and gk not in self.infos

    # -- writes ----------------------------------------------------------------------------------

    async def _apply(self, key: Key, body: dict[str, Any], status: bool = False) -> Outcome:
        """An apply. An event on our watch while it is under way waits for the answer: the write's
        echo (at the version it made) queues nothing, any other change queues the key."""
        namespace, name = split_key(key[1])
        path = BY_PLURAL[key[0]].path(namespace, name)
        seen = self._writing[key] = []
        outcome: Outcome | None = None
        try:
            outcome = await (self.writer.apply_status(path, body) if status else self.writer.apply(path, body))
        finally:
            del self._writing[key]
            version = _version(outcome)
            if any(v != version for v in seen):
                self.queue.add(key)
        return outcome

    async def _delete(self, key: Key, obj: Summary) -> Outcome:
        return await self.writer.delete(BY_PLURAL[key[0]].path(obj.metadata.namespace, obj.metadata.name),
                                       obj.metadata.uid)
