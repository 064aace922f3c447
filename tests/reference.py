"""A from-scratch recomputation of the index's aggregates: slow, obvious, independent of the
incremental code, so tests can compare the two after any sequence of events. And the first
v1alpha1 shape of a NodeSummary status, computed from the current one."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from kubeindex.model.index import (
    ACCELERATOR_RESOURCES,
    DISRUPTION_TAINTS,
    NODE_STATES,
    PROBLEM_CONDITIONS,
    TERMINATED,
    ClusterIndex,
    effective_requests,
    label_workload_uid,
)
from kubeindex.model.karpenter import go_duration, timestamp
from kubeindex.model.objects import Node, NodeClaim, Pod
from kubeindex.model.owners import CYCLE, MISSING, NONE, OK, TOO_DEEP
from kubeindex.model.quantity import NANO, parse_nano, parse_or_zero


@dataclass
class Owner:
    uid: str
    group: str
    kind: str
    namespace: str
    name: str
    parent: str | None  # controller ownerReference UID


@dataclass
class World:
    """The truth: the objects as they are now."""

    nodes: dict[str, Node]
    pods: dict[str, Pod]
    owners: dict[str, Owner]  # uid -> owner
    node_summarizers: dict[str, str]
    configured: set[tuple[str, str]]
    pod_labels: tuple[str, ...] = ()
    max_depth: int = 10
    disruption_taints: tuple[str, ...] = DISRUPTION_TAINTS  # "key" or "key:Effect"
    problem_conditions: tuple[str, ...] = PROBLEM_CONDITIONS
    accelerator_resources: tuple[str, ...] = ACCELERATOR_RESOURCES  # names or "prefix*"
    nodeclaims: dict[str, NodeClaim] | None = None  # Karpenter's, by name; at most one per node
    now: float = 0.0  # seconds since the epoch: what expiry is measured against
    expiry_horizon: float = 3600.0


@dataclass(frozen=True)
class GroupTruth:
    """One node group as recompute() and snapshot() both give it: compared whole, read by name."""

    nodes: int
    conditions: dict[str, int]
    unschedulable: int
    allocatable: dict[str, int]
    capacity: dict[str, int]
    pods: dict[str, int]  # phase -> pods bound to its nodes
    requested: dict[str, int]
    node_names: list[str]
    devices_unhealthy: dict[str, int]  # resource -> Unhealthy devices of the unfinished pods on its nodes
    pods_with_unhealthy_devices: int


@dataclass(frozen=True)
class WorkloadTruth:
    """One root workload as recompute() and snapshot() both give it."""

    namespace: str
    name: str
    group: str
    kind: str
    label_key: str
    pods: dict[str, int]  # phase -> pods
    nodes: dict[tuple[str, str], int]  # node group -> distinct nodes its unfinished pods hold
    devices_unhealthy: dict[str, int]
    pods_with_unhealthy_devices: int


Truth = tuple[dict[tuple[str, str], GroupTruth], dict[str, WorkloadTruth], dict[str, int], dict[str, int]]


def _clean(counter: Counter) -> dict:
    return {k: v for k, v in counter.items() if v}


def walk(world: World, uid: str) -> tuple[str | None, str]:
    """Follow controller references up from ``uid`` (a pod or an owner) as the spec says: the
    topmost configured kind is the root; a missing owner ends the walk with MISSING, keeping the
    topmost configured kind found below it; a cycle or too long a chain has no root."""
    parents: dict[str, str | None] = {o.uid: o.parent for o in world.owners.values()}
    kinds: dict[str, tuple[str, str]] = {o.uid: (o.group, o.kind) for o in world.owners.values()}
    for pod in world.pods.values():
        ref = pod.metadata.controller_ref()
        parents[pod.metadata.uid] = ref.uid if ref else None
        kinds[pod.metadata.uid] = ("", "Pod")
    visited = {uid}
    current = uid
    top = uid if kinds[uid] in world.configured else None
    hops = 0
    while True:
        parent = parents[current]
        if parent is None:
            return top, OK if top else NONE
        hops += 1
        if hops > world.max_depth:
            return None, TOO_DEEP
        if parent not in parents:
            return top, MISSING
        if parent in visited:
            return None, CYCLE
        visited.add(parent)
        current = parent
        if kinds[current] in world.configured:
            top = current


def _label(world: World, pod: Pod) -> tuple[str, str] | None:
    return next(((k, pod.metadata.labels[k]) for k in world.pod_labels if pod.metadata.labels.get(k)), None)


def unhealthy(pod: Pod) -> Counter:
    """The pod's devices the kubelet reports Unhealthy, per resource, counted from scratch."""
    return Counter(resource.name for container in (*pod.status.initContainerStatuses, *pod.status.containerStatuses)
                   for resource in container.allocatedResourcesStatus
                   for device in resource.resources if device.health == "Unhealthy")


