"""Fill a control plane with nodes in groups and pods of Deployment -> ReplicaSet chains, and churn
their pods, concurrently through the API (the API server, not the client, is the bottleneck)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

from kubeindex.client.api import ApiClient, ApiError, Conflict, Transient, load_connection
from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import NODE_SUMMARIZERS, NODES, PODS, WORKLOAD_SUMMARIZERS

POOL_LABEL = "cloud.google.com/gke-nodepool"


def node_manifest(i: int, groups: int) -> dict:
    group = f"pool-{i % groups}"
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": f"node-{i:05d}", "labels": {
            POOL_LABEL: group, "kubernetes.io/hostname": f"node-{i:05d}", "topology.kubernetes.io/zone": "zone-a",
            "node.kubernetes.io/instance-type": "n2-standard-32", "kubernetes.io/os": "linux"}},
        "spec": {"podCIDR": f"10.{i // 256 % 256}.{i % 256}.0/24"},
    }


def node_status(i: int) -> dict:
    alloc = {"cpu": "31850m", "memory": "120Gi", "pods": "110", "ephemeral-storage": "95Gi"}
    if i % 10 == 0:
        alloc["nvidia.com/gpu"] = "8"
    return {"status": {"allocatable": alloc, "capacity": alloc, "conditions": [
        {"type": t, "status": "False", "reason": "Fine", "message": "ok"}
        for t in ("MemoryPressure", "DiskPressure", "PIDPressure")] + [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}],
        "nodeInfo": {"kubeletVersion": "v1.36.3", "osImage": "Container-Optimized OS", "architecture": "amd64"}}}


def pod_manifest(name: str, node: str, rs: dict, app: str, lean: bool = False) -> dict:
    """About 2 KB of JSON, roughly a real pod's spec; ``lean``: about 0.8 KB, still what the
    service reads (labels, the owner, the node, requests) and what a scheduler would have set."""
    if lean:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "bench", "labels": {"app": app, "pod-template-hash": "abc123"},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                              "name": rs["metadata"]["name"], "uid": rs["metadata"]["uid"],
                                              "controller": True, "blockOwnerDeletion": True}]},
            "spec": {"nodeName": node, "containers": [{
                "name": "main", "image": f"registry.example.com/{app}:v1.2.3",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}}}]},
        }
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "bench", "labels": {"app": app, "pod-template-hash": "abc123",
                                                                     "team": "ml", "tier": "backend"},
                     "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": "9090"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
                                          "uid": rs["metadata"]["uid"], "controller": True,
                                          "blockOwnerDeletion": True}]},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "main", "image": f"registry.example.com/{app}:v1.2.3",
                "args": ["--port=8080", "--log-level=info"],
                "env": [{"name": f"ENV_{k}", "value": f"value-{k}"} for k in range(5)],
                "ports": [{"containerPort": 8080, "name": "http"}],
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }


async def run_all(tasks: Sequence[Callable[[], Awaitable[object]]], concurrency: int, label: str) -> None:
    """Await every task's coroutine, ``concurrency`` at a time, with progress on stderr."""
    sem = asyncio.Semaphore(concurrency)
    done = 0
    started = time.monotonic()
    total = len(tasks)

    async def one(make: Callable[[], Awaitable[object]]) -> None:
        nonlocal done
        async with sem:
            await make()
        done += 1
        if done % 2000 == 0 or done == total:
            rate = done / (time.monotonic() - started)
            print(f"  {label}: {done}/{total} ({rate:.0f}/s)", file=sys.stderr, flush=True)

    await asyncio.gather(*(one(t) for t in tasks))


async def create(api: ApiClient, path: str, body: dict) -> dict:
    """POST ``body``, retried under load; the object created (or already there)."""
    for attempt in range(8):
        try:
            return json.loads(await api.request("POST", path, body, timeout=120))
        except Conflict:  # already there (a rerun)
            return json.loads(await api.request("GET", f"{path}/{body['metadata']['name']}"))
        except Transient as err:  # 429 / 5xx under load
            failure = err
            await asyncio.sleep(0.2 * 2**attempt)
    raise RuntimeError(f"POST {path} failed: {failure}")


