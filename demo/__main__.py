"""The complete local demo: a control plane with KWOK node pools (cpu, gpu, tpu), the real JobSet
and LeaderWorkerSet controllers, example workloads, Kueue's CRDs with a ClusterResourceClaim on the
gpu pool, node-workload-summary (exporter + reconciler, quota actuation on) and Prometheus with the
alert rules.

    make demo                              # until Ctrl-C (python -m demo, with the binaries built first)
    make demo DEMO_ARGS="--duration 60 --nodes-per-pool 2"
    make demo DEMO_ARGS=--quota-story      # also play the claim's story: the gpu pool loses nodes, the quota follows
    make demo DEMO_ARGS=--pods             # the service as the chart's pods on a real node (root; builds the image)
    make demo DEMO_ARGS=--karpenter        # instead: a drift rollout of a real Karpenter pool, and who blocks it

The logs (the service's, the control plane's, Prometheus') are written under the control plane's
working directory while it runs and copied to /tmp/nws-demo-<date>-<time>/ when it stops.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml

from alerts.rules import Thresholds, rules_file
from deploy.image import ImageError, find_engine
from deploy.image import build as build_image
from deploy.image import version as package_version
from localkube.build import HELM, NODE_COMPONENTS, BuildError, ensure_binaries
from localkube.cluster import ClusterError, LocalCluster, Options, set_parent_death_signal
from localkube.controllers import BUILD, JOBSET_PROJECT, LWS_PROJECT, Controller
from localkube.node import NODE_ADDRESS, POD_PLACEMENT, NodeError, RealNode
from localkube.prometheus import Prometheus
from localkube.service import Service, metrics_reader_token, wait_for

from . import claims, karpenter, kueue
from .workloads import POOL_LABEL, create, jobset_chain, kwok_node, leaderworkerset_chain, workload_summarizer

ROOT = Path(__file__).resolve().parent.parent
NS = "demo"
CPU = {"cpu": "32", "memory": "128Gi", "pods": "110"}
POOLS = {"cpu": CPU, "gpu": CPU | {claims.GPU: "8"}, "tpu": CPU | {"google.com/tpu": "4"}}


def say(msg: str) -> None:
    print(f"[demo] {msg}", file=sys.stderr, flush=True)


def expected_pods(per_pool: int) -> dict[str, int]:
    """Each example workload's pods once all are made (populate): the Job's 4 complete two at a time."""
    return {"web": 2 * per_pool, "nightly-report": 4, "train": 2 * per_pool, "llm": max(1, per_pool - 1) + 1}


def pod_counts(cluster: LocalCluster) -> dict[str, int]:
    """WorkloadSummary name -> its podCount, as the service wrote them."""
    rows = cluster.kubectl("get", "wls", "-n", NS, "--no-headers", "-o",
                           "custom-columns=NAME:.metadata.name,PODS:.status.podCount").stdout.split("\n")
    return {name: int(pods) for name, pods in (row.split() for row in rows if row.strip()) if pods.isdigit()}


def logs_dir() -> Path:
    """Where the logs are kept when the demo stops: the control plane's working directory goes then."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(tempfile.gettempdir()) / f"nws-demo-{stamp}"
    return path if not path.exists() else Path(tempfile.mkdtemp(prefix=f"nws-demo-{stamp}-"))


def keep_logs(cluster: LocalCluster, kept: Path) -> None:
    """Copy the logs out of the cluster's working directory (every process stopped), then remove it."""
    if cluster.workdir == Path():
        return
    kept.mkdir(parents=True, exist_ok=True)
    for log in (*(cluster.workdir / "logs").glob("*.log"), *(cluster.workdir / "prometheus").glob("*.log")):
        shutil.copy2(log, kept / log.name)
    shutil.rmtree(cluster.workdir, ignore_errors=True)
    say(f"logs kept in {kept}/ ({', '.join(sorted(p.name for p in kept.iterdir()))})")


def stop_all(parts: tuple[Service | Prometheus | Pods | None, ...], cluster: LocalCluster, kept: Path) -> None:
    for part in parts:
        if part is not None:
            part.stop()
    cluster.stop()
    keep_logs(cluster, kept)


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


