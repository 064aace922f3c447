"""Kueue flavors: the nodes matching a ResourceFlavor's nodeLabels, and the nominal quota the
ClusterQueues give each flavor.

A flavor is a node set with a selector: its nodes (and their pods' running sums) enter and leave
it through the same arithmetic as node groups (nodeset.py), but it is kept apart from them: no
node-group series, no NodeSummary, no workload placement. The cluster index hands it its node and
pod events (``node_out`` / ``node_in`` around a node's change, ``pod`` for a bound pod); Sources
hands it the ResourceFlavor and ClusterQueue events. Matching costs O(flavors) per node event; a
flavor's edit re-matches every node (flavors are few and rarely edited).

It also keeps what the ClusterResourceClaim controller (reconciler/claims.py) reads: the claims,
the ClusterQueue objects as projected (their resourceGroups and resourceVersion: the patch is made
from them) and ``capacity``, a flavor's allocatable over its Ready nodes. ``objects_revision`` is
stamped at their every change, so a reader tells in O(1) whether to look again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .nodeset import NodeEntry, NodeSetAgg, Vector, add, bump, move_phase, node_into, pod_into
from .objects import ClusterQueue, ClusterResourceClaim, ResourceFlavor
from .quantity import parse_or_zero
from .revision import Revision

Quotas = dict[tuple[str, str], int]  # (flavor, resource) -> nominal quota, in the units of allocatable


@dataclass(eq=False)
class FlavorAgg(NodeSetAgg):
    """One Kueue flavor: the nodes matching all of its ResourceFlavor's nodeLabels, and the
    nominal quota the ClusterQueues give it. It exists while its ResourceFlavor does (``defined``)
    or while a ClusterQueue names it (then it has quota but no nodes)."""

    name: str
    defined: bool = False
    node_labels: dict[str, str] = field(default_factory=dict)
    quota: dict[str, int] = field(default_factory=dict)  # resource -> nominal quota summed over ClusterQueues
    quota_refs: dict[str, int] = field(default_factory=dict)  # resource -> ClusterQueues that set it (0 counts)


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    """All of a flavor's nodeLabels are on the node (no nodeLabels: every node, as Kueue)."""
    return all(labels.get(k) == v for k, v in selector.items())


def _quotas(queue: ClusterQueue) -> Quotas:
    """The nominal quotas of one ClusterQueue."""
    out: Quotas = {}
    for group in queue.spec.resourceGroups:
        for flavor in group.flavors:
            for r in flavor.resources:
                key = (flavor.name, r.name)
                out[key] = out.get(key, 0) + parse_or_zero(r.nominalQuota)
    return out


