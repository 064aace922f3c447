"""Unit tests of the Kueue flavors in the index and on /metrics (no cluster): nodes matching a
ResourceFlavor's nodeLabels, nominal quota summed over ClusterQueues, every change incremental and
equal to a from-scratch recomputation, and nothing of it in node groups or workloads."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable

import prometheus_client
import pytest

from exporter.metrics import Renderer
from kubeindex.model.index import TERMINATED, ClusterIndex, effective_requests
from kubeindex.model.objects import (
    ClusterQueue,
    ClusterQueueSpec,
    FlavorQuotas,
    ObjectMeta,
    ResourceFlavor,
    ResourceFlavorSpec,
    ResourceGroup,
    ResourceQuota,
)
from kubeindex.model.quantity import NANO, parse_or_zero
from localkube.service import parse, select, value
from tests.builders import add_owner, make_node, make_pod
from tests.reference import World, health_snapshot, node_state, snapshot
from tests.scenario import Scenario

GI = 2**30
QUOTAS: list[str | int] = ["0", "1", "2500m", "4", 3]  # nominalQuota is int-or-string


def flavor(name: str, **labels: str) -> ResourceFlavor:
    return ResourceFlavor(ObjectMeta(name=name), ResourceFlavorSpec(dict(labels)))


def queue(name: str, quotas: dict[str, dict[str, str | int]]) -> ClusterQueue:
    """A ClusterQueue with one resource group: flavor -> resource -> nominalQuota."""
    flavors = [FlavorQuotas(f, [ResourceQuota(r, q) for r, q in resources.items()])
               for f, resources in quotas.items()]
    return ClusterQueue(ObjectMeta(name=name), ClusterQueueSpec([ResourceGroup(flavors)]))


# -- the truth ---------------------------------------------------------------------------------------

def recompute_flavors(world: World, flavors: dict[str, dict[str, str]],
                      queues: dict[str, ClusterQueue]) -> dict[str, tuple]:
    """Every flavor from scratch: its nodes (all nodeLabels match), their states, sums and pods;
    the nominal quota summed over the queues and how many queues set each resource."""
    names = set(flavors) | {f.name for q in queues.values() for g in q.spec.resourceGroups for f in g.flavors
                            if f.resources}
    out = {}
    for name in names:
        selector = flavors.get(name)
        nodes = [] if selector is None else [
            n for n in world.nodes.values() if all(n.metadata.labels.get(k) == v for k, v in selector.items())]
        node_names = {n.metadata.name for n in nodes}
        states: Counter[str] = Counter()
        allocatable: Counter[str] = Counter()
        pods: Counter[str] = Counter()
        requested: Counter[str] = Counter()
        for node in nodes:
            states[node_state(world, node)] += 1
            allocatable.update({r: parse_or_zero(q) for r, q in node.status.allocatable.items()})
        for pod in world.pods.values():
            if pod.spec.nodeName in node_names:
                pods[pod.status.phase] += 1
                if pod.status.phase not in TERMINATED:
                    requested.update(effective_requests(pod.spec))
        quota: Counter[str] = Counter()
        refs: Counter[str] = Counter()
        for q in queues.values():
            for group in q.spec.resourceGroups:
                for f in group.flavors:
                    if f.name == name:
                        for r in f.resources:
                            quota[r.name] += parse_or_zero(r.nominalQuota)
                            refs[r.name] += 1
        out[name] = (selector is not None, len(nodes), +states, +allocatable, +pods, +requested,
                     sorted(node_names), +quota, +refs)
    return out


def flavor_snapshot(index: ClusterIndex) -> dict[str, tuple]:
    return {name: (f.defined, f.nodes, f.states, f.allocatable, f.pods, f.requested, sorted(f.node_names),
                   f.quota, f.quota_refs) for name, f in index.kueue.flavors.items()}


class KueueScenario(Scenario):
    """The index's random scenario (nodes labelled pool/zone come, go and change; pods; owners;
    summarizers) with ResourceFlavors and ClusterQueues coming, changing and going among them."""

    def __init__(self, rnd: random.Random) -> None:
        super().__init__(rnd)
        self.flavors: dict[str, dict[str, str]] = {}
        self.queues: dict[str, ClusterQueue] = {}

    def step(self) -> None:
        rnd, idx = self.rnd, self.index
        action = rnd.random()
        if action < 0.08:
            name = rnd.choice(["fa", "fb", "fc"])
            labels = {k: rnd.choice(["a", "b", "c"]) for k in ("pool", "zone") if rnd.random() < 0.5}
            self.flavors[name] = labels
            idx.kueue.upsert_flavor(flavor(name, **labels))
        elif action < 0.11 and self.flavors:
            name = rnd.choice(list(self.flavors))
            del self.flavors[name]
            idx.kueue.delete_flavor(name)
        elif action < 0.18:
            name = rnd.choice(["q1", "q2", "q3"])
            quotas = {f: {r: rnd.choice(QUOTAS) for r in rnd.sample(["cpu", "nvidia.com/gpu"], 2)
                          if rnd.random() < 0.7}
                      for f in rnd.sample(["fa", "fb", "fc", "fd"], rnd.randint(0, 3))}
            self.queues[name] = queue(name, quotas)
            idx.kueue.upsert_cluster_queue(self.queues[name])
        elif action < 0.21 and self.queues:
            name = rnd.choice(list(self.queues))
            del self.queues[name]
            idx.kueue.delete_cluster_queue(name)
        else:
            super().step()


@pytest.mark.parametrize("seed", range(25))
def test_incremental_flavors_equal_recomputation(seed: int) -> None:
    scenario = KueueScenario(random.Random(seed))
    for step in range(400):
        scenario.step()
        if step % 5 == 0:
            truth = recompute_flavors(scenario.world, scenario.flavors, scenario.queues)
            assert flavor_snapshot(scenario.index) == truth, f"seed {seed}, step {step}"
    assert flavor_snapshot(scenario.index) == recompute_flavors(scenario.world, scenario.flavors, scenario.queues)


@pytest.mark.parametrize("seed", range(10))
def test_flavors_leave_node_groups_and_workloads_alone(seed: int) -> None:
    """The same events with and without the Kueue objects: node groups, workloads (their node
    counts per group included) and node health are identical."""
    with_kueue, plain = KueueScenario(random.Random(seed)), Scenario(random.Random(seed))
    for _ in range(300):
        with_kueue.step()
    with_kueue.index.kueue.upsert_flavor(flavor("every-node"))  # at least one flavor, with every node
    # Replay the world without the Kueue objects into a fresh index.
    for node in with_kueue.world.nodes.values():
        plain.index.upsert_node(node)
    for s, key in with_kueue.world.node_summarizers.items():
        plain.index.set_node_summarizer(s, key)
    for name in with_kueue.index.workload_summarizers.keys() | with_kueue.index.label_summarizers.keys():
        plain.index.set_workload_summarizer(name, with_kueue.index.workload_summarizers.get(name, []),
                                            with_kueue.index.label_summarizers.get(name, []))
    for owner in with_kueue.world.owners.values():
        add_owner(plain.index, owner)
    for pod in with_kueue.world.pods.values():
        plain.index.upsert_pod(pod)
    assert with_kueue.index.kueue.flavors["every-node"].nodes == len(with_kueue.world.nodes)
    assert snapshot(with_kueue.index) == snapshot(plain.index)
    assert health_snapshot(with_kueue.index) == health_snapshot(plain.index)


# -- exact values ---------------------------------------------------------------------------------

def pools() -> ClusterIndex:
    """gpu-1, gpu-2 (pool gpu, zone a and b), cpu-1 (pool cpu); pods on gpu-1 and cpu-1."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "pool")
    gpu = {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}
    index.upsert_node(make_node("gpu-1", {"pool": "gpu", "zone": "a"}, allocatable=gpu))
    index.upsert_node(make_node("gpu-2", {"pool": "gpu", "zone": "b"}, allocatable=gpu))
    index.upsert_node(make_node("cpu-1", {"pool": "cpu", "zone": "a"}))
    index.upsert_pod(make_pod("p1", "u1", node="gpu-1", cpu="2"))
    index.upsert_pod(make_pod("p2", "u2", node="cpu-1", cpu="1"))
    return index


