"""Desired NodeSummary and WorkloadSummary objects, computed from the index's aggregates.

Pure functions: no I/O. Fields that would be empty are left out, so a desired status compares
equal to what the API server stores and returns.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from kubeindex.model.disruption import Blocker
from kubeindex.model.gangs import BROKEN, PENDING, WHOLE, Gang, gang_order
from kubeindex.model.index import (
    NODE_STATES,
    PHASES,
    ClusterIndex,
    LabelWorkloadInfo,
    NodeGroupAgg,
    NodeGroupKey,
    WorkloadAgg,
)
from kubeindex.model.karpenter import DISRUPTING, DRIFTED, RISKS, UP_TO_DATE
from kubeindex.model.objects import GROUP, key_of, label_workload_type
from kubeindex.model.owners import GroupKind
from kubeindex.model.quantity import format_quantity
from kubeindex.model.resources import NODE_SUMMARIES, NODE_SUMMARIZERS, WORKLOAD_SUMMARIES
from kubeindex.model.revision import Stamped

from .names import Claim, NameAllocator

MANAGED_BY = f"{GROUP}/managed-by"
MANAGER = "node-workload-summary"
SUMMARIZER_LABEL = f"{GROUP}/summarizer"
MAX_LABEL_VALUE = 63
MAX_BLOCKERS = 10  # blocked nodes a NodeSummary names (crds/nodesummaries.yaml's maxItems)
MAX_GANGS = 5  # the worst gangs a WorkloadSummary names, and the places each names (maxItems)

SHORT_TYPES = {
    ("apps", "Deployment"): "deploy", ("apps", "StatefulSet"): "sts", ("apps", "DaemonSet"): "ds",
    ("apps", "ReplicaSet"): "rs", ("batch", "Job"): "job", ("batch", "CronJob"): "cj",
    ("", "ReplicationController"): "rc", ("", "Pod"): "pod",
    ("jobset.x-k8s.io", "JobSet"): "js", ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): "lws",
    ("ray.io", "RayCluster"): "raycluster", ("ray.io", "RayJob"): "rayjob", ("ray.io", "RayService"): "raysvc",
    ("sparkoperator.k8s.io", "SparkApplication"): "sparkapp", ("kubeflow.org", "PyTorchJob"): "ptjob",
    ("kubeflow.org", "MPIJob"): "mpijob", ("kubeflow.org", "TFJob"): "tfjob", ("kubeflow.org", "TrainJob"): "trainjob",
    ("trainer.kubeflow.org", "TrainJob"): "trainjob", ("argoproj.io", "Workflow"): "wf",
    ("argoproj.io", "Rollout"): "rollout", ("batch.volcano.sh", "Job"): "vcjob",
    ("scheduling.k8s.io", "Workload"): "wl",
}


LABEL_SHORT_TYPE = "label"  # the shortType of a label workload whose podLabelWorkloads entry sets none


def short_type(group: str, kind: str, configured: str | None) -> str:
    return configured or SHORT_TYPES.get((group, kind), kind.lower())


def names_prefix(names: set[str]) -> str:
    """Longest common prefix of the node names, then '*' (the LCP of a set is that of its min and max)."""
    if not names:
        return ""
    low, high = min(names), max(names)
    n = 0
    while n < min(len(low), len(high)) and low[n] == high[n]:
        n += 1
    return low[:n] + "*"


def _quantities(values: dict[str, int]) -> dict[str, str]:
    return {r: format_quantity(r, v) for r, v in sorted(values.items())}


def _minus(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """a - b per resource; resources at 0 left out."""
    return {r: v - b.get(r, 0) for r, v in a.items() if v != b.get(r, 0)}


def _drop_empty(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v not in ({}, [], "", None)}


@dataclass(frozen=True)
class Desired:
    """One object to exist: identity, metadata+spec (applied once) and status (kept current)."""

    plural: str
    namespace: str
    name: str
    body: dict[str, Any]  # apiVersion, kind, metadata (name, namespace, labels, ownerReferences), spec
    status: dict[str, Any]

    @property
    def key(self) -> str:
        return key_of(self.namespace, self.name)


def node_claim(summarizer: str, value: str) -> Claim:
    return Claim("", f"{summarizer}\x00{value}", f"{summarizer}-{value}")


def workload_claim(namespace: str, group: str, kind: str, name: str) -> Claim:
    return Claim(namespace, f"{group}\x00{kind}\x00{name}", name)


def label_claim(namespace: str, label_key: str, value: str) -> Claim:
    """A label workload's claim. Its identity starts with `label/`: an owner's starts with its API
    group, which has no '/', so the two never share an identity (nor a hashed name)."""
    return Claim(namespace, f"{label_workload_type(label_key)}\x00{value}", value)


def claim_of_workload(agg: WorkloadAgg) -> Claim:
    """The claim a workload's summary makes (controller.claim_of_summary reads it back from the object)."""
    if agg.is_object:
        return workload_claim(agg.namespace, agg.group, agg.kind, agg.name)
    return label_claim(agg.namespace, agg.label_key, agg.name)


