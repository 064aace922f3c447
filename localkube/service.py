"""Run the node-workload-summary process against a local control plane, and read its metrics:
shared by tests, benchmarks and the demo."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from .cluster import LocalCluster, free_port, set_parent_death_signal

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
READER_ROLE = "node-workload-summary-metrics-reader"
RBAC = Path(__file__).resolve().parent.parent / "deploy" / "base" / "rbac.yaml"


def metrics_reader_token(cluster: LocalCluster, account: str = "reader", namespace: str = "default") -> str:
    """A token of ServiceAccount ``namespace/account`` bound to the shipped metrics-reader
    ClusterRole (deploy/base/rbac.yaml): what Prometheus presents to a --metrics-secure service."""
    role = next(d for d in yaml.safe_load_all(RBAC.read_text()) if d["metadata"]["name"] == READER_ROLE)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(role))
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace, check=False)  # may exist
    cluster.kubectl("create", "clusterrolebinding", f"{account}-{namespace}-metrics", f"--clusterrole={READER_ROLE}",
                    f"--serviceaccount={namespace}:{account}", check=False)
    return cluster.kubectl("create", "token", account, "-n", namespace, "--duration=2h").stdout.strip()


def parse(text: str) -> Samples:
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return samples


def select(samples: Samples, name: str, /, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` with at least these labels (a label may be called ``name`` too)."""
    want = set(labels.items())
    return {lbl: v for (n, lbl), v in samples.items() if n == name and want <= lbl}


def value(samples: Samples, name: str, /, **labels: str) -> float | None:
    """The one sample of ``name`` with exactly these labels, or None."""
    return samples.get((name, frozenset(labels.items())))


class ScrapeFailed(AssertionError):
    """A scrape of /metrics that got no 200 answer (refused, dropped, timed out, or an HTTP error)."""


def wait_for(predicate: Callable[[], object], timeout: float = 20, interval: float = 0.05,
             retry: type[BaseException] | tuple[type[BaseException], ...] = ()) -> float:
    """Poll until ``predicate()`` is truthy; returns the seconds it took.

    An exception from the predicate ends the wait at once (a broken predicate or service is never
    "not yet"), unless it is one of ``retry``: the call site names what may fail on the way, such
    as ``ScrapeFailed`` where Prometheus would simply scrape again. The last such error is reported
    if the time runs out."""
    started = time.monotonic()
    last: object = None
    while time.monotonic() - started < timeout:
        try:
            last = predicate()
        except retry as err:
            last = err
        else:
            if last:
                return time.monotonic() - started
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last: {last!r})")


@dataclass
class Service:
    """The real `node-workload-summary` process (exporter + reconciler) against the local control plane.

    ``secure``: /metrics over HTTPS with token checks (--metrics-secure, its self-signed certificate
    saved to ``ca_file`` and trusted by get()), the probes on a plain port of their own; ``token``
    is the bearer token get() sends to /metrics unless given another."""

    cluster: LocalCluster
    args: tuple[str, ...] = ()
    proc: subprocess.Popen | None = None
    port: int = 0
    log: Path | None = None
    secure: bool = False
    probe_port: int = 0
    ca_file: Path | None = None
    token: str = ""

    def start(self, ready: bool = True) -> Service:
        """Start the process; wait for /readyz 200 (``ready``), or only for the HTTP server."""
        self.port = free_port()
        self.probe_port = free_port() if self.secure else self.port
        self.log = self.cluster.workdir / "logs" / f"node-workload-summary-{self.port}.log"
        secure = ("--metrics-secure", f"--probe-port={self.probe_port}") if self.secure else ()
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "node_workload_summary.main", f"--kubeconfig={self.cluster.kubeconfig}",
                 "--listen-address=127.0.0.1", f"--port={self.port}", *secure, *self.args],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=lambda: set_parent_death_signal(signal.SIGKILL),  # never outlives pytest
            )
        try:
            wait_for(lambda: self.get("/readyz")[0] == 200 if ready else self.get("/healthz")[0] == 200, timeout=60)
        except AssertionError:
            self.stop()
            readyz = self.get_readyz_text()
            raise AssertionError(f"service not ready within 60s: {readyz}\n{self.log_text()}") from None
        if self.secure:  # trust exactly the certificate it serves
            self.ca_file = self.log.with_suffix(".crt")
            self.ca_file.write_text(ssl.get_server_certificate(("127.0.0.1", self.port)))
        return self

    def get_readyz_text(self) -> str:
        return self.get("/readyz")[1] if self.proc and self.proc.poll() is None else "(exited)"

    @property
    def metrics_url(self) -> str:
        return f"{'https' if self.secure else 'http'}://127.0.0.1:{self.port}/metrics"

    def tls_context(self) -> ssl.SSLContext | None:
        """Verifies the served certificate (and that it names 127.0.0.1)."""
        return ssl.create_default_context(cafile=self.ca_file) if self.secure and self.ca_file else None

    def get(self, path: str, accept: str = "", token: str = "") -> tuple[int, str]:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"service exited with {self.proc.returncode}:\n{self.log_text()}")
        metrics = path.startswith("/metrics")
        token = token or (self.token if metrics else "")
        headers = {"Accept": accept, **({"Authorization": f"Bearer {token}"} if token else {})}
        url = self.metrics_url + path.removeprefix("/metrics") if metrics else f"http://127.0.0.1:{self.probe_port}{path}"
        request = urllib.request.Request(url, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=10, context=self.tls_context() if metrics else None) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as err:
            return 0, str(err)

    def scrape(self, token: str = "") -> Samples:
        code, text = self.get("/metrics", token=token)
        if code != 200:
            raise ScrapeFailed(f"/metrics answered {code or 'nothing'}: {text}")
        return parse(text)

    def log_text(self) -> str:
        return self.log.read_text() if self.log else ""

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, as a crash: no graceful shutdown, the lease is not released."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
