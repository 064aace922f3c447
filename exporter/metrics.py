"""The /metrics exposition, rendered from the index's aggregates.

Families are tables of FamilyGenerator rows, in the manner of kube-state-metrics: one table per
kind of aggregate (NODEGROUP_FAMILIES, WORKLOAD_FAMILIES, FLAVOR_FAMILIES) and one for the
renderer's own bookkeeping (RENDERER_FAMILIES). A row holds the family's name, type and help and a
function from the aggregate to its samples, so a new family is one row (and its line in
docs/metrics.md, which tests/unit/test_docs.py checks).

A scrape costs O(series), never O(pods): each node group and each workload keeps its exposition
lines cached under the aggregate's revision stamp (kubeindex/model/revision.py's ``Stamped``), so only
what changed since the last scrape is formatted again; the rest is a join of cached strings.
(prometheus-client's generic path costs about 10 us per labelled sample; it renders the other
collectors of the registry, appended at the end: process, watches (kubeindex.watch.metrics),
reconciler (reconciler.metrics).)

Every family has a bound (docs/metrics.md): node groups per summarizer are capped by
``max_nodegroup_series``, workloads by ``max_workload_series``; what is beyond a cap is summed
into an explicit ``other`` series and counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import prometheus_client
from prometheus_client.openmetrics import exposition as openmetrics

from kubeindex.model.disruption import Blocker
from kubeindex.model.gangs import BROKEN, GANG_STATES, Gang
from kubeindex.model.index import (
    NODE_STATES,
    PHASES,
    READY_STATES,
    UNHEALTHY_STATES,
    ClusterIndex,
    NodeGroupAgg,
    NodeGroupKey,
    WorkloadAgg,
)
from kubeindex.model.karpenter import RISKS, ROLLOUT_STATES
from kubeindex.model.kueue import FlavorAgg
from kubeindex.model.objects import ClusterResourceClaim, claim_status
from kubeindex.model.owners import CYCLE, MISSING, NONE, TOO_DEEP, GroupKind
from kubeindex.model.quantity import NANO, parse_or_zero
from kubeindex.model.revision import Revision, Stamped

PREFIX = "nws_"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OTHER = "other"  # the explicit overflow series when a series cap is reached
MAX_WORKLOAD_SERIES = 5000  # workloads with series of their own (--max-workload-series)
MAX_NODEGROUP_SERIES = 2000  # node groups with series of their own, per NodeSummarizer
MAX_LOST_SERIES = 10  # places a workload's broken gangs name with series of their own (the rest: "other")
GANG_MEMBERS = ("required", "scheduled", "ready", "at_risk")
ALWAYS_PHASES = ("Pending", "Running")  # workload phases emitted even at 0 (stable series)
UNRESOLVED_REASONS = (NONE, MISSING, CYCLE, TOO_DEEP)  # emitted even at 0
BROKEN_REASONS = (MISSING,)  # the only break a workload can sit below

A = TypeVar("A")
K = TypeVar("K", bound=Hashable)
Sample = tuple[str, object]  # (label pairs beyond the aggregate's own, value)


@dataclass(frozen=True)
class Family:
    name: str  # without prefix; a counter's name without _total
    type: str  # gauge | counter
    help: str

    def header(self, openmetrics_format: bool) -> str:
        name = PREFIX + self.name
        if self.type == "counter" and not openmetrics_format:
            name += "_total"
        return f"# HELP {name} {self.help}\n# TYPE {name} {self.type}\n"


@dataclass(frozen=True)
class FamilyGenerator(Generic[A]):
    """One metric family of one kind of aggregate and how to get its samples from one aggregate."""

    family: Family
    samples: Callable[[A], Iterable[Sample]]


def _esc(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(**labels: str) -> str:
    return ",".join(f'{k}="{_esc(v)}"' for k, v in labels.items())


def _quantity(nano: int) -> str:
    return str(nano // NANO) if nano % NANO == 0 else repr(nano / NANO)


def _line(family: Family, labels: str, value: object) -> str:
    suffix = "_total" if family.type == "counter" else ""
    label_set = f"{{{labels}}}" if labels else ""
    return f"{PREFIX}{family.name}{suffix}{label_set} {value}\n"


def _resources(values: dict[str, int]) -> Iterator[Sample]:
    return ((_labels(resource=r), _quantity(v)) for r, v in sorted(values.items()))


def _resources_counted(values: dict[str, int]) -> Iterator[Sample]:
    """Counts per resource (devices), not quantities."""
    return ((_labels(resource=r), v) for r, v in sorted(values.items()))


# -- node groups ---------------------------------------------------------------------------------

def _blocked_by_kind(blockers: dict[str, Blocker]) -> Iterator[Sample]:
    counts: dict[str, int] = {}
    for blocker in blockers.values():
        counts[blocker.kind] = counts.get(blocker.kind, 0) + 1
    return ((_labels(kind=k), n) for k, n in sorted(counts.items()))


NODEGROUP_FAMILIES: tuple[FamilyGenerator[NodeGroupAgg], ...] = (
    FamilyGenerator(Family("nodegroup_nodes", "gauge",
                           "Nodes in the node group (nodes of a NodeSummarizer with one label value)."),
                    lambda g: [("", g.nodes)]),
    FamilyGenerator(Family("nodegroup_nodes_by_condition", "gauge",
                           "Nodes of the group by Ready condition: Ready, NotReady or Unknown."),
                    lambda g: ((_labels(condition=c), g.conditions.get(c, 0)) for c in READY_STATES)),
    FamilyGenerator(Family("nodegroup_nodes_by_state", "gauge",
                           "Nodes of the group by state, the first that applies: NotReady, Unknown, Disrupting, "
                           "Cordoned, Degraded, else Ready."),
                    lambda g: ((_labels(state=s), g.states.get(s, 0)) for s in NODE_STATES)),
    FamilyGenerator(Family("nodegroup_accelerators_unhealthy", "gauge",
                           "Accelerators of the group's nodes missing from allocatable (capacity - allocatable), "
                           "per resource, while non-zero."),
                    lambda g: _resources(g.accelerators_unhealthy)),
    FamilyGenerator(Family("nodegroup_pods_with_unhealthy_devices", "gauge",
                           "Unfinished pods on the group's nodes holding a device the kubelet reports Unhealthy "
                           "(status.containerStatuses[].allocatedResourcesStatus), while non-zero."),
                    lambda g: [("", g.pods_with_unhealthy_devices)] if g.pods_with_unhealthy_devices else []),
    FamilyGenerator(Family("nodegroup_devices_unhealthy", "gauge",
                           "Devices reported Unhealthy that the unfinished pods on the group's nodes hold, per "
                           "resource, while non-zero."),
                    lambda g: _resources_counted(g.devices_unhealthy)),
    FamilyGenerator(Family("nodegroup_nodes_blocked", "gauge",
                           "Nodes of the group Karpenter says it may not disrupt (its DisruptionBlocked Events, "
                           "with --karpenter-events=on), by what blocks them: kind Pod (karpenter.sh/do-not-disrupt), "
                           "PodDisruptionBudget, or Node (its own annotation); while non-zero."),
                    lambda g: _blocked_by_kind(g.blockers)),
    FamilyGenerator(Family("nodegroup_nodes_unschedulable", "gauge",
                           "Cordoned nodes (spec.unschedulable) in the node group."),
                    lambda g: [("", g.unschedulable)]),
    FamilyGenerator(Family("nodegroup_allocatable", "gauge",
                           "Sum of node allocatable per resource (cpu in cores, memory in bytes, others in units)."),
                    lambda g: _resources(g.allocatable)),
    FamilyGenerator(Family("nodegroup_capacity", "gauge", "Sum of node capacity per resource."),
                    lambda g: _resources(g.capacity)),
    FamilyGenerator(Family("nodegroup_pods", "gauge", "Pods bound to the group's nodes, by phase."),
                    lambda g: ((_labels(phase=p), g.pods.get(p, 0)) for p in PHASES)),
    FamilyGenerator(Family("nodegroup_requested", "gauge",
                           "Sum of the effective resource requests of the non-terminated pods on the group's nodes."),
                    lambda g: _resources(g.requested)),
    FamilyGenerator(Family("nodegroup_nodes_by_rollout", "gauge",
                           "Nodes of the group with a Karpenter NodeClaim by rollout state: UpToDate, Drifted, "
                           "Disrupting (DisruptionReason, or being deleted); every state while the group has one."),
                    lambda g: ((_labels(rollout=r), g.rollout.get(r, 0)) for r in ROLLOUT_STATES) if g.rollout else ()),
    FamilyGenerator(Family("nodegroup_nodes_held", "gauge",
                           "Nodes of the group Karpenter wants to disrupt (a NodeClaim drifted, expiring or "
                           "consolidatable) that a blocker holds (nws_nodegroup_nodes_blocked); while the group has a "
                           "NodeClaim."),
                    lambda g: [("", g.held)] if g.rollout else ()),
    FamilyGenerator(Family("nodegroup_rollout_changed_timestamp_seconds", "gauge",
                           "When a node of the group last entered or left the Drifted or Disrupting rollout count (or "
                           "this replica first saw one there), in seconds since the epoch; none before that."),
                    lambda g: [("", g.rollout_changed)] if g.rollout and g.rollout_changed else []),
)


# -- Kueue flavors -------------------------------------------------------------------------------

def _flavor_resources(f: FlavorAgg, values: dict[str, int]) -> Iterator[Sample]:
    """A flavor's node sums (none without its ResourceFlavor), with a 0 for each resource it has
    quota for but its nodes lack: a pool that lost every node still compares with its quota."""
    return _resources({**dict.fromkeys(f.quota_refs, 0), **values}) if f.defined else iter(())


FLAVOR_FAMILIES: tuple[FamilyGenerator[FlavorAgg], ...] = (
    FamilyGenerator(Family("flavor_allocatable", "gauge",
                           "Sum of the allocatable of the nodes matching the Kueue ResourceFlavor's nodeLabels, "
                           "per resource."),
                    lambda f: _flavor_resources(f, f.allocatable)),
    FamilyGenerator(Family("flavor_ready_allocatable", "gauge",
                           "Sum of the allocatable of the flavor's nodes whose Ready condition is True, per resource: "
                           "the capacity ClusterResourceClaims and the quota alerts measure."),
                    lambda f: _flavor_resources(f, f.ready_allocatable)),
    FamilyGenerator(Family("flavor_nodes_by_state", "gauge",
                           "Nodes matching the Kueue ResourceFlavor by state, as nws_nodegroup_nodes_by_state."),
                    lambda f: ((_labels(state=s), f.states.get(s, 0)) for s in NODE_STATES) if f.defined else ()),
    FamilyGenerator(Family("flavor_nominal_quota", "gauge",
                           "Nominal quota of the Kueue flavor summed over the ClusterQueues that name it, "
                           "per resource."),
                    lambda f: ((_labels(resource=r), _quantity(f.quota.get(r, 0))) for r in sorted(f.quota_refs))),
    FamilyGenerator(Family("flavor_requested", "gauge",
                           "Sum of the effective requests of the non-terminated pods on the flavor's nodes."),
                    lambda f: _flavor_resources(f, f.requested)),
)


# -- workloads -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class WorkloadSeries:
    """What a workload's series show: its pods, and its distinct nodes per node group where node
    groups beyond their cap are folded into (summarizer, "other"); its pods and distinct nodes on
    nodes that are not Ready (no distinct count for the summed "other" workload)."""

    pods: dict[str, int]
    nodes_by_node_group: dict[NodeGroupKey, int]
    pods_by_node_state: dict[str, int]
    unhealthy_nodes: int | None
    pods_with_unhealthy_devices: int
    devices_unhealthy: dict[str, int]
    pods_at_risk: dict[str, int]
    gangs: dict[str, int]  # GANG_STATES -> gangs; empty for a workload with none
    gang_members: dict[str, int]  # GANG_MEMBERS -> members, summed over its gangs
    gang_lost: dict[tuple[str, str, str], int]  # (summarizer, group, domain) -> members its broken gangs lost there


def gang_series(gangs: Iterable[Gang]) -> tuple[dict[str, int], dict[str, int], dict[tuple[str, str, str], int]]:
    """A workload's gangs per state, their members, and where its Broken gangs lost members: at most
    MAX_LOST_SERIES places, the rest summed as group "other". O(gangs of the workload)."""
    states = dict.fromkeys(GANG_STATES, 0)
    members = dict.fromkeys(GANG_MEMBERS, 0)
    lost: dict[tuple[str, str, str], int] = {}
    for gang in gangs:
        states[gang.state] += 1
        members["required"] += gang.required or 0
        members["scheduled"] += gang.scheduled
        members["ready"] += gang.ready
        members["at_risk"] += gang.at_risk
        if gang.state == BROKEN:
            for (node_groups, domain), n in gang.places().items():
                for summarizer, group in node_groups or (("", ""),):
                    lost[summarizer, group, domain] = lost.get((summarizer, group, domain), 0) + n
    if not any(states.values()):
        return {}, {}, {}
    if len(lost) > MAX_LOST_SERIES:
        ranked = sorted(lost.items(), key=lambda item: (-item[1], item[0]))
        lost = dict(ranked[:MAX_LOST_SERIES])
        for (summarizer, _, _), n in ranked[MAX_LOST_SERIES:]:
            lost[summarizer, OTHER, ""] = lost.get((summarizer, OTHER, ""), 0) + n
    return states, members, lost


WORKLOAD_FAMILIES: tuple[FamilyGenerator[WorkloadSeries], ...] = (
    FamilyGenerator(Family("workload_pods", "gauge",
                           "Pods of the root workload by phase (Pending and Running always, "
                           "other phases when non-zero)."),
                    lambda w: ((_labels(phase=p), w.pods.get(p, 0))
                               for p in PHASES if p in ALWAYS_PHASES or w.pods.get(p))),
    FamilyGenerator(Family("workload_nodes", "gauge",
                           "Distinct nodes of each node group that the workload's pods run on."),
                    lambda w: ((_labels(summarizer=s, group=g), n)
                               for (s, g), n in sorted(w.nodes_by_node_group.items()))),
    FamilyGenerator(Family("workload_pods_by_node_state", "gauge",
                           "Pods of the root workload on nodes that are not Ready, by node state, while non-zero."),
                    lambda w: ((_labels(state=s), w.pods_by_node_state[s])
                               for s in UNHEALTHY_STATES if w.pods_by_node_state.get(s))),
    FamilyGenerator(Family("workload_nodes_unhealthy", "gauge",
                           "Distinct nodes that the root workload's pods run on and that are not Ready, "
                           "while non-zero."),
                    lambda w: [("", w.unhealthy_nodes)] if w.unhealthy_nodes else []),
    FamilyGenerator(Family("workload_pods_with_unhealthy_devices", "gauge",
                           "Unfinished pods of the root workload holding a device the kubelet reports Unhealthy, "
                           "while non-zero."),
                    lambda w: [("", w.pods_with_unhealthy_devices)] if w.pods_with_unhealthy_devices else []),
    FamilyGenerator(Family("workload_devices_unhealthy", "gauge",
                           "Devices reported Unhealthy that the root workload's unfinished pods hold, per resource, "
                           "while non-zero."),
                    lambda w: _resources_counted(w.devices_unhealthy)),
    FamilyGenerator(Family("workload_pods_at_risk", "gauge",
                           "Unfinished pods of the root workload on nodes Karpenter is disrupting or may disrupt next, "
                           "by reason (the first of Disrupting, Drifted, Expiring, Consolidatable), while non-zero."),
                    lambda w: ((_labels(reason=r), w.pods_at_risk[r]) for r in RISKS if w.pods_at_risk.get(r))),
    FamilyGenerator(Family("workload_gangs", "gauge",
                           "Gangs of the root workload by state (Whole, Pending, Broken; every state, 0s included, "
                           "for a workload with gangs): docs/gangs.md."),
                    lambda w: ((_labels(state=s), n) for s, n in w.gangs.items())),
    FamilyGenerator(Family("workload_gang_members", "gauge",
                           "Members of the root workload's gangs, summed over them: required (their minimums), "
                           "scheduled (unfinished, bound to a node), ready (of those, Ready on a Ready node), at_risk "
                           "(on nodes Karpenter is disrupting or may disrupt next)."),
                    lambda w: ((_labels(state=s), n) for s, n in w.gang_members.items())),
    FamilyGenerator(Family("workload_gang_members_lost", "gauge",
                           "Members the root workload's Broken gangs lost, by where they were: node group "
                           "(summarizer, group) and domain (the node's --gang-topology-label value); only while a "
                           "gang is Broken, at most 10 series per workload, the rest summed in group \"other\"."),
                    lambda w: ((_labels(summarizer=s, group=g, domain=d), n)
                               for (s, g, d), n in sorted(w.gang_lost.items()))),
)


# -- ClusterResourceClaims, read from their status (the leader writes it; every replica shows it) --

def _status_resources(values: dict[str, str]) -> Iterator[Sample]:
    return _resources({r: parse_or_zero(v) for r, v in values.items()})


def _claim_info(claim: ClusterResourceClaim) -> Iterator[Sample]:
    """One series per resource whose quota the claim sets (those its assignments name), with its
    flavor and policy: read from the spec as written, so a claim governs from the moment it exists
    (its status, and what it says of an invalid spec, come later)."""
    spec = claim.spec
    flavor, member = str(spec.get("flavor", "")), str(spec.get("clusterName") or "local")
    policy = str(spec.get("overAllocation") or "Scale")
    assignments = spec.get("resourceAssignments")
    named = {str(r) for a in assignments if isinstance(a, dict) for part in ("resources", "shares")
             if isinstance(a.get(part), dict) for r in a[part]} if isinstance(assignments, list) else set()
    for resource in sorted(named):
        yield _labels(flavor=flavor, resource=resource, member=member, over_allocation=policy), 1


CLAIM_FAMILIES: tuple[FamilyGenerator[ClusterResourceClaim], ...] = (
    FamilyGenerator(Family("claim_info", "gauge",
                           "1 per resource whose quota a ClusterResourceClaim sets (its assignments name it), with "
                           "the flavor, the cluster whose capacity it reads and its overAllocation policy "
                           "(spec.flavor, spec.clusterName, spec.overAllocation)."),
                    _claim_info),
    FamilyGenerator(Family("claim_nominal", "gauge",
                           "Live capacity of a ClusterResourceClaim's flavor (allocatable of its Ready nodes), "
                           "per resource (status.nominalResources)."),
                    lambda c: _status_resources(claim_status(c).nominalResources)),
    FamilyGenerator(Family("claim_assigned", "gauge",
                           "What a ClusterResourceClaim's assignments ask at its settled capacity, per resource "
                           "(status.assigned)."),
                    lambda c: _status_resources(claim_status(c).assigned)),
    FamilyGenerator(Family("claim_shortfall", "gauge",
                           "Assigned minus settled capacity where positive: an over-allocated ClusterResourceClaim, "
                           "per resource (status.shortfall)."),
                    lambda c: _status_resources(claim_status(c).shortfall)),
)

QueueQuota = dict[str, dict[tuple[str, str], int]]  # ClusterQueue -> (flavor, resource) -> nano-units


def desired_quota(claims: Iterable[ClusterResourceClaim]) -> QueueQuota:
    """What the claims give each ClusterQueue (the sum of their status.queues)."""
    out: QueueQuota = {}
    for claim in claims:
        for q in claim_status(claim).queues:
            per_queue = out.setdefault(q.name, {})
            for resource, value in q.resources.items():
                key = (q.flavor, resource)
                per_queue[key] = per_queue.get(key, 0) + parse_or_zero(value)
    return out


QueueSeries = tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]  # (claimed, nominal) of one queue


def _per_flavor(values: dict[tuple[str, str], int]) -> Iterator[Sample]:
    return ((_labels(flavor=f, resource=r), _quantity(v)) for (f, r), v in sorted(values.items()))


QUEUE_FAMILIES: tuple[FamilyGenerator[QueueSeries], ...] = (
    FamilyGenerator(Family("queue_desired_quota", "gauge",
                           "The nominalQuota the ClusterResourceClaims give a ClusterQueue, per flavor and resource "
                           "(applied with --quota-actuation=on; what would be applied in a dry run)."),
                    lambda q: _per_flavor(q[0])),
    FamilyGenerator(Family("queue_nominal_quota", "gauge",
                           "The nominalQuota a ClusterQueue's spec has, per flavor and resource."),
                    lambda q: _per_flavor(q[1])),
)


def chunks(table: tuple[FamilyGenerator[A], ...], base: str, aggregate: A) -> tuple[str, ...]:
    """One exposition chunk per row of ``table`` for one aggregate whose own labels are ``base``."""
    out = []
    for row in table:
        out.append("".join(_line(row.family, f"{base},{extra}" if extra else base, value)
                           for extra, value in row.samples(aggregate)))
    return tuple(out)


def kind_labels(types: Iterable[GroupKind]) -> dict[GroupKind, str]:
    """The `kind` label per configured (group, kind): the bare kind, or `Kind.group` where two
    configured groups share a kind (batch Job and batch.volcano.sh Job), so series never collide."""
    types = list(types)
    counts: dict[str, int] = {}
    for _, kind in types:
        counts[kind] = counts.get(kind, 0) + 1
    return {(g, k): k if counts[k] == 1 or not g else f"{k}.{g}" for g, k in types}


# -- the renderer's own families (each one a single sample or a small, bounded set) -----------

def _node_groups_per_summarizer(r: Renderer) -> list[Sample]:
    counts: dict[str, int] = {}
    for summarizer, _ in r.index.node_groups:
        counts[summarizer] = counts.get(summarizer, 0) + 1
    return [(_labels(summarizer=s), counts.get(s, 0)) for s in sorted(r.index.node_summarizers)]


def _per_summarizer_cap(value: Callable[[SeriesCap[NodeGroupKey]], int]) -> Callable[[Renderer], list[Sample]]:
    """A sample per configured summarizer from its node-group cap (0 before its first render)."""
    def samples(r: Renderer) -> list[Sample]:
        caps = r.node_group_caps
        return [(_labels(summarizer=s), value(caps[s]) if s in caps else 0) for s in sorted(r.index.node_summarizers)]
    return samples


RENDERER_FAMILIES: tuple[FamilyGenerator[Renderer], ...] = (
    FamilyGenerator(Family("pods_without_workload", "gauge",
                           "Pods with no root workload, by reason: no_workload_type, missing_owner, cycle, too_deep."),
                    lambda r: [(_labels(reason=x), r.index.unresolved.get(x, 0)) for x in UNRESOLVED_REASONS]),
    FamilyGenerator(Family("pods_owner_chain_broken", "gauge",
                           "Pods counted for a workload although an owner above it is missing, by reason."),
                    lambda r: [(_labels(reason=x), r.index.chain_broken.get(x, 0)) for x in BROKEN_REASONS]),
    FamilyGenerator(Family("nodegroups", "gauge", "Node groups per summarizer."),
                    _node_groups_per_summarizer),
    FamilyGenerator(Family("nodegroup_series_limit", "gauge",
                           "The cap on node groups with series of their own, per summarizer."),
                    lambda r: [("", r.max_nodegroup_series)]),
    FamilyGenerator(Family("nodegroup_series_overflow", "gauge",
                           "Node groups beyond the cap, folded into the group=other series, per summarizer."),
                    _per_summarizer_cap(lambda cap: len(cap.overflowed))),
    FamilyGenerator(Family("nodegroup_series_dropped", "counter",
                           "Node groups that were ever folded into the other series, per summarizer."),
                    _per_summarizer_cap(lambda cap: cap.dropped_total)),
    FamilyGenerator(Family("workloads", "gauge", "Root workloads known to the index."),
                    lambda r: [("", len(r.index.workloads))]),
    FamilyGenerator(Family("workload_series_limit", "gauge", "The cap on workloads with series of their own."),
                    lambda r: [("", r.max_workload_series)]),
    FamilyGenerator(Family("workload_series_overflow", "gauge",
                           "Workloads beyond the cap, folded into the workload=other series."),
                    lambda r: [("", len(r.workload_cap.overflowed))]),
    FamilyGenerator(Family("workload_series_dropped", "counter",
                           "Workloads that were ever folded into the other series."),
                    lambda r: [("", r.workload_cap.dropped_total)]),
    FamilyGenerator(Family("scrape_render_seconds", "gauge", "Seconds the previous /metrics render took."),
                    lambda r: [("", round(r.last_render_seconds, 6))]),
    FamilyGenerator(Family("build_info", "gauge",
                           "Always 1; labels carry the version, the source revision and Python's version."),
                    lambda r: [(_labels(**r.build_info), 1)]),
)


class SeriesCap(Generic[K]):
    """At most ``limit`` keys have series of their own. A key keeps its slot while it exists (no
    series churn); new keys take free slots; the rest overflow. ``revision`` is stamped (from the
    index's counter) whenever the set of overflowing keys changes."""

    def __init__(self, limit: int, counter: Revision) -> None:
        self.limit = limit
        self.slots: set[K] = set()
        self.overflowed: set[K] = set()
        self.dropped_total: int = 0  # annotated: RENDERER_FAMILIES, above the class, reads it
        self.counter = counter
        self.revision = 0

    def assign(self, keys: Iterable[K]) -> list[K]:
        """The overflowing keys among ``keys`` (all the keys that exist now). O(keys)."""
        keys = list(keys)
        present = set(keys)
        self.slots &= present
        if not self.overflowed <= present:
            self.overflowed &= present
            self.revision = next(self.counter)
        overflow = []
        for key in keys:
            if key in self.slots:
                continue
            if len(self.slots) < self.limit:
                self.slots.add(key)
                if key in self.overflowed:
                    self.overflowed.discard(key)
                    self.revision = next(self.counter)
            else:
                overflow.append(key)
                if key not in self.overflowed:
                    self.overflowed.add(key)
                    self.dropped_total += 1
                    self.revision = next(self.counter)
        return overflow


def _sum_node_groups(summarizer: str, node_groups: Iterable[NodeGroupAgg]) -> NodeGroupAgg:
    total = NodeGroupAgg(summarizer, OTHER)
    for g in node_groups:
        total.add_sums(g)
    return total


class Renderer:
    def __init__(self, index: ClusterIndex, max_workload_series: int = MAX_WORKLOAD_SERIES,
                 max_nodegroup_series: int = MAX_NODEGROUP_SERIES,
                 build_info: dict[str, str] | None = None,
                 registry: prometheus_client.CollectorRegistry | None = None) -> None:
        # Annotated: RENDERER_FAMILIES, above the class, reads them.
        self.index: ClusterIndex = index
        self.max_workload_series: int = max_workload_series
        self.max_nodegroup_series: int = max_nodegroup_series
        self.build_info: dict[str, str] = build_info or {"version": "unknown"}  # nws_build_info's labels
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        self.workload_cap: SeriesCap[str] = SeriesCap(max_workload_series, index.revision)
        self.node_group_caps: dict[str, SeriesCap[NodeGroupKey]] = {}  # per summarizer
        self._overflowed_node_groups: set[NodeGroupKey] = set()
        self._node_groups_revision = 0  # stamped whenever _overflowed_node_groups changes
        self._node_groups: Stamped[NodeGroupKey, tuple[str, ...]] = Stamped()
        self._other_node_groups: Stamped[str, tuple[str, ...]] = Stamped()
        self._workloads: Stamped[str, tuple[str, ...]] = Stamped()
        self._flavors: Stamped[str, tuple[str, ...]] = Stamped()
        self.last_render_seconds: float = 0.0

    # -- node groups under the cap -------------------------------------------------------------

    def _node_group_chunks(self) -> list[tuple[str, ...]]:
        by_summarizer: dict[str, list[NodeGroupAgg]] = {s: [] for s in self.index.node_summarizers}
        for agg in self.index.node_groups.values():
            by_summarizer.setdefault(agg.summarizer, []).append(agg)
        for gone in self.node_group_caps.keys() - by_summarizer.keys():
            self._forget_summarizer(gone)
        out: list[tuple[str, ...]] = []
        overflowed: set[NodeGroupKey] = set()
        for summarizer, aggs in by_summarizer.items():
            cap = self.node_group_caps.get(summarizer)
            if cap is None:
                cap = self.node_group_caps[summarizer] = SeriesCap(self.max_nodegroup_series, self.index.revision)
            overflow = set(cap.assign((a.summarizer, a.value) for a in aggs))
            out.extend(self._cached_node_group(a) for a in aggs if (a.summarizer, a.value) not in overflow)
            if overflow:
                overflowed |= overflow
                folded = [self.index.node_groups[k] for k in overflow]
                out.append(self._cached_other_node_group(summarizer, cap, folded))
        for key in self._node_groups.keys() - self.index.node_groups.keys():
            del self._node_groups[key]
        if overflowed != self._overflowed_node_groups:
            self._overflowed_node_groups = overflowed
            self._node_groups_revision = next(self.index.revision)
        return out

    def _forget_summarizer(self, summarizer: str) -> None:
        del self.node_group_caps[summarizer]
        self._other_node_groups.pop(summarizer, None)

    def _cached_node_group(self, agg: NodeGroupAgg) -> tuple[str, ...]:
        return self._node_groups.made((agg.summarizer, agg.value), agg.revision, lambda: chunks(
            NODEGROUP_FAMILIES, _labels(summarizer=agg.summarizer, group=agg.value), agg))

    def _cached_other_node_group(self, summarizer: str, cap: SeriesCap[NodeGroupKey],
                                 aggs: list[NodeGroupAgg]) -> tuple[str, ...]:
        # Stamps grow monotonically across the index: (the set's revision, the newest stamp in it)
        # changes whenever the sum does, and checking it costs no dict arithmetic.
        stamp = (cap.revision, max(a.revision for a in aggs))
        return self._other_node_groups.made(summarizer, stamp, lambda: chunks(
            NODEGROUP_FAMILIES, _labels(summarizer=summarizer, group=OTHER), _sum_node_groups(summarizer, aggs)))

    # -- workloads under the cap ---------------------------------------------------------------

    def _series(self, agg: WorkloadAgg) -> WorkloadSeries:
        nodes_by_node_group = agg.nodes_by_node_group
        if self._overflowed_node_groups and nodes_by_node_group:
            folded: dict[NodeGroupKey, int] = {}
            for key, n in nodes_by_node_group.items():
                key = (key[0], OTHER) if key in self._overflowed_node_groups else key
                folded[key] = folded.get(key, 0) + n
            nodes_by_node_group = folded
        return WorkloadSeries(agg.pods, nodes_by_node_group, agg.pods_by_node_state, agg.unhealthy_nodes,
                              agg.pods_with_unhealthy_devices, agg.devices_unhealthy, agg.pods_at_risk,
                              *gang_series(agg.gangs.values()))

    def _cached_workload(self, agg: WorkloadAgg, kinds: dict[GroupKind, str]) -> tuple[str, ...]:
        kind = kinds.get((agg.group, agg.kind), agg.kind) if agg.is_object else agg.label_key
        stamp = (agg.revision, kind, self._node_groups_revision)
        return self._workloads.made(agg.uid, stamp, lambda: chunks(
            WORKLOAD_FAMILIES, _labels(namespace=agg.namespace, workload=agg.name, kind=kind), self._series(agg)))

    def _workload_chunks(self) -> list[tuple[str, ...]]:
        workloads = self.index.workloads
        overflow = self.workload_cap.assign(workloads)
        kinds = kind_labels(self.index.workload_types)
        out = [self._cached_workload(workloads[uid], kinds) for uid in self.workload_cap.slots]
        for uid in self._workloads.keys() - self.workload_cap.slots:
            del self._workloads[uid]
        if overflow:  # pod counts only: where "other" runs would be one series per node group again
            pods: dict[str, int] = {}
            by_state: dict[str, int] = {}
            devices: dict[str, int] = {}
            at_risk: dict[str, int] = {}
            for uid in overflow:
                w = workloads[uid]
                for mine, theirs in ((pods, w.pods), (by_state, w.pods_by_node_state), (devices, w.devices_unhealthy),
                                     (at_risk, w.pods_at_risk)):
                    for k, n in theirs.items():
                        mine[k] = mine.get(k, 0) + n
            device_pods = sum(workloads[uid].pods_with_unhealthy_devices for uid in overflow)
            gangs, members, _ = gang_series(g for uid in overflow for g in workloads[uid].gangs.values())
            out.append(chunks(WORKLOAD_FAMILIES, _labels(namespace="", workload=OTHER, kind=OTHER),
                              WorkloadSeries(pods, {}, by_state, None, device_pods, devices, at_risk, gangs, members,
                                             {})))
        return out

    # -- Kueue flavors (few: no cap) ------------------------------------------------------------

    def _flavor_chunks(self) -> list[tuple[str, ...]]:
        flavors = self.index.kueue.flavors
        for name in self._flavors.keys() - flavors.keys():
            del self._flavors[name]
        return [self._cached_flavor(flavors[name]) for name in sorted(flavors)]

    def _cached_flavor(self, agg: FlavorAgg) -> tuple[str, ...]:
        return self._flavors.made(agg.name, agg.revision,
                                  lambda: chunks(FLAVOR_FAMILIES, _labels(flavor=agg.name), agg))

    # -- render ---------------------------------------------------------------------------------

    def render(self, openmetrics_format: bool = False) -> bytes:
        started = time.perf_counter()
        out: list[str] = []
        node_groups = self._node_group_chunks()  # first: workloads fold node groups by its outcome
        workloads = self._workload_chunks()
        flavors = self._flavor_chunks()
        claims = self.index.kueue.claims  # few: formatted on every scrape
        claim_chunks = [chunks(CLAIM_FAMILIES, _labels(claim=n), claims[n]) for n in sorted(claims)]
        claimed, nominal = desired_quota(claims.values()), self.index.kueue.cluster_queues
        queue_chunks = [chunks(QUEUE_FAMILIES, _labels(cluster_queue=q), (claimed.get(q, {}), nominal.get(q, {})))
                        for q in sorted(claimed.keys() | nominal.keys())]
        # (rows, their chunks per aggregate); each table's rows take another kind of aggregate
        tables: tuple[tuple[tuple[FamilyGenerator[Any], ...], list[tuple[str, ...]]], ...] = (
            (NODEGROUP_FAMILIES, node_groups), (WORKLOAD_FAMILIES, workloads), (FLAVOR_FAMILIES, flavors),
            (CLAIM_FAMILIES, claim_chunks), (QUEUE_FAMILIES, queue_chunks))
        for table, rendered in tables:
            for i, row in enumerate(table):
                out.append(row.family.header(openmetrics_format))
                out.extend(c[i] for c in rendered)
        out.extend(self._own_lines(openmetrics_format))
        self.last_render_seconds = time.perf_counter() - started
        body = "".join(out).encode()
        if openmetrics_format:
            return body + openmetrics.generate_latest(self.registry)  # ends with "# EOF"
        return body + prometheus_client.generate_latest(self.registry)

    def _own_lines(self, om: bool) -> list[str]:
        """The renderer's own families: few samples each, formatted anew on every scrape."""
        out: list[str] = []
        for row in RENDERER_FAMILIES:
            out.append(row.family.header(om))
            out.extend(_line(row.family, labels, value) for labels, value in row.samples(self))
        return out
