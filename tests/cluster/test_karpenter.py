"""The real Karpenter (its KWOK provider, built from the pinned module: make test-karpenter) beside a
local control plane with kube-scheduler, kube-controller-manager and KWOK: pending pods make it
launch NodeClaims and their Nodes, a NodePool template change drifts the pool's nodes and it replaces
them, and an empty node is consolidated. Each test has a NodePool and a namespace of its own
(tests.karpenter.pool) and ends when that pool's nodes are gone; what Karpenter did is read from its
objects and from watches that recorded every version of them (docs/karpenter.md)."""

from __future__ import annotations

import time

import pytest

from kubeindex.model.resources import EVENTS, NODECLAIMS, NODES, PODS
from localkube.karpenter import (
    DISRUPTED_TAINT,
    KWOK_NODE,
    NODEPOOL_LABEL,
    UNREGISTERED_TAINT,
    KarpenterController,
    apply,
)
from localkube.service import wait_for
from tests.karpenter import (
    Watched,
    condition,
    deployment,
    is_true,
    nodeclaims,
    nodepool,
    nodes,
    pool,
    running_on,
    tainted,
)

pytestmark = pytest.mark.karpenter  # make test-karpenter; make test leaves them out


def _millis(cpu: str) -> int:
    return int(cpu[:-1]) if cpu.endswith("m") else int(float(cpu) * 1000)


def _unschedulable(pod: dict) -> bool:
    scheduled = condition(pod, "PodScheduled")
    return scheduled is not None and scheduled["status"] == "False" and scheduled["reason"] == "Unschedulable"


def test_pending_pods_make_karpenter_launch_nodeclaims_and_their_nodes(karpenter: KarpenterController) -> None:
    kube = karpenter.cluster
    with pool(kube, "scale-up"), Watched(kube, PODS.path("scale-up")) as watched:
        deployment(kube, "scale-up", "web", "scale-up", replicas=4, cpu="1", memory="1Gi")
        took = wait_for(lambda: running_on(kube, "scale-up", 4), timeout=90, interval=0.2)
        placement = running_on(kube, "scale-up", 4)
        assert placement is not None
        print(f"4 pending pods Running on Karpenter's nodes {took:.1f}s after their Deployment was made")
        # The scheduler found no node for them first: what Karpenter provisions for.
        for name in placement:
            assert watched.ever(name, _unschedulable), name

        claims = nodeclaims(kube, "scale-up")
        by_node = {c["status"]["nodeName"]: c for c in claims}
        assert claims and len(by_node) == len(claims)
        for claim in claims:
            for kind in ("Launched", "Registered", "Initialized", "Ready"):
                assert is_true(claim, kind), (claim["metadata"]["name"], kind, claim["status"]["conditions"])
            assert claim["spec"]["nodeClassRef"] == {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass",
                                                     "name": "default"}
            owner = claim["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"]) == ("NodePool", "scale-up")
        launched = {n["metadata"]["name"]: n for n in nodes(kube, "scale-up")}
        assert launched.keys() == by_node.keys()
        assert set(placement.values()) <= launched.keys()
        for name, node in launched.items():
            labels, claim = node["metadata"]["labels"], by_node[name]
            assert node["spec"]["providerID"] == claim["status"]["providerID"] == f"kwok://{name}"
            assert labels[KWOK_NODE] == node["metadata"]["annotations"][KWOK_NODE] == "fake"  # KWOK runs it
            assert labels["karpenter.sh/registered"] == labels["karpenter.sh/initialized"] == "true"
            instance_type = labels["node.kubernetes.io/instance-type"]
            assert instance_type == claim["metadata"]["labels"]["node.kubernetes.io/instance-type"]
            assert not tainted(node, UNREGISTERED_TAINT)
            assert is_true(node, "Ready")

        # The NodePool counts them: status.nodes, and status.resources as the sum of the nodes' capacity.
        def counted() -> bool:
            status = nodepool(kube, "scale-up").get("status", {})
            cpu = sum(_millis(n["status"]["capacity"]["cpu"]) for n in launched.values())
            return (status.get("nodes") == len(launched) and status["resources"]["nodes"] == str(len(launched))
                    and _millis(status["resources"]["cpu"]) == cpu)

        wait_for(counted, timeout=30, interval=0.5)


