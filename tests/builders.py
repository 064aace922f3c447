"""Objects for unit tests, built in memory: nodes, pods, owner references, configured kinds, and
the label values property tests draw from."""

from __future__ import annotations

import re
from typing import TypedDict

from hypothesis import strategies as st

from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import (
    Container,
    ContainerStatus,
    Node,
    NodeClaim,
    NodeClaimCondition,
    NodeClaimMeta,
    NodeClaimSpec,
    NodeClaimStatus,
    NodeCondition,
    NodeSpec,
    NodeStatus,
    ObjectMeta,
    OwnerReference,
    Pod,
    PodCondition,
    PodLabelWorkload,
    PodSpec,
    PodStatus,
    ResourceHealth,
    Resources,
    ResourceStatus,
    Taint,
    WorkloadType,
)
from tests.reference import Owner

GPU = "nvidia.com/gpu"
DISRUPTED = Taint("karpenter.sh/disrupted", "NoSchedule")  # Karpenter's disruption taint

API_VERSIONS = {"apps": "apps/v1", "batch": "batch/v1", "jobset.x-k8s.io": "jobset.x-k8s.io/v1alpha2",
                "leaderworkerset.x-k8s.io": "leaderworkerset.x-k8s.io/v1", "": "v1"}


def ref(owner: Owner | tuple[str, str, str], name: str = "") -> OwnerReference:
    """A controller reference to an owner, or to (group, kind, uid)."""
    if isinstance(owner, Owner):
        return OwnerReference(API_VERSIONS[owner.group], owner.kind, owner.name, owner.uid, controller=True)
    group, kind, uid = owner
    return OwnerReference(API_VERSIONS[group], kind, name or uid, uid, controller=True)


class NodeFields(TypedDict, total=False):
    """make_node's keyword arguments, for a test that keeps them in a dict."""

    ready: str | None
    unschedulable: bool
    allocatable: dict[str, str] | None
    capacity: dict[str, str] | None
    taints: list[Taint] | None
    conditions: dict[str, str] | None


def make_node(name: str, labels: dict[str, str], ready: str | None = "True", unschedulable: bool = False,
              allocatable: dict[str, str] | None = None, capacity: dict[str, str] | None = None,
              taints: list[Taint] | None = None, conditions: dict[str, str] | None = None) -> Node:
    """A node; ``ready=None`` leaves out the Ready condition; ``conditions``: more, type -> status;
    ``capacity`` defaults to the allocatable."""
    alloc = allocatable if allocatable is not None else {"cpu": "4", "memory": "16Gi", "pods": "110"}
    conds = [NodeCondition(t, v) for t, v in (conditions or {}).items()]
    if ready is not None:
        conds.insert(0, NodeCondition("Ready", ready))
    return Node(
        ObjectMeta(name=name, uid=f"uid-{name}", labels=dict(labels)),
        NodeSpec(unschedulable=unschedulable, taints=list(taints or [])),
        NodeStatus(allocatable=alloc, capacity=capacity if capacity is not None else alloc, conditions=conds),
    )


def make_nodeclaim(name: str, node: str = "", conditions: dict[str, str] | None = None, deleting: bool = False,
                   created: str = "2026-01-01T00:00:00Z", expire_after: str = "720h") -> NodeClaim:
    """A Karpenter NodeClaim of ``node`` ("" before its Node registered); ``conditions``: type -> status
    (Drifted, Consolidatable, DisruptionReason ...)."""
    return NodeClaim(
        NodeClaimMeta(name=name, creationTimestamp=created,
                      deletionTimestamp="2026-01-02T00:00:00Z" if deleting else ""),
        NodeClaimSpec(expireAfter=expire_after),
        NodeClaimStatus(nodeName=node, conditions=[NodeClaimCondition(t, v) for t, v in (conditions or {}).items()]),
    )


def make_pod(name: str, uid: str, node: str = "", phase: str = "Running", owner: OwnerReference | None = None,
             cpu: str = "100m", labels: dict[str, str] | None = None, namespace: str = "ns",
             devices: dict[str, list[str]] | None = None, ready: bool | None = None) -> Pod:
    """``devices``: resource -> the health of each device allocated to its container, as the
    kubelet reports it (allocatedResourcesStatus); ``ready``: its Ready condition (None: none)."""
    conditions = [] if ready is None else [PodCondition("Ready", "True" if ready else "False")]
    return Pod(
        ObjectMeta(name=name, namespace=namespace, uid=uid, labels=labels or {},
                   ownerReferences=[owner] if owner else []),
        PodSpec(nodeName=node, containers=[Container(Resources({"cpu": cpu, "memory": "64Mi"}))]),
        PodStatus(phase=phase, conditions=conditions, containerStatuses=[device_status(devices or {})]),
    )


def device_status(devices: dict[str, list[str]]) -> ContainerStatus:
    return ContainerStatus([ResourceStatus(r, [ResourceHealth(h) for h in healths]) for r, healths in devices.items()])


def add_owner(index: ClusterIndex, owner: Owner) -> None:
    parent = None
    if owner.parent:
        parent = ("v1", "Pod", owner.parent) if owner.parent.startswith("pod") else ("x/v1", "X", owner.parent)
    index.upsert_owner((owner.group, owner.kind), owner.namespace, owner.name, owner.uid, parent)


def configured(*pairs: tuple[str, str]) -> list[WorkloadType]:
    return [WorkloadType(kind=k, group=g) for g, k in pairs]


def labels_of(*keys: str) -> list[PodLabelWorkload]:
    return [PodLabelWorkload(key) for key in keys]


# apimachinery's regexes, written out independently of the code under test.
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

# Small alphabets make collisions (`gke` + `pool-a` against `gke-pool` + `a`) likely.
label_values = st.text(alphabet="aB1-._", max_size=63).filter(lambda v: LABEL_VALUE.fullmatch(v) is not None) | \
    st.sampled_from(["a..b", "a.-b", "a-.b", "x" * 63, "A_b", ""])