def _not_ready(agg: NodeGroupAgg) -> int:
    return agg.conditions.get("NotReady", 0) + agg.conditions.get("Unknown", 0)


def _phases(pods: dict[str, int]) -> dict[str, int]:
    return {p: pods[p] for p in PHASES if pods.get(p)}


# NodeSummary status: one function per field. A new field is one row here and its property in
# crds/nodesummaries.yaml (the API server drops undeclared fields; tests/unit/test_desired.py checks the
# two agree). Empty maps, lists and strings are left out, so the desired status compares equal to
# what the API server returns.
NODE_SUMMARY_STATUS: dict[str, Callable[[NodeGroupAgg], Any]] = {
    "nodeCount": lambda a: a.nodes,
    "nodeNamesPrefix": lambda a: names_prefix(a.node_names),
    "conditions": lambda a: [{"type": "Ready", "count": a.conditions.get("Ready", 0)},
                             {"type": "NotReady", "count": _not_ready(a)}],
    "unschedulableCount": lambda a: a.unschedulable,
    "podCount": lambda a: sum(a.pods.values()),
    "pods": lambda a: _phases(a.pods),
    "allocatable": lambda a: _quantities(a.allocatable),
    "capacity": lambda a: _quantities(a.capacity),
    "notReadyAllocatable": lambda a: _quantities(_minus(a.allocatable, a.ready_allocatable)),
    "requested": lambda a: _quantities(a.requested),
    "nodesByState": lambda a: {s: a.states[s] for s in NODE_STATES if a.states.get(s)},  # a state left out: 0
    "unhealthyNodeCount": lambda a: sum(n for s, n in a.states.items() if s not in ("Ready", "Cordoned")),
    "unhealthyAccelerators": lambda a: _quantities(a.accelerators_unhealthy),
    "podsWithUnhealthyDevices": lambda a: a.pods_with_unhealthy_devices or None,  # 0: left out
    "unhealthyDevices": lambda a: dict(sorted(a.devices_unhealthy.items())),
    "rollout": lambda a: _rollout(a.rollout, a.held),
    "blockedNodeCount": lambda a: a.blocked or None,  # 0: left out
    "blockers": lambda a: _blockers(a.blockers),
}


def _rollout(counts: dict[str, int], held: int) -> dict[str, int]:
    """Every count, 0s included, for a group with NodeClaims (a health gate reads drifted == 0); else none.
    ``held``, the candidates a blocker holds (only with --karpenter-events), while there are some."""
    if not counts:
        return {}
    return {"upToDate": counts.get(UP_TO_DATE, 0), "drifted": counts.get(DRIFTED, 0),
            "disrupting": counts.get(DISRUPTING, 0), **({"held": held} if held else {})}


def _blockers(blockers: Mapping[str, Blocker]) -> list[dict[str, str]]:
    """The first MAX_BLOCKERS blocked nodes by name, each with what blocks it. O(blocked nodes)."""
    out = []
    for node in sorted(blockers)[:MAX_BLOCKERS]:
        b = blockers[node]
        entry = {"node": node, "kind": b.kind, "namespace": b.namespace, "name": ",".join(b.names) or node}
        out.append(_drop_empty(entry))
    return out


