"""The neighbours soak's replicas as users run them: the chart's two pods, on a real node.

The image is built as `make image` builds it, loaded into a real node's containerd (containerd,
runc, a CNI bridge, the kubelet, kube-proxy: localkube.node) and installed with the chart, with
the soak's flags in ``extraArgs``. The pods reach the API server at the `kubernetes` Service's
address, through kube-proxy's rules, as in any cluster; the soak scrapes each pod at its address
over HTTPS with a token the shipped metrics-reader ClusterRole allows.

kube-controller-manager and kube-scheduler run until the chart's pods are Ready, then stop: the
soak's workloads are Deployments and ReplicaSets it writes by hand (their pods bound to nodes
without a kubelet), which a ReplicaSet controller would scale away. Nothing the pods need after
their start comes from those two: the kubelet restarts a killed container by itself.

The faults, as a pod meets them:
- **the leader crashes**: its container's process gets SIGKILL from the host (the PID containerd
  reports for the container's task, the process the pod's PID namespace has as its init); the
  kubelet restarts it in place, with the same identity (the pod's name). Until its container is
  Ready again its metrics are not checked; the summaries are, all along;
- **the API server restarts**: as for processes; the pods' connections go to the Service address;
- **a stall**: in the leader's network namespace, iptables drops every packet of the connections
  it has open to the API server (found with ss), both ways, so they go silent as a dead middlebox
  leaves them, while new connections (new source ports) pass. The rules go once its read timeout
  has passed (those connections are closed by then).
A container restart the soak did not cause is a death.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from functools import partial
from pathlib import Path

from demo.kueue import install_kueue
from localkube.build import HELM, ensure_binaries
from localkube.cluster import LocalCluster, Options
from localkube.node import NODE_ADDRESS, POD_PLACEMENT, RealNode
from localkube.service import Samples, metrics_reader_token, parse, wait_for
from tests.realnode import IMAGE, TAG, build_image, pods, ready, run_helm

from .common import ROOT
from .neighbours_replicas import Replica, service_args

NS = "nws"
RELEASE = "nws"
API_PORT = 443  # the `kubernetes` Service's port: what the pods' connections to the API server name


def cluster_options() -> Options:
    return Options(node_address=NODE_ADDRESS, controller_manager=True, scheduler=True)


def say(msg: str) -> None:
    print(f"[neighbours] {msg}", flush=True)


def _unverified() -> ssl.SSLContext:
    """Each pod serves a certificate it made at its start (the chart's default): the scraper takes it
    as Prometheus does with insecure_skip_verify; the token is what is checked."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class Pods:
    where = "pods"

    def __init__(self, cluster: LocalCluster, args: argparse.Namespace) -> None:
        self.cluster, self.args = cluster, args
        self.replicas: list[Replica] = []
        self.node: RealNode | None = None
        self.tmp = Path(tempfile.mkdtemp(prefix="neighbours-pods-"))
        self.token = ""
        self.kills: dict[str, int] = {}  # pod -> container restarts the soak caused
        self.seen_restarts: dict[str, int] = {}  # pod -> restarts already accounted for
        self.drops: list[tuple[float, str, list[str]]] = []  # (until, pod, rule) to delete

    # -- start --

    def prepare(self) -> None:
        """The image, the node, the chart; then the controllers stop (see the module's docstring)."""
        say("building the image as `make image` does (minutes on a first run) ...")
        archive = build_image(self.tmp)
        say("starting a real node: containerd, the kubelet, kube-proxy ...")
        self.node = RealNode(self.cluster).start()
        self.node.load_image(archive)
        values = self.tmp / "values.yaml"
        extra = [a for a in service_args(self.args) if not a.startswith("--quota-actuation")]
        values.write_text(json.dumps({
            "image": {"repository": IMAGE, "tag": TAG, "pullPolicy": "Never"}, **POD_PLACEMENT,
            "quota": {"actuation": True},
            "extraArgs": [*extra, f"--initial-list={self.args.initial_list}"]}))
        install_kueue(self.cluster)  # the pods find Kueue's kinds served from their start
        say("helm install: the chart's two pods on the real node ...")
        run_helm(self.cluster, self.helm(), "install", RELEASE, str(ROOT / "charts/node-workload-summary"),
                 "--namespace", NS, "--create-namespace", "-f", str(values), "--wait", "--timeout", "300s")
        for name in ("kube-controller-manager", "kube-scheduler"):
            self.cluster.processes[name].stop()
        self.token = metrics_reader_token(self.cluster)

    def helm(self) -> list[str]:
        """The helm command as the tests run it (tests/realnode.run_helm), with home dirs of its own."""
        homes = [f"{var}={self.tmp / var.lower()}" for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME")]
        return ["env", *homes, str(ensure_binaries((HELM,))["helm"])]

    def pods(self) -> dict[str, dict]:
        return {p["metadata"]["name"]: p for p in pods(self.cluster, NS)}

    def start(self) -> None:
        wait_for(lambda: len(self.pods()) == 2 and all(map(ready, self.pods().values())), timeout=120)
        for name, pod in sorted(self.pods().items()):
            log = self.node.dir / "var/log/pods" if self.node else self.tmp
            self.replicas.append(Replica(name, self._scraper(pod["status"]["podIP"]), log, self.args.initial_list,
                                         stallable=True, ready=partial(self._pod_ready, name)))
            self.kills[name] = 0
            self.seen_restarts[name] = self._restarts(pod)

    def _pod_ready(self, name: str) -> bool:
        pod = self.pods().get(name)
        return pod is not None and ready(pod)

    @staticmethod
    def _restarts(pod: dict) -> int:
        return sum(s.get("restartCount", 0) for s in pod.get("status", {}).get("containerStatuses", []))

    def _scraper(self, ip: str) -> Callable[[], Samples]:
        def scrape() -> Samples:
            request = urllib.request.Request(f"https://{ip}:8080/metrics",
                                             headers={"Authorization": f"Bearer {self.token}"})
            with urllib.request.urlopen(request, timeout=10, context=_unverified()) as resp:
                return parse(resp.read().decode())
        return scrape

    # -- faults --

    def _pid(self, pod: dict) -> int:
        """The host PID of the pod's container's task (its init in the pod's PID namespace)."""
        container = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        assert self.node is not None
        for line in self.node.ctr("tasks", "ls").stdout.splitlines()[1:]:
            task, pid, status = line.split()
            if task == container and status == "RUNNING":
                return int(pid)
        raise RuntimeError(f"no running task for {pod['metadata']['name']}'s container {container}")

    def kill(self, leader: Replica) -> str:
        pid = self._pid(self.pods()[leader.identity])
        os.kill(pid, signal.SIGKILL)
        self.kills[leader.identity] += 1
        return f"killed the container of leader {leader.identity} (SIGKILL to PID {pid}); the kubelet restarts it"

    def deaths(self) -> list[tuple[Replica, dict]]:
        out = []
        pods = self.pods()
        for r in self.replicas:
            pod = pods.get(r.identity)
            if pod is None:
                if not r.gone:
                    r.gone = "died"
                    out.append((r, {"code": "pod gone"}))
                continue
            restarts = self._restarts(pod)
            unexplained = restarts - self.seen_restarts[r.identity] - self.kills[r.identity]
            if unexplained > 0:
                state = pod["status"]["containerStatuses"][0].get("lastState", {}).get("terminated", {})
                out.append((r, {"code": f"restarted: {state.get('reason')} ({state.get('exitCode')})"}))
                self.seen_restarts[r.identity] += unexplained
        return out

    def stall(self) -> list[Replica]:
        """The leader's open connections to the API server dropped in its network namespace."""
        leader = next((r for r in self.replicas if self._leads(r)), None)
        if leader is None:
            return []
        pid = self._pid(self.pods()[leader.identity])
        until = time.monotonic() + self.args.read_timeout + 5
        listing = subprocess.run(["nsenter", "-t", str(pid), "-n", "ss", "-Htn", "state", "established",
                                  f"( dport = :{API_PORT} )"], check=True, capture_output=True, text=True).stdout
        ports = [line.split()[2].rsplit(":", 1)[1] for line in listing.splitlines() if line.strip()]
        for port in ports:
            for rule in (["OUTPUT", "-p", "tcp", "--sport", port, "-j", "DROP"],
                         ["INPUT", "-p", "tcp", "--dport", port, "-j", "DROP"]):
                self._iptables(pid, "-I", rule)
                self.drops.append((until, leader.identity, rule))
        say(f"dropping the packets of {leader.identity}'s {len(ports)} API connections (source ports {ports})")
        return [leader]

    def _leads(self, r: Replica) -> bool:
        try:
            return r.leader()
        except Exception:
            return False

    def _iptables(self, pid: int, op: str, rule: list[str]) -> None:
        subprocess.run(["nsenter", "-t", str(pid), "-n", "iptables-legacy", "-w", op, *rule], check=True)

    def settle(self) -> None:
        now, kept = time.monotonic(), []
        for until, pod, rule in self.drops:
            try:  # the network namespace is the pod's: a restarted container has the same, at a new PID
                if until <= now:
                    self._iptables(self._pid(self.pods()[pod]), "-D", rule)
                    continue
            except (RuntimeError, KeyError, subprocess.CalledProcessError):
                pass  # its container is restarting: the next check's settle deletes it
            kept.append((until, pod, rule))
        self.drops = kept

    # -- end --

    def logs(self, dest: Path) -> None:
        """The containers' logs as the kubelet kept them (the last two of each container)."""
        if self.node is not None:
            shutil.copytree(self.node.dir / "var/log/pods", dest / "pods", dirs_exist_ok=True)

    def stop(self) -> None:
        if self.node is not None:
            left = self.node.stop()
            if left:
                say(f"the node left something behind: {left}")
        shutil.rmtree(self.tmp, ignore_errors=True)
