"""Karpenter's NodeClaims in the index (kubeindex/model/karpenter.py): what each condition makes of
a node's rollout state and disruption candidacy, and the expiry horizon moving with the clock. The
randomized comparison with a recomputation is tests/unit/test_index.py's."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from exporter.metrics import Renderer
from kubeindex.model.index import ClusterIndex
from kubeindex.model.karpenter import go_duration
from kubeindex.model.objects import WorkloadType
from localkube.service import parse, select, value
from reconciler.desired import TypeInfo, desired_state
from tests.builders import DISRUPTED, make_node, make_nodeclaim, make_pod, ref
from tests.reference import Owner

T0 = 1767225600.0  # 2026-01-01T00:00:00Z, the builders' creationTimestamp


@pytest.mark.parametrize(("text", "seconds"), [("720h", 2592000.0), ("1h30m0s", 5400.0), ("90s", 90.0),
                                                ("1.5h", 5400.0), ("500ms", 0.5), ("Never", None), ("", None),
                                                ("10", None), ("1x", None)])
def test_go_durations(text: str, seconds: float | None) -> None:
    assert go_duration(text) == seconds


def _index(clock: list[float]) -> ClusterIndex:
    index = ClusterIndex(expiry_horizon=3600, now=lambda: clock[0])
    index.set_node_summarizer("pool", "karpenter.sh/nodepool")
    index.set_workload_summarizer("w", [WorkloadType(kind="Deployment", group="apps")])
    deployment = Owner("d1", "apps", "Deployment", "ns", "web", None)
    index.upsert_owner(("apps", "Deployment"), "ns", "web", "d1", None)
    for i in range(3):
        index.upsert_node(make_node(f"n{i}", {"karpenter.sh/nodepool": "web"}))
        index.upsert_pod(make_pod(f"p{i}", f"u{i}", f"n{i}", owner=ref(deployment)))
    return index


def test_conditions_make_the_rollout_counts_and_the_pods_at_risk() -> None:
    clock = [T0]
    index = _index(clock)
    group, web = index.node_groups["pool", "web"], index.workloads["d1"]
    assert group.rollout == {} and web.pods_at_risk == {}  # no NodeClaim: not Karpenter's
    index.upsert_nodeclaim(make_nodeclaim("c0", "", {"Drifted": "True"}))  # before its Node registered
    assert group.rollout == {}
    for i in range(3):
        index.upsert_nodeclaim(make_nodeclaim(f"c{i}", f"n{i}"))
    assert group.rollout == {"UpToDate": 3} and web.pods_at_risk == {}
    index.upsert_nodeclaim(make_nodeclaim("c0", "n0", {"Drifted": "True"}))
    index.upsert_nodeclaim(make_nodeclaim("c1", "n1", {"Drifted": "True", "DisruptionReason": "True"}))
    index.upsert_nodeclaim(make_nodeclaim("c2", "n2", {"Consolidatable": "True"}))
    assert group.rollout == {"Drifted": 1, "Disrupting": 1, "UpToDate": 1}
    assert web.pods_at_risk == {"Drifted": 1, "Disrupting": 1, "Consolidatable": 1}
    assert web.pods_at_risk_by_node_group == {("pool", "web"): 3}
    # The taint alone (a node Karpenter disrupts, before its NodeClaim says so) puts its pods at risk.
    index.upsert_node(make_node("n2", {"karpenter.sh/nodepool": "web"}, taints=[DISRUPTED]))
    assert web.pods_at_risk == {"Drifted": 1, "Disrupting": 2}
    index.delete_nodeclaim("c1")  # its node no longer Karpenter's
    index.delete_pod("ns/p0")  # the drifted node's pod gone
    assert group.rollout == {"Drifted": 1, "UpToDate": 1} and web.pods_at_risk == {"Disrupting": 1}


def test_a_node_becomes_expiring_when_its_expiry_comes_within_the_horizon() -> None:
    clock = [T0]
    index = _index(clock)
    web = index.workloads["d1"]
    index.upsert_nodeclaim(make_nodeclaim("c0", "n0", expire_after="2h"))
    index.upsert_nodeclaim(make_nodeclaim("c1", "n1", expire_after="Never"))
    index.tick()
    assert web.pods_at_risk == {}
    clock[0] = T0 + 3599
    index.tick()
    assert web.pods_at_risk == {}
    clock[0] = T0 + 3600  # an hour before it expires: Karpenter deletes it then, without budget
    index.tick()
    assert web.pods_at_risk == {"Expiring": 1}
    assert index.node_groups["pool", "web"].rollout == {"UpToDate": 2}  # a candidate, not a rollout state


def test_the_summaries_show_the_rollout_and_the_pods_at_risk() -> None:
    clock = [T0]
    index = _index(clock)
    infos = {("apps", "Deployment"): TypeInfo("apps/v1", "deploy", "deployment.apps/v1")}
    out = {d.key: d for d in desired_state(index, {"pool": "uid-pool"}, infos)}
    assert "rollout" not in out["pool-web"].status and "atRisk" not in out["ns/web"].status  # no NodeClaim
    index.upsert_nodeclaim(make_nodeclaim("c0", "n0", {"Drifted": "True"}))
    index.upsert_nodeclaim(make_nodeclaim("c1", "n1", {"Drifted": "True"}, deleting=True))
    out = {d.key: d for d in desired_state(index, {"pool": "uid-pool"}, infos)}
    # n2 has no NodeClaim: in no rollout count. Every count is there, 0s included.
    assert out["pool-web"].status["rollout"] == {"upToDate": 0, "drifted": 1, "disrupting": 1}
    assert out["ns/web"].status["atRisk"] == {"pods": 2, "reasons": {"Disrupting": 1, "Drifted": 1},
                                              "nodeSummaries": [{"name": "pool-web", "pods": 2}]}


def test_the_metrics_show_the_rollout_and_the_pods_at_risk() -> None:
    clock = [T0]
    index = _index(clock)
    renderer = Renderer(index, registry=CollectorRegistry())
    samples = parse(renderer.render().decode())
    assert select(samples, "nws_nodegroup_nodes_by_rollout") == {}
    assert select(samples, "nws_workload_pods_at_risk") == {}
    index.upsert_nodeclaim(make_nodeclaim("c0", "n0", {"Drifted": "True", "DisruptionReason": "True"}))
    index.upsert_nodeclaim(make_nodeclaim("c1", "n1"))
    samples = parse(renderer.render().decode())
    group = {"summarizer": "pool", "group": "web"}
    assert {r: value(samples, "nws_nodegroup_nodes_by_rollout", **group, rollout=r)
            for r in ("UpToDate", "Drifted", "Disrupting")} == {"UpToDate": 1, "Drifted": 0, "Disrupting": 1}
    assert select(samples, "nws_workload_pods_at_risk") == {
        frozenset({"namespace": "ns", "workload": "web", "kind": "Deployment", "reason": "Disrupting"}.items()): 1}


def test_the_rollout_change_time_moves_with_the_drifted_and_disrupting_nodes_only() -> None:
    """What NodeGroupRolloutStuck measures: when a node last entered or left the Drifted or
    Disrupting count. A heartbeat, a pod, or an up-to-date node's change does not move it."""
    clock = [T0]
    index = _index(clock)
    group = index.node_groups["pool", "web"]
    for i in range(3):
        index.upsert_nodeclaim(make_nodeclaim(f"c{i}", f"n{i}"))
    assert group.rollout_changed == 0
    clock[0] = T0 + 10
    index.upsert_nodeclaim(make_nodeclaim("c0", "n0", {"Drifted": "True"}))
    assert group.rollout_changed == T0 + 10
    clock[0] = T0 + 20
    index.upsert_node(make_node("n0", {"karpenter.sh/nodepool": "web"}))  # a heartbeat of the drifted node
    index.upsert_nodeclaim(make_nodeclaim("c0", "n0", {"Drifted": "True", "Ready": "True"}))
    index.upsert_nodeclaim(make_nodeclaim("c1", "n1", {"Consolidatable": "True"}))
    index.upsert_pod(make_pod("p9", "u9", "n0"))
    assert group.rollout_changed == T0 + 10
    clock[0] = T0 + 30
    index.upsert_nodeclaim(make_nodeclaim("c0", "n0", {"Drifted": "True", "DisruptionReason": "True"}))
    assert group.rollout_changed == T0 + 30
    clock[0] = T0 + 40
    index.delete_node("n0")  # replaced
    assert group.rollout_changed == T0 + 40
