"""Alert rules and dashboards: generated files current, promtool checks and unit tests, every
expression parses and uses only metrics a real scrape has, and alerts fire in a real Prometheus."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

import alerts.__main__ as alerts_gen
import dashboards.__main__ as dashboards_gen
from alerts.rules import Thresholds, alerts, rules_file
from demo.workloads import node_summarizer
from localkube.cluster import LocalCluster, Options
from localkube.prometheus import Prometheus
from localkube.service import Service, wait_for
from node_workload_summary import generated
from tests.conftest import CRDS, ROOT
from tests.kube import create_node, set_node_status

API = "ux.sean.example.com/v1alpha1"
RULES = ROOT / "alerts" / "generated" / "node-workload-summary.rules.yaml"
PROMTOOL_TESTS = ROOT / "tests" / "promtool" / "alerts.test.yaml"
# Series Prometheus makes itself, not the exporter.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds"}


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True)


def dashboard_exprs() -> list[str]:
    exprs = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                exprs.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    for text in dashboards_gen.render().values():
        walk(json.loads(text))
    return exprs


def all_exprs() -> list[str]:
    return [a.expr for a in alerts()] + dashboard_exprs()


def metric_names(expr: str) -> set[str]:
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    without_ranges = re.sub(r"\[[^\]]*\]", "", without_strings)
    names = set(re.findall(r"\b([a-z_][a-z0-9_]*)\b(?=\s*(?:\{|\)|$|\s|>|<|/|\*|-|\+|offset))", without_ranges))
    return {n for n in names if n.startswith(("nws_", "process_")) or n in PROMETHEUS_OWN}


# -- generated files and promtool -----------------------------------------------------------------


def test_generated_files_are_current() -> None:
    assert generated.stale(alerts_gen.render(), alerts_gen.OUT) == [], "run `make generate`"
    assert generated.stale(dashboards_gen.render(), dashboards_gen.OUT) == [], "run `make generate`"


def test_prometheusrule_carries_the_same_rules() -> None:
    rule = yaml.safe_load((alerts_gen.OUT / "prometheusrule.yaml").read_text())
    assert rule["kind"] == "PrometheusRule" and rule["spec"] == rules_file()


def test_promtool_check_rules() -> None:
    result = promtool("check", "rules", str(RULES))
    assert result.returncode == 0 and f"SUCCESS: {len(alerts())} rules found" in result.stdout, result


def test_promtool_unit_tests_cover_every_alert_firing_and_silent() -> None:
    result = promtool("test", "rules", str(PROMTOOL_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    cases = [c for t in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    for alert in alerts():
        mine = [c for c in cases if c["alertname"] == alert.name]
        assert any(c["exp_alerts"] for c in mine), f"{alert.name}: no firing case"
        assert any(not c["exp_alerts"] for c in mine), f"{alert.name}: no silent case"


def test_every_alert_is_annotated_and_has_a_runbook() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    for alert in alerts():
        assert "{{ $labels" in alert.summary + alert.description or "NodeWorkloadSummary" in alert.name, alert.name
        assert f"## {alert.name}" in runbooks, f"docs/runbooks.md has no runbook for {alert.name}"


def test_every_expression_parses(tmp_path: Path) -> None:
    """promtool parses each dashboard expression as a recording rule (variables substituted)."""
    exprs = dashboard_exprs()
    assert len(exprs) > 30
    subst = {"$__rate_interval": "5m", "$top": "10"}
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in subst.items():
            expr = expr.replace(var, value)
        rules.append({"record": f"dashboard:expr_{i}", "expr": expr})
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_metric_name_extraction() -> None:
    assert metric_names('sum by (a) (nws_x{b="nws_y"}) / nws_z offset 5m') == {"nws_x", "nws_z"}
    assert metric_names("max_over_time(nws_nodegroup_nodes[1h] offset 5m)") == {"nws_nodegroup_nodes"}


# -- against a real scrape and a real Prometheus -------------------------------------------------


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        node_summarizer(c, "pool", "pool")
        for name, pool in (("a-1", "a"), ("a-2", "a"), ("b-1", "b"), ("b-2", "b")):
            create_node(c, name, {"pool": pool})
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube).start()
    yield svc
    svc.stop()


def test_every_metric_used_is_in_a_real_scrape(service: Service) -> None:
    code, text = service.get("/metrics")
    assert code == 200
    exposed = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    exposed |= {n.removesuffix("_total") + "_total" for n in exposed}  # counters' sample names
    used = set().union(*(metric_names(e) for e in all_exprs())) - PROMETHEUS_OWN
    assert len(used) > 15
    assert used <= exposed, f"used but never exported: {sorted(used - exposed)}"


def test_node_group_not_ready_fires_in_prometheus_and_resolves(kube: LocalCluster, service: Service,
                                                                  tmp_path: Path) -> None:
    fast = Thresholds(not_ready_for="3s", down_for="3s")
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(rules_file(fast)))
    prom = Prometheus(tmp_path / "prometheus", [f"127.0.0.1:{service.port}"], [rules]).start()
    try:
        wait_for(lambda: prom.query('nws_nodegroup_nodes{group="a"}'), timeout=30)
        assert prom.alerts() == []
        for node in ("a-1", "a-2"):
            set_node_status(kube, node, "False")

        def firing(name: str) -> list[dict]:
            return [a for a in prom.alerts() if a["labels"]["alertname"] == name]

        wait_for(lambda: firing("NodeGroupNotReady"), timeout=30)
        (alert,) = firing("NodeGroupNotReady")  # for group a, and no other
        assert alert["labels"]["group"] == "a" and alert["labels"]["summarizer"] == "pool"
        assert alert["annotations"]["description"].startswith("100% of the nodes of node group a")
        wait_for(lambda: firing("NodeGroupDown"), timeout=30)
        assert [a["labels"]["group"] for a in firing("NodeGroupDown")] == ["a"]
        for node in ("a-1", "a-2"):
            set_node_status(kube, node, "True")
        wait_for(lambda: not firing("NodeGroupNotReady") and not firing("NodeGroupDown"), timeout=30)
    finally:
        prom.stop()
