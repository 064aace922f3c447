"""Pod events per second that the watch path sustains on one core: a watch line's bytes ->
msgspec decode -> index update, the exact code of a live watch (no network).

    python -m bench.index_events --pods 30000 --nodes 1000 --events 200000
    python -m bench.index_events --gang-size 8    # every pod in a KubeNexus-labelled gang of 8
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from kubernetes import client

from kubeindex.client.api import ApiClient, Connection
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import GangPodLabels, Node, Pod, WorkloadGangs, WorkloadType
from kubeindex.watch.reflector import Handler, Reflector

from .common import add_out
from .populate import node_manifest, node_status, pod_manifest

PHASES = ["Pending", "Running", "Running", "Running", "Succeeded"]
GANG, GANG_MIN = "pod-group.scheduling.kubenexus.io/name", "pod-group.scheduling.kubenexus.io/min-available"


def pod_json(name: str, uid: str, node: str, rs: dict, phase: str, rv: int) -> dict:
    """A watch-sized pod: spec, a kubelet-like status and managedFields (about 5 KB)."""
    pod = pod_manifest(name, node, rs, name.rsplit("-", 1)[0])
    pod["metadata"] |= {"uid": uid, "resourceVersion": str(rv), "creationTimestamp": "2026-11-22T10:00:00Z",
                        "managedFields": [{"manager": m, "operation": "Update", "apiVersion": "v1",
                                           "time": "2026-11-22T10:00:00Z", "fieldsType": "FieldsV1",
                                           "fieldsV1": {"f:status": {f"f:{k}": {} for k in range(25)}}}
                                          for m in ("kube-controller-manager", "kubelet")]}
    pod["status"] = {
        "phase": phase, "podIP": "10.1.2.3", "hostIP": "10.0.0.1", "qosClass": "Burstable",
        "startTime": "2026-11-22T10:00:01Z",
        "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2026-11-22T10:00:02Z"}
                       for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")],
        "containerStatuses": [{"name": "main", "ready": True, "restartCount": 0, "image": "x:v1",
                               "imageID": "sha256:" + "0" * 64, "containerID": "containerd://" + "1" * 64,
                               "started": True, "state": {"running": {"startedAt": "2026-11-22T10:00:03Z"}}}],
    }
    return pod


def watch_path(gangs: bool = False) -> tuple[ClusterIndex, Reflector, Reflector]:
    """An index (node groups by pool and zone, Deployments summarized, pod-label gangs if ``gangs``)
    and its pod and node reflectors, fed lines by hand."""
    index = ClusterIndex()
    index.set_node_summarizer("pool", "cloud.google.com/gke-nodepool")
    index.set_node_summarizer("zone", "topology.kubernetes.io/zone")
    index.set_workload_summarizer("apps", [WorkloadType(kind="Deployment", group="apps")],
                                  gangs=WorkloadGangs(podLabels=(GangPodLabels(GANG, GANG_MIN),)) if gangs else None)
    # The reflectors' event handling needs no connection: only _handle(line) is exercised, and the
    # client is never asked anything (it opens a connection on its first request).
    api = ApiClient(Connection("https://127.0.0.1:1", False, client.Configuration()))
    pods = Reflector(api, "pods", "", Pod, Handler(index.upsert_pod, index.delete_pod))
    nodes = Reflector(api, "nodes", "", Node, Handler(index.upsert_node, index.delete_node))
    return index, pods, nodes


def build(args: argparse.Namespace) -> tuple[ClusterIndex, Reflector, list[bytes]]:
    """An index with nodes, Deployments and ReplicaSets, and the pod watch lines to replay."""
    gang_size = getattr(args, "gang_size", 0)  # (other benches build their own arguments)
    index, pods, nodes = watch_path(gang_size > 0)
    for i in range(args.nodes):
        node = node_manifest(i, 10) | node_status(i)
        node["metadata"]["resourceVersion"] = "1"
        nodes._handle(json.dumps({"type": "ADDED", "object": node}).encode())
    replicasets = []
    for w in range(args.workloads):
        index.upsert_owner(("apps", "Deployment"), "bench", f"app-{w}", f"d-{w}", None)
        index.upsert_owner(("apps", "ReplicaSet"), "bench", f"app-{w}-abc123", f"rs-{w}",
                           ("apps/v1", "Deployment", f"d-{w}"))
        replicasets.append({"metadata": {"name": f"app-{w}-abc123", "uid": f"rs-{w}"}})
    rnd = random.Random(1)
    lines = []
    for e in range(args.events):
        p = rnd.randrange(args.pods)
        kind = "ADDED" if e < args.pods else "MODIFIED"
        p = e if e < args.pods else p
        pod = pod_json(f"app-{p % args.workloads}-{p:06d}", f"pod-{p}", f"node-{p % args.nodes:05d}",
                       replicasets[p % args.workloads], rnd.choice(PHASES), e + 10)
        if gang_size:  # the pods of a workload in gangs of gang_size (p % workloads is the workload)
            pod["metadata"]["labels"] |= {GANG: f"g-{p // (args.workloads * gang_size)}",
                                          GANG_MIN: str(gang_size)}
        lines.append(json.dumps({"type": kind, "object": pod}).encode())
    return index, pods, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.index_events", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=30000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--workloads", type=int, default=300)
    parser.add_argument("--events", type=int, default=150000)
    parser.add_argument("--gang-size", type=int, default=0,
                        help="put every pod in a pod-label gang of this many pods of its workload (0: no gangs)")
    add_out(parser, "index-events.json")
    args = parser.parse_args(argv)
    index, pods, lines = build(args)
    size = sum(map(len, lines)) / len(lines)
    started = time.process_time()
    for line in lines:
        pods._handle(line)
    cpu = time.process_time() - started
    result = {"events": len(lines), "avg_event_bytes": round(size), "cpu_seconds": round(cpu, 3),
              "events_per_second": round(len(lines) / cpu), "pods": len(index.pods), "nodes": len(index.nodes),
              "workloads": len(index.workloads),
              "gangs": sum(len(w.gangs) for w in index.workloads.values())}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for key, val in result.items():
        print(f"{key:>18}: {val}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
