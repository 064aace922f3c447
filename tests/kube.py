"""Test helpers that talk to the local control plane through its REST API (admin credentials),
and an API client that records what the code under test asks of it."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from demo.workloads import create, node_summarizer, ok, owner_ref, workload_summarizer
from kubeindex.client.api import JSON, ApiClient, ApiError, Transient
from kubeindex.client.watchstream import Framing
from kubeindex.model.resources import (
    CLAIMS,
    LEASES,
    NODE_SUMMARIES,
    NODE_SUMMARIZERS,
    NODECLAIMS,
    NODES,
    PODS,
    WORKLOAD_SUMMARIES,
    WORKLOAD_SUMMARIZERS,
    Resource,
)
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, select, value, wait_for
from tests.paths import CRDS


def create_node(cluster: LocalCluster, name: str, labels: dict[str, str], ready: str = "True",
                allocatable: dict[str, str] | None = None, unschedulable: bool = False) -> dict:
    alloc = allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}
    ok(cluster.request(NODES.path(), "POST", {
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": unschedulable},
    }))
    return set_node_status(cluster, name, ready, alloc)


def set_node_status(cluster: LocalCluster, name: str, ready: str, allocatable: dict[str, str] | None = None) -> dict:
    status: dict = {"conditions": [{"type": "Ready", "status": ready, "reason": "Test",
                                    "lastHeartbeatTime": None, "lastTransitionTime": None}]}
    if allocatable is not None:
        status["allocatable"] = allocatable
        status["capacity"] = allocatable
    return ok(cluster.request(NODES.path(name=name, subresource="status"), "PATCH", {"status": status},
                              content_type="application/merge-patch+json"))


def set_node_labels(cluster: LocalCluster, name: str, labels: dict[str, str | None]) -> dict:
    return ok(cluster.request(NODES.path(name=name), "PATCH", {"metadata": {"labels": labels}},
                              content_type="application/merge-patch+json"))


def create_pod(cluster: LocalCluster, namespace: str, name: str, node: str = "", phase: str = "Running",
               owner: dict | None = None, cpu: str = "500m", labels: dict[str, str] | None = None,
               memory: str | None = None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner_ref(owner)]
    requests = {"cpu": cpu, **({"memory": memory} if memory else {})}
    spec: dict = {"containers": [{"name": "c", "image": "x", "resources": {"requests": requests}}]}
    if node:
        spec["nodeName"] = node
    pod = create(cluster, PODS.path(namespace),
                 {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    if phase != "Pending":
        set_pod_phase(cluster, namespace, name, phase)
    return pod


def nodeclaim_crd(cluster: LocalCluster) -> None:
    """Karpenter's NodeClaim kind, served without Karpenter (its fields left unchecked): where a test
    needs the service to read NodeClaims but not Karpenter to make them (the real one: make test-karpenter)."""
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": NODECLAIMS.name},
           "spec": {"group": NODECLAIMS.group, "scope": "Cluster",
                    "names": {"kind": NODECLAIMS.kind, "plural": NODECLAIMS.plural, "listKind": "NodeClaimList",
                              "singular": "nodeclaim"},
                    "versions": [{"name": NODECLAIMS.version, "served": True, "storage": True,
                                  "subresources": {"status": {}},
                                  "schema": {"openAPIV3Schema": {"type": "object",
                                                                 "x-kubernetes-preserve-unknown-fields": True}}}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(crd))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{NODECLAIMS.name}", "--timeout=60s")


def set_pod_phase(cluster: LocalCluster, namespace: str, name: str, phase: str) -> dict:
    return ok(cluster.request(PODS.path(namespace, name, "status"), "PATCH",
                              {"status": {"phase": phase}}, content_type="application/merge-patch+json"))


T = TypeVar("T")


def set_pod_ready(cluster: LocalCluster, namespace: str, name: str, ready: bool = True) -> dict:
    """The pod's Ready condition, as its kubelet writes it (what a gang member's readiness reads)."""
    return ok(cluster.request(PODS.path(namespace, name, "status"), "PATCH",
                              {"status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}},
                              content_type="application/merge-patch+json"))


def get_object(cluster: LocalCluster, path: str) -> dict[str, Any] | None:
    """The object at ``path``, or None when the answer is not 200 (not there, or not yet)."""
    code, body = cluster.request(path)
    if code != 200:
        return None
    assert isinstance(body, dict), body
    return body


def found(obj: T | None) -> T:
    """``obj``, which the test knows is there by now."""
    assert obj is not None
    return obj


def truth(kube: LocalCluster, namespace: str) -> set[str]:
    """The keys of the pods in ``namespace``, as kubectl lists them."""
    out = kube.kubectl("get", "pods", "-n", namespace, "-o", "jsonpath={.items[*].metadata.name}").stdout
    return {f"{namespace}/{name}" for name in out.split()}


def delete(cluster: LocalCluster, path: str) -> None:
    """Delete now; Background propagation, so no GC finalizer keeps the object (Jobs default to
    orphaning, which waits for kube-controller-manager)."""
    code, body = cluster.request(path, "DELETE", {"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
    assert code in (200, 202, 404), (code, body)


def deployment(kube: LocalCluster, namespace: str, name: str) -> dict:
    """A Deployment with no replicas: a root workload that exists without a controller manager."""
    labels = {"app": name}
    return create(kube, f"/apis/apps/v1/namespaces/{namespace}/deployments", {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"replicas": 0, "selector": {"matchLabels": labels},
                 "template": {"metadata": {"labels": labels},
                              "spec": {"containers": [{"name": "c", "image": "example.com/x"}]}}}})


class AuditedCluster(LocalCluster):
    """A control plane whose API server writes an audit log to ``audit_log`` (its options name the
    same path in --audit-log-path, with an --audit-policy-file)."""

    def __init__(self, options: Options, binaries: dict[str, Path], audit_log: Path) -> None:
        super().__init__(options, binaries)
        self.audit_log = audit_log


@contextmanager
def summarized_cluster(binaries: dict[str, Path], namespace: str) -> Iterator[LocalCluster]:
    """A control plane of a test module's own: the CRDs, NodeSummarizer `pool` (label `pool`),
    WorkloadSummarizer `apps` (Deployments) and ``namespace``."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        node_summarizer(c, "pool", "pool")
        workload_summarizer(c, "apps", [("apps", "Deployment")])
        c.kubectl("create", "namespace", namespace)
        yield c


