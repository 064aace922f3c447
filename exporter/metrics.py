"""The /metrics exposition, rendered from the index's aggregates.

A scrape costs O(series), never O(pods): each node group and each workload keeps its exposition
lines cached under the aggregate's generation stamp, so only what changed since the last scrape
is formatted again; the rest is a join of cached strings. (prometheus-client's generic path costs
about 10 us per labelled sample; it still renders the process metrics appended at the end.)

Families (prefix ``nws_``) are documented in README.md; every one of them is listed here once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import prometheus_client
from prometheus_client.openmetrics import exposition as openmetrics

from kubeindex.index import PHASES, READY_STATES, ClusterIndex, GroupAgg, WorkloadAgg
from kubeindex.quantity import NANO
from kubeindex.sources import Sources

if TYPE_CHECKING:
    from reconciler.controller import Reconciler
    from reconciler.leader import LeaderElector

PREFIX = "nws_"
TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
OTHER = "other"  # the explicit overflow series when the workload series cap is reached
ALWAYS_PHASES = ("Pending", "Running")  # workload phases emitted even at 0 (stable series)


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


GROUP_FAMILIES = (
    Family("nodegroup_nodes", "gauge", "Nodes in the node group (nodes of a NodeSummarizer with one label value)."),
    Family("nodegroup_nodes_by_condition", "gauge",
           "Nodes of the group by Ready condition: Ready, NotReady or Unknown."),
    Family("nodegroup_nodes_unschedulable", "gauge", "Cordoned nodes (spec.unschedulable) in the node group."),
    Family("nodegroup_allocatable", "gauge",
           "Sum of node allocatable per resource (cpu in cores, memory in bytes, others in units)."),
    Family("nodegroup_capacity", "gauge", "Sum of node capacity per resource."),
    Family("nodegroup_pods", "gauge", "Pods bound to the group's nodes, by phase."),
    Family("nodegroup_requested", "gauge",
           "Sum of the effective resource requests of the non-terminated pods on the group's nodes."),
)
WORKLOAD_FAMILIES = (
    Family("workload_pods", "gauge",
           "Pods of the root workload by phase (Pending and Running always, other phases when non-zero)."),
    Family("workload_nodes", "gauge", "Distinct nodes of each node group that the workload's pods run on."),
)
F_EVENTS = Family("watch_events", "counter", "Watch events received, by resource and event type.")
F_RELISTS = Family("watch_relists", "counter", "Full LISTs (initial, after 410 Gone), by resource.")
F_RESTARTS = Family("watch_restarts", "counter", "Watch restarts by resource and reason (gone, timeout, ...).")
F_AGE = Family("watch_last_event_age_seconds", "gauge", "Seconds since the last event or list page, by resource.")
F_OBJECTS = Family("watch_objects", "gauge", "Objects currently known, by resource.")
F_SYNCED = Family("watch_synced", "gauge", "1 once the resource's initial LIST completed.")
F_SYNC = Family("initial_sync_duration_seconds", "gauge", "Seconds from start until every watch had listed.")
F_UNRESOLVED = Family("pods_without_workload", "gauge",
                      "Pods with no root workload, by reason: no_workload_type, missing_owner, cycle, too_deep.")
F_NOT_SERVED = Family("kind_not_served", "gauge", "1 for each configured or referenced kind the API does not serve.")
F_CAP = Family("workload_series_limit", "gauge", "The cap on workloads with series of their own.")
F_WORKLOADS = Family("workloads", "gauge", "Root workloads known to the index.")
F_OVERFLOW = Family("workload_series_overflow", "gauge",
                    "Workloads beyond the cap, folded into the workload=other series.")
F_DROPPED = Family("workload_series_dropped", "counter", "Workloads that were ever folded into the other series.")
F_NODE_GROUPS = Family("nodegroups", "gauge", "Node groups per summarizer.")
F_RENDER = Family("scrape_render_seconds", "gauge", "Seconds the previous /metrics render took.")
F_INFO = Family("build_info", "gauge", "Always 1; labels carry the version.")
F_WRITES = Family("reconciler_writes", "counter", "Successful API writes of the reconciler, by verb.")
F_WRITE_ERRORS = Family("reconciler_write_errors", "counter", "Failed API writes of the reconciler, by HTTP status.")
F_LEADER = Family("reconciler_leader", "gauge", "1 while this replica holds the lease and writes.")
F_SUMMARIES = Family("reconciler_summaries", "gauge", "Summary objects that exist, by kind.")


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


def group_chunks(agg: GroupAgg) -> tuple[str, ...]:
    """One exposition chunk per GROUP_FAMILIES entry for one node group."""
    base = _labels(summarizer=agg.summarizer, group=agg.value)
    nodes, by_cond, unsched, alloc, cap, pods, req = GROUP_FAMILIES
    return (
        _line(nodes, base, agg.nodes),
        "".join(_line(by_cond, f'{base},condition="{c}"', agg.conditions.get(c, 0)) for c in READY_STATES),
        _line(unsched, base, agg.unschedulable),
        "".join(_line(alloc, f'{base},resource="{_esc(r)}"', _quantity(v)) for r, v in sorted(agg.allocatable.items())),
        "".join(_line(cap, f'{base},resource="{_esc(r)}"', _quantity(v)) for r, v in sorted(agg.capacity.items())),
        "".join(_line(pods, f'{base},phase="{p}"', agg.pods.get(p, 0)) for p in PHASES),
        "".join(_line(req, f'{base},resource="{_esc(r)}"', _quantity(v)) for r, v in sorted(agg.requested.items())),
    )


def _workload_lines(base: str, pods: dict[str, int], group_nodes: dict[tuple[str, str], int]) -> tuple[str, str]:
    fam_pods, fam_nodes = WORKLOAD_FAMILIES
    phases = [p for p in PHASES if p in ALWAYS_PHASES or pods.get(p)]
    return (
        "".join(_line(fam_pods, f'{base},phase="{p}"', pods.get(p, 0)) for p in phases),
        "".join(_line(fam_nodes, f"{base},{_labels(summarizer=s, group=g)}", n)
                for (s, g), n in sorted(group_nodes.items())),
    )


def workload_chunks(agg: WorkloadAgg, kind: str) -> tuple[str, str]:
    return _workload_lines(_labels(namespace=agg.namespace, workload=agg.name, kind=kind), agg.pods, agg.group_nodes)


def kind_labels(types: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """The `kind` label per configured (group, kind): the bare kind, or `Kind.group` where two
    configured groups share a kind (batch Job and batch.volcano.sh Job), so series never collide."""
    types = list(types)
    counts: dict[str, int] = {}
    for _, kind in types:
        counts[kind] = counts.get(kind, 0) + 1
    return {(g, k): k if counts[k] == 1 or not g else f"{k}.{g}" for g, k in types}


class Renderer:
    def __init__(self, index: ClusterIndex, sources: Sources | None, max_workload_series: int,
                 version: str = "0.1.0", registry: prometheus_client.CollectorRegistry | None = None,
                 reconciler: Reconciler | None = None, elector: LeaderElector | None = None) -> None:
        self.index = index
        self.sources = sources
        self.reconciler = reconciler
        self.elector = elector
        self.max_workload_series = max_workload_series
        self.version = version
        self.registry = registry if registry is not None else prometheus_client.REGISTRY
        self._groups: dict[tuple[str, str], tuple[int, tuple[str, ...]]] = {}
        self._workloads: dict[str, tuple[int, str, tuple[str, str]]] = {}
        self._slots: set[str] = set()  # workloads that have series of their own
        self._overflowed: set[str] = set()
        self.dropped_total = 0
        self.last_render_seconds = 0.0

    # -- workloads under the cap -------------------------------------------------------------

    def _assign_slots(self) -> list[WorkloadAgg]:
        """Workloads keep their slot while they exist (no series churn); new ones take free slots;
        the rest go to "other". O(workloads)."""
        workloads = self.index.workloads
        self._slots &= workloads.keys()
        self._overflowed &= workloads.keys()
        overflow = []
        for uid, agg in workloads.items():
            if uid in self._slots:
                continue
            if len(self._slots) < self.max_workload_series:
                self._slots.add(uid)
                self._overflowed.discard(uid)
            else:
                overflow.append(agg)
                if uid not in self._overflowed:
                    self._overflowed.add(uid)
                    self.dropped_total += 1
        return overflow

    def _cached_group(self, agg: GroupAgg) -> tuple[str, ...]:
        key = (agg.summarizer, agg.value)
        hit = self._groups.get(key)
        if hit is None or hit[0] != agg.generation:
            hit = self._groups[key] = (agg.generation, group_chunks(agg))
        return hit[1]

    def _cached_workload(self, agg: WorkloadAgg, kinds: dict[tuple[str, str], str]) -> tuple[str, str]:
        kind = kinds.get((agg.group, agg.kind), agg.kind)
        hit = self._workloads.get(agg.uid)
        if hit is None or hit[0] != agg.generation or hit[1] != kind:
            hit = self._workloads[agg.uid] = (agg.generation, kind, workload_chunks(agg, kind))
        return hit[2]

    # -- render ---------------------------------------------------------------------------------

    def render(self, openmetrics_format: bool = False) -> bytes:
        started = time.perf_counter()
        out: list[str] = []
        groups = [self._cached_group(g) for g in self.index.groups.values()]
        for key in self._groups.keys() - self.index.groups.keys():
            del self._groups[key]
        for i, family in enumerate(GROUP_FAMILIES):
            out.append(family.header(openmetrics_format))
            out.extend(chunks[i] for chunks in groups)

        overflow = self._assign_slots()
        kinds = kind_labels(self.index.workload_types)
        workloads = [self._cached_workload(self.index.workloads[uid], kinds) for uid in self._slots]
        for uid in self._workloads.keys() - self._slots:
            del self._workloads[uid]
        if overflow:
            pods: dict[str, int] = {}
            for agg in overflow:
                for phase, n in agg.pods.items():
                    pods[phase] = pods.get(phase, 0) + n
            workloads.append(_workload_lines(_labels(namespace="", workload=OTHER, kind=OTHER), pods, {}))
        for i, family in enumerate(WORKLOAD_FAMILIES):
            out.append(family.header(openmetrics_format))
            out.extend(chunks[i] for chunks in workloads)

        out.extend(self._self_metrics(openmetrics_format, len(overflow)))
        self.last_render_seconds = time.perf_counter() - started
        body = "".join(out).encode()
        if openmetrics_format:
            return body + openmetrics.generate_latest(self.registry)  # ends with "# EOF"
        return body + prometheus_client.generate_latest(self.registry)

    def _self_metrics(self, om: bool, overflow: int) -> list[str]:
        out: list[str] = []

        def family(fam: Family, samples: list[tuple[str, object]]) -> None:
            out.append(fam.header(om))
            out.extend(_line(fam, labels, value) for labels, value in samples)

        now = time.time()
        stats = self.sources.stats if self.sources else {}
        family(F_EVENTS, [(_labels(resource=r, type=t), n)
                          for r, s in stats.items() for t, n in sorted(s.events.items())])
        family(F_RELISTS, [(_labels(resource=r), s.relists) for r, s in stats.items()])
        family(F_RESTARTS, [(_labels(resource=r, reason=k), n)
                            for r, s in stats.items() for k, n in sorted(s.restarts.items())])
        family(F_AGE, [(_labels(resource=r), round(now - s.last_event, 3)) for r, s in stats.items() if s.last_event])
        family(F_OBJECTS, [(_labels(resource=r), s.objects) for r, s in stats.items()])
        family(F_SYNCED, [(_labels(resource=r), int(s.synced)) for r, s in stats.items()])
        if self.sources is not None and self.sources.sync_seconds is not None:
            family(F_SYNC, [("", round(self.sources.sync_seconds, 3))])
        family(F_UNRESOLVED, [(_labels(reason=k), n) for k, n in sorted(self.index.unresolved.items())])
        missing = sorted(self.sources.missing_kinds) if self.sources else []
        family(F_NOT_SERVED, [(_labels(group=g, kind=k), 1) for g, k in missing])
        counts: dict[str, int] = {}
        for summarizer, _ in self.index.groups:
            counts[summarizer] = counts.get(summarizer, 0) + 1
        family(F_NODE_GROUPS, [(_labels(summarizer=s), counts.get(s, 0)) for s in sorted(self.index.node_summarizers)])
        family(F_WORKLOADS, [("", len(self.index.workloads))])
        family(F_CAP, [("", self.max_workload_series)])
        family(F_OVERFLOW, [("", overflow)])
        family(F_DROPPED, [("", self.dropped_total)])
        family(F_RENDER, [("", round(self.last_render_seconds, 6))])
        family(F_INFO, [(_labels(version=self.version), 1)])
        if self.reconciler is not None:
            stats = self.reconciler.stats
            family(F_WRITES, [(_labels(verb=v), n) for v, n in sorted(stats.writes.items())])
            family(F_WRITE_ERRORS, [(_labels(code=c), n) for c, n in sorted(stats.errors.items())])
            leader = self.elector.is_leader if self.elector is not None else True
            family(F_LEADER, [("", int(leader))])
            family(F_SUMMARIES, [(_labels(kind=k), len(v)) for k, v in sorted(self.reconciler.actual.items())])
        return out
