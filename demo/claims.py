"""The demo's ClusterResourceClaim: Kueue's real CRDs, a ResourceFlavor ``gpu`` selecting the gpu
pool's nodes, ClusterQueues ``research`` and ``prod`` listing it (cpu and nvidia.com/gpu), and a claim
``gpu`` that gives research absolute amounts and prod 50% of the pool. The service runs with
``--quota-actuation=on`` and a short ``--quota-settle``, so the story of docs/kueue.md plays here:

1. the pool loses nodes (KWOK's chaos stage makes half of them NotReady);
2. ``kubectl get crc`` shows the live capacity at once and, after the settle time, the shortfall;
3. the ClusterQueues' nominalQuota follows after the settle time.

``commands`` gives the kubectl arguments the demo prints, ``Story`` plays them (``--quota-story``)
and prints each command with its real output."""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubeindex.model.objects import API_VERSION
from kubeindex.model.quantity import parse_nano
from kubeindex.model.resources import CLAIMS, CLUSTER_QUEUES
from localkube.cluster import LocalCluster

from .kueue import cell, cluster_queue, install_kueue, resource_flavor
from .workloads import POOL_LABEL, create, ok

FLAVOR = POOL = CLAIM = "gpu"
GPU = "nvidia.com/gpu"
QUEUES = ("research", "prod")
NOT_READY = "node-not-ready.stage.kwok.x-k8s.io"
# A queue's quota of flavor gpu: cluster_queue lists the resources sorted, cpu first.
QUOTA_COLUMNS = ("custom-columns=NAME:.metadata.name,"
                 "CPU:.spec.resourceGroups[0].flavors[0].resources[0].nominalQuota,"
                 "GPU:.spec.resourceGroups[0].flavors[0].resources[1].nominalQuota")


@dataclass(frozen=True)
class Commands:
    """The kubectl arguments of the story (without the kubectl command itself)."""

    lose: tuple[str, ...]  # makes the last half of the gpu pool NotReady
    claims: tuple[str, ...] = ("get", "clusterresourceclaims", "-o", "wide")
    shortfall: tuple[str, ...] = ("get", "clusterresourceclaim", CLAIM, "-o",
                                  'jsonpath={.status.shortfall}{"\\n"}'
                                  '{.status.conditions[?(@.type=="OverAllocated")].message}{"\\n"}')
    quota: tuple[str, ...] = ("get", "clusterqueues", "-o", QUOTA_COLUMNS)