def test_a_flavor_is_the_nodes_matching_all_its_node_labels() -> None:
    index = pools()
    index.kueue.upsert_flavor(flavor("gpu", pool="gpu"))
    index.kueue.upsert_flavor(flavor("gpu-a", pool="gpu", zone="a"))
    index.kueue.upsert_flavor(flavor("everything"))  # no nodeLabels: every node, as Kueue
    index.kueue.upsert_flavor(flavor("none", pool="tpu"))
    f = index.kueue.flavors
    assert sorted(f["gpu"].node_names) == ["gpu-1", "gpu-2"]
    assert f["gpu"].allocatable == {"cpu": 16 * NANO, "memory": 64 * GI * NANO, "nvidia.com/gpu": 8 * NANO}
    assert f["gpu"].requested == {"cpu": 2 * NANO, "memory": 64 * 2**20 * NANO}
    assert f["gpu"].pods == {"Running": 1} and f["gpu"].states == {"Ready": 2}
    assert sorted(f["gpu-a"].node_names) == ["gpu-1"]
    assert sorted(f["everything"].node_names) == ["cpu-1", "gpu-1", "gpu-2"] and f["everything"].pods == {"Running": 2}
    assert f["none"].nodes == 0 and f["none"].allocatable == {}
    assert set(index.node_groups) == {("pool", "gpu"), ("pool", "cpu")}  # no group per flavor


