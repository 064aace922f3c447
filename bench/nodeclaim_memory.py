"""What Karpenter's NodeClaims cost the service: memory per NodeClaim and time per NodeClaim event,
through the live watch path (a watch line's bytes -> msgspec decode into the NodeClaim projection ->
index), with NodeClaims shaped as Karpenter v1.14 writes them (labels, annotations, requirements,
ten conditions, managedFields: about 5 KB of JSON each), each joined to a Node of its pool with
``--pods-per-node`` pods of a Deployment on it.

- **Memory**: tracemalloc's bytes per NodeClaim (the reflector's store and the index's entry), and
  the process's RSS growth per NodeClaim between the two sizes (after a full collection).
- **Events**: microseconds per NodeClaim update at each size, of two kinds: a condition that moves
  nothing a summary counts (Ready's lastTransitionTime: the most common), and Drifted set and
  cleared (the node's rollout state and its pods' risk move: O(pods on that node)). The same cost
  at both sizes is what O(1) per event looks like.

    python -m bench.nodeclaim_memory --nodeclaims 2000 20000
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import subprocess
import sys
import time
import tracemalloc
import uuid
from pathlib import Path
from typing import Any

from kubeindex.model.objects import NodeClaim
from kubeindex.watch.reflector import Handler, Reflector

from .common import add_out, sayer, status_kb, write_results
from .index_events import pod_json, watch_path
from .populate import node_manifest, node_status

say = sayer("nodeclaim-memory")
KB = 1024
POOLS = 8
NODEPOOL = "karpenter.sh/nodepool"


def nodeclaim_json(i: int, rv: int, drifted: bool = False) -> dict[str, Any]:
    """A NodeClaim of node node-<i> as Karpenter v1.14's KWOK provider writes one, Initialized and Ready."""
    name, pool, at = f"pool-{i % POOLS}-{i:06x}", f"pool-{i % POOLS}", "2026-11-22T10:00:00Z"
    conditions = [{"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": at,
                   "observedGeneration": 1}
                  for t in ("Launched", "Registered", "Initialized", "Ready", "ConsistentStateFound",
                            "Consolidatable")]
    conditions.append({"type": "Drifted", "status": "True" if drifted else "False",
                       "reason": "NodePoolDrifted" if drifted else "NotDrifted", "message": "",
                       "lastTransitionTime": f"2026-11-22T10:{rv % 60:02d}:00Z", "observedGeneration": 1})
    labels = {NODEPOOL: pool, "node.kubernetes.io/instance-type": "c-8x-amd64-linux",
              "karpenter.sh/capacity-type": "on-demand", "topology.kubernetes.io/zone": "test-zone-b",
              "kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "karpenter.kwok.sh/instance-cpu": "8",
              "karpenter.kwok.sh/instance-family": "c", "karpenter.kwok.sh/instance-memory": "16384",
              "karpenter.kwok.sh/instance-size": "8x", "kwok.x-k8s.io/node": "fake"}
    return {
        "apiVersion": "karpenter.sh/v1", "kind": "NodeClaim",
        "metadata": {"name": name, "uid": str(uuid.UUID(int=i, version=4)), "resourceVersion": str(rv),
                     "generation": 1, "creationTimestamp": at, "labels": labels,
                     "annotations": {"karpenter.sh/nodepool-hash": "9223372036854775807",
                                     "karpenter.sh/nodepool-hash-version": "v3",
                                     "karpenter.kwok.sh/kwoknodeclass-hash": "1234567890",
                                     "karpenter.kwok.sh/kwoknodeclass-hash-version": "v1"},
                     "finalizers": ["karpenter.sh/termination"],
                     "ownerReferences": [{"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "name": pool,
                                          "uid": str(uuid.UUID(int=i % POOLS + 1, version=4)),
                                          "blockOwnerDeletion": True}],
                     "managedFields": [{"manager": "karpenter", "operation": "Update", "apiVersion": "karpenter.sh/v1",
                                        "time": at, "fieldsType": "FieldsV1",
                                        "fieldsV1": {"f:status": {f"f:{k}": {} for k in range(20)}}}]},
        "spec": {"nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": "default"},
                 "requirements": [{"key": k, "operator": "In", "values": v} for k, v in (
                     (NODEPOOL, [pool]), ("kubernetes.io/arch", ["amd64"]), ("kubernetes.io/os", ["linux"]),
                     ("karpenter.sh/capacity-type", ["on-demand"]),
                     ("node.kubernetes.io/instance-type", ["c-8x-amd64-linux", "c-16x-amd64-linux"]))],
                 "resources": {"requests": {"cpu": "4", "memory": "4Gi", "pods": "4"}},
                 "expireAfter": "720h", "terminationGracePeriod": "1h"},
        "status": {"nodeName": f"node-{i:05d}", "providerID": f"kwok://node-{i:05d}", "imageID": "",
                   "capacity": {"cpu": "8", "memory": "16Gi", "pods": "110", "ephemeral-storage": "20Gi"},
                   "allocatable": {"cpu": "7900m", "memory": "15Gi", "pods": "110", "ephemeral-storage": "20Gi"},
                   "conditions": conditions, "lastPodEventTime": at},
    }