def recompute(world: World) -> Truth:
    """Node groups, root workloads, pods without a workload by reason, pods below a broken chain."""
    groups: dict = {}
    node_groups: dict[str, list] = {}
    for node in world.nodes.values():
        keys = [(s, node.metadata.labels[k]) for s, k in world.node_summarizers.items() if k in node.metadata.labels]
        node_groups[node.metadata.name] = keys
        for key in keys:
            g = groups.setdefault(key, {"nodes": 0, "conditions": Counter(), "unschedulable": 0,
                                        "allocatable": Counter(), "capacity": Counter(), "pods": Counter(),
                                        "requested": Counter(), "node_names": set(), "devices": Counter(),
                                        "device_pods": 0})
            g["nodes"] += 1
            g["conditions"][node.ready()] += 1
            g["unschedulable"] += int(node.spec.unschedulable)
            for r, q in node.status.allocatable.items():
                g["allocatable"][r] += parse_or_zero(q)
            for r, q in node.status.capacity.items():
                g["capacity"][r] += parse_or_zero(q)
            g["node_names"].add(node.metadata.name)
    workloads: dict = {}
    unresolved: Counter = Counter()
    broken: Counter = Counter()

    def workload(uid: str, namespace: str, name: str, group: str, kind: str, label_key: str = "") -> dict:
        identity = {"namespace": namespace, "name": name, "group": group, "kind": kind, "label_key": label_key}
        return workloads.setdefault(uid, {"id": identity, "pods": Counter(), "nodes": {}, "devices": Counter(),
                                          "device_pods": 0})

    for owner in world.owners.values():
        top, status = walk(world, owner.uid)
        if top == owner.uid:
            workload(owner.uid, owner.namespace, owner.name, owner.group, owner.kind)
    for pod in world.pods.values():
        phase = pod.status.phase
        node_name = pod.spec.nodeName
        bad = Counter() if phase in TERMINATED else unhealthy(pod)
        for key in node_groups.get(node_name, []) if node_name else []:
            groups[key]["pods"][phase] += 1
            if phase not in TERMINATED:
                for r, v in effective_requests(pod.spec).items():
                    groups[key]["requested"][r] += v
            groups[key]["devices"].update(bad)
            groups[key]["device_pods"] += bool(bad)
        top, status = walk(world, pod.metadata.uid)
        if top is None and status == NONE:
            label = _label(world, pod)
            if label:
                ns = pod.metadata.namespace
                top = label_workload_uid(label[0], ns, label[1])
                workload(top, ns, label[1], "", "", label[0])
        if top is None:
            unresolved[status] += 1
            continue
        if status == MISSING:  # a root below a broken chain
            broken[status] += 1
        if top not in workloads:
            o = world.owners[top]
            workload(top, o.namespace, o.name, o.group, o.kind)
        w = workloads[top]
        w["pods"][phase] += 1
        w["devices"].update(bad)
        w["device_pods"] += bool(bad)
        if node_name and phase not in TERMINATED:  # a finished pod holds no node
            for key in node_groups.get(node_name, []):
                w["nodes"].setdefault(key, set()).add(node_name)
    norm_groups = {
        k: GroupTruth(g["nodes"], _clean(g["conditions"]), g["unschedulable"], _clean(g["allocatable"]),
                      _clean(g["capacity"]), _clean(g["pods"]), _clean(g["requested"]), sorted(g["node_names"]),
                      _clean(g["devices"]), g["device_pods"])
        for k, g in groups.items()
    }
    norm_workloads = {
        uid: WorkloadTruth(**w["id"], pods=_clean(w["pods"]), nodes={k: len(v) for k, v in w["nodes"].items()},
                           devices_unhealthy=_clean(w["devices"]), pods_with_unhealthy_devices=w["device_pods"])
        for uid, w in workloads.items()
    }
    return norm_groups, norm_workloads, _clean(unresolved), _clean(broken)


