"""The neighbours soak's Kueue part: a ClusterResourceClaim on a flavor whose nodes flap, and
neighbours who edit the ClusterQueues' other fields.

One ResourceFlavor (the nodes of pool-0, whose Ready condition the churn flips), two ClusterQueues
that start at quota 0 and one claim sharing the flavor between them. The checks:
- **converged**: each queue's nominalQuota equals what the quota rules (reconciler/quota.py) give
  for the flavor's capacity computed from scratch (the allocatable of its Ready nodes, from the API
  server's objects), once the capacity has held for the settle time;
- **a blip is no write**: a node NotReady for a third of the settle time, then Ready again, leaves
  the ClusterQueues' resourceVersions as they were (the claim's status may say what it saw);
- **not reverted**: a neighbour (field manager ``gitops``) server-side applies the queues'
  queueingStrategy and a label now and then; every check finds its last values still there.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from demo import kueue
from demo.kueue import cluster_queue, install_kueue, resource_flavor
from demo.workloads import ok
from kubeindex.model.objects import API_VERSION
from kubeindex.model.quantity import format_quantity, parse_nano
from kubeindex.model.resources import CLAIMS, CLUSTER_QUEUES, NODES
from localkube.cluster import LocalCluster
from reconciler.quota import evaluate, parse_claim

FLAVOR = "pool-0"  # the nodes labelled pool-0: their Ready condition flaps with the churn
QUEUES = ("team-a", "team-b")
CLAIM = "pool-0"
RESOURCES = ("cpu", "memory")
GITOPS = "gitops"  # the neighbour's field manager
STRATEGIES = ("StrictFIFO", "BestEffortFIFO")


def queue_path(name: str = "") -> str:
    return kueue.cell().at(CLUSTER_QUEUES).path(name=name)


def setup(cluster: LocalCluster, label_key: str) -> None:
    """Kueue's CRDs, the flavor, the queues at quota 0 and the claim (60% / 40% of cpu, 50% / 25%
    of memory): before the replicas start, so they read them in their first list."""
    install_kueue(cluster)
    resource_flavor(cluster, FLAVOR, {label_key: FLAVOR})
    for name in QUEUES:
        cluster_queue(cluster, name, {FLAVOR: dict.fromkeys(RESOURCES, "0")})
    ok(cluster.request(CLAIMS.path(), "POST", {
        "apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": CLAIM},
        "spec": {"flavor": FLAVOR, "overAllocation": "Scale", "resourceAssignments": [
            {"clusterQueueName": "team-a", "shares": {"cpu": "60%", "memory": "50%"}},
            {"clusterQueueName": "team-b", "shares": {"cpu": "40%", "memory": "25%"}}]}}))


def ready_capacity(nodes: list[dict], label_key: str) -> dict[str, int]:
    """The flavor's capacity from scratch: allocatable summed over its nodes whose Ready is True."""
    total: dict[str, int] = {}
    for node in nodes:
        if node["metadata"].get("labels", {}).get(label_key) != FLAVOR:
            continue
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        if conditions.get("Ready") != "True":
            continue
        for resource, quantity in node["status"].get("allocatable", {}).items():
            total[resource] = total.get(resource, 0) + parse_nano(quantity)
    return total


def queues(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    listed = ok(cluster.request(queue_path()))["items"]
    return {q["metadata"]["name"]: q for q in listed if q["metadata"]["name"] in QUEUES}


def nominal(queue: dict[str, Any]) -> dict[str, str]:
    """resource -> nominalQuota of the flavor, as canonical quantities."""
    return {r["name"]: format_quantity(r["name"], parse_nano(r["nominalQuota"]))
            for g in queue["spec"]["resourceGroups"] for f in g["flavors"] if f["name"] == FLAVOR
            for r in f["resources"]}


def expected_quota(cluster: LocalCluster, nodes: list[dict], label_key: str) -> dict[str, dict[str, str]]:
    """queue -> resource -> the nominalQuota the claim gives at the capacity the nodes have now."""
    claim = ok(cluster.request(CLAIMS.path(name=CLAIM)))
    capacity = ready_capacity(nodes, label_key)
    plan = evaluate([parse_claim(claim)], queues(cluster), {("local", FLAVOR): capacity})
    return {q: {r: format_quantity(r, plan.quota.get(q, {}).get((FLAVOR, r), 0)) for r in RESOURCES} for q in QUEUES}


@dataclass
class Neighbour:
    """The GitOps-like neighbour's last edit of each queue, and the times a check found it undone."""

    applied: dict[str, tuple[str, str]] = field(default_factory=dict)  # queue -> (strategy, team label)
    reverted: list[str] = field(default_factory=list)
    serial: int = 0

    def edit(self, cluster: LocalCluster) -> str:
        self.serial += 1
        strategy, team = STRATEGIES[self.serial % 2], f"t{self.serial}"
        for name in QUEUES:
            body = {"apiVersion": kueue.API, "kind": "ClusterQueue",
                    "metadata": {"name": name, "labels": {"team": team}}, "spec": {"queueingStrategy": strategy}}
            cluster.kubectl("apply", "--server-side", f"--field-manager={GITOPS}", "-f", "-", input=json.dumps(body))
            self.applied[name] = (strategy, team)
        return f"{GITOPS} applied queueingStrategy {strategy} and label team={team} to {', '.join(QUEUES)}"

    def undone(self, current: dict[str, dict[str, Any]]) -> list[str]:
        """Each queue whose neighbour-set fields differ from the neighbour's last edit."""
        out = []
        for name, (strategy, team) in self.applied.items():
            q = current.get(name, {})
            have = (q.get("spec", {}).get("queueingStrategy"), q.get("metadata", {}).get("labels", {}).get("team"))
            if have != (strategy, team):
                out.append(f"ClusterQueue {name}: {GITOPS}'s queueingStrategy/team {strategy}/{team}, "
                           f"now {have[0]}/{have[1]}")
        return out


def quota_probe(cluster: LocalCluster, label_key: str, neighbour: Neighbour) -> Callable[[], list[str]]:
    """A check's probe: the differences between the queues' quota and the from-scratch quota, and any
    neighbour's edit undone (what a check reports; empty when all is right)."""
    def probe() -> list[str]:
        nodes = ok(cluster.request(NODES.path()))["items"]
        want = expected_quota(cluster, nodes, label_key)
        current = queues(cluster)
        problems = [f"quota {q}/{r}: want {want[q][r]} got {nominal(current[q]).get(r)}"
                    for q in QUEUES for r in RESOURCES if nominal(current[q]).get(r) != want[q][r]]
        return problems + neighbour.undone(current)
    return probe


def versions(cluster: LocalCluster) -> dict[str, str]:
    """Each queue's resourceVersion: any write to it changes it."""
    return {name: q["metadata"]["resourceVersion"] for name, q in queues(cluster).items()}
