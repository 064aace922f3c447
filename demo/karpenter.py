"""`python -m demo --karpenter`: a drift rollout of a real Karpenter pool, as the service shows it.

A control plane with the real Karpenter (its KWOK provider, localkube/karpenter.py), NodePool
`demo` (template label `rollout: v1`), and in namespace `demo` three Deployments, one pod per node:
`web` (3 pods, nothing holds them), `pinned` (1 pod with `karpenter.sh/do-not-disrupt`) and
`guarded` (2 pods under a PodDisruptionBudget that allows none). node-workload-summary runs with
--karpenter-events=on. Once Karpenter has named the blockers, the template's label goes to `v2`: the
pool drifts, Karpenter replaces web's nodes and cannot touch the other three. The demo prints
`kubectl get nodesummaries -o wide` (the rollout columns), the pool's blockers, `kubectl get
workloads.ux -A` and the Events the service recorded, before and after, then waits for Ctrl-C (or
--duration).

The scenario's objects are made here, and tests/cluster/test_karpenter_blockers.py makes the same.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

from localkube.build import KARPENTER, BuildError, ensure_binaries
from localkube.cluster import ClusterError, LocalCluster, Options
from localkube.karpenter import NODEPOOL_LABEL, KarpenterController, apply, node_class, node_pool
from localkube.service import Service, wait_for

from .workloads import create, node_summarizer, workload_summarizer

ROOT = Path(__file__).resolve().parent.parent
NS = POOL = "demo"
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true"}
REPORTER = "node-workload-summary"  # the Events' reportingController
# `kubectl get events` shows no count; its series' does (none: once).
SUMMARY = f"pools-{POOL}"  # the pool's NodeSummary (NodeSummarizer pools, label karpenter.sh/nodepool)
BLOCKERS = r'{range .status.blockers[*]}{.node}{"\t"}{.kind}{"\t"}{.namespace}/{.name}{"\n"}{end}'
EVENT_COLUMNS = "TYPE:.type,REASON:.reason,OBJECT:.involvedObject.name,COUNT:.series.count,MESSAGE:.message"


def say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def spread_deployment(cluster: LocalCluster, namespace: str, name: str, pool: str, replicas: int,
                      annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """``replicas`` pods of 1 CPU on NodePool ``pool``, one per node: an anti-affinity on the hostname
    with every pod of the namespace's spread, so Karpenter launches a node for each."""
    spread = {"spread": namespace}
    metadata: dict[str, Any] = {"labels": {"app": name, **spread}, **({"annotations": annotations} if annotations
                                                                      else {})}
    return create(cluster, f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": {
            "metadata": metadata, "spec": {
                "nodeSelector": {NODEPOOL_LABEL: pool}, "terminationGracePeriodSeconds": 0,
                "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": spread}, "topologyKey": "kubernetes.io/hostname"}]}},
                "containers": [{"name": "c", "image": "example.com/app",
                                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}}}})


def no_disruption_budget(cluster: LocalCluster, namespace: str, app: str) -> dict[str, Any]:
    """A PodDisruptionBudget of the Deployment ``app``'s pods that allows no disruption."""
    return create(cluster, f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", {
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": app},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": app}}}})


def drift(cluster: LocalCluster, pool: dict[str, Any], rollout: str) -> None:
    """Set the template's label `rollout`: in the template's hash, so every node of the pool drifts."""
    pool["spec"]["template"]["metadata"]["labels"]["rollout"] = rollout
    apply(cluster, pool)


def pods_on(cluster: LocalCluster, namespace: str) -> dict[str, str]:
    """{pod: node} of the running pods not being deleted."""
    items = json.loads(cluster.kubectl("get", "pods", "-n", namespace, "-o", "json").stdout)["items"]
    return {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in items
            if "deletionTimestamp" not in p["metadata"] and p["status"].get("phase") == "Running"}


def pool_nodes(cluster: LocalCluster) -> list[str]:
    return cluster.kubectl("get", "nodes", "-l", f"{NODEPOOL_LABEL}={POOL}", "-o",
                           "jsonpath={.items[*].metadata.name}").stdout.split()


def on_unhealthy_nodes(cluster: LocalCluster, workload: str) -> int:
    out = cluster.kubectl("get", "workloads.ux", "-n", NS, workload, "-o",
                          "jsonpath={.status.podsOnUnhealthyNodes}", check=False).stdout
    return int(out) if out.isdigit() else 0


def blocked_nodes(cluster: LocalCluster, summary: str) -> int:
    out = cluster.kubectl("get", "nodesummary", summary, "-o", "jsonpath={.status.blockedNodeCount}", check=False)
    return int(out.stdout) if out.returncode == 0 and out.stdout.isdigit() else 0


