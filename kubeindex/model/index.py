"""The cluster index: nodes, pods and owners in, node-group and root-workload aggregates out.

All updates are incremental. A pod event subtracts the pod's previous contribution and adds the
new one (O(node groups of its node)); a node event moves the node's own facts and the running
sums of its pods between node groups (O(resources), O(pods on the node) only when its node groups
or its state change); an owner event costs O(depth) plus the pods whose root workload really
changed (see owners.py).

Each node has one state (NODE_STATES, see node_state for the precedence); workloads count their
pods and distinct nodes on nodes in a state other than Ready. A pod in phase Succeeded or Failed
holds no node: it counts in its node's and its workload's phase counts, never in a workload's
nodes (placement, pods and nodes on unhealthy nodes), so a finished Job on a lost pool is not
"on unhealthy nodes". A Pending pod bound to a node holds it.

A node's blocker (what Karpenter says keeps it from disrupting the node: disruption.py, from its
DisruptionBlocked Events) is one more of the node's facts, moved with it between node groups; a
node's state becoming Disrupting, and a blocker said, leave notices for the reconciler's Events.

Node groups and Kueue flavors are both node sets, summed by one arithmetic (nodeset.py). The
flavors, with the nominal quota of the ClusterQueues that name them, are an aggregate of their own
(kueue.py, ``ClusterIndex.kueue``) that sees the same node and pod events.

Aggregates carry a stamp of the index's revision (``revision``, revision.py) that moves whenever
their content does, so consumers (the exporter's renderer, the reconciler) redo only what changed.
A consumer that would otherwise look at every aggregate to find those is told which by a change
cursor of its own (``cursor``).

A pod update that changes nothing an aggregate counts (most of them: conditions, container
states) stops at that comparison; one that changes the phase alone moves the phase counts only.
Strings many pods repeat are held once (``objects.share``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .disruption import (
    BLOCKED_REASON,
    BLOCKER_TTL,
    NODE,
    NODEPOOL_LABEL,
    PDB,
    Block,
    Blocker,
    Notice,
    Notices,
    observed,
    parse_blocker,
)
from .disruption import POD as POD_BLOCKER
from .gangs import GANG_GRACE, PODGROUP, TOPOLOGY_LABEL, Gang, GangConfig, Member, Place, source_key
from .karpenter import DISRUPTING, DRIFTED, EXPIRY_HORIZON, NodeClaims
from .kueue import KueueIndex
from .nodeset import NodeEntry, NodeSetAgg, Vector, add, bump, move_phase, node_into, pod_into
from .objects import (
    DisruptionEvent,
    Node,
    NodeClaim,
    Pod,
    PodGroup,
    PodLabelWorkload,
    PodSpec,
    PodStatus,
    Taint,
    WorkloadGangs,
    WorkloadType,
    key_of,
    label_workload_type,
    object_key,
    share,
    split_key,
)
from .owners import FAILURES, POD, GroupKind, OwnerGraph, Resolution, Vertex, named
from .quantity import parse_or_zero
from .resources import POD_GROUPS, SCHEDULING_WORKLOADS
from .revision import Revision

NodeGroupKey = tuple[str, str]  # (summarizer name, label value)
PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
_PHASE = {phase: phase for phase in PHASES}  # one string object per phase, not one per pod
TERMINATED = frozenset({"Succeeded", "Failed"})  # hold no node: no requests, no place in a workload's nodes
READY_STATES = ("Ready", "NotReady", "Unknown")
READY = "Ready"
NODE_DISRUPTING = "Disrupting"  # the node state of a disruption taint (a NodeClaim's rollout state is karpenter's)
NODE_STATES = (READY, "NotReady", "Unknown", "Disrupting", "Cordoned", "Degraded")  # in precedence order
UNHEALTHY_STATES = NODE_STATES[1:]
ROLLING = frozenset({DRIFTED, DISRUPTING})  # rollout states of the nodes a rollout has yet to replace
MAX_OWNER_DEPTH = 10  # ownerReference hops followed from a pod (--max-owner-depth)
POD_GROUP, SCHEDULING_WORKLOAD = POD_GROUPS.group_kind, SCHEDULING_WORKLOADS.group_kind

# Defaults of --disruption-taints, --problem-conditions and --accelerator-resources.
DISRUPTION_TAINTS = ("karpenter.sh/disrupted", "ToBeDeletedByClusterAutoscaler",
                     "cloud.google.com/impending-node-termination")
PROBLEM_CONDITIONS = ("KernelDeadlock", "ReadonlyFilesystem", "FrequentKubeletRestart",
                      "FrequentContainerdRestart")  # node-problem-detector's
ACCELERATOR_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "google.com/tpu", "aws.amazon.com/neuron*",
                         "habana.ai/gaudi")


@dataclass(eq=False)
class NodeGroupAgg(NodeSetAgg):
    """One node group: the nodes of one NodeSummarizer that carry one value of its label."""

    summarizer: str
    value: str


@dataclass(eq=False)
class WorkloadAgg:
    """One root workload: a configured owner with no configured owner above it, or the pods of a
    namespace that carry one value (``name``) of a configured pod label key (``label_key``)."""

    uid: str
    namespace: str
    name: str
    group: str  # an owner's API group ("" for the core group); "" for a label workload
    kind: str  # an owner's kind; "" for a label workload
    label_key: str = ""  # a label workload's pod label key; "" for an owner
    pods: dict[str, int] = field(default_factory=dict)  # phase -> pods
    node_pods: dict[str, int] = field(default_factory=dict)  # node -> bound, non-terminated pods of this workload
    nodes_by_node_group: dict[NodeGroupKey, int] = field(default_factory=dict)  # distinct nodes per node group
    pods_by_node_state: dict[str, int] = field(default_factory=dict)  # UNHEALTHY_STATES -> bound pods
    unhealthy_nodes: int = 0  # distinct nodes not Ready
    unhealthy_nodes_by_node_group: dict[NodeGroupKey, int] = field(default_factory=dict)  # the same per node group
    pods_with_unhealthy_devices: int = 0  # non-terminated pods holding a device reported Unhealthy
    devices_unhealthy: dict[str, int] = field(default_factory=dict)  # resource -> such devices
    # Bound pods on nodes Karpenter is disrupting or may disrupt next (karpenter.RISKS -> pods), and
    # those per node group: the blast radius of a pool's disruptions on this workload.
    pods_at_risk: dict[str, int] = field(default_factory=dict)
    pods_at_risk_by_node_group: dict[NodeGroupKey, int] = field(default_factory=dict)
    gangs: dict[str, Gang] = field(default_factory=dict)  # gang key -> its members' counts (gangs.py)
    revision: int = 0  # its stamp: moves with its content

    @property
    def is_object(self) -> bool:
        """An owner (an API object that can own its summary), not a pod label's value."""
        return not self.label_key


@dataclass(slots=True)
class PodGroupEntry:
    """An in-tree PodGroup as the index keeps it."""

    uid: str
    workload: str  # its Workload's name ("": none named)
    min_count: int | None  # a gang's minimum; None: the basic policy


