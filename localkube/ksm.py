"""kube-state-metrics (KSM), built from its pinned Go module on first use, on loopback against the
local control plane: what users run today, for the benchmarks that measure the service beside it
(bench/ksm.py, bench/apiserver_bill.py)."""

from __future__ import annotations

import urllib.request
from pathlib import Path

from .build import KUBE_STATE_METRICS, ensure_binaries
from .cluster import LocalCluster, Process, free_port

# The objects the service's own answers are built from: nodes, pods and their owners.
RESOURCES = "nodes,pods,deployments,replicasets,statefulsets,jobs"


def build() -> Path:
    """The kube-state-metrics binary, built on first use (a cold build takes minutes)."""
    return ensure_binaries((KUBE_STATE_METRICS,))["kube-state-metrics"]


def family_count(text: bytes, family: str) -> int:
    """Series of one family (labelled) in a text exposition."""
    needle = f"{family}{{".encode()
    return text.count(b"\n" + needle) + text.startswith(needle)


class KubeStateMetrics:
    """kube-state-metrics on two free loopback ports (metrics, telemetry), serving gzip when asked;
    ``node_labels``: the node label keys kept on kube_node_labels (none by default, as KSM has it)."""

    def __init__(self, cluster: LocalCluster, resources: str = RESOURCES, node_labels: tuple[str, ...] = ()) -> None:
        self.cluster = cluster
        self.port, self.telemetry_port = free_port(), free_port()
        self.argv = [str(build()), f"--kubeconfig={cluster.kubeconfig}", "--host=127.0.0.1",
                     f"--port={self.port}", "--telemetry-host=127.0.0.1", f"--telemetry-port={self.telemetry_port}",
                     f"--resources={resources}"]
        if node_labels:
            self.argv.append(f"--metric-labels-allowlist=nodes=[{','.join(node_labels)}]")
        self.argv.append("--enable-gzip-encoding")
        self.process = Process(f"kube-state-metrics-{self.port}", self.argv, cluster.workdir / "logs")

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    @property
    def readyz_url(self) -> str:
        return f"http://127.0.0.1:{self.telemetry_port}/readyz"

    @property
    def pid(self) -> int:
        pid = self.process.pid
        assert pid is not None
        return pid

    def start(self) -> KubeStateMetrics:
        self.process.start()
        return self

    def stop(self) -> None:
        self.process.stop()

    def running(self) -> bool:
        return self.process.running()

    def log_tail(self) -> str:
        return self.process.log_tail()

    def ready(self) -> bool:
        """/readyz answers 200. It says only that KSM's self-metrics registry is not empty, not
        that its informers have synced: complete() says that."""
        try:
            with urllib.request.urlopen(self.readyz_url, timeout=10) as resp:
                return resp.status == 200
        except OSError:
            return False

    def metrics(self, timeout: float = 600) -> bytes:
        """One plain scrape of /metrics (hundreds of megabytes at thousands of nodes)."""
        with urllib.request.urlopen(self.metrics_url, timeout=timeout) as resp:
            return resp.read()

    def complete(self, expected: dict[str, int]) -> tuple[bool, dict[str, int]]:
        """Whether a scrape shows every object: ``expected`` is {family: series}; also the series
        seen per family (none when the scrape failed)."""
        try:
            body = self.metrics()
        except OSError:
            return False, {}
        seen = {family: family_count(body, family) for family in expected}
        return seen == expected, seen
