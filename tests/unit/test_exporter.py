"""The exporter. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_exporter.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, TypeVar

import pytest
from prometheus_client import CollectorRegistry

import exporter.metrics as metrics
from exporter.metrics import Renderer
from kubeindex.model.index import NODE_STATES, PHASES, ClusterIndex
from kubeindex.model.objects import Taint
from kubeindex.watch.metrics import SourcesCollector
from kubeindex.watch.reflector import SourceStats
from localkube.service import parse, select, value
from reconciler.metrics import ReconcilerCollector
from reconciler.workqueue import WorkQueue
from tests.builders import add_owner, configured, make_node, make_pod, ref
from tests.reference import Owner

A = TypeVar("A")  # the aggregate of a family table's rows


HOST = "kubernetes.io/hostname"


def _render(renderer: Renderer) -> dict:
    return parse(renderer.render().decode())


def _series_per_family(samples: dict) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, _ in samples:
        counts[name] = counts.get(name, 0) + 1
    return counts


def _hostname_cluster(nodes: int, deployments: int) -> ClusterIndex:
    """A hostname summarizer (one group per node) beside a pool summarizer, a DaemonSet on every
    node, many Deployments, a GPU pool, pods without workload and below a broken chain."""
    index = ClusterIndex()
    index.set_node_summarizer("host", HOST)
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", configured(("apps", "DaemonSet"), ("apps", "Deployment"),
                                                  ("apps", "StatefulSet")))
    add_owner(index, Owner("ds", "apps", "DaemonSet", "ns", "agent", None))
    for i in range(nodes):
        alloc = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "7" if i % 9 == 0 else "8"} if i % 3 == 0 else None
        capacity = {**alloc, "nvidia.com/gpu": "8"} if alloc else None
        index.upsert_node(make_node(f"n{i}", {HOST: f"n{i}", "pool": f"p{i % 3}"}, allocatable=alloc,
                                    capacity=capacity, ready="False" if i % 7 == 0 else "True",
                                    unschedulable=i % 11 == 0))
        index.upsert_pod(make_pod(f"agent-{i}", f"ds-{i}", node=f"n{i}", owner=ref(("apps", "DaemonSet", "ds"))))
    for d in range(deployments):
        add_owner(index, Owner(f"d{d}", "apps", "Deployment", "ns", f"web{d}", None))
        for r in range(3):
            index.upsert_pod(make_pod(f"web{d}-{r}", f"w{d}-{r}", node=f"n{(d * 7 + r) % nodes}",
                                      owner=ref(("apps", "Deployment", f"d{d}")), phase=PHASES[r % 5]))
    add_owner(index, Owner("sts", "apps", "StatefulSet", "ns", "lab", "notebook-forbidden"))
    index.upsert_pod(make_pod("lab-0", "lab-0", node="n1", owner=ref(("apps", "StatefulSet", "sts"))))
    index.upsert_pod(make_pod("bare", "bare", node="n2"))
    return index


def test_every_family_stays_under_its_bound_with_a_hostname_summarizer() -> None:
    nodes, deployments, g_cap, w_cap = 1500, 60, 400, 25
    index = _hostname_cluster(nodes, deployments)
    renderer = Renderer(index, w_cap, g_cap, registry=CollectorRegistry())
    s = _render(renderer)
    counts = _series_per_family(s)
    # The symbols of docs/metrics.md.
    n_s = {"host": nodes, "pool": 3}
    g_s = {k: min(n, g_cap) + (n > g_cap) for k, n in n_s.items()}
    groups = sum(g_s.values())
    resources = 4  # cpu, memory, pods, nvidia.com/gpu
    w = min(len(index.workloads), w_cap) + (len(index.workloads) > w_cap)
    bounds = {
        "nws_nodegroup_nodes": groups, "nws_nodegroup_nodes_by_condition": 3 * groups,
        "nws_nodegroup_nodes_unschedulable": groups, "nws_nodegroup_allocatable": resources * groups,
        "nws_nodegroup_capacity": resources * groups, "nws_nodegroup_pods": 5 * groups,
        "nws_nodegroup_requested": resources * groups, "nws_workload_pods": 5 * w,
        "nws_workload_nodes": min(len(index.workloads), w_cap) * groups,
        "nws_nodegroup_nodes_by_state": 6 * groups, "nws_nodegroup_accelerators_unhealthy": 1 * groups,
        "nws_workload_pods_by_node_state": 5 * w, "nws_workload_nodes_unhealthy": min(len(index.workloads), w_cap),
        "nws_nodegroups": 2, "nws_nodegroup_series_limit": 1, "nws_nodegroup_series_overflow": 2,
        "nws_nodegroup_series_dropped_total": 2, "nws_workloads": 1, "nws_workload_series_limit": 1,
        "nws_workload_series_overflow": 1, "nws_workload_series_dropped_total": 1, "nws_pods_without_workload": 4,
        "nws_pods_owner_chain_broken": 1, "nws_scrape_render_seconds": 1, "nws_build_info": 1,
    }
    assert set(counts) == set(bounds)  # the renderer's own families: every one has a bound here
    for name, n in counts.items():
        assert n <= bounds[name], (name, n, bounds[name])
    assert counts["nws_nodegroup_nodes"] == g_cap + 1 + 3  # host: 400 + other; pool: 3
    # Nothing is lost: "other" holds the rest, the DaemonSet's nodes add up.
    assert value(s, "nws_nodegroup_nodes", summarizer="host", group="other") == nodes - g_cap
    assert sum(select(s, "nws_nodegroup_nodes", summarizer="host").values()) == nodes
    assert sum(select(s, "nws_nodegroup_allocatable", summarizer="host", resource="cpu").values()) == 8 * 500 + 4 * 1000
    assert value(s, "nws_nodegroup_series_overflow", summarizer="host") == nodes - g_cap
    assert value(s, "nws_nodegroup_series_overflow", summarizer="pool") == 0
    assert value(s, "nws_nodegroup_series_dropped_total", summarizer="host") == nodes - g_cap
    agent = select(s, "nws_workload_nodes", workload="agent", summarizer="host")
    assert len(agent) == g_cap + 1 and sum(agent.values()) == nodes
    assert value(s, "nws_workload_nodes", namespace="ns", workload="agent", kind="DaemonSet",
                 summarizer="host", group="other") == nodes - g_cap
    assert sum(select(s, "nws_workload_nodes", workload="agent", summarizer="pool").values()) == nodes
    assert value(s, "nws_pods_without_workload", reason="no_workload_type") == 1
    assert value(s, "nws_pods_without_workload", reason="cycle") == 0  # present at 0
    assert value(s, "nws_pods_owner_chain_broken", reason="missing_owner") == 1
    assert value(s, "nws_workload_series_overflow") == len(index.workloads) - w_cap
    assert sum(select(s, "nws_workload_pods").values()) == nodes + 3 * deployments + 1  # all but "bare"
    # Node states: every node in one state; the overflowing workloads' pods in "other".
    assert sum(select(s, "nws_nodegroup_nodes_by_state", summarizer="host").values()) == nodes
    not_ready = len(range(0, nodes, 7))
    assert sum(select(s, "nws_nodegroup_nodes_by_state", summarizer="pool", state="NotReady").values()) == not_ready
    assert sum(select(s, "nws_nodegroup_accelerators_unhealthy", summarizer="pool").values()) == len(range(0, nodes, 9))
    assert sum(select(s, "nws_workload_pods_by_node_state").values()) == sum(
        sum(w.pods_by_node_state.values()) for w in index.workloads.values())
    assert value(s, "nws_workload_nodes_unhealthy", namespace="ns", workload="agent", kind="DaemonSet") == sum(
        select(s, "nws_nodegroup_nodes_by_state", summarizer="pool").values()) - sum(
        select(s, "nws_nodegroup_nodes_by_state", summarizer="pool", state="Ready").values())
    assert not select(s, "nws_workload_nodes_unhealthy", workload="other")


def test_node_groups_keep_their_slot_and_free_slots_are_taken() -> None:
    index = ClusterIndex()
    index.set_node_summarizer("host", HOST)
    for i in range(3):
        index.upsert_node(make_node(f"n{i}", {HOST: f"n{i}"}))
    renderer = Renderer(index, 10, 2, registry=CollectorRegistry())
    s = _render(renderer)
    own = {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")}
    assert own == {"n0", "n1", "other"}
    index.upsert_node(make_node("n3", {HOST: "n3"}))  # a new group: no slot free
    s = _render(renderer)
    assert {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")} == own
    assert value(s, "nws_nodegroup_nodes", summarizer="host", group="other") == 2
    assert value(s, "nws_nodegroup_series_dropped_total", summarizer="host") == 2
    index.delete_node("n0")  # its slot goes to a waiting group
    s = _render(renderer)
    groups = {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")}
    assert "n1" in groups and "other" in groups and len(groups) == 3
    assert value(s, "nws_nodegroup_nodes", summarizer="host", group="other") == 1
    index.delete_node("n3")
    index.delete_node("n2")
    s = _render(renderer)
    assert {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")} == {"n1"}  # no other left


def test_scrape_formats_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    index = _hostname_cluster(50, 10)
    renderer = Renderer(index, 100, 100, registry=CollectorRegistry())
    renderer.render()
    calls: list[str] = []
    real = metrics.chunks

    def recording(table: tuple[metrics.FamilyGenerator[A], ...], base: str, agg: A) -> tuple[str, ...]:
        calls.append(base)
        return real(table, base, agg)

    monkeypatch.setattr(metrics, "chunks", recording)
    renderer.render()
    assert calls == []
    index.upsert_pod(make_pod("agent-3", "ds-3", node="n3", owner=ref(("apps", "DaemonSet", "ds")), phase="Failed"))
    renderer.render()
    assert sorted(calls) == sorted([
        'summarizer="host",group="n3"', 'summarizer="pool",group="p0"',
        'namespace="ns",workload="agent",kind="DaemonSet"'])


def test_node_states_exact_values_other_series_and_no_stale_series() -> None:
    """A gpu pool of four nodes in four states, a cordoned cpu node; workloads with pods there; a
    cap of one node group and of two workloads. Every value, and back to Ready: nothing left."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    index.set_workload_summarizer("w", configured(("apps", "Deployment")))
    gpu = {"cpu": "8", "nvidia.com/gpu": "8"}
    healthy: dict[str, dict[str, Any]] = {"g0": {}, "g1": {}, "g2": {}, "g3": {}, "c0": {}}
    sick: dict[str, dict[str, Any]] = {
        "g0": {"ready": "False"}, "g1": {"taints": [Taint("karpenter.sh/disrupted", "NoSchedule")]},
        "g2": {"allocatable": {"cpu": "8", "nvidia.com/gpu": "5"}, "capacity": gpu},
        "g3": {"conditions": {"KernelDeadlock": "True"}}, "c0": {"unschedulable": True}}

    def nodes(states: dict[str, dict[str, Any]]) -> None:
        for name, extra in states.items():
            pool = "cpu" if name.startswith("c") else "gpu"
            index.upsert_node(make_node(name, {"pool": pool}, **{"allocatable": gpu, **extra}))

    nodes(healthy)
    for d, placement in {"train": ["g0", "g0", "g1", "g2", "g3"], "web": ["c0", "c0"], "idle": ["g3"]}.items():
        add_owner(index, Owner(d, "apps", "Deployment", "ns", d, None))
        for i, node in enumerate(placement):
            index.upsert_pod(make_pod(f"{d}-{i}", f"{d}-{i}", node=node, owner=ref(("apps", "Deployment", d))))
    renderer = Renderer(index, 10, registry=CollectorRegistry())
    s = _render(renderer)
    assert select(s, "nws_nodegroup_nodes_by_state", group="gpu") == {
        frozenset({("summarizer", "pool"), ("group", "gpu"), ("state", st)}): 4 if st == "Ready" else 0
        for st in NODE_STATES}
    assert not select(s, "nws_nodegroup_accelerators_unhealthy") and not select(s, "nws_workload_pods_by_node_state")
    assert not select(s, "nws_workload_nodes_unhealthy")  # only while non-zero

    nodes(sick)
    s = _render(renderer)
    by_state = {dict(k)["state"]: v for k, v in select(s, "nws_nodegroup_nodes_by_state", group="gpu").items()}
    assert by_state == {"Ready": 0, "NotReady": 1, "Unknown": 0, "Disrupting": 1, "Cordoned": 0, "Degraded": 2}
    assert value(s, "nws_nodegroup_nodes_by_state", summarizer="pool", group="cpu", state="Cordoned") == 1
    assert select(s, "nws_nodegroup_accelerators_unhealthy") == {
        frozenset({("summarizer", "pool"), ("group", "gpu"), ("resource", "nvidia.com/gpu")}): 3}
    train = {"namespace": "ns", "workload": "train", "kind": "Deployment"}
    assert {dict(k)["state"]: v for k, v in select(s, "nws_workload_pods_by_node_state", workload="train").items()} == {
        "NotReady": 2, "Disrupting": 1, "Degraded": 2}
    assert value(s, "nws_workload_nodes_unhealthy", **train) == 4
    assert value(s, "nws_workload_pods_by_node_state", namespace="ns", workload="web", kind="Deployment",
                 state="Cordoned") == 2
    assert value(s, "nws_workload_nodes_unhealthy", namespace="ns", workload="idle", kind="Deployment") == 1

    # Capped: the overflowing node group's states and the overflowing workload's pods are summed.
    capped = _render(Renderer(index, 1, 1, registry=CollectorRegistry()))
    assert sum(select(capped, "nws_nodegroup_nodes_by_state", summarizer="pool", state="Cordoned").values()) == 1
    assert sum(select(capped, "nws_nodegroup_nodes_by_state", summarizer="pool").values()) == 5
    assert sum(select(capped, "nws_workload_pods_by_node_state").values()) == 5 + 2 + 1
    assert select(capped, "nws_workload_pods_by_node_state", workload="other")
    assert not select(capped, "nws_workload_nodes_unhealthy", workload="other")

    nodes(healthy)
    s = _render(renderer)
    assert not select(s, "nws_workload_pods_by_node_state") and not select(s, "nws_nodegroup_accelerators_unhealthy")
    assert not select(s, "nws_workload_nodes_unhealthy")  # no stale series
    assert value(s, "nws_nodegroup_nodes_by_state", summarizer="pool", group="gpu", state="Ready") == 4


