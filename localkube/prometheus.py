"""A real Prometheus (Debian's `prometheus` package, installed by `make tools`) on loopback,
scraping node-workload-summary and evaluating its alert rules: for tests and the demo."""

from __future__ import annotations

import json
import shutil
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from .build import PROMETHEUS_OPERATOR, ensure_binaries
from .cluster import ClusterError, LocalCluster, Process, free_port, wait_until


class Prometheus:
    def __init__(self, workdir: Path, targets: list[str], rule_files: list[Path], interval: str = "1s",
                 job: str = "node-workload-summary", target_labels: dict[str, dict[str, str]] | None = None,
                 honor_labels: bool = False, scheme: str = "http", ca_file: Path | None = None,
                 bearer_token_file: Path | None = None, extra_jobs: list[dict] | None = None,
                 insecure_skip_verify: bool = False, alertmanagers: list[str] | None = None) -> None:
        self.workdir = workdir
        self.targets = targets
        # Extra labels per target address, as service discovery would add them (pod, namespace, ...).
        self.target_labels = target_labels or {}
        self.honor_labels = honor_labels
        # HTTPS targets (--metrics-secure): the CA that signed their certificate, and a token file.
        self.scheme = scheme
        self.ca_file = ca_file
        self.bearer_token_file = bearer_token_file
        self.insecure_skip_verify = insecure_skip_verify  # a self-signed certificate per pod
        self.rule_files = rule_files
        # More scrape_configs entries, as written in prometheus.yml (another exporter beside ours).
        self.extra_jobs = extra_jobs or []
        # Alertmanagers (host:port) the firing alerts are sent to.
        self.alertmanagers = alertmanagers or []
        self.interval = interval
        self.job = job
        self.port = 0
        self.process: Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> Prometheus:
        binary = shutil.which("prometheus")
        if binary is None:
            raise ClusterError("prometheus is not installed: run `make tools` (Debian's prometheus package)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        job: dict = {
            "job_name": self.job, "honor_labels": self.honor_labels, "scheme": self.scheme,
            "static_configs": [{"targets": [t], "labels": self.target_labels.get(t, {})} for t in self.targets],
        }
        if self.ca_file is not None:
            job["tls_config"] = {"ca_file": str(self.ca_file)}
        elif self.insecure_skip_verify:
            job["tls_config"] = {"insecure_skip_verify": True}
        if self.bearer_token_file is not None:
            job["authorization"] = {"type": "Bearer", "credentials_file": str(self.bearer_token_file)}
        config = {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [job, *self.extra_jobs],
        }
        if self.alertmanagers:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": self.alertmanagers}]}]}
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.process = Process("prometheus", [
            binary, f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
            "--storage.tsdb.retention.time=1d", "--log.level=warn",
        ], self.workdir)
        self.process.start()
        wait_until("prometheus /-/ready", lambda: self._get("/-/ready")[0] == 200, timeout, [self.process])
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def _get(self, path: str) -> tuple[int, bytes]:
        return http_get(self.url + path)

    def api(self, path: str) -> dict:
        code, body = self._get(path)
        if code != 200:
            raise ClusterError(f"prometheus {path}: HTTP {code}: {body[:200]!r}")
        return json.loads(body)["data"]

    def alerts(self, state: str | None = "firing") -> list[dict]:
        return [a for a in self.api("/api/v1/alerts")["alerts"] if state is None or a["state"] == state]

    def query(self, expr: str) -> list[dict]:
        return self.api("/api/v1/query?query=" + urllib.parse.quote(expr))["result"]


def start_operator(cluster: LocalCluster) -> Process:
    """The Prometheus Operator (built from its pinned module on first use) against ``cluster``,
    with the cluster's admin client certificate; stop() the returned process."""
    binary = ensure_binaries((PROMETHEUS_OPERATOR,))["operator"]
    config = json.loads(cluster.kubeconfig.read_text())
    # The operator reads a kubeconfig only from $KUBECONFIG; its flags need no environment.
    proc = Process("prometheus-operator", [
        str(binary), f"--apiserver={cluster.server}",
        f"--ca-file={config['clusters'][0]['cluster']['certificate-authority']}",
        f"--cert-file={config['users'][0]['user']['client-certificate']}",
        f"--key-file={config['users'][0]['user']['client-key']}",
        f"--web.listen-address=127.0.0.1:{free_port()}",
    ], cluster.workdir / "logs")
    proc.start()
    return proc


def http_get(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET to a local server (Prometheus, Alertmanager); an HTTP error is an answer."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
