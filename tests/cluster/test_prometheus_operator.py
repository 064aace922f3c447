"""The Prometheus Operator, built from its pinned Go module, run against the local control plane: the
scrape job (HTTPS with a bearer token file) and rule file it generates from deploy/with-monitoring/
for a Prometheus that selects every ServiceMonitor and PrometheusRule."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from localkube.build import PROMETHEUS_OPERATOR, ensure_binaries
from localkube.cluster import LocalCluster, Options
from localkube.prometheus import start_operator
from localkube.service import wait_for
from tests.paths import ROOT

pytestmark = pytest.mark.needs(PROMETHEUS_OPERATOR)

WITH_MONITORING = ROOT / "deploy" / "with-monitoring"
NS = "node-workload-summary"
JOB = f"serviceMonitor/{NS}/node-workload-summary/0"
# As kube-prometheus-stack's Prometheus does with its selectors left open: every namespace.
PROMETHEUS = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
    "metadata": {"name": "k8s", "namespace": "monitoring"},
    "spec": {"serviceMonitorSelector": {}, "serviceMonitorNamespaceSelector": {},
             "ruleSelector": {}, "ruleNamespaceSelector": {}},
}


@pytest.fixture(scope="module")
def generated(binaries: dict[str, Path]) -> Iterator[tuple[dict, dict[str, str]]]:
    """(the operator's prometheus.yaml, its rule files) once it has reconciled our objects."""
    operator = ensure_binaries((PROMETHEUS_OPERATOR,))
    with LocalCluster(Options(), binaries) as kube:
        kube.install_crds(operator["monitoring-crds.yaml"])
        kube.install_crds(operator["prometheus-operator-crds.yaml"])
        kube.kubectl("apply", "-k", str(WITH_MONITORING))
        kube.kubectl("create", "namespace", "monitoring")
        kube.kubectl("apply", "-f", "-", input=json.dumps(PROMETHEUS))
        proc = start_operator(kube)
        try:
            def secret_data() -> dict[str, str] | None:
                out = kube.kubectl("get", "secret", "prometheus-k8s", "-n", "monitoring", "-o",
                                   "jsonpath={.data}", check=False)
                return json.loads(out.stdout) if out.returncode == 0 and out.stdout else None

            def rule_files() -> dict[str, str] | None:
                out = kube.kubectl("get", "configmap", "prometheus-k8s-rulefiles-0", "-n", "monitoring",
                                   "-o", "jsonpath={.data}", check=False)
                return json.loads(out.stdout) if out.returncode == 0 and out.stdout else None

            try:
                wait_for(lambda: secret_data() and rule_files(), timeout=60)
            except AssertionError as err:
                raise AssertionError(f"{err}\n{proc.log_tail(40)}") from None
            data = secret_data()
            assert data is not None
            prometheus_yaml = gzip.decompress(base64.b64decode(data["prometheus.yaml.gz"]))
            yield yaml.safe_load(prometheus_yaml), rule_files() or {}
        finally:
            proc.stop()


def test_scrape_job_for_our_service_monitor(generated: tuple[dict, dict[str, str]]) -> None:
    config, _ = generated
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert JOB in jobs, sorted(jobs)
    job = jobs[JOB]
    # honor_labels keeps our `namespace` label (the workload's) instead of exported_namespace.
    assert job["honor_labels"] is True
    assert job["metrics_path"] == "/metrics" and job["scrape_interval"] == "30s"
    [sd] = job["kubernetes_sd_configs"]
    assert sd["role"] == "endpoints" and sd["namespaces"]["names"] == [NS]
    keeps = {(tuple(r["source_labels"]), r["regex"]) for r in job["relabel_configs"] if r.get("action") == "keep"}
    # Only our Service (by its label) and only its `metrics` port.
    assert (("__meta_kubernetes_service_label_app_kubernetes_io_name",
             "__meta_kubernetes_service_labelpresent_app_kubernetes_io_name"), "(node-workload-summary);true") in keeps
    assert (("__meta_kubernetes_endpoint_port_name",), "metrics") in keeps
    # --metrics-secure: HTTPS, Prometheus' own ServiceAccount token, the self-signed certificate unverified.
    assert job["scheme"] == "https"
    assert job["bearer_token_file"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert job["tls_config"] == {"insecure_skip_verify": True}


def test_rule_file_carries_our_alerts(generated: tuple[dict, dict[str, str]]) -> None:
    _, files = generated
    ours = yaml.safe_load((WITH_MONITORING / "generated" / "prometheusrule.yaml").read_text())
    [(name, text)] = [(k, v) for k, v in files.items() if k.startswith(f"{NS}-node-workload-summary-")]
    assert yaml.safe_load(text) == ours["spec"], name
