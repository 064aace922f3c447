"""What the tests of the alerts share: the replicas' target labels as the Prometheus Operator gives
them, Karpenter's disruption taint, docs/runbooks.md's inhibit_rules, and a stub scrape target
that doubles as Alertmanager's receiver (the pager)."""

from __future__ import annotations

import http.server
import json
import re
import threading
from typing import Any

import yaml

from demo.workloads import ok
from kubeindex.model.resources import NODES
from localkube.cluster import LocalCluster
from tests.paths import ROOT

RUNBOOKS = (ROOT / "docs" / "runbooks.md").read_text()


def disrupt(cluster: LocalCluster, node: str, taints: list[dict[str, str]] | None = None) -> None:
    """Set the node's taints (default: Karpenter's disruption taint)."""
    taints = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}] if taints is None else taints
    ok(cluster.request(NODES.path(name=node), "PATCH", {"spec": {"taints": taints}},
                       content_type="application/merge-patch+json"))


def replica_labels(identity: str) -> dict[str, str]:
    """The target labels Prometheus Operator's discovery gives a replica's series (besides
    instance and job); the exporter's own `namespace` wins over the target's (honorLabels)."""
    return {"pod": f"node-workload-summary-{identity}", "namespace": "node-workload-summary",
            "service": "node-workload-summary", "endpoint": "metrics", "container": "node-workload-summary"}


def runbooks_inhibit_rules() -> list[dict[str, Any]]:
    """The inhibit_rules of docs/runbooks.md: the YAML block of its "Beside kubernetes-mixin" section."""
    section = RUNBOOKS.split("\n## Beside kubernetes-mixin\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```yaml\n(.*?)```", section, re.S)
    rules: list[dict[str, Any]] = yaml.safe_load(block)["inhibit_rules"]
    return rules


class Stub:
    """A scrape target serving fixed series, and a webhook receiver that records every alert
    Alertmanager notifies: the pager."""

    def __init__(self, series: str) -> None:
        self.notified: list[dict[str, str]] = []
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = series.encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.notified += [alert["labels"] for alert in payload["alerts"]]
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