# What one module may leave that another would see: cluster-scoped objects, and namespaced ones
# that the service and its tests watch in every namespace. (Namespaces stay, empty of these: with
# no namespace controller a deleted one would stay Terminating, so each module uses its own names.)
# Each with its collection, which one request empties (kubectl deletes by name, 5 a second past a
# burst of 10: a module's 60 pods took 10 s).
SHARED = (Resource("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False),
          NODES, NODE_SUMMARIZERS, WORKLOAD_SUMMARIZERS, NODE_SUMMARIES, CLAIMS, WORKLOAD_SUMMARIES, PODS,
          Resource("apps", "v1", "Deployment", "deployments", True),
          Resource("apps", "v1", "ReplicaSet", "replicasets", True),
          Resource("apps", "v1", "StatefulSet", "statefulsets", True), Resource("batch", "v1", "Job", "jobs", True),
          LEASES)
SHARED_KINDS = tuple(r.name for r in SHARED)
_COLLECTION = {".".join([r.kind.lower(), *([r.group] if r.group else [])]): r for r in SHARED}  # _objects' kinds
SYSTEM_NAMESPACES = ("kube-system", "kube-node-lease")  # the control plane's own leases live there


def _objects(cluster: LocalCluster) -> set[tuple[str, str, str]]:
    """(kind.group, namespace, name) of every object of SHARED_KINDS outside the system namespaces."""
    items = json.loads(cluster.kubectl("get", ",".join(SHARED_KINDS), "-A", "-o", "json").stdout)["items"]
    return {(".".join([o["kind"].lower(), *o["apiVersion"].split("/")[:-1]]), o["metadata"].get("namespace", ""),
             o["metadata"]["name"]) for o in items if o["metadata"].get("namespace") not in SYSTEM_NAMESPACES}


@contextmanager
def leaves_nothing(cluster: LocalCluster) -> Iterator[None]:
    """Delete, at the end, every object of SHARED_KINDS made meanwhile (pods at once: no kubelet
    would ever finish a graceful delete)."""
    before = _objects(cluster)
    try:
        yield
    finally:
        by_scope: dict[tuple[str, str], list[str]] = {}
        for kind, namespace, name in _objects(cluster) - before:
            by_scope.setdefault((kind, namespace), []).append(name)
        had = {(kind, namespace) for kind, namespace, _ in before}
        for (kind, namespace), names in sorted(by_scope.items()):
            if (kind, namespace) not in had:  # every one there is the module's: empty the collection
                code, _ = cluster.request(_COLLECTION[kind].path(namespace), "DELETE",
                                          {"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
                if code == 200:
                    continue
            scope = ("-n", namespace) if namespace else ()
            cluster.kubectl("delete", kind, *names, *scope, "--grace-period=0", "--force", "--wait=false",
                            "--ignore-not-found")


def token_kubeconfig(kube: LocalCluster, account: str, namespace: str, name: str | None = None) -> Path:
    """The cluster's kubeconfig with a token of ServiceAccount ``namespace/account`` as its user."""
    token = kube.kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()
    config = yaml.safe_load(kube.kubeconfig.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    config["contexts"][0]["context"]["user"] = account
    path = kube.workdir / f"{name or account}.kubeconfig"
    path.write_text(json.dumps(config))
    return path


# -- a replica's writes and leadership, from its /metrics ----------------------------------------

def writes(svc: Service) -> float:
    return sum(select(svc.scrape(), "nws_reconciler_writes_total").values())


def settled(svc: Service, quiet: float = 1.5) -> float:
    """Wait until the replica has written nothing for ``quiet`` seconds; its write count."""
    last = [writes(svc), time.monotonic()]

    def still() -> bool:
        now = writes(svc)
        if now != last[0]:
            last[:] = [now, time.monotonic()]
        return time.monotonic() - last[1] >= quiet

    wait_for(still, timeout=30, interval=0.2)
    return last[0]


def is_leader(svc: Service) -> bool:
    return value(svc.scrape(), "nws_reconciler_leader") == 1


# -- in-process clients ----------------------------------------------------------------------------

async def until(predicate: Callable[[], object], timeout: float = 20) -> float:
    """Wait, on the event loop, until ``predicate()`` holds; how long that took."""
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


def serves_watch_list(kube: LocalCluster) -> bool:
    """Whether the API server accepts a WatchList. 1.33 refuses it by default (its WatchList feature
    gate is off), as does any server from 1.27 with the gate off (docs/compatibility.md)."""
    proc = kube.kubectl("get", "--raw", "/api/v1/namespaces?watch=1&sendInitialEvents=true&allowWatchBookmarks=true"
                        "&resourceVersionMatch=NotOlderThan&timeoutSeconds=1", check=False)
    return proc.returncode == 0


class RecordingApi(ApiClient):
    """Records what it is asked: ``gets`` every GET and watch (path, parameters), ``lists`` the
    parameters of every LIST page, ``watches`` those of every watch, ``answers`` each LIST's
    Accept and the Content-Type it was answered in, ``requests`` every other request (method,
    path, HTTP status).
    ``break_after``: the first watch breaks after that many lines (a connection lost in the
    middle of a WatchList's initial state)."""

    def __init__(self, *args: Any, break_after: int = 0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gets: list[tuple[str, dict[str, str]]] = []
        self.lists: list[dict[str, str]] = []
        self.watches: list[dict[str, str]] = []
        self.answers: list[tuple[str, str]] = []  # of LISTs: (Accept, Content-Type)
        self.requests: list[tuple[str, str, int]] = []
        self.break_after = break_after

    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = JSON,
                  timeout: float = 60) -> bytes:
        self.gets.append((path, dict(params or {})))
        return await super().get(path, params, accept, timeout)

    async def get_frames(self, path: str, params: dict[str, str] | None, accept: str,
                         framing: Callable[[str], Framing], on_frame: Callable[[bytes], None],
                         timeout: float = 60) -> None:
        self.gets.append((path, dict(params or {})))
        self.lists.append(dict(params or {}))

        def recorded(content_type: str) -> Framing:
            self.answers.append((accept, content_type))
            return framing(content_type)

        await super().get_frames(path, params, accept, recorded, on_frame, timeout)

    async def request(self, method: str, path: str, *args: Any, **kw: Any) -> bytes:
        try:
            body = await super().request(method, path, *args, **kw)
        except ApiError as err:
            self.requests.append((method, path, err.status))
            raise
        self.requests.append((method, path, 200))  # any 2xx
        return body

    async def watch(self, path: str, params: dict[str, str], accept: str, read_timeout: float,
                    on_frame: Callable[[bytes], None], *args: Any, **kw: Any) -> None:
        self.gets.append((path, dict(params)))
        self.watches.append(dict(params))
        lines = 0

        def counted(frame: bytes) -> None:
            nonlocal lines
            on_frame(frame)
            lines += 1
            if lines == self.break_after:
                self.break_after = 0
                raise Transient(0, "truncated", "the connection closed inside the watch's answer (injected)")

        await super().watch(path, params, accept, read_timeout, counted, *args, **kw)

    @property
    def streamed(self) -> int:
        """WatchLists asked for."""
        return sum(1 for w in self.watches if w.get("sendInitialEvents") == "true")