class Pods:
    """The service as the chart's two pods on a real node: the image built from the Dockerfile,
    `helm install`, and Prometheus scraping the pods over HTTPS with a reader's token."""

    def __init__(self, cluster: LocalCluster, settle: float) -> None:
        self.cluster = cluster
        self.settle = settle
        self.node: RealNode | None = None
        self.token_file = cluster.workdir / "reader.token"

    def start(self) -> list[str]:
        """Returns the pods' metrics addresses."""
        tag = f"localhost/node-workload-summary:{package_version()}"
        engine = find_engine("podman")  # the node loads an OCI archive, which podman saves
        build_image(tag, None, engine)
        archive = self.cluster.workdir / "image.oci.tar"
        engine.run("save", "--format", "oci-archive", "--output", str(archive), tag)
        self.node = RealNode(self.cluster).start()
        self.node.load_image(archive)
        values = self.cluster.workdir / "values.yaml"
        values.write_text(json.dumps({"image": {"repository": tag.split(":")[0], "pullPolicy": "Never"},
                                      "quota": {"actuation": True}, "extraArgs": [f"--quota-settle={self.settle:g}"],
                                      **POD_PLACEMENT}))
        helm = ensure_binaries((HELM,))["helm"]
        subprocess.run([str(helm), "install", "node-workload-summary", str(ROOT / "charts/node-workload-summary"),
                        "--namespace", "node-workload-summary", "--create-namespace", "-f", str(values), "--wait",
                        "--timeout", "180s"], check=True, capture_output=True,
                       env={"KUBECONFIG": str(self.cluster.kubeconfig), "HOME": str(self.cluster.workdir),
                            "PATH": "/usr/bin:/bin"})
        self.token_file.write_text(metrics_reader_token(self.cluster))
        ips = self.cluster.kubectl("get", "pods", "-n", "node-workload-summary", "-o",
                                   "jsonpath={.items[*].status.podIP}").stdout.split()
        return [f"{ip}:8080" for ip in ips]

    def stop(self) -> None:
        if self.node is not None:
            self.node.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes-per-pool", type=int, default=4, help="KWOK nodes in each of cpu, gpu, tpu")
    parser.add_argument("--duration", type=float, default=0, help="stop after this many seconds (0: at Ctrl-C)")
    parser.add_argument("--pods", action="store_true",
                        help="run the service as the chart's pods on a real node (containerd, the kubelet; needs root "
                             "and podman: make node-tools), from the image built from the Dockerfile")
    parser.add_argument("--quota-settle", type=float, default=20,
                        help="the service's --quota-settle: seconds a capacity change lasts before the claims "
                             "follow it")
    parser.add_argument("--alerts-after", type=int, default=30,
                        help="the `for` of the node-health, workload and claim alerts, in seconds (the shipped "
                             "rules wait minutes)")
    parser.add_argument("--karpenter", action="store_true",
                        help="instead of the node pools above: the real Karpenter and a drift rollout of its pool, "
                             "with a pod and a PodDisruptionBudget blocking it (demo/karpenter.py; docs/karpenter.md)")
    parser.add_argument("--quota-story", action="store_true",
                        help="once ready, play the ClusterResourceClaim story (the gpu pool loses nodes, the claim "
                             "shows the shortfall, the quota follows) and print each command with its output")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    set_parent_death_signal(signal.SIGTERM)  # if whatever started us dies, shut down as on Ctrl-C
    if args.karpenter:
        return karpenter.run(args.duration, stop)
    started = time.monotonic()
    # The working directory stays when the processes stop: keep_logs copies the logs out, then removes it.
    cluster = LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True, keep_workdir=True,
                                   node_address=NODE_ADDRESS if args.pods else None))
    kept = logs_dir()
    service: Service | None = None
    prometheus: Prometheus | None = None
    pods: Pods | None = None
    try:
        say("building or reusing the control plane binaries and the JobSet and LeaderWorkerSet controllers ...")
        ensure_binaries()
        # Kueue's CRDs: the newest Kueue's, as v0.20 and later serve them (v1beta2 only); copied out of its module
        ensure_binaries((*BUILD, kueue.select(kueue.NEWEST).crds))
        if args.pods:
            ensure_binaries((*NODE_COMPONENTS, HELM))
        say("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and KWOK ...")
        cluster.start()
        cluster.install_crds(ROOT / "crds")
        say("starting the JobSet and LeaderWorkerSet controllers (their CRDs and webhooks) ...")
        for project in (JOBSET_PROJECT, LWS_PROJECT):
            Controller(cluster, project).start()  # stopped with the cluster
        # The example summarizers; the demo makes its own claim (claims.setup), on its own flavor.
        cluster.kubectl("apply", "-f", str(ROOT / "examples/nodesummarizer.yaml"),
                        "-f", str(ROOT / "examples/workloadsummarizer.yaml"))
        say(f"creating {3 * args.nodes_per_pool} KWOK nodes in pools cpu, gpu, tpu and the example workloads ...")
        populate(cluster, args.nodes_per_pool)
        say(f"installing Kueue's CRDs, ResourceFlavor {claims.FLAVOR}, ClusterQueues {' and '.join(claims.QUEUES)} "
            f"and ClusterResourceClaim {claims.CLAIM} ...")
        claims.setup(cluster, args.nodes_per_pool)
        rules = cluster.workdir / "rules.yaml"
        after = f"{args.alerts_after}s"
        fast = Thresholds(not_ready_for=after, down_for=after, unhealthy_for=after, disrupting_for=after,
                          claim_over_allocated_for=after)
        rules.write_text(yaml.safe_dump(rules_file(fast)))
        if args.pods:
            say("building the image, starting a real node and installing the chart (two pods) ...")
            pods = Pods(cluster, args.quota_settle)
            targets = pods.start()
            metrics = (f"curl -sk -H \"Authorization: Bearer $(cat {pods.token_file})\" "
                       f"https://{targets[0]}/metrics")
            say(f"starting Prometheus with the alert rules (node health alerts after {after} here) ...")
            prometheus = Prometheus(cluster.workdir / "prometheus", targets, [rules], interval="5s", scheme="https",
                                    bearer_token_file=pods.token_file, insecure_skip_verify=True).start()
        else:
            say(f"starting node-workload-summary (exporter + reconciler; --quota-actuation=on "
                f"--quota-settle={args.quota_settle:g}) ...")
            service = Service(cluster, ("--quota-actuation=on", f"--quota-settle={args.quota_settle:g}")).start()
            metrics = f"curl -s http://127.0.0.1:{service.port}/metrics"
            say(f"starting Prometheus with the alert rules (node health alerts after {after} here) ...")
            prometheus = Prometheus(cluster.workdir / "prometheus", [f"127.0.0.1:{service.port}"], [rules],
                                    interval="5s").start()
        # Ready: every example workload has all its pods in its WorkloadSummary, and the claim's
        # first quota is in the queues.
        wanted = expected_pods(args.nodes_per_pool)
        wait_for(lambda: pod_counts(cluster) == wanted, timeout=120)
        wait_for(lambda: claims.applied(cluster), timeout=60)
    except (ClusterError, BuildError, AssertionError, NodeError, ImageError, subprocess.CalledProcessError) as err:
        say(f"error: {err}")
        stop_all((prometheus, service, pods), cluster, kept)
        return 1

    kubectl = f"{cluster.kubectl_path} --kubeconfig {cluster.kubeconfig}"
    if service is not None and service.log is not None:
        log = f"  tail -n 20 {service.log}"
    else:  # the chart's pods
        log = f"  {kubectl} logs -n node-workload-summary deploy/node-workload-summary --tail 20"
    print(f"""
Ready in {time.monotonic() - started:.0f}s.

$ kubectl get nodesummaries
{cluster.kubectl("get", "nodesummaries").stdout}
$ kubectl get wls -A
{cluster.kubectl("get", "wls", "-A").stdout}
Look around, in a shell of your own (Prometheus: {prometheus.url}/alerts):
  export KUBECONFIG={cluster.kubeconfig} PATH={cluster.kubectl_path.parent}:$PATH
  kubectl get nodesummaries -o wide
  kubectl get wls -A -o wide      # with or without Kueue; `kubectl get workloads` is Kueue's here
  kubectl get nodesummarizers,workloadsummarizers -o wide
  {metrics} | grep ^nws_nodegroup

The service's log, and the control plane's beside it (kept in {kept}/ when the demo stops):
{log}

Make the gpu pool NotReady (KWOK's chaos stage) and watch NodeGroupNotReady fire in about a minute:
  {kubectl} label nodes -l {POOL_LABEL}=gpu node-not-ready.stage.kwok.x-k8s.io=true
  curl -s {prometheus.url}/api/v1/alerts

Taint the cpu pool as Karpenter does before it removes nodes, and watch the workload columns change
(UNHEALTHY: pods on nodes that are not Ready, here Disrupting; the Jobs' finished pods hold no node):
  {kubectl} taint nodes -l {POOL_LABEL}=cpu karpenter.sh/disrupted:NoSchedule
  {kubectl} get wls -A -o wide
  {metrics} | grep ^nws_workload_pods_by_node_state

{claims.instructions(kubectl, args.nodes_per_pool, args.quota_settle, fast.claim_over_allocated_for)}""",
          flush=True)
    try:
        story = claims.Story(cluster, args.nodes_per_pool, args.quota_settle, stop, lambda t: print(t, flush=True))
        if args.quota_story and not story.play() and not stop.is_set():
            say("error: the ClusterResourceClaim story did not play to its end")
            return 1
        print("\nPress Ctrl-C to stop everything.", flush=True)
        while not stop.wait(1):
            if args.duration and time.monotonic() - started > args.duration:
                break
    except ClusterError as err:
        say(f"error: {err}")
        return 1
    finally:
        say("stopping ...")
        stop_all((prometheus, service, pods), cluster, kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
