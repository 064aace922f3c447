"""The Helm chart (charts/node-workload-summary): `helm lint`; by default it renders exactly what
`kubectl kustomize deploy/` does (and deploy/with-monitoring/ with the monitoring toggles on),
object by object; every value changes exactly what it says; every variant passes a server-side
dry run; and after a real `helm install` on the local control plane the service works as the
chart's ServiceAccount."""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from alerts.rules import Thresholds, alerts, rules_file
from demo.workloads import kwok_node
from localkube.build import HELM, KUBERNETES_CONTROLLERS, KWOK, PROMETHEUS_OPERATOR, ensure_binaries
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, wait_for
from tests.kube import token_kubeconfig
from tests.paths import CRDS, ROOT

CHART = ROOT / "charts" / "node-workload-summary"
DEPLOY = ROOT / "deploy"
NS = "node-workload-summary"
RELEASE = "node-workload-summary"
# Helm needs a release namespace that exists before it stores the release, so the chart leaves the
# Namespace to `helm install --create-namespace`: the one object kustomize renders and Helm does not.
NAMESPACE_KEY = ("Namespace", "", NS)

# The first test here may build helm (about 3 minutes cold on 2 idle cores, far longer under load):
# more room than the suite's 600 s; every command below has its own timeout.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800),
              pytest.mark.needs(HELM, PROMETHEUS_OPERATOR, KUBERNETES_CONTROLLERS, KWOK)]

Key = tuple[str, str, str]  # kind, namespace ("" for cluster-scoped), name
Objects = dict[Key, dict[str, Any]]
Change = Callable[[dict[str, Any]], None]  # what a value does to the default Deployment

MONITORING = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}


def _summarizer_values() -> dict[str, Any]:
    """deploy/summarizers.yaml as chart values."""
    values: dict[str, Any] = {"nodeSummarizers": {}, "workloadSummarizers": {}}
    for doc in yaml.safe_load_all((DEPLOY / "summarizers.yaml").read_text()):
        key = "nodeSummarizers" if doc["kind"] == "NodeSummarizer" else "workloadSummarizers"
        values[key][doc["metadata"]["name"]] = doc["spec"]
    return values


EXTRA_OWNERS = [{"apiGroups": ["kubeflow.org"], "resources": ["notebooks", "pytorchjobs"]},
                {"apiGroups": ["example.com"], "resources": ["trainers"]}]
RESOURCES = {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "4Gi"}}
EXTRA_ENV = [{"name": "NWS_MAX_OWNER_DEPTH", "value": "12"}]
TOLERATIONS = [{"key": "dedicated", "operator": "Equal", "value": "monitoring", "effect": "NoSchedule"}]
AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}
CERT_SECRET = "nws-metrics-tls"
SM_AUTHORIZATION = {"credentials": {"name": "prometheus-token", "key": "token"}}
SM_TLS = {"ca": {"secret": {"name": CERT_SECRET, "key": "ca.crt"}},
          "serverName": "node-workload-summary.node-workload-summary.svc"}
DASHBOARDS = {"label": "my_dashboard", "labelValue": "yes", "namespace": "monitoring",
              "annotations": {"grafana_folder": "Kubernetes"}}

FLEET_READER = {"kind": "ServiceAccount", "name": "multikueue-sa", "namespace": "kueue-system"}


def _tuned(value: Any) -> Any:
    """A setting away from its default, one that Helm and Python print alike."""
    return "42m" if isinstance(value, str) else round(value * 2 + 0.05, 2) if isinstance(value, float) else value * 2


# The alert rules' values (prometheusRule.runbookBaseUrl, .disabled, .overrides, .additionalRuleLabels).
RUNBOOK_BASE = "https://wiki.example.com/platform/node-workload-summary/runbooks"
EVERY_SETTING = {alert: {key: _tuned(v) for key, v in settings.items()}
                 for alert, settings in Thresholds().settings().items()}
RULE_VALUES: dict[str, Any] = {
    "runbookBaseUrl": RUNBOOK_BASE, "disabled": {"NodeGroupShrunk": True, "KueueCapacityUnassigned": True},
    "overrides": EVERY_SETTING, "additionalRuleLabels": {"team": "platform", "tier": "cluster"}}