def snapshot(index: ClusterIndex) -> Truth:
    """The incremental index's aggregates in the same records."""
    groups = {
        k: GroupTruth(g.nodes, dict(g.conditions), g.unschedulable, dict(g.allocatable), dict(g.capacity),
                      dict(g.pods), dict(g.requested), sorted(g.node_names), dict(g.devices_unhealthy),
                      g.pods_with_unhealthy_devices)
        for k, g in index.node_groups.items()
    }
    workloads = {
        uid: WorkloadTruth(w.namespace, w.name, w.group, w.kind, w.label_key, dict(w.pods), dict(w.nodes_by_node_group),
                           dict(w.devices_unhealthy), w.pods_with_unhealthy_devices)
        for uid, w in index.workloads.items()
    }
    return groups, workloads, dict(index.unresolved), dict(index.chain_broken)


# -- node health -----------------------------------------------------------------------------------

def accelerators_unhealthy(world: World, node: Node) -> dict[str, int]:
    out = {}
    for resource, quantity in node.status.capacity.items():
        if any(fnmatchcase(resource, pattern) for pattern in world.accelerator_resources):
            missing = parse_or_zero(quantity) - parse_or_zero(node.status.allocatable.get(resource, "0"))
            if missing > 0:
                out[resource] = missing
    return out


def node_state(world: World, node: Node) -> str:
    ready = [c.status for c in node.status.conditions if c.type == "Ready"]
    if ready[:1] == ["False"]:
        return "NotReady"
    if ready[:1] != ["True"]:
        return "Unknown"
    for taint in node.spec.taints:
        if taint.key in world.disruption_taints or f"{taint.key}:{taint.effect}" in world.disruption_taints:
            return "Disrupting"
    if node.spec.unschedulable:
        return "Cordoned"
    problems = [c for c in node.status.conditions if c.type in world.problem_conditions and c.status == "True"]
    if problems or accelerators_unhealthy(world, node):
        return "Degraded"
    return "Ready"


def recompute_health(world: World) -> tuple[dict, dict]:
    """Per node group (states, accelerators_unhealthy); per workload (pods_by_node_state,
    unhealthy_nodes, unhealthy_nodes_by_node_group), for every group and workload recompute() finds."""
    groups, workloads, _, _ = recompute(world)
    states = {name: node_state(world, node) for name, node in world.nodes.items()}
    node_groups = {name: [(s, node.metadata.labels[k]) for s, k in world.node_summarizers.items()
                          if k in node.metadata.labels] for name, node in world.nodes.items()}
    group_health: dict = {key: (Counter(), Counter()) for key in groups}
    for name, node in world.nodes.items():
        for key in node_groups[name]:
            group_health[key][0][states[name]] += 1
            group_health[key][1].update(accelerators_unhealthy(world, node))
    workload_health: dict = {uid: (Counter(), set(), {}) for uid in workloads}
    for pod in world.pods.values():
        node_name = pod.spec.nodeName
        if states.get(node_name, "Ready") == "Ready":  # unbound, on a node not seen, or on a Ready node
            continue
        if pod.status.phase in TERMINATED:  # finished: on no node
            continue
        top, status = walk(world, pod.metadata.uid)
        label = _label(world, pod) if top is None and status == NONE else None
        if label:
            top = label_workload_uid(label[0], pod.metadata.namespace, label[1])
        if top is None:
            continue
        by_state, nodes, per_group = workload_health[top]
        by_state[states[node_name]] += 1
        nodes.add(node_name)
        for key in node_groups[node_name]:
            per_group.setdefault(key, set()).add(node_name)
    return (
        {k: (_clean(by_state), _clean(accel)) for k, (by_state, accel) in group_health.items()},
        {uid: (_clean(by_state), len(nodes), {k: len(v) for k, v in per_group.items()})
         for uid, (by_state, nodes, per_group) in workload_health.items()},
    )


