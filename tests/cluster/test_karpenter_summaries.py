"""The service beside the real Karpenter (make test-karpenter): a NodeSummarizer on
`karpenter.sh/nodepool` and the pools Karpenter makes. Our NodeSummary agrees with the NodePool's own
counts (status.nodes, status.resources) once each change settles; its rollout counts move through a
drift; the WorkloadSummaries of a Deployment and a LeaderWorkerSet on the drifting pool name their
pods at risk (a JobSet's pods are never Running here: KWOK's pod-complete stage completes a Job's
pods at once, and a finished pod holds no node); an empty node's consolidation shows as Disrupting,
then its NodeSummary goes; a rollout held by a `karpenter.sh/do-not-disrupt` pod fires
NodeGroupRolloutStuck in a real Prometheus. What the service wrote is read from watches that
recorded every version of its summaries (tests.karpenter.Watched)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from alerts.rules import Thresholds, rules_file
from demo.workloads import create, node_summarizer, workload_summarizer
from kubeindex.model.quantity import parse_nano
from kubeindex.model.resources import NODE_SUMMARIES, WORKLOAD_SUMMARIES
from localkube.controllers import LWS_PROJECT, Controller
from localkube.karpenter import NODEPOOL_LABEL, KarpenterController, apply
from localkube.prometheus import Prometheus
from localkube.service import Service, wait_for
from tests.karpenter import Watched, deployment, is_true, nodeclaims, nodepool, nodes, pods, pool, running_on
from tests.kube import get_object

pytestmark = pytest.mark.karpenter  # make test-karpenter; make test leaves them out

SUMMARIZER = "karpenter"  # NodeSummarizer on karpenter.sh/nodepool: NodeSummary karpenter-<pool>
STUCK = Thresholds(rollout_stuck_after=20, rollout_stuck_for="2s")  # 20 s without a move, not an hour


def summary(kube: Any, pool_name: str) -> dict[str, Any] | None:
    return get_object(kube, NODE_SUMMARIES.path(name=f"{SUMMARIZER}-{pool_name}"))


def workload(kube: Any, namespace: str, name: str) -> dict[str, Any] | None:
    return get_object(kube, WORKLOAD_SUMMARIES.path(namespace, name))


def agreement(kube: Any, pool_name: str) -> dict[str, Any]:
    """Our NodeSummary and Karpenter's NodePool side by side: node counts, and per resource of the
    NodePool's status.resources our capacity (what Karpenter sums) and allocatable."""
    ours = (summary(kube, pool_name) or {}).get("status", {})
    theirs = nodepool(kube, pool_name).get("status", {})
    resources = {r: q for r, q in theirs.get("resources", {}).items() if r != "nodes"}
    return {"nodes": (ours.get("nodeCount", 0), theirs.get("nodes"), len(nodes(kube, pool_name))),
            "capacity": {r: (parse_nano(ours.get("capacity", {}).get(r, "0")), parse_nano(q))
                         for r, q in resources.items()},
            "allocatable": {r: (parse_nano(ours.get("allocatable", {}).get(r, "0")), parse_nano(q))
                            for r, q in resources.items()}}


def agrees(kube: Any, pool_name: str) -> bool:
    """Node counts equal (ours, the NodePool's, the Nodes'), and our capacity equal to its resources."""
    seen = agreement(kube, pool_name)
    ours, theirs, real = seen["nodes"]
    return ours == theirs == real and all(a == b for a, b in seen["capacity"].values())