def test_a_template_change_drifts_the_pools_nodes_and_karpenter_replaces_them(karpenter: KarpenterController) -> None:
    kube = karpenter.cluster
    selector = f"{NODEPOOL_LABEL}=drift"
    with pool(kube, "drift", labels={"rollout": "v1"}) as spec, Watched(kube, NODECLAIMS.path(), selector) as claims, \
            Watched(kube, NODES.path(), selector) as watched_nodes:
        deployment(kube, "drift", "api", "drift", replicas=2, cpu="1", memory="1Gi")
        wait_for(lambda: running_on(kube, "drift", 2), timeout=90, interval=0.2)
        old = {c["metadata"]["name"]: c["status"]["nodeName"] for c in nodeclaims(kube, "drift")}
        assert old
        hashed = nodepool(kube, "drift")["metadata"]["annotations"]["karpenter.sh/nodepool-hash"]

        # The template's labels are in its hash (karpenter.sh/nodepool-hash): a change drifts every node.
        spec["spec"]["template"]["metadata"]["labels"]["rollout"] = "v2"
        apply(kube, spec)
        changed = time.monotonic()
        wait_for(lambda: nodepool(kube, "drift")["metadata"]["annotations"]["karpenter.sh/nodepool-hash"] != hashed,
                 timeout=30, interval=0.2)

        def drifted(claim: dict) -> bool:
            found = condition(claim, "Drifted")
            return found is not None and found["status"] == "True" and found["reason"] == "NodePoolDrifted"

        took = wait_for(lambda: all(claims.ever(name, drifted) for name in old), timeout=60, interval=0.2)
        print(f"every NodeClaim Drifted (NodePoolDrifted) {took:.1f}s after the template change")
        # Karpenter replaces each: the old NodeClaims and Nodes are deleted, and the pods run on new nodes.
        wait_for(lambda: set(old) <= claims.deleted() and set(old.values()) <= watched_nodes.deleted(),
                 timeout=180, interval=0.5)
        wait_for(lambda: running_on(kube, "drift", 2), timeout=60, interval=0.2)
        print(f"the pool's nodes replaced, its pods Running again, {time.monotonic() - changed:.1f}s after the change")
        placement = running_on(kube, "drift", 2)
        assert placement is not None and not set(placement.values()) & set(old.values())

        for name, node in old.items():
            # Disrupted: the NodeClaim's DisruptionReason condition, and the karpenter.sh/disrupted taint
            # on its node, then deleted; never before the template change.
            assert claims.ever(name, lambda c: (d := condition(c, "DisruptionReason")) is not None
                               and d["status"] == "True" and d["reason"] == "Drifted"), name
            assert watched_nodes.ever(node, lambda n: tainted(n, DISRUPTED_TAINT)), node
            deleting = claims.first(name, lambda c: "deletionTimestamp" in c["metadata"])
            assert deleting is not None and deleting > changed
        # A replacement was launched and initialized before the first old NodeClaim was deleted
        # (drift replaces, then deletes, for a node whose pods need a place).
        first_deleted = min(t for name in old if (t := claims.first(name, lambda c: "deletionTimestamp" in
                                                                      c["metadata"])) is not None)
        replacements = claims.names() - set(old)
        assert replacements
        initialized = [t for name in replacements if (t := claims.first(name, lambda c: is_true(c, "Initialized")))]
        assert initialized and min(initialized) < first_deleted
        # Every node of the pool now has the new template's label, and no NodeClaim is Drifted.
        now = nodes(kube, "drift")
        assert now and all(n["metadata"]["labels"]["rollout"] == "v2" for n in now)
        assert not any(is_true(c, "Drifted") for c in nodeclaims(kube, "drift"))


def test_emptiness_consolidates_an_empty_node(karpenter: KarpenterController) -> None:
    kube = karpenter.cluster
    selector = f"{NODEPOOL_LABEL}=empty"
    with pool(kube, "empty", consolidation_policy="WhenEmpty", consolidate_after="1s"), \
            Watched(kube, NODECLAIMS.path(), selector) as claims, \
            Watched(kube, NODES.path(), selector) as watched_nodes:
        deployment(kube, "empty", "batch", "empty", replicas=1, cpu="1", memory="1Gi")
        wait_for(lambda: running_on(kube, "empty", 1), timeout=90, interval=0.2)
        [claim] = nodeclaims(kube, "empty")
        name, node = claim["metadata"]["name"], claim["status"]["nodeName"]

        kube.request("/apis/apps/v1/namespaces/empty/deployments/batch/scale", "PATCH", {"spec": {"replicas": 0}},
                     content_type="application/merge-patch+json")
        emptied = time.monotonic()
        took = wait_for(lambda: name in claims.deleted() and node in watched_nodes.deleted(), timeout=120, interval=0.2)
        print(f"the empty node consolidated (its NodeClaim and Node gone) {took:.1f}s after its pod was removed")

        # Consolidatable (consolidateAfter passed), then disrupted for the reason Empty: the taint, the
        # condition, then deleted; not while its pod ran.
        assert claims.ever(name, lambda c: is_true(c, "Consolidatable"))
        assert claims.ever(name, lambda c: (d := condition(c, "DisruptionReason")) is not None
                           and d["status"] == "True" and d["reason"] == "Empty")
        assert watched_nodes.ever(node, lambda n: tainted(n, DISRUPTED_TAINT))
        deleting = claims.first(name, lambda c: "deletionTimestamp" in c["metadata"])
        assert deleting is not None and deleting > emptied
        # Karpenter's own account of it: an Event on the Node (in namespace default, as for every
        # cluster-scoped object).
        events = kube.request(f"{EVENTS.path('default')}?fieldSelector=regarding.name={node}")[1]
        assert isinstance(events, dict)
        assert any(e["reason"] == "DisruptionTerminating" and e["note"] == "Disrupting Node: Empty"
                   for e in events["items"]), [(e["reason"], e["note"]) for e in events["items"]]
        wait_for(lambda: nodepool(kube, "empty").get("status", {}).get("nodes") == 0, timeout=30, interval=0.5)
