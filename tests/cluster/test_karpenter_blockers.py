"""Beside the real Karpenter (make test-karpenter): during a drift, a pod with
`karpenter.sh/do-not-disrupt` holds one node and a PodDisruptionBudget that allows no disruption
holds two more; the service (--karpenter-events=on) names each blocker in the pool's NodeSummary and
its metric, and records one Event per workload in the workload's namespace, on its
WorkloadSummary: DisruptionBlocked naming the blocker, DisruptionStarted for the workload whose
nodes Karpenter replaced, each a series counting its nodes (docs/karpenter.md#blockers). The pod's
annotation removed, Karpenter takes its node and the service no longer names it."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from demo.karpenter import DO_NOT_DISRUPT, drift, no_disruption_budget, spread_deployment
from demo.workloads import node_summarizer, workload_summarizer
from kubeindex.model.resources import EVENTS
from localkube.karpenter import DISRUPTED_TAINT, NODEPOOL_LABEL, KarpenterController
from localkube.service import Service, wait_for
from tests.karpenter import NODES, Watched, nodeclaims, pool, running_on, tainted

pytestmark = pytest.mark.karpenter

NS = POOL = "blockers"
def our_events(cluster: Any) -> list[dict[str, Any]]:
    """The service's Events in the test's namespace."""
    code, body = cluster.request(f"{EVENTS.path(NS)}?fieldSelector=reportingController=node-workload-summary")
    assert code == 200, body
    return body["items"]


def node_summary(cluster: Any) -> dict[str, Any]:
    proc = cluster.kubectl("get", "nodesummary", f"pools-{POOL}", "-o", "json", check=False)
    return json.loads(proc.stdout).get("status", {}) if proc.returncode == 0 else {}


@pytest.fixture(scope="module")
def service(karpenter: KarpenterController) -> Iterator[Service]:
    kube = karpenter.cluster
    node_summarizer(kube, "pools", NODEPOOL_LABEL)
    workload_summarizer(kube, "apps", [("apps", "Deployment")])
    svc = Service(kube, ("--karpenter-events=on", "--write-debounce=0.5")).start()
    yield svc
    svc.stop()


def test_each_blocker_of_a_drift_is_named_and_each_workload_gets_one_event(
        karpenter: KarpenterController, service: Service) -> None:
    kube = karpenter.cluster
    with pool(kube, POOL, labels={"rollout": "v1"}) as spec, \
            Watched(kube, NODES.path(), f"{NODEPOOL_LABEL}={POOL}") as watched_nodes:
        spread_deployment(kube, NS, "pinned", POOL, 1, DO_NOT_DISRUPT)  # one pod per node
        spread_deployment(kube, NS, "guarded", POOL, 2)
        spread_deployment(kube, NS, "free", POOL, 2)
        no_disruption_budget(kube, NS, "guarded")
        wait_for(lambda: running_on(kube, NS, 5), timeout=90, interval=0.2)
        placement = running_on(kube, NS, 5)
        assert placement is not None and len(set(placement.values())) == 5
        pinned = next(p for p in placement if p.startswith("pinned-"))
        held = {placement[pinned]: {"kind": "Pod", "namespace": NS, "name": pinned}}
        held |= {node: {"kind": "PodDisruptionBudget", "namespace": NS, "name": "guarded"}
                 for p, node in placement.items() if p.startswith("guarded-")}
        free = {node for p, node in placement.items() if p.startswith("free-")}
        wanted = sorted(({"node": n, **b} for n, b in held.items()), key=lambda b: b["node"])

        # Karpenter says a node's blocker at most every 2 minutes, and its first word on a new node is
        # often another reason (not yet initialized): the names come within about 2 minutes.
        started = time.monotonic()
        try:
            wait_for(lambda: node_summary(kube).get("blockers") == wanted, timeout=200, interval=0.5)
        except AssertionError:
            raise AssertionError(f"{node_summary(kube)}\n{service.log_text()[-3000:]}") from None
        print(f"the 3 blockers named in the NodeSummary {time.monotonic() - started:.1f}s after the pods ran")
        status = node_summary(kube)
        assert status["blockedNodeCount"] == 3 and status["nodeCount"] == 5, status
        metrics = service.get("/metrics")[1]
        for kind, count in (("Pod", 1), ("PodDisruptionBudget", 2)):
            line = f'nws_nodegroup_nodes_blocked{{summarizer="pools",group="{POOL}",kind="{kind}"}} {count}'
            assert line in metrics, (line, [m for m in metrics.splitlines() if "blocked" in m])
        # kubectl's column.
        header, row = kube.kubectl("get", "nodesummary", f"pools-{POOL}").stdout.splitlines()
        at = header.index("BLOCKED")  # kubectl aligns each value under its column's name
        assert row[at:].split()[0] == "3", (header, row)

        # Nothing wants those nodes yet (no drift; no consolidation, no expiry): they hold no rollout,
        # and no workload is told it blocks one.
        assert "held" not in status["rollout"] and our_events(kube) == [], (status, our_events(kube))

        # The drift: Karpenter replaces the free nodes; the three held ones stay, still named.
        drift(kube, spec, "v2")
        changed = time.monotonic()
        wait_for(lambda: free <= watched_nodes.deleted(), timeout=120, interval=0.5)
        wait_for(lambda: running_on(kube, NS, 5), timeout=60, interval=0.2)
        print(f"the free nodes replaced {time.monotonic() - changed:.1f}s after the template change")
        assert all(watched_nodes.ever(n, lambda obj: tainted(obj, DISRUPTED_TAINT)) for n in free)
        assert not set(held) & watched_nodes.deleted()
        assert {c["status"]["nodeName"] for c in nodeclaims(kube, POOL)} >= set(held)
        assert node_summary(kube)["blockers"] == wanted
        wait_for(lambda: node_summary(kube)["rollout"].get("held") == 3, timeout=30, interval=0.5)  # drifted, held

        # One Event per workload, in its namespace, on its WorkloadSummary; each a series counting its nodes.
        summaries = {s["metadata"]["name"]: s["metadata"]["uid"] for s in json.loads(kube.kubectl(
            "get", "workloadsummaries.ux", "-n", NS, "-o", "json").stdout)["items"]}

        def by_workload() -> dict[str, list[dict[str, Any]]]:
            out: dict[str, list[dict[str, Any]]] = {}
            for e in our_events(kube):
                out.setdefault(e["regarding"]["name"], []).append(e)
            return out

        def counted() -> bool:
            """One Event each: guarded's counts its two nodes at least (and each time Karpenter says a
            blocker again, every 2 minutes while it holds), free's its two replaced nodes."""
            events = by_workload()
            return (events.keys() == {"pinned", "guarded", "free"} and all(len(v) == 1 for v in events.values())
                    and events["guarded"][0].get("series", {}).get("count", 1) >= 2
                    and events["free"][0].get("series", {}).get("count") == 2)

        try:
            wait_for(counted, timeout=30, interval=0.5)
        except AssertionError:
            raise AssertionError(f"{by_workload()}\n{service.log_text()[-3000:]}") from None
        events = {name: v[0] for name, v in by_workload().items()}
        for name, event in events.items():
            assert event["metadata"]["namespace"] == NS
            assert event["regarding"] == {"apiVersion": "ux.sean.example.com/v1alpha1", "kind": "WorkloadSummary",
                                          "namespace": NS, "name": name, "uid": summaries[name]}, event
            assert event["related"] == {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": POOL}
        assert (events["pinned"]["reason"], events["pinned"]["type"]) == ("DisruptionBlocked", "Warning")
        assert events["pinned"]["note"] == (f"pod {NS}/{pinned} (karpenter.sh/do-not-disrupt) keeps Karpenter from "
                                            f"disrupting nodes of NodePool {POOL} that run this workload's pods")
        assert events["guarded"]["reason"] == "DisruptionBlocked"
        assert events["guarded"]["note"] == (f"PodDisruptionBudget {NS}/guarded (no disruption allowed) keeps "
                                             f"Karpenter from disrupting nodes of NodePool {POOL} that run this "
                                             "workload's pods")
        assert (events["free"]["reason"], events["free"]["type"]) == ("DisruptionStarted", "Normal")
        assert events["free"].get("series", {}).get("count") == 2  # two nodes, one Event
        # kubectl describe shows it where the app team looks.
        described = kube.kubectl("describe", "workloadsummaries.ux", "pinned", "-n", NS).stdout
        assert "DisruptionBlocked" in described and pinned in described, described

        # The annotation removed: Karpenter's next pass takes the drifted node, and the service stops
        # naming it (its disruption taint) and tells pinned's owners their pod is being moved.
        old = placement[pinned]
        kube.kubectl("annotate", "pod", pinned, "-n", NS, "karpenter.sh/do-not-disrupt-")
        lifted = time.monotonic()
        try:
            wait_for(lambda: old in watched_nodes.deleted() and old not in {
                b["node"] for b in node_summary(kube).get("blockers", [])} and any(
                e["reason"] == "DisruptionStarted" for e in by_workload().get("pinned", [])), timeout=120, interval=0.5)
        except AssertionError:
            raise AssertionError(f"{node_summary(kube)}\n{by_workload().get('pinned')}") from None
        print(f"the annotation removed: its node replaced and no longer named {time.monotonic() - lifted:.1f}s later")
        assert watched_nodes.ever(old, lambda obj: tainted(obj, DISRUPTED_TAINT))
        assert {b["node"] for b in node_summary(kube).get("blockers", []) if b["kind"] == "PodDisruptionBudget"} == {
            n for n, b in held.items() if b["kind"] == "PodDisruptionBudget"}
