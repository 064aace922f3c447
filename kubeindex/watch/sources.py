"""All the watches of one process, feeding one ClusterIndex.

Nodes, Pods and the two summarizer kinds are watched from the start. Owner kinds are watched
(metadata only) on demand, while they are needed (ownerkinds.py: which, and at which version).
Kinds are mapped to resources by API discovery (discovery.py), which looks a kind up again every
DISCOVERY_RETRY_SECONDS while it is needed and not served.

Optional kinds (Kueue's ResourceFlavors and ClusterQueues, this project's ClusterResourceClaims,
whose CRD is installed separately, Karpenter's NodeClaims, and the in-tree PodGroups, served from
1.37 behind a gate) are watched in full whenever the API server serves them: looked up at start
and, while not served, again (a CRD installed later, an API turned on, is picked up). Not served is no error and no
readiness problem (and not in ``missing_kinds``); forbidden is reported as for owner kinds, never
against readiness. Kueue's kinds (and PodGroups) are read at the version the API server prefers
among those read (KNOWN_VERSIONS); one served only at other versions is in
``unknown_versions`` (a warning once, a metric, a line of /readyz, the claims' Ready). An optional
kind's watch answered 404 (its version no longer served: Kueue upgraded to one that dropped
v1beta1) is stopped, and the kind looked up again at the next retry: watched at the version served
now, its objects listed again.

``missing_kinds`` holds the (group, kind) of every kind needed now (configured, or referenced by
a live object while not watched) that discovery says is not served; only those are looked up
again. A kind no longer configured nor referenced leaves the set.

Pod label keys. The index keeps only each pod's values of the label keys configured when it took
the pod (a whole label set would cost about 1 KB per pod), so a WorkloadSummarizer edit that adds a
key makes the pods' reflector hand every pod to the index again (one LIST).

Health. ``sync_problems`` lists what keeps this replica out of sync with the API server (see
Reflector.problem): the core resources always count; an owner kind counts unless it is forbidden
or not installed (its pods count as missing_owner and it is retried quietly), and, after the
initial sync, not before it has listed once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Iterable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from ..client.api import ApiClient
from ..model.disruption import BLOCKED_REASON, NODE
from ..model.gangs import JOBSET, LWS, source_key
from ..model.index import ClusterIndex
from ..model.objects import (
    KUEUE_GROUP,
    KUEUE_VERSIONS,
    SCHEDULING_GROUP,
    SCHEDULING_VERSIONS,
    ClusterQueue,
    ClusterResourceClaim,
    DisruptionEvent,
    JobSet,
    LeaderWorkerSet,
    Node,
    NodeClaim,
    NodeSummarizer,
    OwnerReference,
    PartialObject,
    Pod,
    PodGroup,
    ResourceFlavor,
    WorkloadSummarizer,
    object_key,
    split_key,
)
from ..model.owners import POD, GroupKind
from ..model.resources import (
    CLAIMS,
    CLUSTER_QUEUES,
    EVENTS,
    NODE_SUMMARIZERS,
    NODECLAIMS,
    NODES,
    POD_GROUPS,
    PODS,
    RESOURCE_FLAVORS,
    SCHEDULING_WORKLOADS,
    WORKLOAD_SUMMARIZERS,
    Resource,
)
from ..runtime import tasks
from ..runtime.logfields import fields
from .discovery import KindDiscovery, Need, describe
from .ownerkinds import OwnerKinds
from .reflector import Handler, Reflector, SourceStats, WatchSettings

log = logging.getLogger(__name__)

CORE = tuple(r.plural for r in (NODES, PODS, NODE_SUMMARIZERS, WORKLOAD_SUMMARIZERS))  # the reflectors' names
# The versions read of the groups whose objects are projected by shape (discovery.py: ``known``).
KNOWN_VERSIONS = {KUEUE_GROUP: KUEUE_VERSIONS, SCHEDULING_GROUP: SCHEDULING_VERSIONS}
# Why a kind of these groups may not be served (else: its CRD is not installed).
NOT_SERVED_HINT = {SCHEDULING_GROUP: "the in-tree Workload API: Kubernetes 1.37+ with the GenericWorkload feature "
                                     "gate and scheduling.k8s.io/v1beta1 on"}
SYNC_GRACE = 60.0  # seconds a watch may be out of contact before it is a sync problem (--sync-loss-grace)
TICK_SECONDS = 10.0  # how often time-based facts are looked at (a NodeClaim's expiry coming within the horizon)
# Karpenter's DisruptionBlocked Events on Nodes: where client-go records a cluster-scoped object's
# Events, and only those (the API server filters: the two fields are among an Event's selectable ones).
KARPENTER_EVENTS_NAMESPACE = "default"
BLOCKED_SELECTOR = f"reason={BLOCKED_REASON},regarding.kind={NODE}"
BLOCKER_SWEEP = 30.0  # seconds between two looks for blockers Karpenter stopped saying
# The kinds whose objects size gangs (gangs.py), read in full while a WorkloadSummarizer's
# spec.gangs.kinds lists them: at the version their projection reads, in watches named
# "<resource>.gangs" (the kind may be watched as an owner too, metadata only).
GANG_SIZES: dict[str, tuple[Need, type]] = {
    JOBSET: (("jobset.x-k8s.io", JOBSET, "v1alpha2"), JobSet),
    LWS: (("leaderworkerset.x-k8s.io", LWS, "v1"), LeaderWorkerSet),
}
GANGS_SUFFIX = ".gangs"


def _permanent_problems(reflectors: Iterable[Reflector], grace: float) -> list[str]:
    return [f"{r.name}: {r.problem(grace)}" for r in reflectors if r.contact.permanent]


@dataclass
class Summarizers:
    """The summarizer objects as last seen (the reconciler needs uid and generation)."""

    node: dict[str, NodeSummarizer] = field(default_factory=dict)
    workload: dict[str, WorkloadSummarizer] = field(default_factory=dict)


class Sources:
    """The one owner of every watch of the process: those feeding the index, and those another
    part reads (``add_watch``), all in ``stats`` (the nws_watch_* metrics), stopped by ``stop``."""

    def __init__(self, api: ApiClient, index: ClusterIndex, settings: WatchSettings | None = None,
                 sync_grace: float = SYNC_GRACE) -> None:
        self.api = api
        self.index = index
        self.settings = settings or WatchSettings()
        self.sync_grace = sync_grace  # seconds without contact before sync_problems reports it
        self.stats: dict[str, SourceStats] = {}
        self.summarizers = Summarizers()
        self.reflectors: dict[str, Reflector] = {}  # the index's
        self._added: dict[str, Reflector] = {}  # other readers' (add_watch)
        self._added_tasks: dict[str, asyncio.Task] = {}
        self._running = False
        self.ready = asyncio.Event()
        self.started_at = 0.0
        self.sync_seconds: float | None = None
        self._tasks: set[asyncio.Task] = set()
        # Optional kinds: need -> (projection, handler); watched whenever served.
        self.karpenter = False  # read Karpenter's blockers (watch_blockers)
        self.optional: dict[Need, tuple[type, Handler]] = {
            (*RESOURCE_FLAVORS.group_kind, None):
                (ResourceFlavor, Handler(index.kueue.upsert_flavor, index.kueue.delete_flavor)),
            (*CLUSTER_QUEUES.group_kind, None):
                (ClusterQueue, Handler(index.kueue.upsert_cluster_queue, index.kueue.delete_cluster_queue)),
            (*CLAIMS.group_kind, CLAIMS.version):
                (ClusterResourceClaim, Handler(index.kueue.upsert_claim, index.kueue.delete_claim)),
            (*POD_GROUPS.group_kind, None): (PodGroup, Handler(self._pod_group_upsert, self._pod_group_delete)),
            (*NODECLAIMS.group_kind, NODECLAIMS.version):
                (NodeClaim, Handler(index.upsert_nodeclaim, index.delete_nodeclaim)),
        }
        self._optional_reflectors: dict[GroupKind, Reflector] = {}
        self._optional_tasks: dict[GroupKind, asyncio.Task] = {}
        self.discovery = KindDiscovery(api, self._spawn, self._found, self.optional, KNOWN_VERSIONS)
        self.owner_kinds = OwnerKinds(index, self.discovery, self._start_metadata_watch, reserved=CORE)
        api.on_silence.append(self.reconnect)

    @property
    def owner_resources(self) -> dict[GroupKind, Resource]:
        """The owner kinds watched, and the resource each is read at."""
        return self.owner_kinds.watched

    # -- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        self.started_at = time.monotonic()
        self._running = True
        for name, reflector in self._added.items():
            self._added_tasks[name] = self._spawn(reflector.run())
        # Nodes are read as each event comes: a NotReady node is what alerts fire on, and nodes change
        # seldom (a kubelet reports an unchanged status every 5 minutes). Every other watch gathers.
        self._add(Reflector(self.api, NODES.plural, NODES.path(), Node,
                            Handler(self.index.upsert_node, self.index.delete_node),
                            settings=replace(self.settings, gather=0.0)))
        self._add(Reflector(self.api, PODS.plural, PODS.path(), Pod,
                            Handler(self._pod_upsert, self._pod_delete), settings=self.settings))
        self._add(Reflector(self.api, NODE_SUMMARIZERS.plural, NODE_SUMMARIZERS.path(), NodeSummarizer,
                            Handler(self._node_summarizer, self._node_summarizer_deleted), settings=self.settings))
        self._add(Reflector(self.api, WORKLOAD_SUMMARIZERS.plural, WORKLOAD_SUMMARIZERS.path(),
                            WorkloadSummarizer, Handler(self._workload_summarizer, self._workload_summarizer_deleted),
                            settings=self.settings))
        if self.karpenter:
            self._add(Reflector(self.api, EVENTS.name, EVENTS.path(KARPENTER_EVENTS_NAMESPACE), DisruptionEvent,
                                Handler(self._blocked, self.index.delete_blocked_event), settings=self.settings,
                                field_selector=BLOCKED_SELECTOR))
            self._spawn(self._expire_blocks())
        for need in self.optional:
            self.discovery.look_up(need)
        self._spawn(self._wait_ready())
        self._spawn(self.discovery.retry_unserved(self._needs))
        self._spawn(self._tick())

    def watch_blockers(self) -> None:
        """Read Karpenter's DisruptionBlocked Events on Nodes (before ``start``): the blockers of its
        disruptions, in the index (kubeindex/model/disruption.py)."""
        self.karpenter = True

    def _blocked(self, event: DisruptionEvent) -> None:
        self.index.upsert_blocked_event(event, time.time())

    async def _expire_blocks(self) -> None:
        while True:
            await asyncio.sleep(BLOCKER_SWEEP)
            self.index.expire_blocks(time.time())

    def add_watch(self, reflector: Reflector) -> None:
        """Run a watch that another part of the process reads (the reconciler's of its own
        summaries) with the others: in the nws_watch_* metrics, in ``watches`` (relisted by a new
        leader) and stopped by ``stop``; added before ``start``, it starts then. Its sync is its
        reader's to wait for (``reflector.synced``): it counts neither in ``ready`` nor in
        ``sync_problems``, which say whether the index is current."""
        if reflector.name in self.stats:
            raise ValueError(f"a watch named {reflector.name} exists already")
        self.stats[reflector.name] = reflector.stats
        self._added[reflector.name] = reflector
        if self._running:
            self._added_tasks[reflector.name] = self._spawn(reflector.run())

    def remove_watch(self, name: str) -> None:
        """Stop an added watch and forget it (its nws_watch_* series go): a member cluster that
        left the fleet, or is reconnected with new credentials."""
        self.stats.pop(name, None)
        self._added.pop(name, None)
        task = self._added_tasks.pop(name, None)
        if task is not None:
            task.cancel()

    def optional_listed(self, gk: GroupKind) -> bool:
        """The optional kind is watched and has listed once."""
        reflector = self._optional_reflectors.get(gk)
        return reflector is not None and reflector.synced.is_set()

    def add_optional_kind(self, need: Need, item_type: type, handler: Handler) -> None:
        """Watch one more optional kind whenever it is served (before ``start``): the fleet's
        MultiKueueClusters."""
        self.optional[need] = (item_type, handler)

    def watches(self) -> list[Reflector]:
        """Every watch of the process: the index's and the added ones."""
        return [*self.reflectors.values(), *self._added.values()]

    def reconnect(self) -> None:
        """A request's connection went silent (ApiClient._silent): every watch may be on a dead
        one, and would sit on it until its read timeout. Each watches again from where it was."""
        ended = sum(reflector.reconnect() for reflector in self.watches())
        if ended:
            log.warning("a request to the API server got no answer within its timeout: its connection went "
                        "silent, and the %d watches opened before may be as dead; they reconnect", ended)

    async def relist(self) -> None:
        """Every watch relists (see Reflector.relist): afterwards the index is as fresh as a
        restart would make it, at the cost of one LIST per resource."""
        await asyncio.gather(*(r.relist() for r in self.watches()))

    async def stop(self) -> None:
        await tasks.stop(self._tasks)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _add(self, reflector: Reflector) -> None:
        self.stats[reflector.name] = reflector.stats
        self.reflectors[reflector.name] = reflector
        self._spawn(reflector.run())

    def _start_metadata_watch(self, name: str, path: str, handler: Handler[PartialObject]) -> Reflector:
        reflector = Reflector(self.api, name, path, PartialObject, handler, metadata_only=True, settings=self.settings)
        self._add(reflector)
        return reflector

    async def _wait_ready(self) -> None:
        """Ready once every reflector, including owner kinds discovered on the way, has listed."""
        while True:
            await asyncio.sleep(0.05)
            if self.discovery.busy:
                continue
            if all(self._settled(r) for r in self.reflectors.values()):
                # Let owner kinds found in the last lists start before declaring victory.
                await asyncio.sleep(0)
                if not self.discovery.busy and all(self._settled(r) for r in self.reflectors.values()):
                    break
        self.sync_seconds = time.monotonic() - self.started_at
        log.info("initial sync complete in %.2fs: %d nodes, %d pods, %d owner kinds",
                 self.sync_seconds, len(self.index.nodes), len(self.index.pods), len(self.owner_resources))
        self.ready.set()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(min(TICK_SECONDS, self.index.tick_seconds))
            self.index.tick()

    def _settled(self, reflector: Reflector) -> bool:
        """Listed, or an owner kind we are not allowed to list (it must not hold readiness hostage;
        its pods count as missing_owner and the reflector keeps retrying)."""
        if reflector.synced.is_set():
            return True
        return reflector.name not in CORE and reflector.contact.permanent

    # -- health ---------------------------------------------------------------------------------

    def sync_problems(self) -> list[str]:
        """One line per resource that is not in sync ("pods: forbidden (...)"); empty: in sync.
        O(reflectors): cheap enough for every probe and every lease renewal."""
        problems = []
        for name, reflector in self.reflectors.items():
            if name not in CORE and (reflector.contact.permanent
                                     or (self.ready.is_set() and not reflector.synced.is_set())):
                continue
            problem = reflector.problem(self.sync_grace)
            if problem is not None:
                problems.append(f"{name}: {problem}")
        if not problems and not self.ready.is_set():
            problems.append("initial sync in progress: owner kinds being discovered")
        return problems

    def owner_problems(self) -> list[str]:
        """Owner kinds that cannot be read (forbidden, not installed): reported, not counted
        against readiness."""
        return _permanent_problems(self.owner_kinds.reflectors.values(), self.sync_grace)

    def optional_problems(self) -> list[str]:
        """Optional kinds served but not readable (forbidden, or only at versions this code does not
        read): reported, not counted against readiness."""
        return [*_permanent_problems(self._optional_reflectors.values(), self.sync_grace),
                *(self.version_problem(need) for need in sorted(self.discovery.unknown, key=str)
                  if need in self.optional)]

    @property
    def unknown_versions(self) -> dict[GroupKind, tuple[str, ...]]:
        """(group, kind) -> the versions served, of every needed kind served only at versions not read."""
        return {(need[0], need[1]): versions for need, versions in self.discovery.unknown.items()}

    def version_problem(self, need: Need) -> str:
        """Why a kind served only at unknown versions is not read (``discovery.unknown``)."""
        served = ", ".join(f"{need[0]}/{v}" for v in self.discovery.unknown.get(need, ()))
        return (f"{describe(need)}: served only at {served}, which this version of node-workload-summary does not "
                f"read (it reads {', '.join(KNOWN_VERSIONS.get(need[0], ()))})")

    def kueue_problem(self) -> str | None:
        """Why Kueue's ResourceFlavors or ClusterQueues are not read though served, for the claims."""
        needs = [n for n in self.discovery.unknown if n[0] == KUEUE_GROUP and n in self.optional]
        return "; ".join(self.version_problem(n) for n in sorted(needs, key=str)) or None

    @property
    def forbidden_kinds(self) -> set[GroupKind]:
        """Owner and optional kinds whose list/watch the API server denies (401/403)."""
        reflectors = {**self.owner_kinds.reflectors, **self._optional_reflectors}
        return {gk for gk, r in reflectors.items() if r.contact.forbidden}

    def kind_problem(self, group: str, kind: str, version: str | None) -> tuple[str, str] | None:
        """Why a configured workload type cannot be summarized, as (reason, message); None when
        it can (or while discovery has not answered yet)."""
        need = (group, kind, version or None)
        if self.discovery.not_served(need):
            hint = NOT_SERVED_HINT.get(group, "CRD not installed?")
            return "KindNotServed", f"{describe(need)} is not served by the API server ({hint})"
        resource = self.discovery.resource(need)
        if resource is None:  # not known yet: the watch of the kind may tell
            watched = self.owner_resources.get((group, kind))
            if watched is None or (version and watched.version != version):
                return None
            resource = watched
        if not resource.namespaced:
            return "KindNotNamespaced", (f"{resource.name} is cluster-scoped; WorkloadSummaries are namespaced, "
                                         f"so it cannot be a root workload")
        reflector = self.owner_kinds.reflectors.get((group, kind))
        if reflector is not None and reflector.contact.forbidden:
            return "KindForbidden", f"list/watch of {reflector.name} is denied: {reflector.contact.last_error}"
        if reflector is not None and reflector.contact.not_served:
            return "KindNotServed", f"{reflector.name} is not served any more: {reflector.contact.last_error}"
        return None

    # -- kinds needed ---------------------------------------------------------------------------

    def _needs(self) -> set[Need]:
        self._rewatch_unserved()
        return self.owner_kinds.needs() | self.optional.keys()

    def _rewatch_unserved(self) -> None:
        """Stop each optional kind's watch the API server answers 404 (its version no longer
        served), and forget the kind's resource: it is looked up again, at the version served now.
        (An object deleted meanwhile stays in the index until the process restarts: rare, and the
        next LIST of the new watch brings every object that exists.)"""
        for need in list(self.optional):
            gk = (need[0], need[1])
            reflector = self._optional_reflectors.get(gk)
            if reflector is None or not reflector.contact.not_served:
                continue
            log.warning("%s is no longer served (%s): looking %s up again", reflector.path,
                        reflector.contact.last_error, describe(need), extra=fields(reflector.name))
            del self._optional_reflectors[gk]
            if gk == POD_GROUPS.group_kind:
                self.index.set_follow_pod_groups(False)
            self.reflectors.pop(reflector.name, None)
            self.stats.pop(reflector.name, None)
            self._optional_tasks.pop(gk).cancel()
            self.discovery.forget(need)

    @property
    def missing_kinds(self) -> set[GroupKind]:
        """The kinds needed now (configured, or referenced while not watched) that are not served."""
        return self.owner_kinds.missing()

    def _found(self, need: Need, resource: Resource) -> None:
        if need in self.optional:
            self._watch_optional_kind(need, resource)
        if need not in self.optional or need in self.owner_kinds.needs():  # (a kind may be both)
            self.owner_kinds.watch(resource)

    def _watch_optional_kind(self, need: Need, resource: Resource) -> None:
        gk = (resource.group, resource.kind)
        if gk in self._optional_reflectors:
            return
        item_type, handler = self.optional[need]
        name = resource.name + (GANGS_SUFFIX if item_type in (JobSet, LeaderWorkerSet) else "")
        log.info("watching %s", resource.path(), extra=fields(name))
        reflector = Reflector(self.api, name, resource.path(), item_type, handler, settings=self.settings)
        self._optional_reflectors[gk] = reflector
        self.stats[reflector.name] = reflector.stats
        self.reflectors[reflector.name] = reflector
        self._optional_tasks[gk] = self._spawn(reflector.run())
        if gk == POD_GROUPS.group_kind:
            self._spawn(self._follow_pod_groups(reflector))

    async def _follow_pod_groups(self, reflector: Reflector) -> None:
        """Pods hang below the PodGroups they name once those have listed (until then, and if they
        never can, below their controller owner: no pod loses its root meanwhile)."""
        await reflector.synced.wait()
        if self._optional_reflectors.get(POD_GROUPS.group_kind) is reflector:
            self.index.set_follow_pod_groups(True)

    # -- pods ------------------------------------------------------------------------------------

    def _pod_upsert(self, pod: Pod) -> None:
        key = self.index.upsert_pod(pod)
        self.owner_kinds.track("pods", key, pod.metadata.controller_ref())

    def _pod_delete(self, key: str) -> None:
        self.index.delete_pod(key)
        self.owner_kinds.track("pods", key, None)

    # -- PodGroups (the in-tree Workload API) ----------------------------------------------------

    def _pod_group_upsert(self, group: PodGroup) -> None:
        """The PodGroup, and the Workload it names: that kind is needed (watched) while named."""
        self.index.upsert_pod_group(group)
        name, api_version, kind = group.workload(), SCHEDULING_WORKLOADS.api_version, SCHEDULING_WORKLOADS.kind
        ref = OwnerReference(api_version, kind, name, "") if name else None
        self.owner_kinds.track(POD_GROUPS.plural, object_key(group.metadata), ref)

    def _pod_group_delete(self, key: str) -> None:
        self.index.delete_pod_group(key)
        self.owner_kinds.track(POD_GROUPS.plural, key, None)

    # -- summarizers -------------------------------------------------------------------------

    def _node_summarizer(self, obj: NodeSummarizer) -> None:
        self.summarizers.node[obj.metadata.name] = obj
        if obj.spec.labelKey:
            self.index.set_node_summarizer(obj.metadata.name, obj.spec.labelKey)
        else:
            self.index.delete_node_summarizer(obj.metadata.name)

    def _node_summarizer_deleted(self, name: str) -> None:
        self.summarizers.node.pop(name, None)
        self.index.delete_node_summarizer(name)

    def _workload_summarizer(self, obj: WorkloadSummarizer) -> None:
        self.summarizers.workload[obj.metadata.name] = obj
        keys, gangs = set(self.index.label_keys), self.index.gang_config
        self.index.set_workload_summarizer(obj.metadata.name, obj.spec.workloadTypes, obj.spec.podLabelWorkloads,
                                           obj.spec.gangs)
        self._reconfigure()
        added = set(self.index.label_keys) - keys
        if (added or self.index.gang_config != gangs) and self.index.pods:
            # The index keeps only the pods' values of keys configured before: hand it every
            # pod again (one LIST; a summarizer edit is rare). At start, the summarizers usually
            # list before the first page of pods, and nothing is read twice.
            log.info("pod label keys %s or gangs configured: relisting pods to read them",
                     ", ".join(sorted(added)) or "none new")
            self._spawn(self.reflectors["pods"].redeliver())

    def _workload_summarizer_deleted(self, name: str) -> None:
        self.summarizers.workload.pop(name, None)
        self.index.delete_workload_summarizer(name)
        self._reconfigure()

    def _reconfigure(self) -> None:
        """Look up configured kinds as soon as they appear (status writes change nothing here), and
        the kinds that size the gangs configured (watched from then on, whenever served)."""
        self.owner_kinds.configure({(t.group, t.kind, t.version or None) for s in self.summarizers.workload.values()
                                    for t in s.spec.workloadTypes if (t.group, t.kind) != POD})
        for kind in self.index.gang_config.kinds & GANG_SIZES.keys():
            need, item_type = GANG_SIZES[kind]
            if need not in self.optional:
                self.optional[need] = (item_type, Handler(partial(self._gang_size, kind),
                                                          partial(self._gang_size_gone, kind)))
                if self._running:
                    self.discovery.look_up(need)

    # -- what sizes gangs --------------------------------------------------------------------------

    def _gang_size(self, kind: str, obj: JobSet | LeaderWorkerSet) -> None:
        self.index.set_gang_size(source_key(kind, obj.metadata.namespace, obj.metadata.name), obj.gang_size())

    def _gang_size_gone(self, kind: str, key: str) -> None:
        self.index.set_gang_size(source_key(kind, *split_key(key)), None)