def node_summary(agg: NodeGroupAgg, name: str, label_key: str, summarizer_uid: str) -> Desired:
    status = _drop_empty({field: value(agg) for field, value in NODE_SUMMARY_STATUS.items()})
    body = {
        "apiVersion": NODE_SUMMARIES.api_version, "kind": NODE_SUMMARIES.kind,
        "metadata": {
            "name": name,
            "labels": _summary_labels(agg.summarizer),
            "ownerReferences": [{"apiVersion": NODE_SUMMARIZERS.api_version, "kind": NODE_SUMMARIZERS.kind,
                                 "name": agg.summarizer, "uid": summarizer_uid, "controller": True}],
        },
        "spec": {"selector": {"matchLabels": {label_key: agg.value}}},
    }
    return Desired(NODE_SUMMARIES.plural, "", name, body, status)


def _summary_labels(summarizer: str) -> dict[str, str]:
    """Our labels; the summarizer's name only where it fits a label value (names may be longer)."""
    labels = {MANAGED_BY: MANAGER}
    if len(summarizer) <= MAX_LABEL_VALUE:
        labels[SUMMARIZER_LABEL] = summarizer
    return labels


@dataclass(frozen=True)
class TypeInfo:
    api_version: str  # of the workload's own resource (for the ownerReference)
    short_type: str
    long_type: str


@dataclass(frozen=True)
class WorkloadView:
    """What a WorkloadSummary's status is made of."""

    agg: WorkloadAgg
    info: TypeInfo
    refs: list[dict[str, Any]]  # nodeSummaryRefs, most nodes first
    summary_names: Mapping[NodeGroupKey, str]


# WorkloadSummary status: the same, from a WorkloadView (crds/workloadsummaries.yaml).
WORKLOAD_SUMMARY_STATUS: dict[str, Callable[[WorkloadView], Any]] = {
    "podCount": lambda w: sum(w.agg.pods.values()),
    "shortType": lambda w: w.info.short_type,
    "longType": lambda w: w.info.long_type,
    "pods": lambda w: _phases(w.agg.pods),
    "podsOnUnhealthyNodes": lambda w: sum(w.agg.pods_by_node_state.values()),
    "podsByNodeState": lambda w: {s: w.agg.pods_by_node_state[s] for s in NODE_STATES
                                  if w.agg.pods_by_node_state.get(s)},
    "nodeSummaryRefs": lambda w: w.refs,
    "placement": lambda w: ",".join(f"{r['name']}={r['nodeCount']}" for r in w.refs),
    "podsWithUnhealthyDevices": lambda w: w.agg.pods_with_unhealthy_devices or None,
    "unhealthyDevices": lambda w: dict(sorted(w.agg.devices_unhealthy.items())),
    "atRisk": lambda w: _at_risk(w.agg, w.summary_names),
    "gangs": lambda w: _gang_counts(w.agg.gangs.values()),
    "gangsWhole": lambda w: f"{sum(g.state == WHOLE for g in w.agg.gangs.values())}/{len(w.agg.gangs)}"
                            if w.agg.gangs else "",
    "worstGangs": lambda w: _worst_gangs(w.agg.gangs.values(), w.summary_names),
}


def _gang_counts(gangs: Iterable[Gang]) -> dict[str, int]:
    """Gangs per state, 0s included (a health gate reads broken == 0), for a workload with gangs."""
    states = [g.state for g in gangs]
    if not states:
        return {}
    return {"count": len(states), "whole": states.count(WHOLE), "pending": states.count(PENDING),
            "broken": states.count(BROKEN)}


def _worst_gangs(gangs: Iterable[Gang], summary_names: Mapping[NodeGroupKey, str]) -> list[dict[str, Any]]:
    """The MAX_GANGS worst gangs (gangs.gang_order). O(gangs of the workload)."""
    return [_drop_empty({"name": g.name, "state": g.state, "required": g.required, "scheduled": g.scheduled,
                         "ready": g.ready, "succeeded": g.succeeded or None,
                         "lost": _lost(g, summary_names) if g.missing else []})
            for g in sorted(gangs, key=gang_order)[:MAX_GANGS]]


def _lost(gang: Gang, summary_names: Mapping[NodeGroupKey, str]) -> list[dict[str, Any]]:
    """Where a short gang's missing members were: per NodeSummary and domain, most first."""
    counts: dict[tuple[str, str], int] = {}
    for (node_groups, domain), n in gang.places().items():
        for name in [summary_names[g] for g in node_groups if g in summary_names] or [""]:
            counts[name, domain] = counts.get((name, domain), 0) + n
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:MAX_GANGS]
    return [_drop_empty({"nodeSummary": name, "domain": domain, "members": n}) for (name, domain), n in ranked]