def lost_nodes(per_pool: int) -> list[str]:
    """The gpu nodes the story makes NotReady: the last half of the pool (at least one)."""
    return [f"{POOL}-{i}" for i in range(per_pool - max(1, per_pool // 2), per_pool)]


def commands(per_pool: int) -> Commands:
    return Commands(lose=("label", "nodes", *lost_nodes(per_pool), f"{NOT_READY}=true"))


def shown(args: tuple[str, ...], kubectl: str = "kubectl") -> str:
    """A command line as a shell reads it."""
    return f"{kubectl} {shlex.join(args)}"


def research(per_pool: int) -> dict[str, str]:
    """research's absolute amounts: 8 cpu and 3 GPUs per node of the pool (of 32 cpu and 8 GPUs), so
    the claim fits the whole pool and no longer fits when half of it is lost."""
    return {"cpu": str(8 * per_pool), GPU: str(3 * per_pool)}


def setup(cluster: LocalCluster, per_pool: int) -> None:
    """Kueue's CRDs, the flavor, the queues (quota 0: the service writes what the claim assigns) and
    the claim. Before the service starts, so it watches Kueue's kinds from its first list."""
    install_kueue(cluster)
    resource_flavor(cluster, FLAVOR, {POOL_LABEL: POOL})
    for name in QUEUES:
        cluster_queue(cluster, name, {FLAVOR: {"cpu": "0", GPU: "0"}})
    create(cluster, CLAIMS.path(), {
        "apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": CLAIM},
        "spec": {"clusterName": "local", "flavor": FLAVOR, "overAllocation": "Scale", "resourceAssignments": [
            {"clusterQueueName": "research", "resources": research(per_pool)},
            {"clusterQueueName": "prod", "shares": {"cpu": "50%", GPU: "50%"}}]}})


def quota(cluster: LocalCluster, queue: str) -> dict[str, str]:
    """resource -> nominalQuota of the queue's flavor gpu."""
    spec = ok(cluster.request(cell().at(CLUSTER_QUEUES).path(name=queue)))["spec"]
    return {r["name"]: str(r["nominalQuota"]) for g in spec["resourceGroups"] for f in g["flavors"]
            if f["name"] == FLAVOR for r in f["resources"]}


def claim_status(cluster: LocalCluster) -> dict[str, Any]:
    return ok(cluster.request(CLAIMS.path(name=CLAIM))).get("status", {})


def ready_reason(status: dict[str, Any]) -> str:
    return next((c.get("reason", "") for c in status.get("conditions", []) if c.get("type") == "Ready"), "")


def applied(cluster: LocalCluster) -> bool:
    """The claim's first evaluation is in the queues (created with quota 0)."""
    return all(quota(cluster, q).get(GPU, "0") != "0" for q in QUEUES)


def live_gpus(cluster: LocalCluster) -> str:
    """The claim's live capacity of GPUs (status.nominalResources)."""
    return str(claim_status(cluster).get("nominalResources", {}).get(GPU, ""))


def instructions(kubectl: str, per_pool: int, settle: float, alert_after: str) -> str:
    """What the demo prints: the commands a user runs to see the story."""
    c = commands(per_pool)
    lost = len(lost_nodes(per_pool))
    lines = (f"Take {lost} of the gpu pool's {per_pool} nodes away (NotReady): ClusterResourceClaim {CLAIM} "
             "shows the live capacity at",
             f"once and, after the settle time (--quota-settle={settle:g}), the shortfall; the ClusterQueues' "
             "quota follows",
             f"then, and ClusterResourceClaimOverAllocated fires {alert_after} later (`make demo "
             "DEMO_ARGS=--quota-story`",
             "plays it all and prints the output):",
             *(f"  {shown(args, kubectl)}" for args in (c.lose, c.claims, c.shortfall, c.quota)))
    return "\n".join(lines)


class Story:
    """Plays the three steps on the demo's cluster and prints each command with its real output."""

    def __init__(self, cluster: LocalCluster, per_pool: int, settle: float, stop: threading.Event,
                 out: Callable[[str], None] = print) -> None:
        self.cluster = cluster
        self.per_pool = per_pool
        self.settle = settle
        self.stop = stop
        self.out = out
        self.commands = commands(per_pool)

    def run(self, args: tuple[str, ...]) -> None:
        self.out(f"$ {shown(args)}\n{self.cluster.kubectl(*args).stdout.rstrip()}")

    def wait(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Poll until ``predicate()``; False if the demo is stopped or the time runs out."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.stop.wait(0.2) or time.monotonic() > deadline:
                return False
        return True

    def play(self) -> bool:
        """True if every step was seen."""
        c, per_pool = self.commands, self.per_pool
        lost_count = len(lost_nodes(per_pool))
        cpu, gpu = research(per_pool)["cpu"], research(per_pool)[GPU]
        self.out(f"\n### claim {CLAIM}: research gets {cpu} cpu and {gpu} GPUs of flavor {FLAVOR}, prod 50%")
        self.run(c.claims)
        self.run(c.quota)
        self.out(f"\n### 1. the gpu pool loses {lost_count} of its {per_pool} nodes (NotReady)")
        before, gpus = {q: quota(self.cluster, q) for q in QUEUES}, live_gpus(self.cluster)
        lost = time.monotonic()
        self.run(c.lose)
        left = parse_nano(gpus) * (per_pool - lost_count) // per_pool  # every lost node seen, not the first
        if not self.wait(lambda: live_gpus(self.cluster) not in ("", gpus)
                         and parse_nano(live_gpus(self.cluster)) == left, timeout=30):
            return False
        self.out(f"\n### {time.monotonic() - lost:.0f} s later: the claim's CPU and GPU show the live capacity; "
                 f"the quota waits for the settle time ({self.settle:g} s)")
        self.run(c.claims)
        self.run(c.quota)
        if not self.wait(lambda: ready_reason(claim_status(self.cluster)) == "OverAllocated"
                         and {q: quota(self.cluster, q) for q in QUEUES} != before, timeout=self.settle + 30):
            return False
        self.out(f"\n### 2. after the settle time, {time.monotonic() - lost:.0f} s after the loss: "
                 "the claim shows the shortfall")
        self.run(c.claims)
        self.run(c.shortfall)
        self.out("\n### 3. and the ClusterQueues' quota followed the pool (Scale: the shares shrink first, into "
                 "what the absolute amounts leave)")
        self.run(c.quota)
        return True