class PodEntry:
    __slots__ = ("devices", "gang", "gang_place", "gang_risk", "key", "labels", "node", "phase", "ready", "requests",
                 "status", "uid", "workload")

    def __init__(self, key: str, uid: str, node: str, phase: str, requests: Vector, labels: LabelMatches,
                 devices: Vector = (), gang: Member | None = None, ready: bool = False) -> None:
        self.key = key
        self.uid = uid
        self.node = node
        self.phase = phase
        self.requests = requests  # effective requests; () once terminated
        self.devices = devices  # (resource, devices reported Unhealthy); () for most pods, and once terminated
        # Only the values of configured label keys are kept (usually none): a pod's whole label
        # set would cost about 1 KB per pod, so keys added later are learnt by upserting pods again.
        self.labels = labels
        self.workload: str | None = None
        self.status = ""  # owners.OK / NONE / a failure: why there is (no) workload
        self.gang = gang  # its gang, if any (gangs.py); only gang members' readiness is looked at
        self.ready = ready  # its Ready condition is True (read for gang members only)
        # How its gang counts it, taken back exactly so whatever its node did since: ready (True),
        # neither ready nor lost (False: starting, or not a bound, unfinished member), or lost there (a Place).
        self.gang_place: Place | bool = False
        self.gang_risk = False  # its gang counts it at risk of Karpenter's disruptions (on its node as counted)


_interned: dict[Vector, Vector] = {}


def interned_vectors() -> int:
    """Distinct request vectors held (a memory figure for benchmarks)."""
    return len(_interned)


def _intern(vector: dict[str, int]) -> Vector:
    """Most pods share a few request vectors: store one tuple per distinct vector."""
    key = tuple(sorted((k, v) for k, v in vector.items() if v))
    return _interned.setdefault(key, key) if len(_interned) < 100_000 else key


_by_text: dict[tuple[tuple[str, str], ...], Vector] = {}  # one container's requests as written -> vector


def pod_requests(spec: PodSpec) -> Vector:
    """``effective_requests``, interned. Most pods have one container and nothing else that
    requests: their vector is looked up by that container's requests as written, which the pods of
    a workload repeat, instead of parsing every quantity again on each of their events."""
    if spec.initContainers or spec.overhead or spec.resources.requests or len(spec.containers) != 1:
        return _intern(effective_requests(spec))
    text = tuple(spec.containers[0].resources.requests.items())
    vector = _by_text.get(text)
    if vector is None:
        vector = _intern(_parse(spec.containers[0].resources.requests))
        if len(_by_text) < 100_000:
            _by_text[text] = vector
    return vector


def unhealthy_devices(status: PodStatus) -> Vector:
    """The devices allocated to the pod's containers that the kubelet reports Unhealthy
    (allocatedResourcesStatus), per resource; () for a pod that has none (nearly all: every pod
    event asks, so those return after a look at each container)."""
    for container in status.containerStatuses:
        if container.allocatedResourcesStatus:
            return _unhealthy_devices(status)
    for container in status.initContainerStatuses:
        if container.allocatedResourcesStatus:
            return _unhealthy_devices(status)
    return ()


def _unhealthy_devices(status: PodStatus) -> Vector:
    counts: dict[str, int] = {}
    for statuses in (status.initContainerStatuses, status.containerStatuses):
        for container in statuses:
            for resource in container.allocatedResourcesStatus:
                bad = sum(1 for device in resource.resources if device.health == "Unhealthy")
                if bad:
                    counts[resource.name] = counts.get(resource.name, 0) + bad
    return _intern(counts) if counts else ()


def _parse(resources: dict[str, str]) -> dict[str, int]:
    return {name: parse_or_zero(q) for name, q in resources.items()}


def _pod_level(resource: str) -> bool:
    """The resources pod-level requests may set (component-helpers' IsSupportedPodLevelResource)."""
    return resource in ("cpu", "memory") or resource.startswith("hugepages-")


def effective_requests(spec: PodSpec) -> dict[str, int]:
    """What the scheduler reserves for a pod, as k8s.io/component-helpers' PodRequests: per
    resource, max(sum of containers + sidecars, largest init container step); then pod-level
    requests replace that for the resources they name (cpu, memory, hugepages-*); then overhead.
    The API server drops spec.resources while the PodLevelResources gate is off, so a value there
    means the scheduler uses it."""
    if not (spec.initContainers or spec.overhead or spec.resources.requests) and len(spec.containers) == 1:
        return _parse(spec.containers[0].resources.requests)  # most pods: the sum of one
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for c in spec.initContainers:
        req = _parse(c.resources.requests)
        if c.restartPolicy == "Always":
            add(sidecars, req.items(), 1)
            for r, v in sidecars.items():
                init_peak[r] = max(init_peak.get(r, 0), v)
        else:
            for r in req.keys() | sidecars.keys():
                init_peak[r] = max(init_peak.get(r, 0), req.get(r, 0) + sidecars.get(r, 0))
    total = dict(sidecars)
    for c in spec.containers:
        add(total, _parse(c.resources.requests).items(), 1)
    result = {r: max(total.get(r, 0), init_peak.get(r, 0)) for r in total.keys() | init_peak.keys()}
    result.update((r, v) for r, v in _parse(spec.resources.requests).items() if _pod_level(r))
    add(result, _parse(spec.overhead).items(), 1)
    return result


@dataclass(frozen=True)
class WorkloadTypeInfo:
    """How a configured kind is shown: from the first summarizer (by name) that lists it."""

    summarizer: str
    group: str
    kind: str
    version: str | None
    short_type: str | None


@dataclass(frozen=True)
class LabelWorkloadInfo:
    """A pod label key whose values name workloads, from the first summarizer (by name) that
    lists it; summarizer "" for a key of the deprecated --workload-pod-labels alone (metrics only)."""

    summarizer: str
    label_key: str
    short_type: str | None = None


def label_workload_uid(label_key: str, namespace: str, value: str) -> str:
    """The index's key of a label workload (owners are keyed by their UID, which has no '/')."""
    return f"{label_workload_type(label_key)}:{namespace}/{value}"


LabelMatches = tuple[tuple[str, str], ...]  # a pod's (key, value) of the configured label keys, in key order
OwnerKindListener = Callable[[str, str], None]  # (apiVersion, kind) of an owner kind seen first


@dataclass(frozen=True)
class NodeHealth:
    """What makes a node Disrupting or Degraded (--disruption-taints, --problem-conditions,
    --accelerator-resources)."""

    disruption_taints: frozenset[str]  # "key" (any effect) or "key:Effect"
    problem_conditions: frozenset[str]
    accelerators: frozenset[str]  # exact resource names
    accelerator_prefixes: tuple[str, ...]  # from patterns ending in "*"

    @classmethod
    def of(cls, disruption_taints: Iterable[str], problem_conditions: Iterable[str],
           accelerator_resources: Iterable[str]) -> NodeHealth:
        patterns = list(accelerator_resources)
        return cls(frozenset(disruption_taints), frozenset(problem_conditions),
                   frozenset(p for p in patterns if not p.endswith("*")),
                   tuple(p[:-1] for p in patterns if p.endswith("*")))

    def is_accelerator(self, resource: str) -> bool:
        return resource in self.accelerators or resource.startswith(self.accelerator_prefixes)

    def disrupts(self, taint: Taint) -> bool:
        return taint.key in self.disruption_taints or f"{taint.key}:{taint.effect}" in self.disruption_taints

    def accelerators_unhealthy(self, allocatable: dict[str, int], capacity: dict[str, int]) -> dict[str, int]:
        """Accelerator resource -> capacity - allocatable, where positive: devices the device
        plugin reports unhealthy leave allocatable while capacity stays."""
        return {r: c - allocatable.get(r, 0) for r, c in capacity.items()
                if c > allocatable.get(r, 0) and self.is_accelerator(r)}

    def state(self, node: Node, ready: str, accelerators_unhealthy: bool) -> str:
        """The node's one state, the first that applies: NotReady, Unknown (from the Ready
        condition), Disrupting (a disruption taint), Cordoned (spec.unschedulable), Degraded (a
        problem condition True, or unhealthy accelerators), else Ready."""
        if ready != READY:
            return ready
        if any(self.disrupts(t) for t in node.spec.taints):
            return "Disrupting"
        if node.spec.unschedulable:
            return "Cordoned"
        if accelerators_unhealthy or any(c.status == "True" and c.type in self.problem_conditions
                                         for c in node.status.conditions):
            return "Degraded"
        return READY


