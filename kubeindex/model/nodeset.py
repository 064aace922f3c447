"""Node sets: the arithmetic node groups (index.py) and Kueue flavors (kueue.py) share.

A node set sums the facts of its nodes and the running sums of the pods bound to them. A node
enters or leaves with ``node_into``; a pod bound to one of its nodes with ``pod_into``. Every
change takes a new stamp of the index's revision (revision.py), so consumers redo only what changed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from .disruption import Blocker
from .revision import Revision

K = TypeVar("K")
Vector = tuple[tuple[str, int], ...]  # sorted (resource, nano-units), interned (index._intern)


def add(target: dict[K, int], items: Iterable[tuple[K, int]], sign: int) -> None:
    """Add (sign +1) or subtract counts; a count that reaches 0 leaves the map."""
    for key, value in items:
        total = target.get(key, 0) + sign * value
        if total:
            target[key] = total
        else:
            target.pop(key, None)


def bump(target: dict[K, int], key: K, sign: int) -> None:
    add(target, ((key, 1),), sign)


def move_phase(counts: dict[str, int], before: str, after: str) -> None:
    """One pod counted under ``after`` instead of ``before`` (``bump`` twice, written out: most pod
    events come here, for the node, its node groups and flavors, and the workload)."""
    left = counts.get(before, 0) - 1
    if left:
        counts[before] = left
    else:
        counts.pop(before, None)
    now = counts.get(after, 0) + 1
    if now:
        counts[after] = now
    else:
        counts.pop(after, None)


NOT_SUMMED: dict[str, Any] = {"summed": False}  # field metadata: what adding node sets up leaves alone


@dataclass(eq=False, kw_only=True)
class NodeSetAgg:
    """Sums over a set of nodes and the pods bound to them: what node groups and Kueue flavors
    both show (one arithmetic, node_into and pod_into, for both). A new field is its line here
    and its share of a node in node_into: add_sums picks it up."""

    nodes: int = 0
    conditions: dict[str, int] = field(default_factory=dict)  # Ready / NotReady / Unknown
    unschedulable: int = 0
    allocatable: dict[str, int] = field(default_factory=dict)  # resource -> nano-units
    ready_allocatable: dict[str, int] = field(default_factory=dict)  # of the Ready nodes: a claim's capacity
    capacity: dict[str, int] = field(default_factory=dict)
    pods: dict[str, int] = field(default_factory=dict)  # phase -> pods bound to the set's nodes
    requested: dict[str, int] = field(default_factory=dict)  # of non-terminated pods
    node_names: set[str] = field(default_factory=set, metadata=NOT_SUMMED)  # for a NodeSummary only
    states: dict[str, int] = field(default_factory=dict)  # index.NODE_STATES -> nodes
    accelerators_unhealthy: dict[str, int] = field(default_factory=dict)  # resource -> capacity - allocatable
    pods_with_unhealthy_devices: int = 0  # non-terminated pods bound here that hold a device reported Unhealthy
    devices_unhealthy: dict[str, int] = field(default_factory=dict)  # resource -> such devices those pods hold
    rollout: dict[str, int] = field(default_factory=dict)  # karpenter.ROLLOUT_STATES -> nodes with a NodeClaim
    # When (seconds since the epoch) a node last entered or left the Drifted or Disrupting count, or
    # when this replica first saw one there; 0: never. What NodeGroupRolloutStuck measures.
    rollout_changed: float = field(default=0.0, metadata=NOT_SUMMED)
    blocked: int = 0  # nodes Karpenter says it may not disrupt, naming why (disruption.py)
    held: int = 0  # of those, the ones it wants to disrupt (a NodeClaim candidate: drifted, expiring, consolidatable)
    blockers: dict[str, Blocker] = field(default_factory=dict, metadata=NOT_SUMMED)  # node -> its blocker
    revision: int = field(default=0, metadata=NOT_SUMMED)  # its stamp: moves with its content

    def add_sums(self, other: NodeSetAgg) -> None:
        """Add another node set's counts and count maps to this one's (the exporter's `other`
        node group: the groups beyond the series cap, summed)."""
        for name in SUMMED:
            theirs = getattr(other, name)
            if isinstance(theirs, dict):
                mine = getattr(self, name)
                for k, v in theirs.items():
                    mine[k] = mine.get(k, 0) + v
            else:
                setattr(self, name, getattr(self, name) + theirs)


SUMMED = tuple(f.name for f in fields(NodeSetAgg) if f.metadata.get("summed", True))


class NodeEntry:
    """One node as the index keeps it: its own facts, where it belongs, and the running sums of
    the pods bound to it (so it can move between node sets in O(resources))."""

    __slots__ = ("accelerators_unhealthy", "allocatable", "blocker", "candidate", "capacity", "flavors", "labels",
                 "name", "node_groups", "pod_devices", "pod_phases", "pod_requests", "pods",
                 "pods_with_unhealthy_devices", "present", "ready", "rollout", "state", "unschedulable")

    def __init__(self, name: str) -> None:
        self.name = name
        self.present = False  # False while only pods name it (the node event may come later)
        self.labels: dict[str, str] = {}
        self.ready = "Unknown"
        self.unschedulable = False
        self.allocatable: Vector = ()
        self.capacity: Vector = ()
        self.accelerators_unhealthy: Vector = ()
        self.state = "Unknown"
        self.node_groups: tuple[tuple[str, str], ...] = ()  # the index.NodeGroupKey of each node group it is in
        self.flavors: tuple[str, ...] = ()  # Kueue flavors whose nodeLabels it matches (kueue.py)
        self.pod_phases: dict[str, int] = {}  # running sums of the pods bound here
        self.pod_requests: dict[str, int] = {}
        self.pod_devices: dict[str, int] = {}  # resource -> Unhealthy devices its pods hold
        self.pods_with_unhealthy_devices = 0
        self.pods: set[str] = set()  # pod keys
        self.rollout = ""  # its NodeClaim's karpenter.ROLLOUT_STATES; "": none (karpenter.NodeClaims)
        self.candidate = ""  # its NodeClaim's karpenter.CANDIDATES, or ""
        self.blocker: Blocker | None = None  # what keeps Karpenter from disrupting it (disruption.py)


def node_into(agg: NodeSetAgg, entry: NodeEntry, sign: int, revision: Revision) -> None:
    """Add (sign +1) or remove a node's own facts and the running sums of its pods."""
    agg.nodes += sign
    bump(agg.conditions, entry.ready, sign)
    bump(agg.states, entry.state, sign)
    if entry.rollout:
        bump(agg.rollout, entry.rollout, sign)
    add(agg.accelerators_unhealthy, entry.accelerators_unhealthy, sign)
    agg.unschedulable += sign * entry.unschedulable
    add(agg.allocatable, entry.allocatable, sign)
    if entry.ready == "Ready":
        add(agg.ready_allocatable, entry.allocatable, sign)
    add(agg.capacity, entry.capacity, sign)
    add(agg.pods, entry.pod_phases.items(), sign)
    add(agg.requested, entry.pod_requests.items(), sign)
    add(agg.devices_unhealthy, entry.pod_devices.items(), sign)
    agg.pods_with_unhealthy_devices += sign * entry.pods_with_unhealthy_devices
    if sign > 0:
        agg.node_names.add(entry.name)
    else:
        agg.node_names.discard(entry.name)
    if entry.blocker is not None:
        agg.blocked += sign
        if entry.candidate:
            agg.held += sign
        if sign > 0:
            agg.blockers[entry.name] = entry.blocker
        else:
            agg.blockers.pop(entry.name, None)
    agg.revision = next(revision)


def pod_into(agg: NodeSetAgg, phase: str, requests: Vector, devices: Vector, sign: int, revision: Revision) -> None:
    """Add or remove one pod bound to one of the set's nodes (``devices``: its Unhealthy ones)."""
    bump(agg.pods, phase, sign)
    add(agg.requested, requests, sign)
    if devices:
        add(agg.devices_unhealthy, devices, sign)
        agg.pods_with_unhealthy_devices += sign
    agg.revision = next(revision)