async def populate(api: ApiClient, nodes: int, groups: int, pods: int, workloads: int,
                   concurrency: int = 64, grow_from: tuple[int, int, int] = (0, 0, 0), lean: bool = False) -> None:
    """``nodes``, ``pods``, ``workloads`` in all; ``grow_from``: the (nodes, pods, workloads)
    already there (a cluster grown size by size): the new pods go to the new nodes and workloads."""
    first_node, first_pod, first_workload = grow_from
    await create(api, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})
    await create(api, NODE_SUMMARIZERS.path(), {
        "apiVersion": API_VERSION, "kind": "NodeSummarizer", "metadata": {"name": "pool"},
        "spec": {"labelKey": POOL_LABEL}})
    await create(api, WORKLOAD_SUMMARIZERS.path(), {
        "apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": "apps"},
        "spec": {"workloadTypes": [{"group": "apps", "kind": "Deployment"}]}})

    async def make_node(i: int) -> None:
        await create(api, NODES.path(), node_manifest(i, groups))
        await api.request("PATCH", NODES.path(name=f"node-{i:05d}", subresource="status"), node_status(i),
                          content_type="application/merge-patch+json")

    await run_all([partial(make_node, i) for i in range(first_node, nodes)], concurrency, "nodes")
    replicasets: list[dict] = []

    async def make_workload(w: int) -> None:
        template = {"metadata": {"labels": {"app": f"app-{w}"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}
        d = await create(api, "/apis/apps/v1/namespaces/bench/deployments", {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": f"app-{w}"},
            "spec": {"selector": {"matchLabels": {"app": f"app-{w}"}}, "template": template}})
        rs = await create(api, "/apis/apps/v1/namespaces/bench/replicasets", {
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"app-{w}-abc123", "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "Deployment", "name": f"app-{w}", "uid": d["metadata"]["uid"],
                "controller": True}]},
            "spec": {"selector": {"matchLabels": {"app": f"app-{w}"}}, "template": template}})
        replicasets.append(rs)

    await run_all([partial(make_workload, w) for w in range(first_workload, workloads)], concurrency, "workloads")
    replicasets.sort(key=lambda r: r["metadata"]["name"])

    def make_pod(p: int) -> Awaitable[dict]:
        rs = replicasets[(p - first_pod) % len(replicasets)]
        app = rs["metadata"]["name"].rsplit("-", 1)[0]
        node = first_node + (p - first_pod) % (nodes - first_node)
        return create(api, PODS.path("bench"),
                     pod_manifest(f"{app}-{p:06d}", f"node-{node:05d}", rs, app, lean))

    await run_all([partial(make_pod, p) for p in range(first_pod, pods)], concurrency, "pods")


def populate_cluster(kubeconfig: Path, nodes: int, groups: int, pods: int, workloads: int,
                     concurrency: int = 64, grow_from: tuple[int, int, int] = (0, 0, 0), lean: bool = False) -> float:
    """populate() from synchronous code, over ``concurrency`` connections; its seconds."""
    async def run() -> None:
        async with ApiClient(load_connection(str(kubeconfig)), max_connections=concurrency) as api:
            await populate(api, nodes, groups, pods, workloads, concurrency, grow_from, lean)

    started = time.monotonic()
    asyncio.run(run())
    return time.monotonic() - started


async def churn(api: ApiClient, pods: list[str], seconds: float, concurrency: int = 64) -> int:
    """Flip pod phases (namespace bench) as fast as the API server takes them, for ``seconds``;
    returns the number of updates."""
    done = 0
    deadline = time.monotonic() + seconds
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        nonlocal done
        async with sem:
            if time.monotonic() > deadline:
                return
            phase = "Running" if (i // len(pods)) % 2 else "Pending"  # each visit flips the pod
            with contextlib.suppress(ApiError):  # counted when done: a refused write (429) is not churn
                await api.request("PATCH", PODS.path("bench", pods[i % len(pods)], "status"),
                                  {"status": {"phase": phase}}, content_type="application/merge-patch+json")
                done += 1

    i = 0
    while time.monotonic() < deadline:
        await asyncio.gather(*(one(i + k) for k in range(concurrency * 4)))
        i += concurrency * 4
    return done