# What a node gives the workloads with pods on it: its node groups, its state when not Ready, and
# its disruption risk (karpenter.RISKS) when it has one (both None also for a node not seen, or
# deleted, while pods still name it).
Placement = tuple[tuple[NodeGroupKey, ...], str | None, str | None]
NOWHERE: Placement = ((), None, None)


def _node_in_workload(agg: WorkloadAgg, placement: Placement, pods: int, distinct: bool, sign: int) -> None:
    """Add (sign +1) or remove a node's share of a workload: ``pods`` of its pods there and, when
    ``distinct`` (the workload starts or stops using the node), the node in the distinct counts."""
    node_groups, unhealthy, risk = placement
    if distinct:
        add(agg.nodes_by_node_group, ((g, 1) for g in node_groups), sign)
    if risk is not None:
        add(agg.pods_at_risk, ((risk, pods),), sign)
        add(agg.pods_at_risk_by_node_group, ((g, pods) for g in node_groups), sign)
    if unhealthy is None:
        return
    if distinct:
        agg.unhealthy_nodes += sign
        add(agg.unhealthy_nodes_by_node_group, ((g, 1) for g in node_groups), sign)
    add(agg.pods_by_node_state, ((unhealthy, pods),), sign)


def _risk(entry: NodeEntry) -> str | None:
    """Being disrupted (a disruption taint, or its NodeClaim's DisruptionReason or deletion), else
    its NodeClaim's candidacy; None for neither."""
    if entry.state == DISRUPTING or entry.rollout == DISRUPTING:
        return DISRUPTING
    return entry.candidate or None


def _placement(entry: NodeEntry) -> Placement:
    if not entry.present:
        return entry.node_groups, None, None
    return entry.node_groups, (entry.state if entry.state != READY else None), _risk(entry)


def _facts(entry: NodeEntry) -> tuple:
    """What a node adds to its node groups besides its pods (node_into's share): equal before and
    after an update, the update is no news for a NodeSummary."""
    return (entry.present, entry.node_groups, entry.ready, entry.state, entry.unschedulable, entry.allocatable,
            entry.capacity, entry.accelerators_unhealthy, entry.rollout, entry.blocker)


class Changes:
    """What changed since a consumer last took it (``Cursor.take``): the node groups
    and workloads whose content did, or ``structure``: the sets of node groups or workloads, or
    the configuration, changed (then the consumer redoes everything, and nothing finer is kept).
    ``node_news``: the node groups one of whose nodes changed what it counts (readiness, state,
    schedulability, resources, membership), not only their pods. ``workload_news``: the workloads
    one of whose nodes did (its state, its node groups), not only their pods."""

    __slots__ = ("node_groups", "node_news", "structure", "workload_news", "workloads")

    def __init__(self, structure: bool) -> None:
        self.node_groups: set[NodeGroupKey] = set()
        self.node_news: set[NodeGroupKey] = set()
        self.workloads: set[str] = set()
        self.workload_news: set[str] = set()
        self.structure = structure


class Cursor:
    """One consumer's changes, recorded by the index from the cursor's making."""

    __slots__ = ("changes",)

    def __init__(self) -> None:
        self.changes = Changes(structure=True)

    def take(self) -> Changes:
        """What changed since the last take (the first: everything)."""
        taken, self.changes = self.changes, Changes(structure=False)
        return taken