def _at_risk(agg: WorkloadAgg, summary_names: Mapping[NodeGroupKey, str]) -> dict[str, Any]:
    """Pods at risk, by reason (karpenter.RISKS) and per NodeSummary (most first); none: left out."""
    if not agg.pods_at_risk:
        return {}
    named = sorted((-n, summary_names[g]) for g, n in agg.pods_at_risk_by_node_group.items() if g in summary_names)
    pools = [{"name": name, "pods": -n} for n, name in named]
    return _drop_empty({"pods": sum(agg.pods_at_risk.values()),
                        "reasons": {r: agg.pods_at_risk[r] for r in RISKS if agg.pods_at_risk.get(r)},
                        "nodeSummaries": pools,
                        "gangs": sum(1 for g in agg.gangs.values() if g.at_risk) or None})


def _refs(agg: WorkloadAgg, summary_names: dict[NodeGroupKey, str]) -> list[dict[str, Any]]:
    unhealthy = agg.unhealthy_nodes_by_node_group
    refs = [{"name": summary_names[g], "nodeCount": n, "unhealthyNodeCount": unhealthy.get(g, 0)}
            for g, n in agg.nodes_by_node_group.items() if g in summary_names]
    return sorted(refs, key=lambda r: (-r["nodeCount"], r["name"]))


def label_type(info: LabelWorkloadInfo) -> TypeInfo:
    """How a label workload is shown: longType `label/<key>`, shortType its entry's or `label`."""
    return TypeInfo("", info.short_type or LABEL_SHORT_TYPE, label_workload_type(info.label_key))


def workload_summary(agg: WorkloadAgg, name: str, info: TypeInfo, summary_names: dict[NodeGroupKey, str]) -> Desired:
    view = WorkloadView(agg, info, _refs(agg, summary_names), summary_names)
    status = _drop_empty({field: value(view) for field, value in WORKLOAD_SUMMARY_STATUS.items()})
    metadata: dict[str, Any] = {"name": name, "namespace": agg.namespace, "labels": {MANAGED_BY: MANAGER}}
    if agg.is_object:  # owned by the workload, so the garbage collector removes it with it
        ref = {"apiVersion": info.api_version, "kind": agg.kind, "name": agg.name, "uid": agg.uid}
        metadata["ownerReferences"] = [ref]
    else:  # no object to own it: the reconciler deletes it when the label's last pod is gone
        ref = {"labelKey": agg.label_key, "labelValue": agg.name}
    body = {"apiVersion": WORKLOAD_SUMMARIES.api_version, "kind": WORKLOAD_SUMMARIES.kind, "metadata": metadata,
            "spec": {"workloadRef": ref}}
    return Desired(WORKLOAD_SUMMARIES.plural, agg.namespace, name, body, status)


def _type_of(agg: WorkloadAgg, type_infos: Mapping[GroupKind, TypeInfo],
             label_infos: Mapping[str, TypeInfo]) -> TypeInfo | None:
    """How a workload is written; None: it is not (a kind not usable now, a flag-only label key)."""
    return type_infos.get((agg.group, agg.kind)) if agg.is_object else label_infos.get(agg.label_key)


# A Desired is made again only when its inputs changed: an unchanged aggregate keeps its object,
# so a pass over a quiet cluster allocates nothing.
Cache = Stamped[object, Desired]


@dataclass
class Naming:
    """The name allocators of both kinds, and the names of the objects that exist per claim
    (kept by the reconciler from its watch of our objects)."""

    nodes: NameAllocator
    workloads: NameAllocator
    held_nodes: Mapping[Claim, Iterable[str]]
    held_workloads: Mapping[Claim, Iterable[str]]

    @classmethod
    def empty(cls) -> Naming:
        return cls(NameAllocator(), NameAllocator(), {}, {})


@dataclass(frozen=True)
class Layout:
    """What only a pass over everything can decide: each object's name (names are allocated
    among all claims) and, for a workload, how it is written. Between changes to the sets of node
    groups and workloads, each touched aggregate's object is made within it when taken (``desired_one``)."""

    node_groups: dict[NodeGroupKey, tuple[str, str, str]]  # key -> (name, label key, summarizer UID)
    workloads: dict[str, tuple[str, TypeInfo]]  # UID -> (name, type): the workloads written
    summary_names: dict[NodeGroupKey, str]


