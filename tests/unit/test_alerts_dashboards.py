"""Alert rules and dashboards. Here, what needs no cluster; the scenarios against one:
tests/cluster/test_alerts_dashboards.py."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import alerts.__main__ as alerts_gen
import dashboards.__main__ as dashboards_gen
from alerts.replicas import LABELS, by
from alerts.rules import RUNBOOK_BASE_URL, Marker, Thresholds, alerts, chart_rules, rules_file
from dashboards.build import Options as DashboardOptions
from localkube.alertmanager import Alertmanager
from localkube.prometheus import Prometheus
from localkube.service import wait_for
from node_workload_summary import generated
from tests.alerting import RUNBOOKS, Stub, runbooks_inhibit_rules
from tests.paths import ROOT
from tests.support.alerts_dashboards import (
    PROMETHEUS_OWN,
    all_exprs,
    dashboard_exprs,
    metric_names,
)

RULES = ROOT / "alerts" / "generated" / "node-workload-summary.rules.yaml"


PROMTOOL_TESTS = ROOT / "tests" / "promtool" / "alerts.test.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["promtool", *args], capture_output=True, text=True)


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
        assert any(all("cluster" in a["exp_labels"] for a in c["exp_alerts"]) for c in mine if c["exp_alerts"]), \
            f"{alert.name}: no firing case with two clusters"


def test_every_alert_is_annotated_and_has_a_runbook() -> None:
    runbooks = (ROOT / "docs" / "runbooks.md").read_text()
    for alert in alerts():
        assert "{{ $labels" in alert.summary + alert.description or "NodeWorkloadSummary" in alert.name, alert.name
        assert f"## {alert.name}" in runbooks, f"docs/runbooks.md has no runbook for {alert.name}"


def heading_anchors(markdown: str) -> set[str]:
    """The anchors of a Markdown file's headings, as GitHub makes them (lower case, punctuation
    dropped, spaces to hyphens; a repeated heading gets -1, -2, ...)."""
    anchors: set[str] = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, unique = 0, slug
        while unique in anchors:
            n += 1
            unique = f"{slug}-{n}"
        anchors.add(unique)
    return anchors


def test_heading_anchors() -> None:
    assert heading_anchors("# A b\n## NodeGroupDown\n## Beside kubernetes-mixin\n## A b\n") == {
        "a-b", "nodegroupdown", "beside-kubernetes-mixin", "a-b-1"}


def runbook_urls(rules: dict[str, Any]) -> list[str]:
    return [r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"]]


def test_every_rule_names_its_runbook_and_links_none_by_default() -> None:
    """No address where docs/runbooks.md is served exists yet, and a placeholder link is worse than
    none: each rule names its section for a person to read, and has no runbook_url."""
    anchors = heading_anchors(RUNBOOKS)
    assert RUNBOOK_BASE_URL is None
    for generated_file in (RULES, alerts_gen.OUT / "prometheusrule.yaml"):
        doc = yaml.safe_load(generated_file.read_text())
        rules = [r for g in doc.get("spec", doc)["groups"] for r in g["rules"]]
        assert len(rules) == len(alerts())
        for rule in rules:
            assert set(rule["annotations"]) == {"summary", "description", "runbook"}, rule["alert"]
            path, _, anchor = rule["annotations"]["runbook"].partition("#")
            assert path == "docs/runbooks.md" and anchor == rule["alert"].lower(), rule["annotations"]
            assert anchor in anchors, f"{rule['alert']}: docs/runbooks.md has no heading with anchor {anchor!r}"


def test_runbook_base_url_option(tmp_path: Path) -> None:
    base = "https://wiki.example.com/platform/nws-runbooks"
    assert alerts_gen.main(["--runbook-base-url", base, "--out", str(tmp_path)]) == 0
    plain = yaml.safe_load((tmp_path / "node-workload-summary.rules.yaml").read_text())
    rule = yaml.safe_load((tmp_path / "prometheusrule.yaml").read_text())
    want = [f"{base}#{a.name.lower()}" for a in alerts()]
    assert runbook_urls(plain) == runbook_urls(rule["spec"]) == want
    assert all(r["annotations"]["runbook"] == f"docs/runbooks.md#{r['alert'].lower()}"
               for r in plain["groups"][0]["rules"])  # the section named as well
    assert alerts_gen.main(["--check"]) == 0  # the committed files keep the default: no link


def test_every_alert_has_its_settings_and_uses_them_alone() -> None:
    """The chart's copy leaves every setting as a Marker: each alert's `for` is its own setting, and
    every setting shows up in the rules of its alert and of no other."""
    chart = chart_rules()
    defaults, rules = chart["defaults"], chart["spec"]["groups"][0]["rules"]
    assert defaults == Thresholds().settings()
    assert set(defaults) == {a.name for a in alerts()}
    for rule in rules:
        assert rule["for"] == f"${{{rule['alert']}.for}}", rule["alert"]
        assert rule["annotations"]["runbook_url"] == f"${{runbookBaseUrl}}#{rule['alert'].lower()}"
    for alert, settings in defaults.items():
        for key in settings:
            marker = Marker(f"{alert}.{key}")  # or its |percent form
            using = {r["alert"] for r in rules if re.search(re.escape(marker[:-1]) + r"[}|]", json.dumps(r))}
            assert using == {alert}, (marker, using)


def test_overrides_change_only_their_alert() -> None:
    default = alerts()
    for alert, settings in Thresholds().settings().items():
        for key, value in settings.items():
            new = "42m" if isinstance(value, str) else value * 3
            tuned = alerts(Thresholds().with_overrides({alert: {key: new}}))
            assert {a.name for a, b in zip(default, tuned, strict=True) if a != b} == {alert}, (alert, key)
    with pytest.raises(ValueError, match="no such alert"):
        Thresholds().with_overrides({"NodeGroupNotRedy": {"for": "1m"}})
    with pytest.raises(ValueError, match=r"no such setting \(for, fraction\)"):
        Thresholds().with_overrides({"NodeGroupNotReady": {"fractoin": 0.3}})


def test_disabled_alerts_and_additional_labels() -> None:
    rules = rules_file(disabled=["NodeGroupShrunk", "WorkloadOnUnhealthyNodes"],
                       additional_labels={"team": "platform"})["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [a.name for a in alerts()
                                           if a.name not in ("NodeGroupShrunk", "WorkloadOnUnhealthyNodes")]
    assert all(r["labels"] == {"severity": r["labels"]["severity"], "team": "platform"} for r in rules)
    with pytest.raises(ValueError, match="no such alert NodeGroupShrink"):
        rules_file(disabled=["NodeGroupShrink"])
    with pytest.raises(ValueError, match="severity"):
        rules_file(additional_labels={"severity": "page"})


def test_the_tuning_table_lists_every_setting_and_its_default() -> None:
    rows = {m.group(1): (m.group(2), m.group(3)) for m in
            re.finditer(r"^\| `(\w+)` \| ([a-z, ]+) \| (`[^|]*`) \|", RUNBOOKS, re.M)}
    severities: dict[str, list[str]] = {}
    for a in alerts():
        severities.setdefault(a.name, []).append(a.severity)
    assert set(rows) == set(severities)
    for alert, settings in Thresholds().settings().items():
        severity, listed = rows[alert]
        assert severity.split(", ") == severities[alert], alert
        assert dict(re.findall(r"`(\w+): ([^`]+)`", listed)) == {k: str(v) for k, v in settings.items()}, alert


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


def test_every_cluster_family_is_folded_across_replicas() -> None:
    """Replicas serve the same cluster metrics: each such family is read as ``max by (<its own
    labels>)`` first (alerts/replicas.py), never summed or counted across replicas."""
    for expr in all_exprs():
        for m in re.finditer(r"\b(nws_[a-z_]+)\b", expr):
            if m.group(1) in LABELS:
                fold = rf"{re.escape(by(m.group(1)))} ?\(((max_over_time|changes)\()?$"
                assert re.search(fold, expr[:m.start()]), f"{m.group(1)} not folded across replicas in: {expr}"


def aggregations(expr: str) -> list[str]:
    """The label lists of every aggregation in ``expr`` ("" for none: ``sum(...)``)."""
    return [m.group(1) or "" for m in re.finditer(r"\b(?:sum|max|min|count|avg)\s*(?:by \(([^)]*)\)\s*)?\(", expr)]


@pytest.mark.parametrize("label", ["cluster", "k8s_cluster"])
def test_every_alert_aggregation_keeps_the_cluster(label: str) -> None:
    """Rules evaluated over many clusters (Thanos Ruler, Mimir) must stay per cluster: every
    aggregation groups by the cluster label, whatever its name."""
    rules = alerts(Thresholds(cluster=label))
    lists = [(a.name, labels) for a in rules for labels in aggregations(a.expr)]
    assert len(lists) > 20
    assert [(name, labels) for name, labels in lists if label not in labels.split(", ")] == []
    assert label == "cluster" or all("cluster" not in re.sub(label, "", a.expr) for a in rules)


def test_aggregation_extraction() -> None:
    assert aggregations("sum by (a, b) (max by (c) (x)) / max(y) or count (z)") == ["a, b", "c", "", ""]


@pytest.mark.parametrize("label", ["cluster", "k8s_cluster"])
def test_every_dashboard_query_selects_the_cluster(label: str) -> None:
    """Every series selector of every query and variable (but the cluster variable's own) is on
    the dashboard's cluster; the variable is hidden unless multi_cluster, as kubernetes-mixin does."""
    for multi in (False, True):
        for name, text in dashboards_gen.render(DashboardOptions(cluster_label=label, multi_cluster=multi)).items():
            data = json.loads(text)
            variables = {v["name"]: v for v in data["templating"]["list"]}
            cluster = variables.pop("cluster")
            assert cluster["query"] == f"label_values(nws_build_info, {label})", name
            assert (cluster["hide"], cluster["multi"], cluster["includeAll"]) == (0 if multi else 2, False, False)
            queries = [t["expr"] for p in data["panels"] for t in p.get("targets", [])]
            queries += [v["query"] for v in variables.values() if v["type"] == "query"]
            for query in queries:
                selectors = re.findall(r"\b([a-z_]+)(\{[^}]*\})?", re.sub(r'"[^"]*"', '""', query))
                for metric, selector in selectors:
                    if metric.startswith(("nws_", "process_")) or metric in PROMETHEUS_OWN:
                        assert selector.startswith(f'{{{label}=""'), f"{name}: {metric} not on $cluster in {query}"
                assert f'{label}="$cluster"' in query


def test_metric_name_extraction() -> None:
    assert metric_names('sum by (a) (nws_x{b="nws_y"}) / nws_z offset 5m') == {"nws_x", "nws_z"}
    assert metric_names("max_over_time(nws_nodegroup_nodes[1h] offset 5m)") == {"nws_nodegroup_nodes"}


# Stand-ins for kubernetes-mixin's three alerts: their names, severity and labels, over series shaped
# as kube-state-metrics' (simpler expressions: no owner join, no cordon check).
MIXIN_STAND_INS = [
    {"alert": "KubeNodeNotReady", "expr": 'kube_node_status_condition{condition="Ready", status="true"} == 0'},
    {"alert": "KubePodNotReady",
     "expr": 'sum by (cluster, namespace, pod) (kube_pod_status_phase{phase=~"Pending|Unknown"}) > 0'},
    {"alert": "KubeJobFailed", "expr": 'kube_job_failed{condition="true"} > 0'},
]


# Cluster a: node group gpu down (2 of 2 nodes NotReady) and cpu partly (1 of 4); JobSet ml/train with
# both its Running pods on gpu's nodes and one Failed pod; LeaderWorkerSet ml/serve with half its pods
# there, a gang broken; Pending pods in namespaces ml and web, failed
# Jobs in ml and batch. Cluster b: one NotReady node, nothing of ours.
MIXED_SERIES = """\
nws_nodegroup_nodes{cluster="a",summarizer="pool",group="gpu"} 2
nws_nodegroup_nodes_by_condition{cluster="a",summarizer="pool",group="gpu",condition="Ready"} 0
nws_nodegroup_nodes_by_condition{cluster="a",summarizer="pool",group="gpu",condition="NotReady"} 2
nws_nodegroup_nodes{cluster="a",summarizer="pool",group="cpu"} 4
nws_nodegroup_nodes_by_condition{cluster="a",summarizer="pool",group="cpu",condition="Ready"} 3
nws_nodegroup_nodes_by_condition{cluster="a",summarizer="pool",group="cpu",condition="NotReady"} 1
nws_workload_pods{cluster="a",namespace="ml",workload="train",kind="JobSet",phase="Running"} 2
nws_workload_pods{cluster="a",namespace="ml",workload="train",kind="JobSet",phase="Failed"} 1
nws_workload_pods_by_node_state{cluster="a",namespace="ml",workload="train",kind="JobSet",state="NotReady"} 2
nws_workload_pods{cluster="a",namespace="ml",workload="serve",kind="LeaderWorkerSet",phase="Running"} 4
nws_workload_pods_by_node_state{cluster="a",namespace="ml",workload="serve",kind="LeaderWorkerSet",state="NotReady"} 2
nws_workload_gangs{cluster="a",namespace="ml",workload="serve",kind="LeaderWorkerSet",state="Broken"} 1
kube_node_status_condition{cluster="a",node="gpu-1",condition="Ready",status="true"} 0
kube_node_status_condition{cluster="a",node="gpu-2",condition="Ready",status="true"} 0
kube_node_status_condition{cluster="a",node="cpu-1",condition="Ready",status="true"} 1
kube_node_status_condition{cluster="a",node="cpu-4",condition="Ready",status="true"} 0
kube_node_status_condition{cluster="b",node="cpu-9",condition="Ready",status="true"} 0
kube_pod_status_phase{cluster="a",namespace="ml",pod="train-workers-0-0",phase="Pending"} 1
kube_pod_status_phase{cluster="a",namespace="web",pod="web-1",phase="Pending"} 1
kube_job_failed{cluster="a",namespace="ml",job_name="train-workers-0",condition="true"} 1
kube_job_failed{cluster="a",namespace="batch",job_name="report",condition="true"} 1
"""


# (alertname, severity, cluster, what it is about) of every alert that fires: muted or not.
MUTED = {
    ("NodeGroupNotReady", "warning", "a", "gpu"),  # NodeGroupDown says more
    ("WorkloadOnUnhealthyNodes", "warning", "a", "train"),  # its critical twin fires
    ("WorkloadOnUnhealthyNodes", "warning", "a", "serve"),
    ("WorkloadOnUnhealthyNodes", "critical", "a", "serve"),  # its broken gang says more
    ("KubeNodeNotReady", "warning", "a", "gpu-1"), ("KubeNodeNotReady", "warning", "a", "gpu-2"),
    ("KubeNodeNotReady", "warning", "a", "cpu-4"),  # cluster a's node groups alert
    ("KubePodNotReady", "warning", "a", "train-workers-0-0"),  # a workload of namespace ml alerts
    ("KubeJobFailed", "warning", "a", "train-workers-0"),
}


NOTIFIED = {
    ("NodeGroupDown", "critical", "a", "gpu"), ("NodeGroupNotReady", "warning", "a", "cpu"),
    ("WorkloadOnUnhealthyNodes", "critical", "a", "train"), ("WorkloadPodsFailed", "warning", "a", "train"),
    ("WorkloadGangBroken", "critical", "a", "serve"),
    ("KubeNodeNotReady", "warning", "b", "cpu-9"),  # another cluster
    ("KubePodNotReady", "warning", "a", "web-1"), ("KubeJobFailed", "warning", "a", "report"),  # other namespaces
}


def ident(labels: dict[str, str]) -> tuple[str, str, str, str]:
    subject = next((labels[k] for k in ("group", "workload", "node", "pod", "job_name") if k in labels), "")
    return labels["alertname"], labels["severity"], labels.get("cluster", ""), subject


def test_runbooks_inhibition_pages_once_per_incident_beside_kubernetes_mixin(tmp_path: Path) -> None:
    """docs/runbooks.md's inhibit_rules in a real Alertmanager, fed by a real Prometheus that
    evaluates our rules and the kubernetes-mixin stand-ins over two clusters: Alertmanager mutes
    exactly MUTED, and the receiver hears of the others only."""
    fast = Thresholds(not_ready_for="0s", down_for="0s", unhealthy_for="0s", failed_for="0s", gang_broken_for="0s")
    rules = rules_file(fast)
    rules["groups"][0]["rules"] += [{**r, "for": "0s", "labels": {"severity": "warning"}} for r in MIXIN_STAND_INS]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    stub = Stub(MIXED_SERIES)
    pager = {"name": "pager", "webhook_configs": [{"url": f"http://{stub.address}/", "send_resolved": False}]}
    manager = Alertmanager(tmp_path / "alertmanager", {
        "route": {"receiver": "pager", "group_by": ["..."], "group_wait": "1s", "group_interval": "1s",
                  "repeat_interval": "1h"},
        "receivers": [pager],
        "inhibit_rules": runbooks_inhibit_rules(),
    })
    try:
        manager.start()
        prom = Prometheus(tmp_path / "prometheus", [stub.address], [tmp_path / "rules.yaml"], honor_labels=True,
                          alertmanagers=[f"127.0.0.1:{manager.port}"]).start()
        try:
            def firing() -> set[tuple[str, str, str, str]]:
                return {ident(a["labels"]) for a in prom.alerts()}

            def states() -> dict[tuple[str, str, str, str], str]:
                return {ident(a["labels"]): a["status"]["state"] for a in manager.alerts()}

            def notified() -> set[tuple[str, str, str, str]]:
                return {ident(labels) for labels in stub.notified}

            with contextlib.suppress(AssertionError):
                wait_for(lambda: firing() == MUTED | NOTIFIED, timeout=30)
            assert firing() == MUTED | NOTIFIED  # every alert the example speaks of fires
            want = {**{k: "suppressed" for k in MUTED}, **{k: "active" for k in NOTIFIED}}
            with contextlib.suppress(AssertionError):
                wait_for(lambda: states() == want, timeout=30)
            assert states() == want
            assert all(a["status"]["inhibitedBy"] for a in manager.alerts() if a["status"]["state"] == "suppressed")
            with contextlib.suppress(AssertionError):
                wait_for(lambda: notified() == NOTIFIED, timeout=30)
            time.sleep(3)  # three group intervals: a muted alert notified late would show by now
            assert notified() == NOTIFIED
            assert len(stub.notified) == len(NOTIFIED)  # each once
        finally:
            prom.stop()
    finally:
        manager.stop()
        stub.stop()
