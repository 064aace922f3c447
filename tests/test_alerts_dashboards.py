"""Alert rules and dashboards: generated files current, promtool checks and unit tests, every
expression parses and uses only metrics a real scrape has, alerts fire in a real Prometheus, and
every dashboard query reads the same with one replica scraped as with two."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import alerts.__main__ as alerts_gen
import dashboards.__main__ as dashboards_gen
from alerts.replicas import LABELS, by
from alerts.rules import RUNBOOK_BASE_URL, Marker, Thresholds, alerts, chart_rules, rules_file
from dashboards.build import Options as DashboardOptions
from demo.kueue import cluster_queue, install_kueue, resource_flavor
from demo.workloads import create, deployment_chain, node_summarizer, ok, owner_ref, workload_summarizer
from kubeindex.model.resources import NODES, PODS
from localkube.alertmanager import Alertmanager
from localkube.cluster import LocalCluster, Options
from localkube.prometheus import Prometheus
from localkube.service import Service, select, wait_for
from node_workload_summary import generated
from tests.alerting import RUNBOOKS, Stub, disrupt, replica_labels, runbooks_inhibit_rules
from tests.kube import create_node, create_pod, set_node_status, set_pod_phase
from tests.paths import CRDS, ROOT

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
                fold = rf"{re.escape(by(m.group(1)))} ?\((max_over_time\()?$"
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


# -- against a real scrape and a real Prometheus -------------------------------------------------


def gpu_pod(cluster: LocalCluster, name: str, node: str, owner: dict) -> None:
    """A Running pod requesting cpu, memory and a GPU, so every requested/allocatable panel has data."""
    requests = {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}
    create(cluster, PODS.path("default"), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [owner_ref(owner)]},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "x", "resources": {"requests": requests, "limits": requests}}]},
    })
    set_pod_phase(cluster, "default", name, "Running")


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """Groups a (2 nodes with GPUs; a-2 reports one of its 5 unhealthy) and b (3: b-1 being
    disrupted by Karpenter, b-3 cordoned); Deployment web with 2 Running pods (web-2 on b-1) and 1
    Pending; one pod of no workload. Kueue: flavor a (group a's nodes), 24 cpu and 8 GPUs of quota;
    ClusterResourceClaim a on it, over-allocated (a dry run: the quota is not written)."""
    with LocalCluster(Options(), binaries) as c:
        c.install_crds(CRDS)
        install_kueue(c)
        resource_flavor(c, "a", {"pool": "a"})
        cluster_queue(c, "team", {"a": {"cpu": "24", "nvidia.com/gpu": "8"}})
        c.kubectl("apply", "-f", "-", input=json.dumps({  # asks 10 of flavor a's 8 GPUs: a shortfall of 2
            "apiVersion": "ux.sean.example.com/v1alpha1", "kind": "ClusterResourceClaim", "metadata": {"name": "a"},
            "spec": {"flavor": "a", "resourceAssignments": [
                {"clusterQueueName": "team", "resources": {"cpu": "8", "nvidia.com/gpu": "10"}}]}}))
        node_summarizer(c, "pool", "pool")
        workload_summarizer(c, "apps", [("apps", "Deployment")])
        gpu = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}
        for name, pool in (("a-1", "a"), ("a-2", "a"), ("b-1", "b"), ("b-2", "b")):
            create_node(c, name, {"pool": pool}, allocatable=gpu if pool == "a" else None)
        create_node(c, "b-3", {"pool": "b"}, unschedulable=True)
        disrupt(c, "b-1")
        ok(c.request(NODES.path(name="a-2", subresource="status"), "PATCH",
                     {"status": {"capacity": {"nvidia.com/gpu": "5"}}},
                     content_type="application/merge-patch+json"))  # the device plugin gave one up
        _, rs = deployment_chain(c, "default", "web")
        gpu_pod(c, "web-1", "a-1", rs)
        create_pod(c, "default", "web-2", node="b-1", owner=rs)
        create_pod(c, "default", "web-3", phase="Pending", owner=rs)
        create_pod(c, "default", "lonely", node="b-2")
        yield c


@pytest.fixture(scope="module")
def service(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--identity=a",)).start()
    wait_for(lambda: select(svc.scrape(), "nws_claim_shortfall"), timeout=20)  # the claim's status, written
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def replicas(kube: LocalCluster, service: Service) -> Iterator[list[Service]]:
    """Two replicas, as the shipped Deployment runs: both serve metrics, one holds the Lease."""
    other = Service(kube, ("--identity=b",)).start()
    yield [service, other]
    other.stop()


def test_each_folded_family_has_exactly_its_listed_labels(service: Service) -> None:
    """Folding by fewer labels than a family has would merge its series: check the list in
    alerts/replicas.py against a real scrape."""
    seen: dict[str, set[frozenset[str]]] = {}
    for name, labels in service.scrape():
        if name in LABELS:
            seen.setdefault(name, set()).add(frozenset(k for k, _ in labels))
    assert set(LABELS) - set(seen) <= {"nws_kind_not_served"}  # present only while a kind is missing
    for name, label_sets in seen.items():
        assert label_sets == {frozenset(LABELS[name])}, name


def test_every_metric_used_is_in_a_real_scrape(service: Service) -> None:
    code, text = service.get("/metrics")
    assert code == 200
    exposed = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
    exposed |= {n.removesuffix("_total") + "_total" for n in exposed}  # counters' sample names
    exposed |= {f"{n}_{suffix}" for n in re.findall(r"^# TYPE (\S+) histogram$", text, re.M)
                for suffix in ("bucket", "sum", "count")}  # histograms' sample names
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


def test_workload_on_unhealthy_nodes_fires_once_per_affected_workload(binaries: dict[str, Path],
                                                                       tmp_path: Path) -> None:
    """Group sick: sick-1 goes NotReady, sick-2 gets Karpenter's disruption taint. Deployment train
    has both its pods there (critical and warning), serve 1 of 3 (warning), web none (silent); two
    replicas scraped with their target labels: each alert fires once, and resolves on recovery."""
    with LocalCluster(Options(), binaries) as kube:
        kube.install_crds(CRDS)
        node_summarizer(kube, "pool", "pool")
        workload_summarizer(kube, "apps", [("apps", "Deployment")])
        for name, pool in (("sick-1", "sick"), ("sick-2", "sick"), ("well-1", "well"), ("well-2", "well")):
            create_node(kube, name, {"pool": pool})
        placement = {"train": ("sick-1", "sick-2"), "serve": ("sick-1", "well-1", "well-2"),
                     "web": ("well-1", "well-2")}
        for workload, nodes in placement.items():
            _, rs = deployment_chain(kube, "default", workload)
            for i, node in enumerate(nodes):
                create_pod(kube, "default", f"{workload}-{i}", node=node, owner=rs)
        services = [Service(kube, (f"--identity={i}",)).start() for i in ("a", "b")]
        rules = tmp_path / "rules.yaml"
        rules.write_text(yaml.safe_dump(rules_file(Thresholds(unhealthy_for="3s"))))
        targets = {f"127.0.0.1:{s.port}": replica_labels(str(i)) for i, s in enumerate(services)}
        prom = Prometheus(tmp_path / "prometheus", list(targets), [rules], target_labels=targets,
                          honor_labels=True).start()
        try:
            wait_for(lambda: len(prom.query('nws_workload_pods{workload="train", phase="Running"} == 2')) == 2,
                     timeout=60)

            def hurt() -> list[tuple[str, str]]:
                return sorted((a["labels"]["workload"], a["labels"]["severity"]) for a in prom.alerts()
                              if a["labels"]["alertname"] == "WorkloadOnUnhealthyNodes")

            assert hurt() == []
            set_node_status(kube, "sick-1", "False")
            disrupt(kube, "sick-2")
            want = [("serve", "warning"), ("train", "critical"), ("train", "warning")]
            wait_for(lambda: hurt() == want, timeout=60)
            time.sleep(3)  # a duplicate per replica would have shown by now
            assert hurt() == want
            alerts_now = [a for a in prom.alerts() if a["labels"]["alertname"] == "WorkloadOnUnhealthyNodes"]
            assert {a["annotations"]["description"] for a in alerts_now if a["labels"]["workload"] == "train"} == {
                "2 pods of Deployment default/train run on NotReady, Unknown or Disrupting nodes.",
                "2 pods of Deployment default/train run on NotReady, Unknown or Disrupting nodes: at least 50% of "
                "its pods."}
            assert all("pod" not in a["labels"] and "instance" not in a["labels"] for a in alerts_now)
            set_node_status(kube, "sick-1", "True")
            disrupt(kube, "sick-2", [])
            wait_for(lambda: hurt() == [], timeout=60)
        finally:
            prom.stop()
            for svc in services:
                svc.stop()


# -- every dashboard query with two replicas -------------------------------------------------------

# $cluster: the value Grafana gives a variable whose query finds none (these series carry no cluster label).
VARIABLES = {"$__rate_interval": "1m", "$top": "10", "$summarizer": "pool", "$group": "a", "$namespace": ".*",
             "$resource": "cpu", "$kind": ".*", "$job": "node-workload-summary", "$cluster": ""}
CLUSTER_DASHBOARDS = ("node-groups.json", "node-group-detail.json", "workloads.json")


def scraping(services: list[Service], workdir: Path) -> Prometheus:
    targets = {f"127.0.0.1:{s.port}": replica_labels(str(i)) for i, s in enumerate(services)}
    prom = Prometheus(workdir, list(targets), [], target_labels=targets, honor_labels=True).start()
    wait_for(lambda: len(prom.query("up == 1")) == len(services)
             and len(prom.query("nws_workloads")) == len(services)
             and prom.query("sum(nws_reconciler_leader) == 1"), timeout=60)
    return prom


def panels(dashboard: str) -> dict[str, list[str]]:
    """Panel title -> its queries, with the dashboard variables substituted."""
    def substitute(expr: str) -> str:
        for var, value in VARIABLES.items():
            expr = expr.replace(var, value)
        return expr

    data = json.loads(dashboards_gen.render()[dashboard])
    return {p["title"]: [substitute(t["expr"]) for t in p.get("targets", [])] for p in data["panels"]}


def result(prom: Prometheus, expr: str) -> dict[frozenset[tuple[str, str]], float]:
    return {frozenset(r["metric"].items()): float(r["value"][1]) for r in prom.query(expr)}


def stat(prom: Prometheus, dashboard: str, title: str) -> float:
    (query,) = panels(dashboard)[title]
    (value,) = result(prom, query).values()
    return value


def test_every_dashboard_query_reads_the_same_with_two_replicas(replicas: list[Service], tmp_path: Path) -> None:
    one, two = scraping(replicas[:1], tmp_path / "one"), scraping(replicas, tmp_path / "two")
    try:
        queries = [q for d in CLUSTER_DASHBOARDS for qs in panels(d).values() for q in qs]
        unanswered = []
        for query in queries:
            want = result(one, query)
            assert result(two, query) == want, query
            unanswered += [] if want else [query]
        assert unanswered == [], "every query has an answer here, so equality is not vacuous"
        truth = {
            ("node-groups.json", "Node groups"): 2, ("node-groups.json", "Nodes"): 5,
            ("node-groups.json", "Not ready nodes"): 0, ("node-groups.json", "Cordoned nodes"): 1,
            ("node-groups.json", "Running pods on groups"): 3, ("node-group-detail.json", "Nodes"): 2,
            ("workloads.json", "Workloads"): 1, ("workloads.json", "Pods in workloads"): 3,
            ("workloads.json", "Pending pods"): 1, ("workloads.json", "Pods without a workload"): 1,
            ("health.json", "Targets up"): 2, ("health.json", "Replicas holding the Lease"): 1,
            ("node-groups.json", "Unhealthy accelerators per group (capacity - allocatable)"): 1,
            ("node-group-detail.json", "Disrupting"): 0, ("node-group-detail.json", "Degraded"): 1,
            ("workloads.json", "Workloads on unhealthy nodes"): 1, ("workloads.json", "Pods on unhealthy nodes"): 1,
        }
        assert {key: stat(two, *key) for key in truth} == truth
        web = frozenset({("namespace", "default"), ("workload", "web"), ("kind", "Deployment")})
        # web-2 on the Disrupting b-1: pods there, in all not-Ready states, nodes not Ready, all pods
        # (and on group a's detail dashboard the nodes of a it uses).
        for dashboard, title, columns in (
                ("workloads.json", "Workloads hurt now: pods on nodes not Ready", [1, 1, 1, 3]),
                ("node-group-detail.json", "Workloads on this group hurt now", [1, 1, 1, 3, 1])):
            assert [result(two, q) for q in panels(dashboard)[title]] == [{web: v} for v in columns], title
        by_state = result(two, panels("node-groups.json")["Nodes by state (all selected groups)"][0])
        assert {dict(k)["state"]: v for k, v in by_state.items()} == {
            "Ready": 2, "NotReady": 0, "Unknown": 0, "Disrupting": 1, "Cordoned": 1, "Degraded": 1}
        kueue = panels("node-groups.json")
        (ratio,) = next(qs for title, qs in kueue.items() if title.startswith("Kueue: nominal quota / Ready"))
        assert {(dict(k)["flavor"], dict(k)["resource"]): v for k, v in result(two, ratio).items()} == {
            ("a", "cpu"): 1.5, ("a", "nvidia.com/gpu"): 1.0}
        absolute = kueue["Kueue: nominal quota, allocatable (all, Ready) and requested per flavor ($resource)"]
        assert [{dict(k)["flavor"]: v for k, v in result(two, q).items()} for q in absolute] == [
            {"a": 16}, {"a": 16}, {"a": 24}, {"a": 1}]  # cpu: allocatable, of Ready nodes, quota, requested
        for query in (q for qs in panels("health.json").values() for q in qs):
            two.query(query)  # per-replica panels: every query evaluates
    finally:
        one.stop()
        two.stop()


# -- beside kubernetes-mixin: docs/runbooks.md's inhibition in a real Alertmanager -----------------


# Stand-ins for kubernetes-mixin's three alerts: their names, severity and labels, over series shaped
# as kube-state-metrics' (simpler expressions: no owner join, no cordon check).
MIXIN_STAND_INS = [
    {"alert": "KubeNodeNotReady", "expr": 'kube_node_status_condition{condition="Ready", status="true"} == 0'},
    {"alert": "KubePodNotReady",
     "expr": 'sum by (cluster, namespace, pod) (kube_pod_status_phase{phase=~"Pending|Unknown"}) > 0'},
    {"alert": "KubeJobFailed", "expr": 'kube_job_failed{condition="true"} > 0'},
]

# Cluster a: node group gpu down (2 of 2 nodes NotReady) and cpu partly (1 of 4); JobSet ml/train with
# both its Running pods on gpu's nodes and one Failed pod; Pending pods in namespaces ml and web, failed
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
    ("KubeNodeNotReady", "warning", "a", "gpu-1"), ("KubeNodeNotReady", "warning", "a", "gpu-2"),
    ("KubeNodeNotReady", "warning", "a", "cpu-4"),  # cluster a's node groups alert
    ("KubePodNotReady", "warning", "a", "train-workers-0-0"),  # a workload of namespace ml alerts
    ("KubeJobFailed", "warning", "a", "train-workers-0"),
}
NOTIFIED = {
    ("NodeGroupDown", "critical", "a", "gpu"), ("NodeGroupNotReady", "warning", "a", "cpu"),
    ("WorkloadOnUnhealthyNodes", "critical", "a", "train"), ("WorkloadPodsFailed", "warning", "a", "train"),
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
    fast = Thresholds(not_ready_for="0s", down_for="0s", unhealthy_for="0s", failed_for="0s")
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