class Cluster:
    """The index with its node, pod and NodeClaim reflectors; nodes, their pods and NodeClaims fed by hand."""

    def __init__(self, pods_per_node: int) -> None:
        self.index, self.pods, self.nodes = watch_path()
        self.index.set_node_summarizer("karpenter", NODEPOOL)
        self.claims = Reflector(self.pods.api, "nodeclaims.karpenter.sh", "", NodeClaim,
                                Handler(self.index.upsert_nodeclaim, self.index.delete_nodeclaim))
        self.pods_per_node = pods_per_node
        self.count = 0
        self.rv = 10
        self.index.upsert_owner(("apps", "Deployment"), "bench", "web", "d1", None)
        self.index.upsert_owner(("apps", "ReplicaSet"), "bench", "web-1", "rs1", ("apps/v1", "Deployment", "d1"))
        self.rs = {"metadata": {"name": "web-1", "uid": "rs1"}}

    def _event(self, reflector: Reflector, kind: str, obj: dict) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        reflector._handle(json.dumps({"type": kind, "object": obj}).encode())

    def nodes_to(self, size: int) -> None:
        """Nodes node-<i> of pool-<i % POOLS> with their pods, no NodeClaim yet."""
        for i in range(self.count, size):
            node = node_manifest(i, 1) | node_status(i)
            node["metadata"]["labels"][NODEPOOL] = f"pool-{i % POOLS}"
            self._event(self.nodes, "ADDED", node)
            for p in range(self.pods_per_node):
                pod = pod_json(f"web-1-{i:05d}{p:02d}", str(uuid.uuid4()), f"node-{i:05d}", self.rs, "Running", 1)
                pod["metadata"]["namespace"] = "bench"
                self._event(self.pods, "ADDED", pod)

    def claims_to(self, size: int) -> None:
        for i in range(self.count, size):
            self._event(self.claims, "ADDED", nodeclaim_json(i, self.rv))
        self.count = size

    def grow(self, size: int) -> None:
        self.nodes_to(size)
        self.claims_to(size)

    def events_per_second(self, n: int, drift: bool) -> float:
        """Microseconds per NodeClaim MODIFIED event, over ``n`` events round the NodeClaims; lines made first."""
        lines = []
        for k in range(n):
            i = k % self.count
            obj = nodeclaim_json(i, self.rv + k + 1, drifted=drift and (k // self.count) % 2 == 0)
            lines.append(json.dumps({"type": "MODIFIED", "object": obj}).encode())
        self.rv += n + 1
        started = time.perf_counter()
        for line in lines:
            self.claims._handle(line)
        return (time.perf_counter() - started) * 1e6 / n


def rss_kb() -> int:
    gc.collect()
    return status_kb(os.getpid(), "VmRSS")


def traced(nodeclaims: int) -> dict:
    """Bytes per NodeClaim (store and index), the nodes and pods fed before tracing starts."""
    cluster = Cluster(pods_per_node=0)
    cluster.nodes_to(nodeclaims)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    cluster.claims_to(nodeclaims)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    sites = [{"site": f"{Path(s.traceback[0].filename).name}:{s.traceback[0].lineno}",
              "bytes_per_nodeclaim": round(s.size_diff / nodeclaims)} for s in stats[:6] if s.size_diff > 0]
    return {"nodeclaims": nodeclaims, "bytes_per_nodeclaim": round(total / nodeclaims), "sites": sites}


def measure(sizes: list[int], pods_per_node: int, events: int) -> dict:
    cluster = Cluster(pods_per_node)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        cluster.nodes_to(size)
        base = rss_kb()
        cluster.claims_to(size)
        grown = rss_kb() - base
        row = {"nodeclaims": size, "pods": size * pods_per_node,
               "rss_bytes_per_nodeclaim": round(grown * KB / (size - (rows[-1]["nodeclaims"] if rows else 0))),
               "us_per_event_quiet": round(cluster.events_per_second(events, drift=False), 1),
               "us_per_event_drift": round(cluster.events_per_second(events, drift=True), 1)}
        rows.append(row)
        say(f"{size:,} NodeClaims: {row}")
    return {"pods_per_node": pods_per_node, "rows": rows}


def markdown(result: dict) -> str:
    t = result["traced"]
    lines = [f"tracemalloc, {t['nodeclaims']:,} NodeClaims: {t['bytes_per_nodeclaim']} bytes per NodeClaim "
             "(the reflector's store and the index's entry).", "",
             "| allocated at | bytes per NodeClaim |", "|---|---|"]
    lines += [f"| `{s['site']}` | {s['bytes_per_nodeclaim']} |" for s in t["sites"]]
    lines += ["", f"{result['pods_per_node']} pods per node.", "",
              "| NodeClaims | pods | RSS growth per NodeClaim added | µs per event, nothing counted moves | "
              "µs per event, Drifted set or cleared |", "|---|---|---|---|---|"]
    lines += [f"| {r['nodeclaims']:,} | {r['pods']:,} | {r['rss_bytes_per_nodeclaim']} B | {r['us_per_event_quiet']} | "
              f"{r['us_per_event_drift']} |" for r in result["rows"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.nodeclaim_memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodeclaims", type=int, nargs="+", default=[2000, 20000],
                        help="sizes, ascending (default: 2000 20000)")
    parser.add_argument("--pods-per-node", type=int, default=10, help="pods of a Deployment on each node")
    parser.add_argument("--events", type=int, default=20000, help="NodeClaim updates timed at each size, per kind")
    parser.add_argument("--traced-only", type=int, metavar="N", help=argparse.SUPPRESS)
    add_out(parser, "nodeclaim-memory.json", beside=(".md",))
    args = parser.parse_args(argv)
    if args.traced_only:
        print(json.dumps(traced(args.traced_only)))
        return 0
    if any(a >= b for a, b in itertools.pairwise(args.nodeclaims)):
        parser.error("--nodeclaims: each size larger than the one before")
    result = measure(args.nodeclaims, args.pods_per_node, args.events)
    say(f"tracing {args.nodeclaims[0]:,} NodeClaims in a second process ...")
    proc = subprocess.run([sys.executable, "-m", "bench.nodeclaim_memory", "--traced-only", str(args.nodeclaims[0])],
                          capture_output=True, text=True, check=True)
    result["traced"] = json.loads(proc.stdout)
    write_results(args.out, result, markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