@pytest.fixture(scope="module")
def service(karpenter: KarpenterController) -> Iterator[Service]:
    kube = karpenter.cluster
    Controller(kube, LWS_PROJECT).start()  # stopped with the cluster
    node_summarizer(kube, SUMMARIZER, NODEPOOL_LABEL)
    workload_summarizer(kube, "apps", [("apps", "Deployment"), ("leaderworkerset.x-k8s.io", "LeaderWorkerSet")])
    svc = Service(kube).start()
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def prometheus(service: Service, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    workdir = tmp_path_factory.mktemp("karpenter-alerts")
    rules = workdir / "rules.yaml"
    rules.write_text(yaml.safe_dump(rules_file(STUCK)))
    prom = Prometheus(workdir / "prometheus", [f"127.0.0.1:{service.port}"], [rules]).start()
    yield prom
    prom.stop()


def test_scale_up_our_summary_agrees_with_the_nodepool(karpenter: KarpenterController, service: Service) -> None:
    kube = karpenter.cluster
    with pool(kube, "grow"):
        deployment(kube, "grow", "web", "grow", replicas=4, cpu="1", memory="1Gi")
        wait_for(lambda: running_on(kube, "grow", 4), timeout=90, interval=0.2)
        started = time.monotonic()
        wait_for(lambda: agrees(kube, "grow"), timeout=30, interval=0.2)
        print(f"NodeSummary and NodePool agree {time.monotonic() - started:.1f}s after the pods ran: "
              f"{agreement(kube, 'grow')}")
        status = (summary(kube, "grow") or {})["status"]
        assert status["rollout"] == {"upToDate": status["nodeCount"], "drifted": 0, "disrupting": 0}
        # Allocatable is the instance type's; Karpenter sums capacity, which a KWOK node sets to the
        # pods' requests (docs/karpenter.md): ours is larger here, where on a cloud it is smaller.
        seen = agreement(kube, "grow")["allocatable"]
        assert seen["cpu"][0] > seen["cpu"][1], seen


def at_risk(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    return _at_risk(workload(kube, namespace, name) or {})


def _rollout(obj: dict[str, Any]) -> dict[str, int]:
    return obj.get("status", {}).get("rollout", {})


def _at_risk(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("status", {}).get("atRisk", {})




def test_drift_moves_the_rollout_counts_and_names_the_pods_at_risk(karpenter: KarpenterController,
                                                                    service: Service) -> None:
    kube = karpenter.cluster
    name = f"{SUMMARIZER}-roll"
    # A budget of 0 nodes first: the drifted nodes wait (Drifted, not yet disrupted) until it is lifted.
    with pool(kube, "roll", labels={"rollout": "v1"}, budgets=("0",)) as spec, \
            Watched(kube, NODE_SUMMARIES.path()) as summaries, \
            Watched(kube, WORKLOAD_SUMMARIES.path("roll")) as workloads:
        deployment(kube, "roll", "api", "roll", replicas=2, cpu="1", memory="1Gi")
        leaderworkerset(kube, "roll", "serve", "roll", workers=1)
        wait_for(lambda: running_on(kube, "roll", 4), timeout=90, interval=0.2)
        wait_for(lambda: agrees(kube, "roll"), timeout=30, interval=0.2)
        before = (summary(kube, "roll") or {})["status"]
        assert before["rollout"] == {"upToDate": before["nodeCount"], "drifted": 0, "disrupting": 0}
        old = {c["metadata"]["name"] for c in nodeclaims(kube, "roll")}

        spec["spec"]["template"]["metadata"]["labels"]["rollout"] = "v2"
        apply(kube, spec)
        changed = time.monotonic()
        # Every old node drifted: the counts move, and the workloads on them name their pods at risk,
        # per reason and per pool.
        took = wait_for(lambda: _rollout(summary(kube, "roll") or {}) == {"upToDate": 0, "drifted": len(old),
                                                                          "disrupting": 0}, timeout=60, interval=0.2)
        print(f"NodeSummary {name}: rollout.drifted = {len(old)} {took:.1f}s after the template change")
        for workload_name, count in (("api", 2), ("serve", 2)):
            drifted = {"pods": count, "reasons": {"Drifted": count}, "nodeSummaries": [{"name": name, "pods": count}]}
            wait_for(lambda: at_risk(kube, "roll", workload_name) == drifted, timeout=30, interval=0.2)  # noqa: B023
        # The budget lifted: Karpenter disrupts them (a replacement first), and they go.
        spec["spec"]["disruption"]["budgets"] = [{"nodes": "100%"}]
        apply(kube, spec)
        wait_for(lambda: set(old) <= claims_gone(kube, "roll", old), timeout=180, interval=0.5)
        assert summaries.ever(name, lambda s: _rollout(s).get("disrupting", 0) >= 1)
        for workload_name in ("api", "serve"):
            assert workloads.ever(workload_name, lambda w: "Disrupting" in _at_risk(w).get("reasons", {})), \
                (workload_name, [_at_risk(v) for v in workloads.versions(workload_name)])
        # Replaced: every node up to date, nothing at risk, and the NodePool agrees again.
        wait_for(lambda: running_on(kube, "roll", 4), timeout=60, interval=0.2)
        wait_for(lambda: _rollout(summary(kube, "roll") or {}).get("upToDate") == len(nodes(kube, "roll"))
                 and _rollout(summary(kube, "roll") or {}).get("drifted") == 0
                 and _rollout(summary(kube, "roll") or {}).get("disrupting") == 0
                 and not any(_at_risk(workload(kube, "roll", w) or {}) for w in ("api", "serve"))
                 and agrees(kube, "roll"), timeout=60, interval=0.5)
        print(f"rollout done, summaries settled and agreeing with the NodePool {time.monotonic() - changed:.1f}s "
              f"after the change: {agreement(kube, 'roll')}")


def leaderworkerset(kube: Any, namespace: str, name: str, pool_name: str, workers: int) -> dict[str, Any]:
    """A LeaderWorkerSet of one group (a leader and ``workers`` workers), each pod asking 1 CPU on the pool."""
    template = {"spec": {"nodeSelector": {NODEPOOL_LABEL: pool_name}, "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": "example.com/server:v1",
                                         "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}
    return create(kube, f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets", {
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "metadata": {"name": name},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": workers + 1, "workerTemplate": template}}})


def claims_gone(kube: Any, pool_name: str, old: set[str]) -> set[str]:
    """Of ``old``, the NodeClaims no longer there."""
    return old - {c["metadata"]["name"] for c in nodeclaims(kube, pool_name)}


def test_an_empty_node_consolidated_shows_disrupting_then_goes(karpenter: KarpenterController,
                                                               service: Service) -> None:
    kube = karpenter.cluster
    name = f"{SUMMARIZER}-empty"
    with pool(kube, "empty", consolidation_policy="WhenEmpty", consolidate_after="1s"), \
            Watched(kube, NODE_SUMMARIES.path()) as summaries:
        deployment(kube, "empty", "batch", "empty", replicas=1, cpu="1", memory="1Gi")
        wait_for(lambda: running_on(kube, "empty", 1), timeout=90, interval=0.2)
        wait_for(lambda: agrees(kube, "empty"), timeout=30, interval=0.2)
        # consolidateAfter passed: the node is a candidate (its NodeClaim Consolidatable), so is its pod.
        wait_for(lambda: all(is_true(c, "Consolidatable") for c in nodeclaims(kube, "empty")), timeout=30)
        wait_for(lambda: _at_risk(workload(kube, "empty", "batch") or {}).get("reasons") == {"Consolidatable": 1},
                 timeout=30, interval=0.2)
        kube.request("/apis/apps/v1/namespaces/empty/deployments/batch/scale", "PATCH", {"spec": {"replicas": 0}},
                     content_type="application/merge-patch+json")
        emptied = time.monotonic()
        wait_for(lambda: summary(kube, "empty") is None, timeout=120, interval=0.5)
        print(f"NodeSummary {name} gone with its last node {time.monotonic() - emptied:.1f}s after the pod was removed")
        assert summaries.ever(name, lambda s: _rollout(s).get("disrupting") == 1)
        # Agreement again: no node in either (our NodeSummary gone with its group, status.nodes 0).
        wait_for(lambda: nodepool(kube, "empty").get("status", {}).get("nodes") == 0 and agrees(kube, "empty"),
                 timeout=30, interval=0.5)


def test_a_held_rollout_fires_in_prometheus(karpenter: KarpenterController, service: Service,
                                            prometheus: Prometheus) -> None:
    """A `karpenter.sh/do-not-disrupt` pod keeps its drifted node: the rollout counts stop moving,
    and NodeGroupRolloutStuck fires for that pool (the window 20 s here, an hour by default); once the
    pod goes, Karpenter replaces the node and the alert ends."""
    kube = karpenter.cluster
    with pool(kube, "held", labels={"rollout": "v1"}) as spec:
        obj = deployment(kube, "held", "keep", "held", replicas=1, cpu="1", memory="1Gi")
        kube.request(f"/apis/apps/v1/namespaces/held/deployments/{obj['metadata']['name']}", "PATCH",
                     {"spec": {"template": {"metadata": {"annotations": {"karpenter.sh/do-not-disrupt": "true"}}}}},
                     content_type="application/merge-patch+json")
        wait_for(lambda: running_on(kube, "held", 1) and all(
            p.get("metadata", {}).get("annotations", {}).get("karpenter.sh/do-not-disrupt") == "true"
            for p in pods(kube, "held")), timeout=90, interval=0.2)
        spec["spec"]["template"]["metadata"]["labels"]["rollout"] = "v2"
        apply(kube, spec)
        changed = time.monotonic()
        wait_for(lambda: _rollout(summary(kube, "held") or {}).get("drifted") == 1, timeout=60, interval=0.2)

        def firing() -> list[dict[str, Any]]:
            return [a["labels"] for a in prometheus.alerts() if a["labels"]["alertname"] == "NodeGroupRolloutStuck"]

        took = wait_for(lambda: firing(), timeout=90, interval=0.5)
        assert [(a["summarizer"], a["group"]) for a in firing()] == [(SUMMARIZER, "held")]
        assert took > 15, took  # not before 20 s without a move (and the rule's 2 s `for`)
        print(f"NodeGroupRolloutStuck firing for held {took:.1f}s after the drift was seen "
              f"({time.monotonic() - changed:.1f}s after the template change; window 20 s)")
        # The blocker goes: Karpenter replaces the node, the alert resolves.
        kube.kubectl("delete", "deployment", "keep", "-n", "held")
        wait_for(lambda: not firing(), timeout=120, interval=0.5)


def test_the_watch_was_on_nodeclaims(service: Service) -> None:
    """The service watched NodeClaims (its own watch metrics say so): what the tests above read."""
    assert "nodeclaims.karpenter.sh" in service.get("/metrics")[1]

