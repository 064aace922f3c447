"""Test helpers that talk to the local control plane through its REST API (admin credentials),
and run the real exporter process against it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from localkube.cluster import LocalCluster, free_port, set_parent_death_signal

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def ok(result: tuple[int, object]) -> dict:
    code, body = result
    assert 200 <= code < 300, (code, body)
    return body  # type: ignore[return-value]


def create_node(cluster: LocalCluster, name: str, labels: dict[str, str], ready: str = "True",
                allocatable: dict[str, str] | None = None, unschedulable: bool = False) -> dict:
    alloc = allocatable or {"cpu": "8", "memory": "32Gi", "pods": "110"}
    ok(cluster.request("/api/v1/nodes", "POST", {
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
    return ok(cluster.request(f"/api/v1/nodes/{name}/status", "PATCH", {"status": status},
                              content_type="application/merge-patch+json"))


def set_node_labels(cluster: LocalCluster, name: str, labels: dict[str, str | None]) -> dict:
    return ok(cluster.request(f"/api/v1/nodes/{name}", "PATCH", {"metadata": {"labels": labels}},
                              content_type="application/merge-patch+json"))


def owner_ref(obj: dict) -> dict:
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"], "controller": True}


def create(cluster: LocalCluster, path: str, obj: dict) -> dict:
    return ok(cluster.request(path, "POST", obj))


def create_pod(cluster: LocalCluster, namespace: str, name: str, node: str = "", phase: str = "Running",
               owner: dict | None = None, cpu: str = "500m", labels: dict[str, str] | None = None) -> dict:
    meta: dict = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner is not None:
        meta["ownerReferences"] = [owner_ref(owner)]
    spec: dict = {"containers": [{"name": "c", "image": "x", "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    pod = create(cluster, f"/api/v1/namespaces/{namespace}/pods",
                 {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})
    if phase != "Pending":
        set_pod_phase(cluster, namespace, name, phase)
    return pod


def set_pod_phase(cluster: LocalCluster, namespace: str, name: str, phase: str) -> dict:
    return ok(cluster.request(f"/api/v1/namespaces/{namespace}/pods/{name}/status", "PATCH",
                              {"status": {"phase": phase}}, content_type="application/merge-patch+json"))


def delete(cluster: LocalCluster, path: str) -> None:
    """Delete now; Background propagation, so no GC finalizer keeps the object (Jobs default to
    orphaning, which waits for kube-controller-manager)."""
    code, body = cluster.request(path, "DELETE", {"gracePeriodSeconds": 0, "propagationPolicy": "Background"})
    assert code in (200, 202, 404), (code, body)


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def select(samples: Samples, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    want = set(labels.items())
    return {lbl: v for (n, lbl), v in samples.items() if n == name and want <= lbl}


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The one sample of ``name`` with exactly these labels, or None."""
    return samples.get((name, frozenset(labels.items())))


def wait_for(predicate: Callable[[], object], timeout: float = 20, interval: float = 0.05) -> float:
    """Poll until ``predicate()`` is truthy; returns the seconds it took."""
    started = time.monotonic()
    last: object = None
    while time.monotonic() - started < timeout:
        last = predicate()
        if last:
            return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


@dataclass
class Exporter:
    """The real `node-workload-summary` process against the local control plane."""

    cluster: LocalCluster
    args: tuple[str, ...] = ()
    proc: subprocess.Popen | None = None
    port: int = 0
    log: Path | None = None

    def start(self) -> Exporter:
        self.port = free_port()
        self.log = self.cluster.workdir / "logs" / f"exporter-{self.port}.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "exporter.main", f"--kubeconfig={self.cluster.kubeconfig}",
                 "--listen-address=127.0.0.1", f"--port={self.port}", *self.args],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL),  # never outlives pytest
            )
        try:
            wait_for(lambda: self.get("/readyz")[0] == 200, timeout=60)
        except AssertionError:
            self.stop()
            readyz = self.get_readyz_text()
            raise AssertionError(f"exporter not ready within 60s: {readyz}\n{self.log_text()}") from None
        return self

    def get_readyz_text(self) -> str:
        return self.get("/readyz")[1] if self.proc and self.proc.poll() is None else "(exited)"

    def get(self, path: str, accept: str = "") -> tuple[int, str]:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"exporter exited with {self.proc.returncode}:\n{self.log_text()}")
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers={"Accept": accept})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as err:
            return 0, str(err)

    def scrape(self) -> Samples:
        code, text = self.get("/metrics")
        assert code == 200, text
        return parse(text)

    def log_text(self) -> str:
        return self.log.read_text() if self.log else ""

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