def layout(index: ClusterIndex, node_summarizer_uids: dict[str, str], type_infos: dict[GroupKind, TypeInfo],
           naming: Naming) -> Layout:
    """O(node groups + workloads)."""
    keys = [k for k, agg in index.node_groups.items() if agg.summarizer in node_summarizer_uids]
    claims = {key: node_claim(*key) for key in keys}
    node_names = naming.nodes.assign(claims.values(), naming.held_nodes)
    summary_names = {key: node_names[claim] for key, claim in claims.items()}
    node_groups = {key: (summary_names[key], index.node_summarizers[key[0]], node_summarizer_uids[key[0]])
                   for key in keys}
    # Label workloads of a key no summarizer lists (the deprecated flag's) are in the metrics only.
    label_infos = {key: label_type(info) for key, info in index.label_types.items() if info.summarizer}
    infos = {w.uid: info for w in index.workloads.values()
             if (info := _type_of(w, type_infos, label_infos)) is not None}
    workload_claims = {uid: claim_of_workload(index.workloads[uid]) for uid in infos}
    names = naming.workloads.assign(workload_claims.values(), naming.held_workloads)
    workloads: dict[str, tuple[str, TypeInfo]] = {}
    emitted: set[Claim] = set()
    for uid, claim in workload_claims.items():
        if claim in emitted:
            continue  # deleted and recreated under the same name: both known for a moment
        emitted.add(claim)
        workloads[uid] = (names[claim], infos[uid])
    return Layout(node_groups, workloads, summary_names)


Made = NodeGroupKey | str  # what one object is made from: a node group, or a workload (its UID)


def made_from(index: ClusterIndex, plan: Layout, node_groups: Iterable[NodeGroupKey],
              workloads: Iterable[str]) -> dict[tuple[str, str], Made]:
    """The objects (plural, store key) of these node groups and workloads that the layout writes,
    each with what it is made from: ``desired_one`` makes it when a worker takes it. O(given)."""
    out: dict[tuple[str, str], Made] = {}
    for key in node_groups:
        if (where := plan.node_groups.get(key)) is not None:
            out[NODE_SUMMARIES.plural, where[0]] = key
    for uid in workloads:
        if (how := plan.workloads.get(uid)) is not None and (w := index.workloads.get(uid)) is not None:
            out[WORKLOAD_SUMMARIES.plural, key_of(w.namespace, how[0])] = uid
    return out


def desired_one(index: ClusterIndex, plan: Layout, cache: Cache, made: Made) -> Desired | None:
    """The object of one node group or workload of the layout (None: not written, or gone)."""
    if isinstance(made, str):
        how, w = plan.workloads.get(made), index.workloads.get(made)
        if how is None or w is None:
            return None
        name, info = how
        refs = tuple(plan.summary_names.get(g) for g in w.nodes_by_node_group)  # the names its refs point at
        return cache.made(made, (w.revision, name, info, refs),
                          partial(workload_summary, w, name, info, plan.summary_names))
    where, agg = plan.node_groups.get(made), index.node_groups.get(made)
    if where is None or agg is None:
        return None
    name, label_key, uid = where
    return cache.made(made, (agg.revision, name, label_key, uid),
                      partial(node_summary, agg, name, label_key, uid))


def desired_all(index: ClusterIndex, plan: Layout, cache: Cache) -> list[Desired]:
    """Every object that should exist; the cache keeps only theirs."""
    made: list[Made] = [*plan.node_groups, *plan.workloads]
    out = [d for m in made if (d := desired_one(index, plan, cache, m)) is not None]
    for stale in cache.keys() - plan.node_groups.keys() - plan.workloads.keys():
        del cache[stale]
    return out


def desired_state(index: ClusterIndex, node_summarizer_uids: dict[str, str],
                  type_infos: dict[GroupKind, TypeInfo], cache: Cache | None = None,
                  naming: Naming | None = None) -> list[Desired]:
    """Every object that should exist. O(node groups + workloads), with a cheap constant when ``cache``
    and ``naming`` are kept between calls."""
    plan = layout(index, node_summarizer_uids, type_infos, naming or Naming.empty())
    return desired_all(index, plan, Stamped() if cache is None else cache)
