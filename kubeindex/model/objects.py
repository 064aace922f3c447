"""Typed projections of API objects: only the fields the index uses, decoded straight from the
response bytes by msgspec (unknown fields such as managedFields are skipped, never materialized).
"""

from __future__ import annotations

import sys
from typing import Any

import msgspec
from msgspec import Struct, field


class OwnerReference(Struct, frozen=True):
    apiVersion: str
    kind: str
    name: str
    uid: str
    controller: bool = False


class ObjectMeta(Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""
    generation: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    ownerReferences: list[OwnerReference] = field(default_factory=list)

    def controller_ref(self) -> OwnerReference | None:
        for ref in self.ownerReferences:
            if ref.controller:
                return ref
        return None


# -- Nodes ---------------------------------------------------------------------------------------

class NodeCondition(Struct):
    type: str
    status: str = "Unknown"


class Taint(Struct):
    key: str
    effect: str = ""


class NodeSpec(Struct):
    unschedulable: bool = False
    taints: list[Taint] = field(default_factory=list)


class NodeStatus(Struct):
    allocatable: dict[str, str] = field(default_factory=dict)
    capacity: dict[str, str] = field(default_factory=dict)
    conditions: list[NodeCondition] = field(default_factory=list)


class Node(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: NodeSpec = field(default_factory=NodeSpec)
    status: NodeStatus = field(default_factory=NodeStatus)

    def ready(self) -> str:
        """"Ready", "NotReady" or "Unknown" from the Ready condition (no condition: Unknown)."""
        for cond in self.status.conditions:
            if cond.type == "Ready":
                return {"True": "Ready", "False": "NotReady"}.get(cond.status, "Unknown")
        return "Unknown"


# -- Pods ----------------------------------------------------------------------------------------

class Resources(Struct):
    requests: dict[str, str] = field(default_factory=dict)


class Container(Struct):
    resources: Resources = field(default_factory=Resources)
    restartPolicy: str | None = None  # "Always" on an init container marks a sidecar


class PodSchedulingGroup(Struct):
    podGroupName: str | None = None


class PodSpec(Struct):
    nodeName: str = ""
    containers: list[Container] = field(default_factory=list)
    initContainers: list[Container] = field(default_factory=list)
    overhead: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)  # pod-level (PodLevelResources, 1.32+)
    schedulingGroup: PodSchedulingGroup | None = None  # 1.36+: the PodGroup it belongs to

    def pod_group(self) -> str | None:
        """The name of the PodGroup (in the pod's namespace) it names, if any."""
        group = self.schedulingGroup
        return (group.podGroupName or None) if group is not None else None


class ResourceHealth(Struct):
    health: str = ""  # Healthy | Unhealthy | Unknown


class ResourceStatus(Struct):
    """A resource's devices allocated to a container, with their health (KEP-4680: the kubelet
    writes it from the device plugin's or DRA driver's reports; beta in 1.36)."""

    name: str = ""
    resources: list[ResourceHealth] = field(default_factory=list)


class ContainerStatus(Struct, gc=False):
    allocatedResourcesStatus: list[ResourceStatus] = field(default_factory=list)


class PodCondition(Struct, gc=False):
    type: str = ""
    status: str = ""


class PodStatus(Struct):
    phase: str = "Pending"
    conditions: list[PodCondition] = field(default_factory=list)  # read for gang members (Ready)
    initContainerStatuses: list[ContainerStatus] = field(default_factory=list)
    containerStatuses: list[ContainerStatus] = field(default_factory=list)


class Pod(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: PodSpec = field(default_factory=PodSpec)
    status: PodStatus = field(default_factory=PodStatus)

    def ready(self) -> bool:
        """Its Ready condition is True."""
        for c in self.status.conditions:
            if c.type == "Ready":
                return c.status == "True"
        return False


# -- Karpenter's DisruptionBlocked Events (events.k8s.io/v1): kubeindex/model/disruption.py --------

class EventRegarding(Struct):
    kind: str = ""
    name: str = ""


class EventSeries(Struct):
    count: int = 0
    lastObservedTime: str | None = None


class DisruptionEvent(Struct):
    """What is read of an Event Karpenter publishes on a Node: whom, what, when."""

    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    regarding: EventRegarding = field(default_factory=EventRegarding)
    reason: str = ""
    note: str = ""
    eventTime: str | None = None
    series: EventSeries | None = None
    deprecatedFirstTimestamp: str | None = None
    deprecatedLastTimestamp: str | None = None


# -- Owners (metadata only) and summarizers ------------------------------------------------------

class PartialObject(Struct):
    """PartialObjectMetadata: what a metadata-only list/watch of an owner kind returns."""

    metadata: ObjectMeta = field(default_factory=ObjectMeta)


class WorkloadType(Struct, frozen=True):
    kind: str
    group: str = ""
    version: str | None = None
    shortType: str | None = None


class PodLabelWorkload(Struct, frozen=True):
    """A pod label whose values name workloads (a gang scheduler's or operator's group label)."""

    labelKey: str
    shortType: str | None = None


class NodeSummarizerSpec(Struct):
    labelKey: str = ""


class NodeSummarizer(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: NodeSummarizerSpec = field(default_factory=NodeSummarizerSpec)
    status: dict[str, Any] = field(default_factory=dict)


class GangPodLabels(Struct, frozen=True):
    """A pod-label gang: the label whose value names the gang, and the one holding its minimum."""

    labelKey: str
    minAvailableLabelKey: str = ""


class WorkloadGangs(Struct, frozen=True):
    """A WorkloadSummarizer's spec.gangs: which gangs its workloads are judged by (gangs.py)."""

    kinds: tuple[str, ...] = ()  # of gangs.GANG_KINDS
    podLabels: tuple[GangPodLabels, ...] = ()


class WorkloadSummarizerSpec(Struct):
    workloadTypes: list[WorkloadType] = field(default_factory=list)
    podLabelWorkloads: list[PodLabelWorkload] = field(default_factory=list)
    gangs: WorkloadGangs | None = None


class WorkloadSummarizer(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: WorkloadSummarizerSpec = field(default_factory=WorkloadSummarizerSpec)
    status: dict[str, Any] = field(default_factory=dict)


# -- Kueue (kueue.x-k8s.io, v1beta2 or v1beta1): flavors and the quotas ClusterQueues give them -------
#
# The fields read here are the same in both versions but for MultiKueueCluster's kubeconfig (see
# below): one projection per kind serves both. Each kind is read, and written, at the version the
# API server prefers among KUEUE_VERSIONS (kubeindex/watch/discovery.py).

class ResourceFlavorSpec(Struct):
    nodeLabels: dict[str, str] = field(default_factory=dict)  # none: every node (as Kueue)


class ResourceFlavor(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: ResourceFlavorSpec = field(default_factory=ResourceFlavorSpec)


class ResourceQuota(Struct):
    name: str
    nominalQuota: str | int = 0  # int-or-string in the CRD
    lendingLimit: str | int | None = None  # the claims never write below it (Kueue's webhook refuses that)


class FlavorQuotas(Struct):
    name: str
    resources: list[ResourceQuota] = field(default_factory=list)


class ResourceGroup(Struct):
    flavors: list[FlavorQuotas] = field(default_factory=list)


class ClusterQueueSpec(Struct):
    resourceGroups: list[ResourceGroup] = field(default_factory=list)


class ClusterQueue(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: ClusterQueueSpec = field(default_factory=ClusterQueueSpec)
    apiVersion: str = ""  # as read: the claims patch the queue at that version (its field paths)


class KubeConfigLocation(Struct):
    location: str = ""  # a Secret's name in Kueue's namespace (key "kubeconfig"), or a file path
    locationType: str = "Secret"  # Secret | Path


class ClusterProfileRef(Struct):
    name: str = ""  # a ClusterProfile (SIG-Multicluster) in Kueue's namespace


class ClusterSource(Struct):
    kubeConfig: KubeConfigLocation | None = None
    clusterProfileRef: ClusterProfileRef | None = None


class MultiKueueClusterSpec(Struct):
    kubeConfig: KubeConfigLocation | None = None  # v1beta1
    clusterSource: ClusterSource = field(default_factory=ClusterSource)  # v1beta2: kubeConfig or clusterProfileRef

    def kubeconfig(self) -> KubeConfigLocation | None:
        """Where the member's kubeconfig is, in either version's shape; None: not by kubeconfig."""
        return self.clusterSource.kubeConfig or self.kubeConfig

    def profile(self) -> str:
        """The ClusterProfile naming the member (v1beta2's clusterProfileRef), or ""."""
        ref = self.clusterSource.clusterProfileRef
        return ref.name if ref is not None and self.kubeconfig() is None else ""


class MultiKueueCluster(Struct):
    """A MultiKueue worker cluster: a fleet hub's member (kubeindex/watch/fleet.py)."""

    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: MultiKueueClusterSpec = field(default_factory=MultiKueueClusterSpec)


KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")  # the versions this service reads and writes, newest first
KUEUE_VERSION = "v1beta1"  # the version bench.fleet writes its objects at (demo.kueue's default cell)


# -- The in-tree Workload API (scheduling.k8s.io; Kubernetes 1.37+, behind GenericWorkload) --------
#
# A Workload holds PodGroup templates; a PodGroup (its runtime instance) names its Workload in
# spec.workloadRef and, for a gang, the minimum in spec.schedulingPolicy.gang.minCount; a pod names
# its PodGroup in spec.schedulingGroup.podGroupName. Read at v1beta1 only: 1.36's alpha
# (v1alpha2) names the Workload elsewhere (spec.podGroupTemplateRef.workload).

SCHEDULING_GROUP = "scheduling.k8s.io"
SCHEDULING_VERSIONS = ("v1beta1",)


class WorkloadReference(Struct):
    workloadName: str = ""
    templateName: str = ""


class GangSchedulingPolicy(Struct):
    minCount: int = 0


class PodGroupSchedulingPolicy(Struct):
    gang: GangSchedulingPolicy | None = None  # None: the basic policy (no minimum)


class PodGroupSpec(Struct):
    workloadRef: WorkloadReference | None = None
    schedulingPolicy: PodGroupSchedulingPolicy = field(default_factory=PodGroupSchedulingPolicy)


class PodGroup(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: PodGroupSpec = field(default_factory=PodGroupSpec)

    def workload(self) -> str:
        """The name of its Workload (same namespace); "" when it names none."""
        ref = self.spec.workloadRef
        return ref.workloadName if ref is not None else ""

    def min_count(self) -> int | None:
        """A gang's minimum number of pods; None for the basic policy."""
        gang = self.spec.schedulingPolicy.gang
        return gang.minCount if gang is not None else None


# -- What sizes a JobSet's and a LeaderWorkerSet's gang (read in full while spec.gangs lists the kind) --

class JobSpecSizes(Struct):
    parallelism: int | None = None  # the Job's default: 1
    completions: int | None = None


class JobTemplate(Struct):
    spec: JobSpecSizes = field(default_factory=JobSpecSizes)


class ReplicatedJob(Struct):
    replicas: int = 1
    template: JobTemplate = field(default_factory=JobTemplate)


class JobSetSpec(Struct):
    replicatedJobs: list[ReplicatedJob] = field(default_factory=list)


class JobSet(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: JobSetSpec = field(default_factory=JobSetSpec)

    def gang_size(self) -> int:
        """Its pods that run at once: per replicated Job, replicas x min(parallelism, completions)."""
        total = 0
        for job in self.spec.replicatedJobs:
            sizes = job.template.spec
            parallelism = 1 if sizes.parallelism is None else sizes.parallelism
            if sizes.completions is not None:
                parallelism = min(parallelism, sizes.completions)
            total += job.replicas * parallelism
        return total


class LeaderWorkerTemplate(Struct):
    size: int = 1  # a group's pods: the leader and its workers


class LeaderWorkerSetSpec(Struct):
    leaderWorkerTemplate: LeaderWorkerTemplate = field(default_factory=LeaderWorkerTemplate)


class LeaderWorkerSet(Struct):
    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: LeaderWorkerSetSpec = field(default_factory=LeaderWorkerSetSpec)

    def gang_size(self) -> int:
        return self.spec.leaderWorkerTemplate.size


# -- Karpenter's NodeClaims (karpenter.sh/v1): a pool's rollout and its disruption candidates ------
#
# One NodeClaim per node Karpenter launched (docs/karpenter.md#nodeclaim). Only what the index reads:
# the node it became, whether it is being deleted, when it expires, and its conditions by type,
# reason and status (Drifted, Consolidatable, DisruptionReason; a reader of another condition or of
# an annotation adds its field here).

class NodeClaimMeta(Struct):
    name: str = ""
    namespace: str = ""  # none (cluster-scoped): the reflector's store key reads it
    resourceVersion: str = ""
    creationTimestamp: str = ""  # with spec.expireAfter: when Karpenter deletes it (no condition says so)
    deletionTimestamp: str = ""  # being deleted: drained and terminated


class NodeClaimCondition(Struct, gc=False):
    type: str = ""
    status: str = ""
    reason: str = ""


class NodeClaimSpec(Struct):
    expireAfter: str = ""  # a Go duration ("720h", "1h30m") or "Never"


class NodeClaimStatus(Struct):
    nodeName: str = ""  # set when its Node registered: the join to the Node
    conditions: list[NodeClaimCondition] = field(default_factory=list)


class NodeClaim(Struct):
    metadata: NodeClaimMeta = field(default_factory=NodeClaimMeta)
    spec: NodeClaimSpec = field(default_factory=NodeClaimSpec)
    status: NodeClaimStatus = field(default_factory=NodeClaimStatus)

    def is_true(self, kind: str) -> bool:
        return any(c.type == kind and c.status == "True" for c in self.status.conditions)


KARPENTER_GROUP = "karpenter.sh"


# -- A member cluster's NodeSummaries, as a fleet hub reads them ----------------------------------

class LabelSelector(Struct):
    matchLabels: dict[str, str] = field(default_factory=dict)


class NodeSummarySpec(Struct):
    selector: LabelSelector = field(default_factory=LabelSelector)


class NodeSummaryCapacity(Struct):
    allocatable: dict[str, str | int] = field(default_factory=dict)
    notReadyAllocatable: dict[str, str | int] = field(default_factory=dict)  # absent: every node Ready


class MemberNodeSummary(Struct):
    """Of a NodeSummary, what a hub needs: whose nodes (the selector) and the allocatable of the
    Ready ones (allocatable - notReadyAllocatable)."""

    metadata: ObjectMeta = field(default_factory=ObjectMeta)
    spec: NodeSummarySpec = field(default_factory=NodeSummarySpec)
    status: NodeSummaryCapacity = field(default_factory=NodeSummaryCapacity)


# -- ClusterResourceClaims (this project's group): capacity claimed, assigned to ClusterQueues ---

class ClaimMeta(Struct):
    name: str = ""
    namespace: str = ""  # none (cluster-scoped): the reflector's store key reads it
    resourceVersion: str = ""
    uid: str = ""
    generation: int = 0
    creationTimestamp: str = ""  # the older of two claims on one (cluster, flavor) counts


class ClusterResourceClaim(Struct):
    metadata: ClaimMeta = field(default_factory=ClaimMeta)
    spec: dict[str, Any] = field(default_factory=dict)  # whole: reconciler/quota.py parses it, naming each problem
    status: dict[str, Any] = field(default_factory=dict)  # whole: the controller compares it with the one it wants


class ClaimQueue(Struct):
    name: str = ""
    flavor: str = ""
    resources: dict[str, str] = field(default_factory=dict)


class Condition(Struct):
    type: str = ""
    status: str = ""
    reason: str | None = None


class SettledFor(Struct):
    clusterName: str = ""
    flavor: str = ""


class ClaimStatus(Struct):
    """What is read of a claim's status (the exporter's claim series, the controller's settle and
    Hold): its shape is the CRD's structural schema, quantities still text."""

    nominalResources: dict[str, str] = field(default_factory=dict)
    settledResources: dict[str, str] = field(default_factory=dict)
    settledFor: SettledFor | None = None
    pendingSince: str = ""
    assigned: dict[str, str] = field(default_factory=dict)
    shortfall: dict[str, str] = field(default_factory=dict)
    queues: list[ClaimQueue] = field(default_factory=list)
    conditions: list[Condition] = field(default_factory=list)

    def ready_reason(self) -> str | None:
        return next((c.reason for c in self.conditions if c.type == "Ready"), None)


def claim_status(claim: ClusterResourceClaim) -> ClaimStatus:
    """The claim's status, typed. One the schema would refuse (written past it, or by a test) reads
    as none at all: the controller then writes it afresh."""
    try:
        return msgspec.convert(claim.status, ClaimStatus, strict=False)
    except msgspec.ValidationError:
        return ClaimStatus()


# -- List and watch envelopes --------------------------------------------------------------------

class ListMeta(Struct):
    resourceVersion: str = ""
    # `continue` is a keyword: rename the attribute.
    continue_: str = field(default="", name="continue")


class RawEvent(Struct):
    type: str
    object: msgspec.Raw


class Status(Struct):
    """metav1.Status, as in a watch ERROR event or an error response."""

    code: int = 0
    reason: str = ""
    message: str = ""


class BookmarkMeta(Struct):
    resourceVersion: str = ""
    annotations: dict[str, str] = field(default_factory=dict)


class Bookmark(Struct):
    metadata: BookmarkMeta = field(default_factory=BookmarkMeta)


# This project's API group: the summarizers (read here) and the summaries (written by the reconciler).
GROUP = "ux.sean.example.com"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"


def _keep(value: str) -> str:
    return value


# One string object for equal strings held by many objects or structures (keys, namespaces, node
# names, owner UIDs). sys.intern lets go of a string nothing holds any more, except on CPython
# 3.12.0 to 3.12.5, where interned strings are immortal: there every key of every pod ever seen
# would stay, so strings are not shared (more memory per pod, no leak).
share = _keep if (3, 12, 0) <= sys.version_info[:3] < (3, 12, 6) else sys.intern


def key_of(namespace: str, name: str) -> str:
    """The store key of an object: "namespace/name", or the name of a cluster-scoped one."""
    return f"{namespace}/{name}" if namespace else name


def split_key(key: str) -> tuple[str, str]:
    namespace, _, name = key.rpartition("/")
    return namespace, name


def object_key(meta: ObjectMeta) -> str:
    """Interned: the reflector's store and the index keep one string per object, not two."""
    return share(key_of(meta.namespace, meta.name))


def group_of(api_version: str) -> str:
    """"apps/v1" -> "apps"; "v1" -> "" (the core group)."""
    return api_version.rpartition("/")[0]


# -- How a workload's type is written --------------------------------------------------------------

def long_type(group: str, kind: str, version: str) -> str:
    """`<kind in lower case>.<group>/<version>`, e.g. jobset.jobset.x-k8s.io/v1alpha2, or
    replicationcontroller/v1 in the core group: a WorkloadSummary's longType, a kind in messages."""
    return f"{kind.lower()}.{group}/{version}" if group else f"{kind.lower()}/{version}"


# A label workload's type stands where an owner's API group and kind would: no API group has a
# '/', so the two never meet (in a claim identity, a hashed name, a summarizer's listing).
LABEL_WORKLOAD_PREFIX = "label/"


def label_workload_type(label_key: str) -> str:
    """`label/<key>`: a label workload's longType, and the start of its claim identity."""
    return f"{LABEL_WORKLOAD_PREFIX}{label_key}"