def test_node_changes_pod_churn_and_flavor_edits_move_the_sums() -> None:
    index = pools()
    index.kueue.upsert_flavor(flavor("gpu", pool="gpu"))
    gpu = index.kueue.flavors["gpu"]
    index.upsert_node(make_node("gpu-3", {"pool": "gpu"}, ready="False"))  # the pool grows
    assert gpu.nodes == 3 and gpu.states == {"Ready": 2, "NotReady": 1}
    index.upsert_node(make_node("gpu-1", {"pool": "cpu"}))  # relabelled away, its pod with it
    assert sorted(gpu.node_names) == ["gpu-2", "gpu-3"] and gpu.pods == {} and "cpu" not in gpu.requested
    index.upsert_pod(make_pod("p3", "u3", node="gpu-2", cpu="3"))
    index.upsert_pod(make_pod("p3", "u3", node="gpu-2", cpu="3", phase="Succeeded"))  # terminated: no requests
    assert gpu.pods == {"Succeeded": 1} and gpu.requested == {}
    index.delete_pod("ns/p3")
    index.delete_node("gpu-3")  # the pool shrinks
    assert sorted(gpu.node_names) == ["gpu-2"] and gpu.allocatable["nvidia.com/gpu"] == 4 * NANO
    index.kueue.upsert_flavor(flavor("gpu", pool="cpu"))  # edited: re-matched
    assert sorted(gpu.node_names) == ["cpu-1", "gpu-1"] and gpu.pods == {"Running": 2}


def test_nominal_quota_is_summed_over_cluster_queues_incrementally() -> None:
    index = pools()
    index.kueue.upsert_flavor(flavor("gpu", pool="gpu"))
    index.kueue.upsert_cluster_queue(queue("team-a", {"gpu": {"cpu": 10, "nvidia.com/gpu": "6"}}))
    index.kueue.upsert_cluster_queue(queue("team-b", {"gpu": {"cpu": "2500m", "memory": "8Gi"}, "spot": {"cpu": "0"}}))
    gpu = index.kueue.flavors["gpu"]
    assert gpu.quota == {"cpu": 12_500_000_000, "nvidia.com/gpu": 6 * NANO, "memory": 8 * GI * NANO}
    # A flavor with no ResourceFlavor still has its quota; a quota of 0 is kept (counted, not summed).
    assert index.kueue.flavors["spot"].quota == {} and index.kueue.flavors["spot"].quota_refs == {"cpu": 1}
    assert not index.kueue.flavors["spot"].defined and index.kueue.flavors["spot"].nodes == 0
    index.kueue.upsert_cluster_queue(queue("team-a", {"gpu": {"cpu": 4}}))  # old contribution out, new in
    assert gpu.quota == {"cpu": 6_500_000_000, "memory": 8 * GI * NANO}
    assert gpu.quota_refs == {"cpu": 2, "memory": 1}
    index.kueue.delete_cluster_queue("team-b")
    assert gpu.quota == {"cpu": 4 * NANO} and "spot" not in index.kueue.flavors


def test_a_flavor_lives_while_its_resource_flavor_or_a_cluster_queue_names_it() -> None:
    index = pools()
    index.kueue.upsert_flavor(flavor("gpu", pool="gpu"))
    index.kueue.delete_flavor("gpu")  # named by nothing else: gone
    assert "gpu" not in index.kueue.flavors
    index.kueue.upsert_flavor(flavor("gpu", pool="gpu"))
    index.kueue.upsert_cluster_queue(queue("team", {"gpu": {"cpu": 4}}))
    index.kueue.delete_flavor("gpu")  # quota without a ResourceFlavor: kept, without nodes
    assert index.kueue.flavors["gpu"].nodes == 0 and index.kueue.flavors["gpu"].quota == {"cpu": 4 * NANO}
    assert not index.kueue.flavors["gpu"].defined
    index.kueue.delete_cluster_queue("team")  # the last name of it
    assert index.kueue.flavors == {}


def generations(index: ClusterIndex) -> dict[str, int]:
    """The revision of every flavor and node group, by name."""
    return {**{f"flavor {name}": f.revision for name, f in index.kueue.flavors.items()},
            **{f"group {value}": g.revision for (_, value), g in index.node_groups.items()}}