def test_every_unresolved_reason_is_present_at_zero() -> None:
    s = _render(Renderer(ClusterIndex(), 10, registry=CollectorRegistry()))
    assert select(s, "nws_pods_without_workload") == {
        frozenset({("reason", r)}): 0 for r in ("no_workload_type", "missing_owner", "cycle", "too_deep")}
    assert value(s, "nws_pods_owner_chain_broken", reason="missing_owner") == 0


def test_sources_and_reconciler_collectors() -> None:
    stats = SourceStats(events={"ADDED": 3}, relists=1, objects=3, synced=True)
    sources = SimpleNamespace(stats={"pods": stats}, sync_seconds=None, missing_kinds={("kubeflow.org", "Notebook")},
                              forbidden_kinds={("serving.knative.dev", "Revision")}, unknown_versions={})
    writes = SimpleNamespace(writes={"apply": 2}, errors={"409": 1})
    summaries = {"nodesummaries": {"a": 1, "b": 2}, "workloadsummaries": {}}
    queues = [WorkQueue[str](name="summaries"), WorkQueue[str](name="clusterqueues")]
    queues[1].add("q")
    elector = SimpleNamespace(is_leader=False)
    registry = CollectorRegistry()
    registry.register(SourcesCollector(sources))
    registry.register(ReconcilerCollector(writes, queues, summaries, SimpleNamespace(counts={}), elector))
    s = _render(Renderer(ClusterIndex(), 10, registry=registry))
    assert value(s, "nws_watch_events_total", resource="pods", type="ADDED") == 3
    assert value(s, "nws_watch_synced", resource="pods") == 1
    assert value(s, "nws_initial_sync_duration_seconds") is None
    assert value(s, "nws_kind_not_served", group="kubeflow.org", kind="Notebook") == 1
    assert value(s, "nws_kind_forbidden", group="serving.knative.dev", kind="Revision") == 1
    assert value(s, "nws_reconciler_writes_total", verb="apply") == 2
    assert value(s, "nws_reconciler_write_errors_total", code="409") == 1
    assert value(s, "nws_reconciler_leader") == 0
    assert value(s, "nws_reconciler_summaries", kind="nodesummaries") == 2
    assert value(s, "nws_workqueue_depth", name="summaries") == 0  # each controller's queue, by its name
    assert value(s, "nws_workqueue_depth", name="clusterqueues") == 1
    assert value(s, "nws_workqueue_adds_total", name="clusterqueues") == 1
    elector.is_leader = True
    sources.missing_kinds.clear()  # a kind no longer configured: its series goes
    s = _render(Renderer(ClusterIndex(), 10, registry=registry))
    assert value(s, "nws_reconciler_leader") == 1 and not select(s, "nws_kind_not_served")
    sources.forbidden_kinds.clear()  # the kind was granted: its series goes
    registry2 = CollectorRegistry()
    registry2.register(SourcesCollector(sources))
    registry2.register(ReconcilerCollector(writes, queues, summaries, SimpleNamespace(counts={})))
    s = _render(Renderer(ClusterIndex(), 10, registry=registry2))
    assert not select(s, "nws_kind_forbidden") and value(s, "nws_reconciler_leader") == 1