# Every value away from its default at once (lint and the server-side dry run).
ALL_FLIPPED: dict[str, Any] = {
    "image": {"repository": "registry.example.com/nws", "tag": "9.9.9", "pullPolicy": "Always"},
    "replicas": 3, "resources": RESOURCES, "extraArgs": ["--max-owner-depth=12"], "extraEnv": EXTRA_ENV,
    "logFormat": "text",
    "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": TOLERATIONS, "affinity": AFFINITY,
    "priorityClassName": "system-cluster-critical",
    **_summarizer_values(),
    "rbac": {"extraOwnerKinds": EXTRA_OWNERS},
    "metrics": {"secure": True, "certSecret": CERT_SECRET},  # secure: false is checked on its own
    "networkPolicy": {"enabled": True, "metricsNamespaceLabels": {"team": "observability"}},
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus-stack"},
                       "bearerTokenFile": "/var/run/secrets/prometheus/token", "authorization": SM_AUTHORIZATION,
                       "tlsConfig": SM_TLS},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, **RULE_VALUES},
    "dashboards": DASHBOARDS,
    "quota": {"actuation": True},
    # The Secrets' namespace: one the dry run finds (the release's).
    "fleet": {"hub": True, "namespace": NS, "memberGrace": 120, "hubReaders": [FLEET_READER]},
}
QUOTA = {"quota": {"actuation": True}}