def show(cluster: LocalCluster) -> str:
    """What the demo prints at each step: the summaries and the service's Events."""
    events = cluster.kubectl("get", "events", "-n", NS, f"--field-selector=reportingComponent={REPORTER}",
                             f"-o=custom-columns={EVENT_COLUMNS}").stdout
    blockers = cluster.kubectl("get", "nodesummary", SUMMARY, f"-o=jsonpath={BLOCKERS}").stdout
    return (f"$ kubectl get nodesummaries -o wide\n{cluster.kubectl('get', 'nodesummaries', '-o', 'wide').stdout}\n"
            f"$ kubectl get nodesummary {SUMMARY} -o jsonpath='{BLOCKERS}'\n{blockers}\n"
            f"$ kubectl get workloads.ux -A\n{cluster.kubectl('get', 'workloads.ux', '-A').stdout}\n"
            f"$ kubectl get events -n {NS} --field-selector reportingComponent={REPORTER} \\\n"
            f"    -o custom-columns={EVENT_COLUMNS}\n{events}")


def run(duration: float, stop: threading.Event) -> int:
    started = time.monotonic()
    cluster = LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True))
    service: Service | None = None
    try:
        say("building or reusing the control plane binaries and Karpenter's KWOK provider ...")
        ensure_binaries()
        ensure_binaries((KARPENTER,))
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK ...")
        cluster.start()
        cluster.install_crds(ROOT / "crds")
        up = time.monotonic()
        say("starting Karpenter (its KWOK provider) ...")
        KarpenterController(cluster).start()  # stopped with the cluster
        say(f"Karpenter ready in {time.monotonic() - up:.1f}s; NodePool {POOL} (rollout: v1), the summarizers "
            f"and node-workload-summary --karpenter-events=on ...")
        pool = node_pool(POOL, labels={"rollout": "v1"})
        apply(cluster, node_class("default"), pool)
        node_summarizer(cluster, "pools", NODEPOOL_LABEL)
        workload_summarizer(cluster, "apps", [("apps", "Deployment")])
        service = Service(cluster, ("--karpenter-events=on",)).start()
        cluster.kubectl("create", "namespace", NS)
        spread_deployment(cluster, NS, "web", POOL, 3)
        spread_deployment(cluster, NS, "pinned", POOL, 1, DO_NOT_DISRUPT)
        spread_deployment(cluster, NS, "guarded", POOL, 2)
        no_disruption_budget(cluster, NS, "guarded")
        say("Deployments web (3 pods), pinned (1, karpenter.sh/do-not-disrupt) and guarded (2, a PDB allowing "
            "none), one pod per node: Karpenter launches 6 nodes ...")
        wait_for(lambda: len(pods_on(cluster, NS)) == 6, timeout=120)
        say("waiting for Karpenter to name what blocks its disruptions (its DisruptionBlocked Events) ...")
        wait_for(lambda: blocked_nodes(cluster, SUMMARY) == 3, timeout=200)
        print(f"\nReady in {time.monotonic() - started:.0f}s: pool {POOL} before the rollout.\n\n{show(cluster)}",
              flush=True)
        free = {node for pod, node in pods_on(cluster, NS).items() if pod.startswith("web-")}
        changed = time.monotonic()
        say(f"NodePool {POOL}: template label rollout v1 -> v2; every node drifts ...")
        drift(cluster, pool, "v2")
        wait_for(lambda: not free & set(pool_nodes(cluster)) and len(pods_on(cluster, NS)) == 6, timeout=180)
        wait_for(lambda: not on_unhealthy_nodes(cluster, "web"), timeout=30)  # its summary written since
        print(f"\nThe rollout, {time.monotonic() - changed:.0f}s after the template change: web's nodes replaced, "
              f"the 3 held nodes still drifted.\n\n{show(cluster)}", flush=True)
        print(f"\nLook around:\n  export KUBECONFIG={cluster.kubeconfig} PATH={cluster.kubectl_path.parent}:$PATH\n"
              "  kubectl get nodesummaries -o yaml | grep -A12 blockers\n"
              f"  kubectl describe workloads.ux -n {NS} pinned\n"
              "  kubectl get nodepools,nodeclaims -o wide\n\nPress Ctrl-C to stop everything.", flush=True)
        while not stop.wait(1):
            if duration and time.monotonic() - started > duration:
                break
        return 0
    except (ClusterError, BuildError, AssertionError) as err:
        say(f"error: {err}")
        return 1
    finally:
        say("stopping ...")
        if service is not None:
            service.stop()
        cluster.stop()