def test_every_change_moves_the_stamp_and_the_revision_of_each_aggregate_it_changes() -> None:
    """The index's newest stamp says that something changed; the revisions say what (to the
    reconciler and the exporter's renderer): each change moves those of the flavors and node
    groups it changed (or makes or removes them), and no other."""
    index = pools()
    changes: list[tuple[Callable[[], None], set[str]]] = [
        (lambda: index.kueue.upsert_flavor(flavor("cpu", pool="cpu")), {"flavor cpu"}),
        (lambda: index.kueue.upsert_flavor(flavor("gpu", pool="gpu")), {"flavor gpu"}),
        (lambda: index.kueue.upsert_cluster_queue(queue("q", {"gpu": {"cpu": 1}})), {"flavor gpu"}),
        (lambda: index.kueue.upsert_cluster_queue(queue("q", {"gpu": {"cpu": 2}})), {"flavor gpu"}),
        (lambda: index.kueue.upsert_cluster_queue(queue("spot-q", {"spot": {"cpu": 1}})), {"flavor spot"}),
        (lambda: index.kueue.upsert_flavor(flavor("gpu", pool="cpu")), {"flavor gpu"}),  # re-matched to cpu-1
        (lambda: index.upsert_node(make_node("cpu-1", {"pool": "cpu", "zone": "a"}, ready="False")),
         {"group cpu", "flavor cpu", "flavor gpu"}),
        (lambda: index.kueue.delete_cluster_queue("q"), {"flavor gpu"}),
        (lambda: index.kueue.delete_cluster_queue("spot-q"), {"flavor spot"}),
        (lambda: index.kueue.delete_flavor("gpu"), {"flavor gpu"}),
    ]
    for n, (change, changed) in enumerate(changes):
        stamp, before = index.revision.value, generations(index)
        change()
        after = generations(index)
        assert {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)} == changed, n
        assert index.revision.value != stamp, n
    stamp, before = index.revision.value, generations(index)
    index.kueue.upsert_flavor(flavor("cpu", pool="cpu"))  # as it is: nothing changes
    assert (index.revision.value, generations(index)) == (stamp, before)


# -- on /metrics ----------------------------------------------------------------------------------

def render(index: ClusterIndex, renderer: Renderer | None = None) -> str:
    renderer = renderer or Renderer(index, 10, registry=prometheus_client.CollectorRegistry())
    return renderer.render().decode()


def test_flavor_families_on_metrics() -> None:
    index = pools()
    index.kueue.upsert_flavor(flavor("gpu", pool="gpu"))
    index.kueue.upsert_cluster_queue(queue("team", {"gpu": {"cpu": 20, "nvidia.com/gpu": 8}, "spot": {"cpu": 4}}))
    renderer = Renderer(index, 10, registry=prometheus_client.CollectorRegistry())
    s = parse(render(index, renderer))
    assert value(s, "nws_flavor_allocatable", flavor="gpu", resource="cpu") == 16
    assert value(s, "nws_flavor_allocatable", flavor="gpu", resource="nvidia.com/gpu") == 8
    assert value(s, "nws_flavor_requested", flavor="gpu", resource="cpu") == 2
    assert value(s, "nws_flavor_requested", flavor="gpu", resource="nvidia.com/gpu") == 0  # quota'd: shown at 0
    assert value(s, "nws_flavor_nominal_quota", flavor="gpu", resource="cpu") == 20
    assert {dict(k)["state"]: v for k, v in select(s, "nws_flavor_nodes_by_state", flavor="gpu").items()} == {
        "Ready": 2, "NotReady": 0, "Unknown": 0, "Disrupting": 0, "Cordoned": 0, "Degraded": 0}
    # No ResourceFlavor "spot": its quota only.
    assert value(s, "nws_flavor_nominal_quota", flavor="spot", resource="cpu") == 4
    assert not select(s, "nws_flavor_allocatable", flavor="spot") and not select(s, "nws_flavor_nodes_by_state",
                                                                                  flavor="spot")
    assert {dict(k)["group"] for k in select(s, "nws_nodegroup_nodes")} == {"gpu", "cpu"}
    # Every node of the pool gone: allocatable 0 for the resources with quota, so the drift shows.
    index.delete_node("gpu-1")
    index.delete_node("gpu-2")
    s = parse(render(index, renderer))
    assert value(s, "nws_flavor_allocatable", flavor="gpu", resource="nvidia.com/gpu") == 0
    assert value(s, "nws_flavor_nominal_quota", flavor="gpu", resource="nvidia.com/gpu") == 8
    assert value(s, "nws_flavor_nodes_by_state", flavor="gpu", state="Ready") == 0
    index.kueue.delete_flavor("gpu")
    index.kueue.delete_cluster_queue("team")
    assert "nws_flavor_" not in "".join(line for line in render(index, renderer).splitlines()
                                        if not line.startswith("#"))