def _run(cmd: list[str], input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
    return proc


def _values_file(tmp_path: Path, values: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]
    path = tmp_path / f"values-{digest}.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


def _objects(text: str) -> Objects:
    objects: Objects = {}
    for doc in yaml.safe_load_all(text):
        if doc:
            key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
            assert key not in objects, f"rendered twice: {key}"
            objects[key] = doc
    return objects


def _template_text(helm: list[str], tmp_path: Path, values: dict[str, Any] | None = None) -> str:
    args = ["-f", _values_file(tmp_path, values)] if values else []
    return _run([*helm, "template", RELEASE, str(CHART), "--namespace", NS, "--include-crds", *args]).stdout


def _template(helm: list[str], tmp_path: Path, values: dict[str, Any] | None = None) -> Objects:
    return _objects(_template_text(helm, tmp_path, values))


def _kustomize(binaries: dict[str, Path], path: Path) -> Objects:
    return _objects(_run([str(binaries["kubectl"]), "kustomize", str(path)]).stdout)


def _diff(a: Objects, b: Objects) -> str:
    lines = [f"only in kustomize: {k}" for k in sorted(a.keys() - b.keys())]
    lines += [f"only in helm: {k}" for k in sorted(b.keys() - a.keys())]
    for k in sorted(a.keys() & b.keys()):
        if a[k] != b[k]:
            lines.append(f"differs: {k}\n  kustomize: {json.dumps(a[k], sort_keys=True)[:1500]}"
                         f"\n  helm:      {json.dumps(b[k], sort_keys=True)[:1500]}")
    return "\n".join(lines)


def test_lint(helm: list[str], tmp_path: Path) -> None:
    _run([*helm, "lint", "--strict", str(CHART)])
    _run([*helm, "lint", "--strict", str(CHART), "-f", _values_file(tmp_path, ALL_FLIPPED)])


@pytest.mark.parametrize("values,path", [({}, DEPLOY), (MONITORING, DEPLOY / "with-monitoring"),
                                         (QUOTA, DEPLOY / "with-quota-actuation")],
                         ids=["default=deploy", "monitoring=deploy/with-monitoring",
                              "quota=deploy/with-quota-actuation"])
def test_template_equals_kustomize(helm: list[str], binaries: dict[str, Path], tmp_path: Path,
                                   values: dict[str, Any], path: Path) -> None:
    kustomized = _kustomize(binaries, path)
    assert kustomized.pop(NAMESPACE_KEY)
    rendered = _template(helm, tmp_path, values)
    assert rendered == kustomized, _diff(kustomized, rendered)


def test_chart_crds_are_the_projects() -> None:
    # Rendered by deploy/render.py (its stale check runs in tests/test_deploy.py); this says why.
    chart = {p.name: list(yaml.safe_load_all(p.read_text())) for p in (CHART / "crds").glob("*.yaml")}
    project = {p.name: list(yaml.safe_load_all(p.read_text())) for p in CRDS.glob("*.yaml")}
    assert chart == project


def test_summarizers_equal_the_samples(helm: list[str], tmp_path: Path) -> None:
    rendered = _template(helm, tmp_path, _summarizer_values())
    default = _template(helm, tmp_path)
    samples = _objects((DEPLOY / "summarizers.yaml").read_text())
    assert {k: v for k, v in rendered.items() if k not in default} == samples
    assert {k: v for k, v in rendered.items() if k in default} == default


def _deployment(objects: Objects) -> dict[str, Any]:
    return copy.deepcopy(objects[("Deployment", NS, RELEASE)])


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    return deployment["spec"]["template"]["spec"]["containers"][0]


def _pod_value(key: str, value: Any) -> Change:
    def change(d: dict[str, Any]) -> None:
        d["spec"]["template"]["spec"][key] = value
    return change


def _container_value(key: str, value: Any) -> Change:
    def change(d: dict[str, Any]) -> None:
        _container(d)[key] = value
    return change


def _container_list(key: str, extra: list[Any]) -> Change:
    def change(d: dict[str, Any]) -> None:
        _container(d)[key] += extra
    return change


def _log_format(log_format: str) -> Change:
    def change(d: dict[str, Any]) -> None:
        args = _container(d)["args"]
        args[args.index("--log-format=json")] = f"--log-format={log_format}"
    return change


def _cert_secret(d: dict[str, Any]) -> None:
    tls = "/etc/node-workload-summary/tls"
    _container(d)["args"] += [f"--metrics-cert-file={tls}/tls.crt", f"--metrics-key-file={tls}/tls.key"]
    _container(d)["volumeMounts"] = [{"name": "metrics-tls", "mountPath": tls, "readOnly": True}]
    d["spec"]["template"]["spec"]["volumes"] = [{"name": "metrics-tls", "secret": {"secretName": CERT_SECRET}}]


# (values, how the default Deployment must change): nothing else may change.
DEPLOYMENT_VALUES: dict[str, tuple[dict[str, Any], list[Change]]] = {
    "metrics.certSecret": ({"metrics": {"secure": True, "certSecret": CERT_SECRET}}, [_cert_secret]),
    "image": ({"image": {"repository": "registry.example.com/nws", "tag": "9.9.9", "pullPolicy": "Always"}},
              [_container_value("image", "registry.example.com/nws:9.9.9"),
               _container_value("imagePullPolicy", "Always")]),
    "replicas": ({"replicas": 3}, [lambda d: d["spec"].update(replicas=3)]),
    "resources": ({"resources": RESOURCES}, [_container_value("resources", RESOURCES)]),
    "extraArgs": ({"extraArgs": ["--max-owner-depth=12", "--no-exporter"]},
                  [_container_list("args", ["--max-owner-depth=12", "--no-exporter"])]),
    "extraEnv": ({"extraEnv": EXTRA_ENV}, [_container_list("env", EXTRA_ENV)]),
    "logFormat": ({"logFormat": "text"}, [_log_format("text")]),
    "nodeSelector": ({"nodeSelector": {"kubernetes.io/os": "linux"}},
                     [_pod_value("nodeSelector", {"kubernetes.io/os": "linux"})]),
    "tolerations": ({"tolerations": TOLERATIONS}, [_pod_value("tolerations", TOLERATIONS)]),
    "affinity": ({"affinity": AFFINITY}, [_pod_value("affinity", AFFINITY)]),
    "priorityClassName": ({"priorityClassName": "system-cluster-critical"},
                          [_pod_value("priorityClassName", "system-cluster-critical")]),
}


@pytest.mark.parametrize("name", DEPLOYMENT_VALUES)
def test_deployment_values_change_only_the_deployment(helm: list[str], tmp_path: Path, name: str) -> None:
    values, changes = DEPLOYMENT_VALUES[name]
    default, rendered = _template(helm, tmp_path), _template(helm, tmp_path, values)
    expected = _deployment(default)
    for change in changes:
        change(expected)
    assert _deployment(rendered) == expected
    del default[("Deployment", NS, RELEASE)], rendered[("Deployment", NS, RELEASE)]
    assert rendered == default


def _added(helm: list[str], tmp_path: Path, values: dict[str, Any], base: dict[str, Any] | None = None) -> Objects:
    """What ``values`` adds to the render of ``base``, asserting it removes and changes nothing."""
    before, after = _template(helm, tmp_path, base), _template(helm, tmp_path, {**(base or {}), **values})
    assert before.keys() <= after.keys() and all(after[k] == v for k, v in before.items()), _diff(before, after)
    return {k: v for k, v in after.items() if k not in before}


def test_service_monitor_toggle(helm: list[str], tmp_path: Path) -> None:
    added = _added(helm, tmp_path, {"serviceMonitor": {"enabled": True}})
    assert list(added) == [("ServiceMonitor", NS, RELEASE)]
    service = _template(helm, tmp_path)[("Service", NS, RELEASE)]
    spec = added[("ServiceMonitor", NS, RELEASE)]["spec"]
    # The ServiceMonitor finds the Service by its labels and scrapes it by its port name.
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in spec["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]


def test_service_monitor_labels_and_interval(helm: list[str], tmp_path: Path) -> None:
    on = {"serviceMonitor": {"enabled": True}}
    default = _template(helm, tmp_path, on)
    rendered = _template(helm, tmp_path, {"serviceMonitor": {
        "enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus-stack"}}})
    key = ("ServiceMonitor", NS, RELEASE)
    expected = copy.deepcopy(default[key])
    expected["metadata"]["labels"]["release"] = "kube-prometheus-stack"
    expected["spec"]["endpoints"][0]["interval"] = "15s"
    assert rendered.pop(key) == expected
    default.pop(key)
    assert rendered == default


def test_metrics_secure_off(helm: list[str], tmp_path: Path) -> None:
    """Plain HTTP: no --metrics-secure, no review grants, a plain ServiceMonitor; the probes stay apart."""
    on = {"serviceMonitor": {"enabled": True}}
    default, rendered = _template(helm, tmp_path, on), _template(helm, tmp_path, {
        **on, "metrics": {"secure": False, "certSecret": CERT_SECRET}})  # no Secret without secure
    deployment, role = ("Deployment", NS, RELEASE), ("ClusterRole", "", RELEASE)
    monitor = ("ServiceMonitor", NS, RELEASE)
    expected = _deployment(default)
    _container(expected)["args"].remove("--metrics-secure")
    assert rendered.pop(deployment) == expected
    reviews = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
               {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]
    assert rendered.pop(role)["rules"] == [r for r in default[role]["rules"] if r not in reviews]
    [endpoint] = rendered.pop(monitor)["spec"]["endpoints"]
    [secure] = default[monitor]["spec"]["endpoints"]
    assert endpoint == {k: v for k, v in secure.items() if k not in ("scheme", "bearerTokenFile", "tlsConfig")}
    for key in (deployment, role, monitor):
        del default[key]
    assert rendered == default


def test_service_monitor_authorization_and_tls(helm: list[str], tmp_path: Path) -> None:
    on = {"serviceMonitor": {"enabled": True}}
    default = _template(helm, tmp_path, on)
    rendered = _template(helm, tmp_path, {"serviceMonitor": {
        "enabled": True, "authorization": SM_AUTHORIZATION, "tlsConfig": SM_TLS}})
    key = ("ServiceMonitor", NS, RELEASE)
    expected = copy.deepcopy(default[key])
    [endpoint] = expected["spec"]["endpoints"]
    del endpoint["bearerTokenFile"]
    endpoint.update(authorization=SM_AUTHORIZATION, tlsConfig=SM_TLS)
    assert rendered.pop(key) == expected
    default.pop(key)
    assert rendered == default


def test_network_policy_toggle_and_labels(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    key = ("NetworkPolicy", NS, RELEASE)
    off = _template(helm, tmp_path, {"networkPolicy": {"enabled": False}})
    assert off == {k: v for k, v in default.items() if k != key}
    labelled = _template(helm, tmp_path, {"networkPolicy": {"metricsNamespaceLabels": {"team": "observability"}}})
    expected = copy.deepcopy(default[key])
    expected["spec"]["ingress"][0]["from"] = [{"namespaceSelector": {"matchLabels": {"team": "observability"}}}]
    assert labelled.pop(key) == expected
    default.pop(key)
    assert labelled == default


def test_prometheus_rule_toggle_and_labels(helm: list[str], tmp_path: Path) -> None:
    added = _added(helm, tmp_path, {"prometheusRule": {"enabled": True}})
    assert list(added) == [("PrometheusRule", NS, RELEASE)]
    rule = added[("PrometheusRule", NS, RELEASE)]
    generated = yaml.safe_load((DEPLOY / "with-monitoring" / "generated" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == generated["spec"]
    assert "{{ $labels.group }}" in json.dumps(rule["spec"])  # not read as a Helm template
    labelled = _template(helm, tmp_path, {"prometheusRule": {"enabled": True, "labels": {"release": "kps"}}})
    expected = copy.deepcopy(rule)
    expected["metadata"]["labels"]["release"] = "kps"
    assert labelled[("PrometheusRule", NS, RELEASE)] == expected


# -- the alert rules: prometheusRule.runbookBaseUrl, .disabled, .overrides, .additionalRuleLabels -----

RULE = ("PrometheusRule", NS, RELEASE)
ON = {"prometheusRule": {"enabled": True}}


def _rules(rendered: Objects) -> list[dict[str, Any]]:
    [group] = rendered[RULE]["spec"]["groups"]
    rules: list[dict[str, Any]] = group["rules"]
    return rules


def test_prometheus_rule_defaults_are_the_generated_rules(helm: list[str], tmp_path: Path) -> None:
    """The chart's copy is alerts/rules.py's rules with the default values: no drift."""
    spec = _template(helm, tmp_path, ON)[RULE]["spec"]
    assert spec == rules_file()
    assert spec == yaml.safe_load((ROOT / "alerts" / "generated" / "node-workload-summary.rules.yaml").read_text())


# name: (values under prometheusRule, what alerts.rules renders for them, the alerts whose rules change)
TUNINGS: dict[str, tuple[dict[str, Any], dict[str, Any], set[str]]] = {
    "runbookBaseUrl": ({"runbookBaseUrl": RUNBOOK_BASE}, rules_file(runbook_base_url=RUNBOOK_BASE),
                       {a.name for a in alerts()}),
    "disabled": ({"disabled": {"NodeGroupShrunk": True, "WorkloadOnUnhealthyNodes": True, "NodeGroupDown": False}},
                 rules_file(disabled=["NodeGroupShrunk", "WorkloadOnUnhealthyNodes"]), set()),
    "overrides": ({"overrides": {"NodeGroupNotReady": {"for": "15m", "fraction": 0.35},
                                 "WorkloadOnUnhealthyNodes": {"criticalFraction": 0.75}}},
                  rules_file(Thresholds().with_overrides({"NodeGroupNotReady": {"for": "15m", "fraction": 0.35},
                                                          "WorkloadOnUnhealthyNodes": {"criticalFraction": 0.75}})),
                  {"NodeGroupNotReady", "WorkloadOnUnhealthyNodes"}),
    "every-setting": ({"overrides": EVERY_SETTING}, rules_file(Thresholds().with_overrides(EVERY_SETTING)),
                      {a.name for a in alerts()}),
    "additionalRuleLabels": ({"additionalRuleLabels": {"team": "platform"}},
                             rules_file(additional_labels={"team": "platform"}), {a.name for a in alerts()}),
    "all": (RULE_VALUES, rules_file(Thresholds().with_overrides(EVERY_SETTING), RUNBOOK_BASE,
                                    list(RULE_VALUES["disabled"]), RULE_VALUES["additionalRuleLabels"]),
            {a.name for a in alerts()} - set(RULE_VALUES["disabled"])),
}


@pytest.mark.parametrize("name", TUNINGS)
def test_prometheus_rule_values_change_exactly_what_was_asked(helm: list[str], tmp_path: Path, name: str) -> None:
    values, expected, changed = TUNINGS[name]
    default = _template(helm, tmp_path, ON)
    rendered = _template(helm, tmp_path, {"prometheusRule": {"enabled": True, **values}})
    assert rendered[RULE]["spec"] == expected  # what alerts/rules.py renders for the same settings
    by_name = {r["alert"]: [x for x in _rules(default) if x["alert"] == r["alert"]] for r in _rules(default)}
    kept = {r["alert"] for r in _rules(rendered)}
    assert {a for a in kept if [r for r in _rules(rendered) if r["alert"] == a] != by_name[a]} == changed
    left_out = set(by_name) - kept
    assert left_out == {a for a, on in values.get("disabled", {}).items() if on}
    # Nothing else changes: the PrometheusRule's metadata, every other object.
    assert {**rendered[RULE], "spec": None} == {**default[RULE], "spec": None}
    assert {k: v for k, v in rendered.items() if k != RULE} == {k: v for k, v in default.items() if k != RULE}


@pytest.mark.parametrize("values,message", [
    ({"disabled": {"NodeGroupNotRedy": True}}, "prometheusRule.disabled.NodeGroupNotRedy: no such alert (Cluster"),
    ({"overrides": {"NodeGroupNotRedy": {"for": "1m"}}}, "prometheusRule.overrides.NodeGroupNotRedy: no such alert"),
    ({"overrides": {"NodeGroupNotReady": {"fractoin": 0.3}}},
     "prometheusRule.overrides.NodeGroupNotReady.fractoin: no such setting (for, fraction)"),
    ({"additionalRuleLabels": {"severity": "page"}}, "prometheusRule.additionalRuleLabels.severity: "),
    ({"runbookBaseUrl": ""}, "prometheusRule.runbookBaseUrl: "),
], ids=["disabled", "overrides-alert", "overrides-setting", "labels-severity", "no-runbook-base"])
def test_prometheus_rule_refuses_what_matches_nothing(helm: list[str], tmp_path: Path, values: dict[str, Any],
                                                      message: str) -> None:
    """A typo in an alert's or setting's name fails the render instead of being ignored."""
    proc = subprocess.run([*helm, "template", RELEASE, str(CHART), "--namespace", NS, "-f",
                           _values_file(tmp_path, {"prometheusRule": {"enabled": True, **values}})],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.parametrize("values", [{}, RULE_VALUES], ids=["default", "tuned"])
def test_rendered_prometheus_rule_passes_promtool(helm: list[str], tmp_path: Path, values: dict[str, Any]) -> None:
    rules = _template(helm, tmp_path, {"prometheusRule": {"enabled": True, **values}})[RULE]["spec"]
    path = tmp_path / "rendered.rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    expected = len(alerts()) - len(values.get("disabled", {}))
    assert proc.returncode == 0 and f"SUCCESS: {expected} rules found" in proc.stdout, proc.stdout + proc.stderr


def _dashboards(objects: Objects) -> Objects:
    return {k: v for k, v in objects.items() if k[0] == "ConfigMap" and "-dashboard-" in k[2]}


def test_dashboards_toggle(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    dashboards = _dashboards(default)
    assert len(dashboards) == len(list((ROOT / "dashboards" / "generated").glob("*.json"))) >= 4
    for cm in dashboards.values():
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = cm["data"].values()
        assert json.loads(text)["panels"] and "{{" in text  # legends reach Grafana untouched
    off = _template(helm, tmp_path, {"dashboards": {"enabled": False}})
    assert off == {k: v for k, v in default.items() if k not in dashboards}


def test_dashboards_label_namespace_and_annotations(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    rendered = _template(helm, tmp_path, {"dashboards": DASHBOARDS})
    expected: Objects = {}
    for (kind, _, name), cm in _dashboards(default).items():
        cm = copy.deepcopy(cm)
        del cm["metadata"]["labels"]["grafana_dashboard"]
        cm["metadata"]["labels"]["my_dashboard"] = "yes"
        cm["metadata"]["namespace"] = "monitoring"
        cm["metadata"]["annotations"] = {"grafana_folder": "Kubernetes"}
        expected[(kind, "monitoring", name)] = cm
    assert _dashboards(rendered) == expected
    assert {k: v for k, v in rendered.items() if k not in expected} == \
        {k: v for k, v in default.items() if k not in _dashboards(default)}


def test_extra_owner_kinds_extend_only_the_cluster_role(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    rendered = _template(helm, tmp_path, {"rbac": {"extraOwnerKinds": EXTRA_OWNERS}})
    key = ("ClusterRole", "", RELEASE)
    old, new = default.pop(key)["rules"], rendered.pop(key)["rules"]
    assert [r for r in new if r not in old] == [{**kind, "verbs": ["list", "watch"]} for kind in EXTRA_OWNERS]
    assert [r for r in new if r in old] == old
    assert rendered == default


def test_quota_actuation_sets_the_flag_and_grants_patch_on_clusterqueues(helm: list[str], tmp_path: Path) -> None:
    default, rendered = _template(helm, tmp_path), _template(helm, tmp_path, QUOTA)
    key = ("ClusterRole", "", RELEASE)
    old, new = default.pop(key)["rules"], rendered.pop(key)["rules"]
    assert new == [*old, {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["patch"]}]
    assert not [r for r in old if "clusterqueues" in r["resources"] and "patch" in r["verbs"]]
    expected = _deployment(default)
    _container_list("args", ["--quota-actuation=on"])(expected)
    assert _deployment(rendered) == expected
    del default[("Deployment", NS, RELEASE)], rendered[("Deployment", NS, RELEASE)]
    assert rendered == default


def test_fleet_hub_sets_the_flags_and_grants_what_the_hub_reads(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    rendered = _template(helm, tmp_path, {"fleet": {"hub": True, "namespace": "kueue", "memberGrace": 60}})
    key = ("ClusterRole", "", RELEASE)
    old, new = default.pop(key)["rules"], rendered.pop(key)["rules"]
    assert new == [*old,
                   {"apiGroups": ["kueue.x-k8s.io"], "resources": ["multikueueclusters"], "verbs": ["list", "watch"]},
                   {"apiGroups": ["ux.sean.example.com"], "resources": ["clusterresourceclaims"], "verbs": ["create"]}]
    role = rendered.pop(("Role", "kueue", f"{RELEASE}-fleet"))
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    binding = rendered.pop(("RoleBinding", "kueue", f"{RELEASE}-fleet"))
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NS}]
    expected = _deployment(default)
    _container_list("args", ["--fleet", "--fleet-namespace=kueue", "--member-grace=60"])(expected)
    assert _deployment(rendered) == expected
    del default[("Deployment", NS, RELEASE)], rendered[("Deployment", NS, RELEASE)]
    assert rendered == default


def test_fleet_hub_readers_may_list_and_watch_summaries_and_flavors_only(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    rendered = _template(helm, tmp_path, {"fleet": {"hubReaders": [FLEET_READER]}})
    role = rendered.pop(("ClusterRole", "", f"{RELEASE}-fleet-reader"))
    assert role["rules"] == [
        {"apiGroups": ["ux.sean.example.com"], "resources": ["nodesummaries"], "verbs": ["list", "watch"]},
        {"apiGroups": ["kueue.x-k8s.io"], "resources": ["resourceflavors"], "verbs": ["list", "watch"]}]
    binding = rendered.pop(("ClusterRoleBinding", "", f"{RELEASE}-fleet-reader"))
    assert binding["subjects"] == [FLEET_READER] and binding["roleRef"]["name"] == f"{RELEASE}-fleet-reader"
    assert rendered == default


def test_every_value_is_tested() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) == set(ALL_FLIPPED)


# -- on the local control plane ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A fresh cluster: no CRDs, as a user's cluster before `helm install`."""
    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True), binaries) as c:
        yield c


@pytest.fixture(scope="module")
def installed(helm: list[str], kube: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`helm install` with the sample summarizers; returns its output."""
    assert kube.kubectl("get", "crd", "-o", "name").stdout == ""
    values = _values_file(tmp_path_factory.mktemp("values"), _summarizer_values())
    return _run([*helm, "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace",
                 "-f", values, f"--kubeconfig={kube.kubeconfig}"]).stdout


def test_helm_install_creates_everything(kube: LocalCluster, installed: str, helm: list[str],
                                         tmp_path: Path) -> None:
    assert "STATUS: deployed" in installed, installed
    crds = set(kube.kubectl("get", "crd", "-o", "name").stdout.split())
    assert crds == {f"customresourcedefinition.apiextensions.k8s.io/{p.stem}.ux.sean.example.com"
                    for p in CRDS.glob("*.yaml")}
    for (kind, namespace, name) in _template(helm, tmp_path, _summarizer_values()):
        if kind != "CustomResourceDefinition":
            scope = ["-n", namespace] if namespace else []
            kube.kubectl("get", kind, name, *scope, "-o", "name")


@pytest.fixture(scope="module")
def as_service_account(kube: LocalCluster, installed: str) -> Iterator[Service]:
    """The real service process, started locally with a token of the chart's ServiceAccount."""
    sa_kubeconfig = token_kubeconfig(kube, RELEASE, NS, "chart-sa")
    for pool in ("cpu", "gpu"):
        for i in range(2):
            kwok_node(kube, f"{pool}-{i}", pool, {"cpu": "8", "memory": "32Gi", "pods": "110"})
    kube.kubectl("create", "deployment", "web", "--image=nginx", "--replicas=2")
    svc = Service(kube, (f"--kubeconfig={sa_kubeconfig}", f"--lease-namespace={NS}"))
    svc.start()
    yield svc
    svc.stop()


def test_service_works_as_the_charts_service_account(kube: LocalCluster, as_service_account: Service) -> None:
    def names(plural: str) -> set[str]:
        return set(kube.kubectl("get", plural, "-A", "-o", "jsonpath={.items[*].metadata.name}").stdout.split())

    try:
        wait_for(lambda: {"nodepool-cpu", "nodepool-gpu"} <= names("nodesummaries"), timeout=30)
        # The user's Deployment, and the chart's own (its pods run on the KWOK nodes).
        wait_for(lambda: {"web", RELEASE} <= names("workloadsummaries"), timeout=30)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{as_service_account.log_text()[-3000:]}") from None
    holder = kube.kubectl("get", "lease", RELEASE, "-n", NS, "-o", "jsonpath={.spec.holderIdentity}").stdout
    assert holder
    log = as_service_account.log_text()
    assert " 403" not in log and "Forbidden" not in log, log


@pytest.fixture(scope="module")
def monitoring_crds(kube: LocalCluster, installed: str) -> None:
    kube.install_crds(ensure_binaries((PROMETHEUS_OPERATOR,))["monitoring-crds.yaml"])  # as tests/test_deploy.py does
    kube.kubectl("create", "namespace", "monitoring")


@pytest.mark.parametrize("values", [{}, MONITORING, ALL_FLIPPED], ids=["default", "monitoring", "all-flipped"])
def test_server_side_dry_run(kube: LocalCluster, helm: list[str], tmp_path: Path, monitoring_crds: None,
                             values: dict[str, Any]) -> None:
    rendered = _template_text(helm, tmp_path, values)
    proc = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == len(_objects(rendered)), proc.stdout


def test_helm_upgrade_turns_monitoring_on(kube: LocalCluster, helm: list[str], monitoring_crds: None) -> None:
    _run([*helm, "upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values",
          "--set", "serviceMonitor.enabled=true,prometheusRule.enabled=true", f"--kubeconfig={kube.kubeconfig}"])
    names = kube.kubectl("get", "servicemonitor,prometheusrule", "-n", NS, "-o", "name").stdout.split()
    assert sorted(names) == ["prometheusrule.monitoring.coreos.com/node-workload-summary",
                             "servicemonitor.monitoring.coreos.com/node-workload-summary"], names


def test_notes_say_what_to_set_when_the_image_names_no_registry(helm: list[str], tmp_path: Path) -> None:
    def notes(values: dict[str, Any] | None = None) -> str:
        args = ["-f", _values_file(tmp_path, values)] if values else []
        return _run([*helm, "install", RELEASE, str(CHART), "--namespace", NS, "--dry-run=client", *args]).stdout

    assert 'WARNING: image.repository is "node-workload-summary", a name no registry serves' in notes()
    assert "set image.repository" in notes()
    assert "WARNING" not in notes({"image": {"repository": "registry.example.com/nws"}})