def health_snapshot(index: ClusterIndex) -> tuple[dict, dict]:
    return (
        {k: (dict(g.states), dict(g.accelerators_unhealthy)) for k, g in index.node_groups.items()},
        {uid: (dict(w.pods_by_node_state), w.unhealthy_nodes, dict(w.unhealthy_nodes_by_node_group))
         for uid, w in index.workloads.items()},
    )


def claim_facts(world: World, node: str) -> tuple[str, str]:
    """(rollout, candidate) of the node's NodeClaim, from its conditions as Karpenter sets them."""
    claim = next((c for c in (world.nodeclaims or {}).values() if c.status.nodeName == node), None)
    if claim is None:
        return "", ""
    true = {c.type for c in claim.status.conditions if c.status == "True"}
    if claim.metadata.deletionTimestamp or "DisruptionReason" in true:
        rollout = "Disrupting"
    else:
        rollout = "Drifted" if "Drifted" in true else "UpToDate"
    created, lifetime = timestamp(claim.metadata.creationTimestamp), go_duration(claim.spec.expireAfter)
    if "Drifted" in true:
        return rollout, "Drifted"
    if created is not None and lifetime is not None and created + lifetime <= world.now + world.expiry_horizon:
        return rollout, "Expiring"
    return rollout, "Consolidatable" if "Consolidatable" in true else ""


def recompute_karpenter(world: World) -> tuple[dict, dict]:
    """Per node group, nodes by rollout state (those with a NodeClaim); per workload, its
    unfinished pods on nodes at risk by reason, and per node group."""
    groups, workloads, _, _ = recompute(world)
    rollout: dict = {key: Counter() for key in groups}
    risk: dict[str, str] = {}
    for name, node in world.nodes.items():
        state, candidate = claim_facts(world, name)
        for s, k in world.node_summarizers.items():
            if k in node.metadata.labels and state:
                rollout[s, node.metadata.labels[k]][state] += 1
        disrupting = node_state(world, node) == "Disrupting" or state == "Disrupting"
        if disrupting or candidate:
            risk[name] = "Disrupting" if disrupting else candidate
    at_risk: dict = {uid: (Counter(), Counter()) for uid in workloads}
    for pod in world.pods.values():
        name = pod.spec.nodeName
        if name not in risk or pod.status.phase in TERMINATED:
            continue
        top, status = walk(world, pod.metadata.uid)
        label = _label(world, pod) if top is None and status == NONE else None
        if label:
            top = label_workload_uid(label[0], pod.metadata.namespace, label[1])
        if top is None:
            continue
        by_reason, by_group = at_risk[top]
        by_reason[risk[name]] += 1
        labels = world.nodes[name].metadata.labels
        by_group.update((s, labels[k]) for s, k in world.node_summarizers.items() if k in labels)
    return ({k: _clean(v) for k, v in rollout.items()},
            {uid: (_clean(r), _clean(g)) for uid, (r, g) in at_risk.items()})


def karpenter_snapshot(index: ClusterIndex) -> tuple[dict, dict]:
    return ({k: dict(g.rollout) for k, g in index.node_groups.items()},
            {uid: (dict(w.pods_at_risk), dict(w.pods_at_risk_by_node_group)) for uid, w in index.workloads.items()})


# -- the first v1alpha1 shape of a NodeSummary status --------------------------------------------

def old_quantity(resource: str, nano: int) -> str:
    """The quantity strings of the first v1alpha1 shape (millis rounded up, no decimal suffixes)."""
    if nano % NANO:
        return f"{-(-nano // 10**6)}m"
    value = nano // NANO
    if resource == "memory" or resource.startswith(("hugepages-", "ephemeral-storage")):
        for suffix, factor in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20),
                               ("Ki", 2**10)):
            if value and value % factor == 0:
                return f"{value // factor}{suffix}"
    return str(value)


def old_from_new(status: dict[str, Any]) -> dict[str, Any]:
    """The first v1alpha1 shape computed from the current one alone: nothing was lost."""
    old = dict(status)
    old.pop("notReadyAllocatable", None)  # added since: a fleet hub's input
    old["nodesByState"] = {s: status.get("nodesByState", {}).get(s, 0) for s in NODE_STATES}
    for field in ("allocatable", "capacity", "requested", "unhealthyAccelerators"):
        if field in status:
            old[field] = {r: old_quantity(r, parse_nano(q)) for r, q in status[field].items()}
    return old
