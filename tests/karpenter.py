"""Helpers of the tests beside the real Karpenter (make test-karpenter): a watch that records every
version of the objects it sees, NodePools made and removed by a `with`, and what to read off
NodeClaims, Nodes and pods."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from demo.workloads import create, ok
from kubeindex.model.objects import KARPENTER_GROUP
from kubeindex.model.resources import NODECLAIMS, NODES, PODS, Resource
from localkube.cluster import LocalCluster
from localkube.karpenter import NODEPOOL_LABEL, apply, node_pool
from localkube.service import wait_for

# Karpenter's NodePools, which the tests read and the service does not (its NodeClaims: kubeindex.model.resources).
NODEPOOLS = Resource(KARPENTER_GROUP, "v1", "NodePool", "nodepools", False)


class Watched:
    """Every version of the objects at a list path, as a watch sends them (``kubectl get --raw
    <path>?watch=1``: each event on its own line), recorded with the time it came by a thread from
    ``start`` on. What a test asserts was seen however briefly: the ``karpenter.sh/disrupted`` taint,
    held for a second or less before an empty node goes, or a NodeClaim's DisruptionReason condition;
    and in which order."""

    def __init__(self, cluster: LocalCluster, path: str, selector: str = "") -> None:
        query = "watch=1" + (f"&labelSelector={selector}" if selector else "")
        self.argv = cluster.kubectl_argv("get", "--raw", f"{path}?{query}")
        self.events: list[tuple[float, str, dict[str, Any]]] = []  # (time.monotonic(), type, object)
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[str] | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def start(self) -> Watched:
        self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.strip():
                event = json.loads(line)
                with self._lock:
                    self.events.append((time.monotonic(), event["type"], event["object"]))

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        self._thread.join(timeout=10)

    def __enter__(self) -> Watched:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def versions(self, name: str | None = None) -> list[dict[str, Any]]:
        """The objects (of ``name``) in the order they were sent, deletions included."""
        with self._lock:
            return [obj for _, _, obj in self.events if name is None or obj["metadata"]["name"] == name]

    def names(self) -> set[str]:
        return {obj["metadata"]["name"] for obj in self.versions()}

    def deleted(self) -> set[str]:
        with self._lock:
            return {obj["metadata"]["name"] for _, kind, obj in self.events if kind == "DELETED"}

    def ever(self, name: str, predicate: Callable[[dict[str, Any]], bool]) -> bool:
        """Whether some version of ``name`` held ``predicate``."""
        return self.first(name, predicate) is not None

    def first(self, name: str, predicate: Callable[[dict[str, Any]], bool]) -> float | None:
        """When (time.monotonic()) the first version of ``name`` that held ``predicate`` came; None: none."""
        with self._lock:
            return next((at for at, _, obj in self.events if obj["metadata"]["name"] == name and predicate(obj)), None)


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The status condition of type ``kind``, or None."""
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def is_true(obj: dict[str, Any], kind: str) -> bool:
    found = condition(obj, kind)
    return found is not None and found["status"] == "True"


def tainted(node: dict[str, Any], key: str) -> bool:
    return any(t["key"] == key for t in node.get("spec", {}).get("taints", []))


def items(cluster: LocalCluster, path: str, selector: str = "") -> list[dict[str, Any]]:
    return ok(cluster.request(f"{path}?labelSelector={selector}" if selector else path))["items"]


def nodeclaims(cluster: LocalCluster, pool: str) -> list[dict[str, Any]]:
    return items(cluster, NODECLAIMS.path(), f"{NODEPOOL_LABEL}={pool}")


def nodes(cluster: LocalCluster, pool: str) -> list[dict[str, Any]]:
    return items(cluster, NODES.path(), f"{NODEPOOL_LABEL}={pool}")


def nodepool(cluster: LocalCluster, pool: str) -> dict[str, Any]:
    return ok(cluster.request(NODEPOOLS.path(name=pool)))


def pods(cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    return items(cluster, PODS.path(namespace))


def running_on(cluster: LocalCluster, namespace: str, replicas: int) -> dict[str, str] | None:
    """{pod: node} once ``replicas`` pods (none being deleted) run, each on a node; else None."""
    live = [p for p in pods(cluster, namespace) if "deletionTimestamp" not in p["metadata"]]
    if len(live) != replicas or any(p["status"].get("phase") != "Running" for p in live):
        return None
    return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in live}


def deployment(cluster: LocalCluster, namespace: str, name: str, pool: str, replicas: int,
               cpu: str = "1", memory: str = "1Gi") -> dict[str, Any]:
    """A Deployment whose pods ask for ``cpu`` and ``memory`` on the nodes of NodePool ``pool``."""
    labels = {"app": name}
    return create(cluster, f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": replicas, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels}, "spec": {
                     "nodeSelector": {NODEPOOL_LABEL: pool},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "c", "image": "example.com/app",
                                     "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}}}})


@contextmanager
def pool(cluster: LocalCluster, name: str, **spec: Any) -> Iterator[dict[str, Any]]:
    """NodePool ``name`` (``localkube.karpenter.node_pool``'s arguments) and a namespace of the same
    name, for one test; at the end both are deleted, and the pool's NodeClaims (Karpenter drains and
    deletes their Nodes), all waited for until gone: the next test starts on a cluster without them.
    The garbage collector would delete the NodeClaims too (their ownerReference is the NodePool), but
    it watches a kind only from its next discovery resync after the CRD came, up to 30 s later."""
    obj = node_pool(name, **spec)
    apply(cluster, obj)
    cluster.kubectl("create", "namespace", name)
    try:
        yield obj
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false")
        cluster.kubectl("delete", "nodepool", name, "--wait=false")
        cluster.kubectl("delete", "nodeclaims", "-l", f"{NODEPOOL_LABEL}={name}", "--wait=false")
        wait_for(lambda: not nodeclaims(cluster, name) and not nodes(cluster, name), timeout=120, interval=0.5)
