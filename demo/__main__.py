"""The complete local demo: a control plane with KWOK node pools (cpu, gpu, tpu), the real JobSet
and LeaderWorkerSet controllers, example workloads, node-workload-summary (exporter + reconciler)
and Prometheus with the alert rules.

    python -m demo            # until Ctrl-C
    python -m demo --duration 60 --nodes-per-pool 2
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path

import yaml

from alerts.rules import Thresholds, rules_file
from localkube.build import BuildError, ensure_binaries
from localkube.cluster import ClusterError, LocalCluster, Options, set_parent_death_signal
from localkube.controllers import BUILD, JOBSET_PROJECT, LWS_PROJECT, Controller
from localkube.prometheus import Prometheus
from localkube.service import Service, wait_for

from .workloads import POOL_LABEL, create, jobset_chain, kwok_node, leaderworkerset_chain, workload_summarizer

ROOT = Path(__file__).resolve().parent.parent
NS = "demo"
CPU = {"cpu": "32", "memory": "128Gi", "pods": "110"}
POOLS = {"cpu": CPU, "gpu": CPU | {"nvidia.com/gpu": "8"}, "tpu": CPU | {"google.com/tpu": "4"}}


def say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def populate(cluster: LocalCluster, per_pool: int) -> None:
    for pool, allocatable in POOLS.items():
        for i in range(per_pool):
            kwok_node(cluster, f"{pool}-{i}", pool, allocatable)
    workload_summarizer(cluster, "batch", [("batch", "Job"), ("apps", "StatefulSet")])
    cluster.kubectl("create", "namespace", NS)
    cluster.kubectl("create", "deployment", "web", "--image=nginx", f"--replicas={2 * per_pool}", "-n", NS)
    create(cluster, f"/apis/batch/v1/namespaces/{NS}/jobs", {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "nightly-report"},
        "spec": {"parallelism": 2, "completions": 4, "template": {"spec": {
            "restartPolicy": "Never", "nodeSelector": {POOL_LABEL: "tpu"},
            "containers": [{"name": "main", "image": "example.com/report:v1"}]}}}})
    jobset_chain(cluster, NS, "train", jobs=2, parallelism=per_pool, node_selector={POOL_LABEL: "gpu"})
    leaderworkerset_chain(cluster, NS, "llm", workers=max(1, per_pool - 1))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes-per-pool", type=int, default=4, help="KWOK nodes in each of cpu, gpu, tpu")
    parser.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: at Ctrl-C)")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    set_parent_death_signal(signal.SIGTERM)  # if whatever started us dies, shut down as on Ctrl-C
    started = time.monotonic()
    cluster = LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True))
    service = prometheus = None
    try:
        say("building or reusing the control plane binaries and the JobSet and LeaderWorkerSet controllers ...")
        ensure_binaries()
        ensure_binaries(BUILD)
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK ...")
        cluster.start()
        cluster.install_crds(ROOT / "crds")
        say("starting the JobSet and LeaderWorkerSet controllers (their CRDs and webhooks) ...")
        for project in (JOBSET_PROJECT, LWS_PROJECT):
            Controller(cluster, project).start()  # stopped with the cluster
        cluster.kubectl("apply", "-f", str(ROOT / "examples"))
        say(f"creating {3 * args.nodes_per_pool} KWOK nodes in pools cpu, gpu, tpu and the example workloads ...")
        populate(cluster, args.nodes_per_pool)
        say("starting node-workload-summary (exporter + reconciler) ...")
        service = Service(cluster).start()
        say("starting Prometheus with the alert rules (node health alerts after 30 s here) ...")
        rules = cluster.workdir / "rules.yaml"
        fast = Thresholds(not_ready_for="30s", down_for="30s", unhealthy_for="30s", disrupting_for="30s")
        rules.write_text(yaml.safe_dump(rules_file(fast)))
        prometheus = Prometheus(cluster.workdir / "prometheus", [f"127.0.0.1:{service.port}"], [rules],
                                interval="5s").start()
        wait_for(lambda: len(cluster.kubectl("get", "workloads.ux", "-A", "--no-headers").stdout.splitlines()) >= 4,
                 timeout=90)
    except (ClusterError, BuildError, AssertionError) as err:
        say(f"error: {err}")
        for part in (prometheus, service):
            if part is not None:
                part.stop()
        cluster.stop()
        return 1

    kubectl = f"{cluster.kubectl_path} --kubeconfig {cluster.kubeconfig}"
    print(f"""
Ready in {time.monotonic() - started:.0f}s.

$ kubectl get nodesummaries
{cluster.kubectl("get", "nodesummaries").stdout}
$ kubectl get workloads.ux -A
{cluster.kubectl("get", "workloads.ux", "-A").stdout}
Look around:
  export KUBECONFIG={cluster.kubeconfig}
  alias kubectl={cluster.kubectl_path}
  kubectl get nodesummaries -o wide
  kubectl get workloads.ux -A -o wide          (`kubectl get workloads` where Kueue is not installed)
  kubectl get nodesummarizers,workloadsummarizers -o wide
  curl -s http://127.0.0.1:{service.port}/metrics | grep ^nws_nodegroup
  Prometheus: {prometheus.url}/alerts

Make the gpu pool NotReady (KWOK's chaos stage) and watch NodeGroupNotReady fire in about a minute:
  {kubectl} label nodes -l {POOL_LABEL}=gpu node-not-ready.stage.kwok.x-k8s.io=true
  curl -s {prometheus.url}/api/v1/alerts

Taint the tpu pool as Karpenter does before it removes nodes, and watch the workload columns change
(UNHEALTHY: pods on nodes that are not Ready; here Disrupting):
  {kubectl} taint nodes -l {POOL_LABEL}=tpu karpenter.sh/disrupted:NoSchedule
  {kubectl} get workloads.ux -A -o wide
  curl -s http://127.0.0.1:{service.port}/metrics | grep ^nws_workload_pods_by_node_state

Press Ctrl-C to stop everything.""", flush=True)
    try:
        while not stop.wait(1):
            if args.duration and time.monotonic() - started > args.duration:
                break
    finally:
        say("stopping ...")
        prometheus.stop()
        service.stop()
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