class ClusterIndex:
    """Nodes, pods, owners and the summarizers in; node groups (``node_groups``) and root workloads
    (``workloads``) out, and beside them the Kueue flavors (``kueue``), fed the same node and pod
    events."""

    def __init__(self, workload_pod_labels: Iterable[str] = (), on_owner_kind: OwnerKindListener | None = None,
                 max_depth: int = MAX_OWNER_DEPTH, disruption_taints: Iterable[str] = DISRUPTION_TAINTS,
                 problem_conditions: Iterable[str] = PROBLEM_CONDITIONS,
                 accelerator_resources: Iterable[str] = ACCELERATOR_RESOURCES,
                 expiry_horizon: float = EXPIRY_HORIZON, now: Callable[[], float] = time.time,
                 gang_grace: float = GANG_GRACE, gang_topology_label: str = TOPOLOGY_LABEL) -> None:
        self.nodes: dict[str, NodeEntry] = {}
        self.pods: dict[str, PodEntry] = {}
        self.owner_uids: dict[tuple[GroupKind, str], str] = {}  # (group/kind, key) -> uid
        self.node_groups: dict[NodeGroupKey, NodeGroupAgg] = {}
        self.revision = Revision()  # every stamp of this index (and of its Kueue flavors)
        self.kueue = KueueIndex(self.nodes, self.revision)  # Kueue flavors: fed the same node and pod events
        self.workloads: dict[str, WorkloadAgg] = {}
        self.node_summarizers: dict[str, str] = {}  # name -> labelKey
        self.workload_summarizers: dict[str, list[WorkloadType]] = {}
        self.workload_types: dict[GroupKind, WorkloadTypeInfo] = {}
        self.unresolved: dict[str, int] = {}  # reason -> pods without a workload
        self.chain_broken: dict[str, int] = {}  # reason -> pods with a workload but a broken chain above it
        self.workload_pod_labels = tuple(workload_pod_labels)  # the deprecated flag's keys
        self.label_summarizers: dict[str, list[PodLabelWorkload]] = {}  # summarizer -> its podLabelWorkloads
        self.label_types: dict[str, LabelWorkloadInfo] = {}  # label key -> info, in precedence order
        self._configure_labels()
        self.health = NodeHealth.of(disruption_taints, problem_conditions, accelerator_resources)
        self.graph = OwnerGraph(self._on_resolution, max_depth=max_depth)
        self.nodeclaims = NodeClaims(self._nodeclaim_changed, now, expiry_horizon)  # Karpenter's, when served
        self.owner_kinds: set[tuple[str, str]] = set()  # (apiVersion, kind) met in ownerReferences
        self.pod_groups: dict[str, PodGroupEntry] = {}  # "<namespace>/<name>" -> the in-tree PodGroup
        # Pods that name a PodGroup: key -> (the group's by-name vertex, the controller owner's UID).
        # Such a pod's parent is its group while the PodGroups are watched, else its controller.
        self._grouped: dict[str, tuple[str, str | None]] = {}
        self.follow_pod_groups = False
        # Gangs (gangs.py): what the summarizers ask for, the sizes their sources give (PodGroups'
        # minCount, JobSets', LeaderWorkerSets'), and which workloads' gangs each source sizes.
        self.gang_summarizers: dict[str, WorkloadGangs] = {}
        self.gang_config = GangConfig()
        self._gang_member: Callable[[str, dict[str, str], str | None], Member | None] | None = None  # while configured
        self.gang_sizes: dict[str, int] = {}
        self._gang_homes: dict[str, set[tuple[str, str]]] = {}  # source -> {(workload UID, gang key)}
        self._short: dict[tuple[str, str], float] = {}  # (workload UID, gang key) -> since when short
        self._gang_nodes: dict[str, int] = {}  # node -> gang members bound to it
        self._gone_places: dict[str, Place] = {}  # a deleted node that gang members still name -> where it was
        self.gang_grace = gang_grace
        self.gang_topology_label = gang_topology_label
        self.now = now
        self.on_owner_kind = on_owner_kind
        self._cursors: list[Cursor] = []
        # Karpenter's blockers (disruption.py): node -> its Block; the Event saying it -> node; a
        # blocking pod's key -> its node. And the notices the reconciler's Events take.
        self.node_blocks: dict[str, Block] = {}
        self._block_events: dict[str, str] = {}
        self.blocking_pods: dict[str, str] = {}
        self.notices = Notices()
        # Stamped at every change to the sets of node groups or workloads, or the configuration.
        self.sets_revision = next(self.revision)

    def cursor(self) -> Cursor:
        """A consumer's own record of what changes from now on."""
        cursor = Cursor()
        self._cursors.append(cursor)
        return cursor

    def _touched_workload(self, uid: str, news: bool = False) -> None:
        for cursor in self._cursors:
            changes = cursor.changes
            if not changes.structure:
                changes.workloads.add(uid)
                if news:
                    changes.workload_news.add(uid)

    def _touched_node_group(self, key: NodeGroupKey, news: bool = False) -> None:
        for cursor in self._cursors:
            changes = cursor.changes
            if not changes.structure:
                changes.node_groups.add(key)
                if news:
                    changes.node_news.add(key)

    def _restructured(self) -> None:
        self.sets_revision = next(self.revision)
        for cursor in self._cursors:
            if not cursor.changes.structure:
                cursor.changes = Changes(structure=True)  # nothing finer is kept

    # ---------------------------------------------------------------------------- configuration

    def set_node_summarizer(self, name: str, label_key: str) -> None:
        if self.node_summarizers.get(name) == label_key:
            return
        self.node_summarizers[name] = label_key
        self._restructured()
        self._regroup_all()

    def delete_node_summarizer(self, name: str) -> None:
        if self.node_summarizers.pop(name, None) is not None:
            self._restructured()
            self._regroup_all()

    def set_workload_summarizer(self, name: str, types: list[WorkloadType], pod_labels: Iterable[PodLabelWorkload] = (),
                                gangs: WorkloadGangs | None = None) -> None:
        self._set_label_summarizer(name, list(pod_labels))
        self._set_gang_summarizer(name, gangs)
        if self.workload_summarizers.get(name) == types:
            return
        self.workload_summarizers[name] = list(types)
        self._reconfigure_workloads()

    def delete_workload_summarizer(self, name: str) -> None:
        self._set_label_summarizer(name, [])
        self._set_gang_summarizer(name, None)
        if self.workload_summarizers.pop(name, None) is not None:
            self._reconfigure_workloads()

    def _reconfigure_workloads(self) -> None:
        types: dict[GroupKind, WorkloadTypeInfo] = {}
        for name in sorted(self.workload_summarizers):
            for t in self.workload_summarizers[name]:
                if (t.group, t.kind) != POD:  # pods are what is summarized, never a workload
                    types.setdefault((t.group, t.kind),
                                     WorkloadTypeInfo(name, t.group, t.kind, t.version, t.shortType))
        self.workload_types = types
        self._restructured()
        self.graph.set_configured(types)  # redoes only the vertices of kinds that changed

    @property
    def label_keys(self) -> tuple[str, ...]:
        """The pod label keys that name workloads, in precedence order."""
        return tuple(self.label_types)

    def _set_label_summarizer(self, name: str, pod_labels: list[PodLabelWorkload]) -> None:
        if self.label_summarizers.get(name, []) == pod_labels:
            return
        if pod_labels:
            self.label_summarizers[name] = pod_labels
        else:
            del self.label_summarizers[name]
        before = self.label_keys
        self._configure_labels()
        if self.label_keys != before:
            self._relabel_pods()
        self._restructured()  # a short type may have changed: the summaries are made of it

    def _set_gang_summarizer(self, name: str, gangs: WorkloadGangs | None) -> None:
        """A summarizer's spec.gangs. A change of the merged configuration takes every pod out of
        its gang: pods join the gangs of the new one as they are upserted again (Sources relists
        them, as for a label key added: the index keeps no pod's whole label set)."""
        if gangs is None or not (gangs.kinds or gangs.podLabels):
            if self.gang_summarizers.pop(name, None) is None:
                return
        elif self.gang_summarizers.get(name) == gangs:
            return
        else:
            self.gang_summarizers[name] = gangs
        chosen = [self.gang_summarizers[n] for n in sorted(self.gang_summarizers)]
        labels: dict[str, str] = {}
        for g in chosen:
            for p in g.podLabels:
                labels.setdefault(p.labelKey, p.minAvailableLabelKey)
        config = GangConfig(frozenset(k for g in chosen for k in g.kinds), tuple(labels.items()))
        if config == self.gang_config:
            return
        self.gang_config = config
        self._gang_member = config.member if config else None
        for entry in self.pods.values():
            if entry.gang is not None:
                if entry.workload is not None:
                    agg = self.workloads[entry.workload]
                    self._gang_in(agg, entry, -1)
                    agg.revision = next(self.revision)
                    self._touched_workload(agg.uid)
                entry.gang = None

    def _configure_labels(self) -> None:
        """Keys by precedence: the summarizers' by name, each in its list's order; then the flag's."""
        types: dict[str, LabelWorkloadInfo] = {}
        for name in sorted(self.label_summarizers):
            for p in self.label_summarizers[name]:
                types.setdefault(p.labelKey, LabelWorkloadInfo(name, p.labelKey, p.shortType))
        for key in self.workload_pod_labels:
            types.setdefault(key, LabelWorkloadInfo("", key))
        self.label_types = types

    def _relabel_pods(self) -> None:
        """The label keys changed: O(pods), rare. A pod keeps only its values of the keys configured
        when it was last upserted, so keys dropped or reordered take effect here; a key added takes
        effect as pods are upserted again (Sources relists them)."""
        for entry in self.pods.values():
            if not entry.labels:
                continue
            labels = tuple(m for key in self.label_types for m in entry.labels if m[0] == key)
            if labels == entry.labels:
                continue
            self._pod_in_workload(entry, -1)
            entry.labels = labels
            res = self.graph.resolution(entry.uid)
            if res is not None:
                entry.workload, entry.status = self._pod_workload(res, split_key(entry.key)[0], labels)
            self._pod_in_workload(entry, +1)

    # ---------------------------------------------------------------------------- nodes

    def _node_groups_for(self, labels: dict[str, str]) -> tuple[NodeGroupKey, ...]:
        return tuple((s, labels[k]) for s, k in self.node_summarizers.items() if k in labels)

    def upsert_node(self, node: Node) -> None:
        name = node.metadata.name
        entry = self.nodes.get(name)
        if entry is None:
            entry = self.nodes[name] = NodeEntry(name)
        self._gone_places.pop(name, None)
        was_disrupting = entry.present and entry.state == NODE_DISRUPTING
        self._refresh_node(entry, lambda: self._read_node(entry, node))
        if entry.state == NODE_DISRUPTING and not was_disrupting:
            self._notice_disrupting(entry)

    def _read_node(self, entry: NodeEntry, node: Node) -> None:
        entry.present = True
        entry.labels = node.metadata.labels
        entry.ready = node.ready()
        entry.unschedulable = node.spec.unschedulable
        allocatable, capacity = _parse(node.status.allocatable), _parse(node.status.capacity)
        entry.allocatable = _intern(allocatable)
        entry.capacity = _intern(capacity)
        unhealthy = self.health.accelerators_unhealthy(allocatable, capacity)
        entry.accelerators_unhealthy = _intern(unhealthy)
        entry.state = self.health.state(node, entry.ready, bool(unhealthy))
        if entry.state == NODE_DISRUPTING:
            self._forget_block(entry.name)  # chosen for disruption: no longer blocked
        block = self.node_blocks.get(entry.name)
        entry.blocker = block.blocker if block is not None else None
        entry.node_groups = self._node_groups_for(entry.labels)
        entry.rollout, entry.candidate = self.nodeclaims.facts(entry.name)

    def _refresh_node(self, entry: NodeEntry, read: Callable[[], None]) -> None:
        """Take the node out of its node groups and flavors, ``read`` its facts anew, put it back, and
        move the workloads of its pods if what it gives them changed: O(resources), and O(pods on it)
        only then."""
        old_groups, was, rollout = entry.node_groups, _facts(entry), entry.rollout
        held = self._gang_stance(entry) if self._gang_nodes.get(entry.name) else None  # most nodes hold no member
        for g in old_groups:  # a group it stays in is not emptied on the way: no delete and recreate
            self._node_into_node_group(entry, g, -1, prune=False)
        self.kueue.node_out(entry)
        before = _placement(entry)
        read()
        for g in entry.node_groups:
            self._node_into_node_group(entry, g, +1)
        if (rollout, old_groups) != (entry.rollout, entry.node_groups) and {rollout, entry.rollout} & ROLLING:
            self._rollout_moved({*old_groups, *entry.node_groups})
        if _facts(entry) != was:  # not a heartbeat, an image list: what its groups count moved
            for g in {*old_groups, *entry.node_groups}:
                self._touched_node_group(g, news=True)
        for g in old_groups:
            self._prune_node_group(g)
        self.kueue.node_in(entry)
        self._move_node_workloads(entry, before, _placement(entry))
        if held is not None and self._gang_stance(entry) != held:
            self._replace_gang_members(entry.name)

    def _gang_stance(self, entry: NodeEntry) -> tuple[bool, Place, bool]:
        """What a node gives the gang members on it: their readiness, where they are, their risk."""
        present = entry.present
        return present and entry.ready == READY, self._place(entry.name), present and _risk(entry) is not None

    # ---------------------------------------------------------------------------- Karpenter's NodeClaims

    def upsert_nodeclaim(self, claim: NodeClaim) -> None:
        self.nodeclaims.upsert(claim)

    def delete_nodeclaim(self, name: str) -> None:
        self.nodeclaims.delete(name)

    def tick(self) -> None:
        """Time-based facts: NodeClaims whose expiry came within the horizon, gangs short for longer
        than the grace (called every few seconds: ``tick_seconds``)."""
        self.nodeclaims.tick()
        now = self.now()
        for (uid, key), since in list(self._short.items()):
            if now - since < self.gang_grace:
                continue
            del self._short[(uid, key)]
            agg = self.workloads.get(uid)
            gang = agg.gangs.get(key) if agg is not None else None
            if agg is None or gang is None or gang.short_since is None or gang.whole:
                continue
            gang.broken = True
            agg.revision = next(self.revision)
            self._touched_workload(uid)

    @property
    def tick_seconds(self) -> float:
        """How often ``tick`` should be called: every 10 s, or more often for a short gang grace."""
        return max(0.5, min(10.0, self.gang_grace / 5))

    def _nodeclaim_changed(self, name: str) -> None:
        """A NodeClaim of node ``name`` changed what the node shows: nothing before the node is seen
        (upsert_node reads its NodeClaim's facts)."""
        entry = self.nodes.get(name)
        if entry is None or not entry.present:
            return
        facts = self.nodeclaims.facts(name)
        if facts != (entry.rollout, entry.candidate):
            was_candidate = entry.candidate
            self._refresh_node(entry, lambda: self._set_claim_facts(entry, *facts))
            if entry.blocker is not None and entry.candidate and not was_candidate:
                self._notice_blocker(name, entry.blocker)  # a blocker Karpenter named now holds a rollout

    @staticmethod
    def _set_claim_facts(entry: NodeEntry, rollout: str, candidate: str) -> None:
        entry.rollout, entry.candidate = rollout, candidate

    def delete_node(self, name: str) -> None:
        entry = self.nodes.get(name)
        if entry is None or not entry.present:
            return
        for g in entry.node_groups:
            self._node_into_node_group(entry, g, -1)
            self._touched_node_group(g, news=True)
        if entry.rollout in ROLLING:
            self._rollout_moved(entry.node_groups)
        self.kueue.node_out(entry)
        before = _placement(entry)
        if name in self._gang_nodes:
            self._gone_places[name] = self._place(name)
        entry.present, entry.node_groups, entry.labels = False, (), {}
        self._forget_block(name)
        entry.blocker = None
        self._move_node_workloads(entry, before, NOWHERE)
        self._replace_gang_members(name)
        if not entry.pods:
            del self.nodes[name]

    def _regroup_all(self) -> None:
        for entry in self.nodes.values():
            if not entry.present:
                continue
            new = self._node_groups_for(entry.labels)
            if new == entry.node_groups:
                continue
            before = _placement(entry)
            for g in entry.node_groups:
                self._node_into_node_group(entry, g, -1)
                self._touched_node_group(g, news=True)
            entry.node_groups = new
            for g in new:
                self._node_into_node_group(entry, g, +1)
                self._touched_node_group(g, news=True)
            self._move_node_workloads(entry, before, _placement(entry))

    def _node_into_node_group(self, entry: NodeEntry, key: NodeGroupKey, sign: int, prune: bool = True) -> None:
        agg = self.node_groups.get(key)
        if agg is None:
            agg = self.node_groups[key] = NodeGroupAgg(*key)
            self._restructured()
        node_into(agg, entry, sign, self.revision)
        if sign > 0 and not agg.rollout_changed and entry.rollout in ROLLING:
            agg.rollout_changed = self.nodeclaims.now()  # first seen here (a start, a new summarizer)
        self._touched_node_group(key)
        if prune:
            self._prune_node_group(key)

    def _rollout_moved(self, keys: Iterable[NodeGroupKey]) -> None:
        now = self.nodeclaims.now()
        for key in keys:
            agg = self.node_groups.get(key)
            if agg is not None:
                agg.rollout_changed = now

    def _prune_node_group(self, key: NodeGroupKey) -> None:
        agg = self.node_groups.get(key)
        if agg is not None and agg.nodes == 0:
            del self.node_groups[key]
            self._restructured()

    def _move_node_workloads(self, entry: NodeEntry, old: Placement, new: Placement) -> None:
        """The node's node groups or state changed: every workload with pods on it moves its counts."""
        if old == new:
            return
        for uid in {p.workload for k in entry.pods if (p := self.pods[k]).phase not in TERMINATED}:
            if uid is None:
                continue
            agg = self.workloads[uid]
            pods = agg.node_pods[entry.name]
            _node_in_workload(agg, old, pods, True, -1)
            _node_in_workload(agg, new, pods, True, +1)
            agg.revision = next(self.revision)
            self._touched_workload(uid, news=True)

    # ---------------------------------------------------------------------------- pods

    def upsert_pod(self, pod: Pod) -> str:
        """The pod as it is now; its key."""
        meta = pod.metadata
        key = object_key(meta)
        ref = meta.controller_ref()
        parent = share(ref.uid) if ref else None  # strings many pods repeat: held once
        group = pod.spec.pod_group()
        if group is not None:
            self._grouped[key] = grouped = (share(named(POD_GROUP, meta.namespace, group)[0]), parent)
            parent = grouped[0] if self.follow_pod_groups else parent
        elif self._grouped:
            self._grouped.pop(key, None)
        phase = _PHASE.get(pod.status.phase, "Unknown")
        requests = () if phase in TERMINATED else pod_requests(pod.spec)
        devices = () if phase in TERMINATED else unhealthy_devices(pod.status)
        labels = self._label_matches(meta.labels)
        gang = self._gang_member(meta.namespace, meta.labels, group) if self._gang_member is not None else None
        ready = gang is not None and pod.ready()
        old = self.pods.get(key)
        if old is not None and old.devices == devices and old.gang == gang and old.ready == ready \
                and self._alike_but_phase(old, meta.uid, pod.spec.nodeName, requests, labels, parent, phase):
            if old.phase != phase:  # a phase change alone (it neither starts nor stops holding its node)
                self._move_phase(old, phase)
            return key  # most pod updates: conditions, container states, IPs
        if self.blocking_pods and (blocked := self.blocking_pods.get(key)) is not None \
                and (pod.spec.nodeName != blocked or phase in TERMINATED):
            self._set_block(blocked, None)  # it no longer holds that node
        entry = PodEntry(key, meta.uid, share(pod.spec.nodeName), phase, requests, labels, devices, gang, ready)
        if old is not None:
            del self.pods[key]  # out of the table first: graph callbacks must not see it
            self._detach_pod(old)
            if old.uid != meta.uid:  # deleted and recreated under the same name (StatefulSet)
                self.graph.delete(old.uid)
        if ref is not None:
            self._saw_owner_kind(ref.apiVersion, ref.kind)
        res = self.graph.upsert(meta.uid, POD, share(meta.namespace), key, parent)
        entry.workload, entry.status = self._pod_workload(res, meta.namespace, entry.labels)
        self.pods[key] = entry
        self._attach_pod(entry)
        return key

    def _alike_but_phase(self, old: PodEntry, uid: str, node: str, requests: Vector, labels: LabelMatches,
                         parent: str | None, phase: str) -> bool:
        """Everything an aggregate counts of the pod but its phase is as it was: the same pod (UID)
        under the same controller owner, on the same node, with the same requests and label values
        (its workload follows from the owner and the labels), still holding its node or not."""
        vertex = self.graph.vertices.get(old.uid)
        return (old.uid == uid and old.node == node and old.requests == requests
                and (old.phase in TERMINATED) == (phase in TERMINATED)
                and old.labels == labels and vertex is not None and vertex.parent == parent)

    def _move_phase(self, entry: PodEntry, phase: str) -> None:
        """The pod's phase alone changes: only the phase counts move (its requests, node and
        workload stay), without taking the pod out and putting it back."""
        if entry.gang is not None and entry.workload is not None:  # its gang counts phases apart
            self._gang_in(self.workloads[entry.workload], entry, -1)
        before, entry.phase = entry.phase, phase
        if entry.gang is not None and entry.workload is not None:
            self._gang_in(self.workloads[entry.workload], entry, +1)
        node = self.nodes.get(entry.node) if entry.node else None
        if node is not None:
            move_phase(node.pod_phases, before, phase)
            for g in node.node_groups:
                group = self.node_groups[g]
                move_phase(group.pods, before, phase)
                group.revision = next(self.revision)
                self._touched_node_group(g)
            self.kueue.pod_phase(node, before, phase)
        if entry.workload is not None:
            workload = self.workloads[entry.workload]
            move_phase(workload.pods, before, phase)
            workload.revision = next(self.revision)
            self._touched_workload(workload.uid)

    def delete_pod(self, key: str) -> None:
        entry = self.pods.pop(key, None)
        if entry is None:
            return
        if (blocked := self.blocking_pods.get(key)) is not None:
            self._set_block(blocked, None)
        self._detach_pod(entry)
        self.graph.delete(entry.uid)
        self._grouped.pop(key, None)
        if entry.gang is not None and entry.node and entry.phase not in TERMINATED and entry.workload is not None:
            self._departed(entry)

    def _label_matches(self, labels: dict[str, str]) -> LabelMatches:
        """O(configured keys), whatever the number of the pod's labels."""
        if not self.label_types:
            return ()
        return tuple((key, value) for key in self.label_types if (value := labels.get(key)))

    def _pod_workload(self, res: Resolution, namespace: str, labels: LabelMatches) -> tuple[str | None, str]:
        """The pod's root workload. An owner of a configured kind wins; else the first configured
        pod label names one (not below a broken chain: the missing owner may be the workload)."""
        if res.workload is not None:
            return res.workload, res.status
        if labels and res.status not in FAILURES:
            label, value = labels[0]
            uid = label_workload_uid(label, namespace, value)
            if uid not in self.workloads:
                self.workloads[uid] = WorkloadAgg(uid, namespace, value, "", "", label_key=label)
                self._restructured()
            return uid, res.status
        return None, res.status

    def _attach_pod(self, entry: PodEntry) -> None:
        self._pod_on_node(entry, +1)
        self._pod_in_workload(entry, +1)

    def _detach_pod(self, entry: PodEntry) -> None:
        self._pod_on_node(entry, -1)
        self._pod_in_workload(entry, -1)

    def _pod_on_node(self, entry: PodEntry, sign: int) -> None:
        if not entry.node:
            return
        node = self.nodes.get(entry.node)
        if node is None:
            node = self.nodes[entry.node] = NodeEntry(entry.node)
        bump(node.pod_phases, entry.phase, sign)
        add(node.pod_requests, entry.requests, sign)
        if entry.devices:
            add(node.pod_devices, entry.devices, sign)
            node.pods_with_unhealthy_devices += sign
        if sign > 0:
            node.pods.add(entry.key)
        else:
            node.pods.discard(entry.key)
        for g in node.node_groups:
            pod_into(self.node_groups[g], entry.phase, entry.requests, entry.devices, sign, self.revision)
            self._touched_node_group(g)
        self.kueue.pod(node, entry.phase, entry.requests, entry.devices, sign)
        if not node.present and not node.pods:
            del self.nodes[entry.node]
            self._gone_places.pop(entry.node, None)

    def _pod_in_workload(self, entry: PodEntry, sign: int) -> None:
        if entry.workload is None:
            bump(self.unresolved, entry.status, sign)
            return
        if entry.status in FAILURES:  # a workload below a missing owner
            bump(self.chain_broken, entry.status, sign)
        agg = self.workloads[entry.workload]
        bump(agg.pods, entry.phase, sign)
        if entry.gang is not None:
            self._gang_in(agg, entry, sign)
        if entry.devices:
            add(agg.devices_unhealthy, entry.devices, sign)
            agg.pods_with_unhealthy_devices += sign
        if entry.node and entry.phase not in TERMINATED:
            before = agg.node_pods.get(entry.node, 0)
            bump(agg.node_pods, entry.node, sign)
            distinct = (before == 0) != (before + sign == 0)  # the workload starts or stops using this node
            node = self.nodes.get(entry.node)
            # (a node at risk but Ready: its NodeClaim a candidate, or Karpenter disrupting it)
            if node is not None and (distinct or node.state != READY or node.candidate or node.rollout == DISRUPTING):
                _node_in_workload(agg, _placement(node), 1, distinct, sign)
        agg.revision = next(self.revision)
        self._touched_workload(agg.uid)
        if not agg.pods and not (agg.is_object and self._is_root(agg.uid)):
            del self.workloads[agg.uid]
            self._restructured()

    # ---------------------------------------------------------------------------- gangs

    def _gang_in(self, agg: WorkloadAgg, entry: PodEntry, sign: int) -> None:
        """Add (sign +1) or take back a pod's share of its gang: O(1)."""
        member = entry.gang
        assert member is not None
        gang = agg.gangs.get(member.key)
        if gang is None:
            if sign < 0:
                return
            gang = agg.gangs[member.key] = Gang(member)
            if member.source:
                self._gang_homes.setdefault(member.source, set()).add((agg.uid, member.key))
        gang.entries += sign
        if member.declared is not None:
            bump(gang.declared, member.declared, sign)
        if entry.phase == "Succeeded":
            gang.succeeded += sign
        elif entry.phase != "Failed":
            gang.pods += sign
            if entry.node:
                gang.scheduled += sign
                bump(self._gang_nodes, entry.node, sign)
                if sign > 0:
                    entry.gang_place = self._member_stance(entry)
                    node = self.nodes.get(entry.node)
                    entry.gang_risk = node is not None and node.present and _risk(node) is not None
                if entry.gang_risk:
                    gang.at_risk += sign
                if entry.gang_place is True:
                    gang.ready += sign
                elif entry.gang_place is not False:
                    bump(gang.lost, entry.gang_place, sign)
                    gang.lost_members += sign
        if gang.entries == 0:
            self._forget_gang(agg, gang)
        else:
            self._judge(agg, gang)

    def _member_stance(self, entry: PodEntry) -> Place | bool:
        """A bound, unfinished member: ready (True), starting (False), or lost where it is."""
        node = self.nodes.get(entry.node)
        if node is None or not node.present or node.ready != READY:
            return self._place(entry.node)
        if entry.ready:
            return True
        return self._place(entry.node) if entry.phase == "Running" else False

    def _place(self, name: str) -> Place:
        """Where a node is, for a gang's lost members: its node groups and its topology label's value."""
        node = self.nodes.get(name)
        if node is None or not node.present:
            return self._gone_places.get(name, ((), ""))  # a node deleted under its members: where it was
        return node.node_groups, node.labels.get(self.gang_topology_label, "")

    def _required(self, gang: Gang) -> int | None:
        if gang.source:
            return self.gang_sizes.get(gang.source)
        return max(gang.declared) if gang.declared else None

    def _judge(self, agg: WorkloadAgg, gang: Gang) -> None:
        short = gang.judge(self._required(gang), self.now)
        home = (agg.uid, gang.key)
        if short and not gang.broken:  # the tick's to time
            self._short[home] = gang.short_since or 0.0
        else:
            self._short.pop(home, None)

    def _forget_gang(self, agg: WorkloadAgg, gang: Gang) -> None:
        del agg.gangs[gang.key]
        self._short.pop((agg.uid, gang.key), None)
        if gang.source:
            homes = self._gang_homes.get(gang.source)
            if homes is not None:
                homes.discard((agg.uid, gang.key))
                if not homes:
                    del self._gang_homes[gang.source]

    def _departed(self, entry: PodEntry) -> None:
        """A bound, unfinished gang member was deleted: where it was, until its gang is whole again."""
        assert entry.gang is not None and entry.workload is not None
        agg = self.workloads.get(entry.workload)
        gang = agg.gangs.get(entry.gang.key) if agg is not None else None
        if agg is None or gang is None:
            return
        place = entry.gang_place if isinstance(entry.gang_place, tuple) else self._place(entry.node)
        bump(gang.departed, place, +1)
        self._judge(agg, gang)

    def _replace_gang_members(self, name: str) -> None:
        """The node's readiness or place changed: its gang members are counted again. O(pods on it),
        only for a node holding gang members."""
        node = self.nodes.get(name)
        if node is None or not self._gang_nodes.get(name):
            return
        for key in node.pods:
            entry = self.pods[key]
            if entry.gang is not None and entry.workload is not None and entry.phase not in TERMINATED:
                agg = self.workloads[entry.workload]
                self._gang_in(agg, entry, -1)
                self._gang_in(agg, entry, +1)
                agg.revision = next(self.revision)
                self._touched_workload(agg.uid)

    def set_gang_size(self, source: str, size: int | None) -> None:
        """A PodGroup's, JobSet's or LeaderWorkerSet's gang size (None: gone, or no gang): its gangs
        are judged again. O(its gangs)."""
        if self.gang_sizes.get(source) == size:
            return
        if size is None:
            self.gang_sizes.pop(source, None)
        else:
            self.gang_sizes[source] = size
        for uid, key in list(self._gang_homes.get(source, ())):
            agg = self.workloads.get(uid)
            gang = agg.gangs.get(key) if agg is not None else None
            if agg is not None and gang is not None:
                self._judge(agg, gang)
                agg.revision = next(self.revision)
                self._touched_workload(uid)

    # ---------------------------------------------------------------------------- owners

    def upsert_owner(self, gk: GroupKind, namespace: str, name: str, uid: str,
                     controller: tuple[str, str, str] | None) -> None:
        """An owner object (metadata only). ``controller`` is its controller ownerReference as
        (apiVersion, kind, uid)."""
        key = key_of(namespace, name)
        previous = self.owner_uids.get((gk, key))
        if previous is not None and previous != uid:
            self.graph.delete(previous)
        self.owner_uids[(gk, key)] = uid
        if controller is not None:
            self._saw_owner_kind(controller[0], controller[1])
        self.graph.upsert(uid, gk, namespace, key, controller[2] if controller else None)
        if gk == SCHEDULING_WORKLOAD:  # PodGroups name their Workload
            self._name(gk, namespace, name, uid)

    def delete_owner(self, gk: GroupKind, key: str) -> None:
        uid = self.owner_uids.pop((gk, key), None)
        if uid is not None:
            self.graph.delete(uid)
            if gk == SCHEDULING_WORKLOAD:
                self._unname(gk, *split_key(key))

    # ---------------------------------------------------------------------------- PodGroups

    def upsert_pod_group(self, group: PodGroup) -> None:
        """An in-tree PodGroup: its pods' parent (while ``follow_pod_groups``), whose own parent is
        its Workload (by name) or, naming none, its controller owner."""
        meta = group.metadata
        key = object_key(meta)
        old = self.pod_groups.get(key)
        if old is not None and old.uid != meta.uid:
            self.graph.delete(old.uid)
        workload = group.workload()
        ref = meta.controller_ref()
        parent = (named(SCHEDULING_WORKLOAD, meta.namespace, workload)[0] if workload
                  else ref.uid if ref is not None else None)
        self.pod_groups[key] = PodGroupEntry(meta.uid, workload, group.min_count())
        self.graph.upsert(meta.uid, POD_GROUP, meta.namespace, key, parent)
        self._name(POD_GROUP, meta.namespace, meta.name, meta.uid)
        self.set_gang_size(source_key(PODGROUP, meta.namespace, meta.name), group.min_count())

    def delete_pod_group(self, key: str) -> None:
        entry = self.pod_groups.pop(key, None)
        if entry is not None:
            self.graph.delete(entry.uid)
            self._unname(POD_GROUP, *split_key(key))
            self.set_gang_size(source_key(PODGROUP, *split_key(key)), None)

    def set_follow_pod_groups(self, follow: bool) -> None:
        """Whether pods that name a PodGroup hang below it (the PodGroups are watched and listed)
        or below their controller owner (they are not: forbidden, or served at no version read).
        O(pods that name a group), on the rare change."""
        if follow == self.follow_pod_groups:
            return
        self.follow_pod_groups = follow
        for key, (group, owner) in self._grouped.items():
            entry = self.pods[key]
            vertex = self.graph.vertices[entry.uid]
            self.graph.upsert(entry.uid, POD, vertex.namespace, key, group if follow else owner)

    def _name(self, gk: GroupKind, namespace: str, name: str, uid: str) -> None:
        vertex, kind = named(gk, namespace, name)
        self.graph.upsert(vertex, kind, namespace, key_of(namespace, name), uid)

    def _unname(self, gk: GroupKind, namespace: str, name: str) -> None:
        self.graph.delete(named(gk, namespace, name)[0])

    def _saw_owner_kind(self, api_version: str, kind: str) -> None:
        if (api_version, kind) not in self.owner_kinds:
            self.owner_kinds.add((api_version, kind))
            if self.on_owner_kind is not None:
                self.on_owner_kind(api_version, kind)

    def _is_root(self, uid: str) -> bool:
        res = self.graph.resolution(uid)
        return res is not None and res.workload == uid

    def _on_resolution(self, vertex: Vertex, old: Resolution, new: Resolution) -> None:
        """The graph changed a vertex's answer: keep roots and pods' workloads in step."""
        if vertex.gk == POD:
            entry = self.pods.get(vertex.key)
            if entry is not None and entry.uid == vertex.uid:  # not the pod being upserted right now
                self._pod_in_workload(entry, -1)
                entry.workload, entry.status = self._pod_workload(new, vertex.namespace, entry.labels)
                self._pod_in_workload(entry, +1)
            return
        was_root, is_root = old.workload == vertex.uid, new.workload == vertex.uid
        if is_root and not was_root:
            stamp = next(self.revision)
            if vertex.uid not in self.workloads:
                namespace, name = split_key(vertex.key)
                self.workloads[vertex.uid] = WorkloadAgg(vertex.uid, namespace, name, *vertex.gk, revision=stamp)
                self._restructured()
        elif was_root and not is_root:
            agg = self.workloads.get(vertex.uid)
            if agg is not None and not agg.pods:
                del self.workloads[vertex.uid]
                self._restructured()  # the set of workloads changed

    # ---------------------------------------------------------------------------- Karpenter's blockers

    def upsert_blocked_event(self, event: DisruptionEvent, now: float) -> None:
        """Karpenter's DisruptionBlocked Event on a Node (disruption.py); ``now``: wall time. A note
        naming a pod, a PDB or the node's annotation is the node's blocker, unless an Event newer
        than it said another; any other note, or a word older than BLOCKER_TTL, is none."""
        key = object_key(event.metadata)
        when = observed(event)
        blocker = parse_blocker(event.note) if event.reason == BLOCKED_REASON and event.regarding.kind == NODE \
            else None
        if blocker is None or when is None or now - when > BLOCKER_TTL:
            self.delete_blocked_event(key)
            return
        name = event.regarding.name
        current = self.node_blocks.get(name)
        if current is not None and (current.observed > when or (current.event == key and current.observed == when)):
            return  # an older word than the one that holds, or the same one again
        entry = self.nodes.get(name)
        if entry is not None and entry.present and entry.state == NODE_DISRUPTING:
            return  # Karpenter has chosen it since
        self._set_block(name, Block(key, when, blocker))

    def delete_blocked_event(self, key: str) -> None:
        name = self._block_events.get(key)
        if name is not None:
            self._set_block(name, None)

    def expire_blocks(self, now: float) -> None:
        """Drop the blockers Karpenter has not said again for BLOCKER_TTL. O(blocked nodes)."""
        for name in [n for n, b in self.node_blocks.items() if now - b.observed > BLOCKER_TTL]:
            self._set_block(name, None)

    def _forget_block(self, name: str) -> None:
        """The node's blocker data gone (its entry's ``blocker`` is the caller's to move)."""
        block = self.node_blocks.pop(name, None)
        if block is not None:
            self._block_events.pop(block.event, None)
            if block.blocker.pod_key:
                self.blocking_pods.pop(block.blocker.pod_key, None)

    def _set_block(self, name: str, block: Block | None) -> None:
        old = self.node_blocks.get(name)
        self._forget_block(name)
        if block is not None:
            self.node_blocks[name] = block
            self._block_events[block.event] = name
            if block.blocker.pod_key:
                self.blocking_pods[block.blocker.pod_key] = name
        entry = self.nodes.get(name)
        blocker = block.blocker if block is not None else None
        if entry is not None and entry.present and entry.blocker != blocker:
            self._refresh_node(entry, lambda: self._set_blocker(entry, blocker))
        if block is not None and (old is None or old.blocker != block.blocker or old.observed < block.observed):
            self._notice_blocker(name, block.blocker)

    @staticmethod
    def _set_blocker(entry: NodeEntry, blocker: Blocker | None) -> None:
        entry.blocker = blocker

    def _notice_disrupting(self, entry: NodeEntry) -> None:
        """The node is being disrupted: a notice for each workload with pods holding it."""
        if not self.notices.enabled:
            return
        pool = entry.labels.get(NODEPOOL_LABEL, "")
        for uid in sorted({p.workload for k in entry.pods if (p := self.pods[k]).phase not in TERMINATED
                           and p.workload is not None}):
            self.notices.add(Notice(uid, entry.name, pool))

    def _notice_blocker(self, name: str, blocker: Blocker) -> None:
        """The node is held by ``blocker`` while Karpenter wants to disrupt it (its NodeClaim a
        candidate: drifted, expiring, consolidatable): a notice for its workload (a pod's), or those
        of the PDB's namespace with pods on the node (the PDB's selector is not read)."""
        entry = self.nodes.get(name)
        if not self.notices.enabled or entry is None or (entry.rollout and not entry.candidate):
            return  # nothing wants to disrupt it: it holds no rollout (its NodeClaim unknown: it may)
        uids: set[str] = set()
        if blocker.kind == POD_BLOCKER:
            pod = self.pods.get(blocker.pod_key)
            if pod is not None and pod.workload is not None:
                uids.add(pod.workload)
        elif blocker.kind == PDB:
            uids = {p.workload for k in entry.pods if split_key(k)[0] == blocker.namespace
                    and (p := self.pods[k]).workload is not None and p.phase not in TERMINATED}
        pool = entry.labels.get(NODEPOOL_LABEL, "")
        for uid in sorted(uids):
            self.notices.add(Notice(uid, name, pool, blocker))