class KueueIndex:
    """The flavors (ResourceFlavors, and names in ClusterQueues) over the cluster index's nodes."""

    def __init__(self, nodes: Mapping[str, NodeEntry], revision: Revision) -> None:
        self.nodes = nodes  # the cluster index's nodes, read only here: a flavor's edit re-matches them
        self.revision = revision  # the cluster index's: every stamp here is one of its
        self.flavors: dict[str, FlavorAgg] = {}
        self.cluster_queues: dict[str, Quotas] = {}  # name -> its quotas
        self.queue_objects: dict[str, ClusterQueue] = {}  # name -> the object (the claims patch it)
        self.claims: dict[str, ClusterResourceClaim] = {}
        self.objects_revision = 0  # stamped by every event of a claim or a ClusterQueue

    def capacity(self, flavor: str) -> dict[str, int] | None:
        """A flavor's capacity for the claims: the allocatable summed over its nodes whose Ready
        condition is True (cordoned ones included); None when no ResourceFlavor of that name exists."""
        agg = self.flavors.get(flavor)
        return dict(agg.ready_allocatable) if agg is not None and agg.defined else None

    def upsert_claim(self, claim: ClusterResourceClaim) -> None:
        self.claims[claim.metadata.name] = claim
        self.objects_revision = next(self.revision)

    def delete_claim(self, name: str) -> None:
        if self.claims.pop(name, None) is not None:
            self.objects_revision = next(self.revision)

    # -- nodes and pods, from the cluster index ----------------------------------------------------

    def node_out(self, entry: NodeEntry) -> None:
        """The node leaves its flavors (before it changes or goes)."""
        for name in entry.flavors:
            node_into(self.flavors[name], entry, -1, self.revision)
        entry.flavors = ()

    def node_in(self, entry: NodeEntry) -> None:
        """The node, as it is now, enters the flavors it matches."""
        entry.flavors = tuple(name for name, agg in self.flavors.items()
                              if agg.defined and _matches(agg.node_labels, entry.labels))
        for name in entry.flavors:
            node_into(self.flavors[name], entry, +1, self.revision)

    def pod(self, node: NodeEntry, phase: str, requests: Vector, devices: Vector, sign: int) -> None:
        """A pod bound to ``node`` comes (sign +1) or goes."""
        for name in node.flavors:
            pod_into(self.flavors[name], phase, requests, devices, sign, self.revision)

    def pod_phase(self, node: NodeEntry, before: str, after: str) -> None:
        """A pod bound to ``node`` changes phase alone (its requests stay)."""
        for name in node.flavors:
            agg = self.flavors[name]
            move_phase(agg.pods, before, after)
            agg.revision = next(self.revision)

    # -- ResourceFlavors ---------------------------------------------------------------------------

    def upsert_flavor(self, flavor: ResourceFlavor) -> None:
        agg = self._flavor(flavor.metadata.name)
        labels = dict(flavor.spec.nodeLabels)
        if agg.defined and agg.node_labels == labels:
            return  # status or metadata only
        agg.defined, agg.node_labels = True, labels
        agg.revision = next(self.revision)
        for entry in self.nodes.values():
            if entry.present:
                self._rematch(entry, agg)

    def delete_flavor(self, name: str) -> None:
        agg = self.flavors.get(name)
        if agg is None or not agg.defined:
            return
        agg.defined, agg.node_labels = False, {}
        agg.revision = next(self.revision)
        for entry in self.nodes.values():
            self._rematch(entry, agg)
        self._forget_flavor_if_unused(name)

    def _flavor(self, name: str) -> FlavorAgg:
        agg = self.flavors.get(name)
        if agg is None:
            agg = self.flavors[name] = FlavorAgg(name=name, revision=next(self.revision))
        return agg

    def _forget_flavor_if_unused(self, name: str) -> None:
        agg = self.flavors[name]
        if not agg.defined and not agg.quota_refs:
            del self.flavors[name]
            next(self.revision)  # the set of flavors changed

    def _rematch(self, entry: NodeEntry, agg: FlavorAgg) -> None:
        """Put the node in or out of the flavor after the flavor changed."""
        match = agg.defined and _matches(agg.node_labels, entry.labels)
        if match == (agg.name in entry.flavors):
            return
        node_into(agg, entry, +1 if match else -1, self.revision)
        entry.flavors = tuple(f for f in entry.flavors if f != agg.name) + ((agg.name,) if match else ())

    # -- ClusterQueues -----------------------------------------------------------------------------

    def upsert_cluster_queue(self, queue: ClusterQueue) -> None:
        """The queue's old contribution to its flavors' nominal quota out, the new one in."""
        name = queue.metadata.name
        self.queue_objects[name] = queue
        self.objects_revision = next(self.revision)
        new = _quotas(queue)
        old = self.cluster_queues.get(name)
        if old == new:
            return
        if old:
            self._queue_quotas(old, -1)
        self.cluster_queues[name] = new
        self._queue_quotas(new, +1)

    def delete_cluster_queue(self, name: str) -> None:
        self.queue_objects.pop(name, None)
        self.objects_revision = next(self.revision)
        old = self.cluster_queues.pop(name, None)
        if old:
            self._queue_quotas(old, -1)

    def _queue_quotas(self, quotas: Quotas, sign: int) -> None:
        for (flavor, resource), value in quotas.items():
            agg = self._flavor(flavor)
            add(agg.quota, ((resource, value),), sign)
            bump(agg.quota_refs, resource, sign)
            agg.revision = next(self.revision)
        if sign < 0:
            for flavor in {f for f, _ in quotas}:
                self._forget_flavor_if_unused(flavor)
