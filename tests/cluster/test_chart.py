"""The Helm chart (charts/node-workload-summary): `helm lint`; by default it renders what `kubectl
kustomize deploy/` does (and deploy/with-monitoring/ with the monitoring toggles on), object by
object, less what only a Helm release has (its labels, the `helm test` hook); every value changes
exactly what it says; values.schema.json rejects a misspelt key; README.md and the schema are
generated from values.yaml; every variant passes a server-side dry run. On the local control plane:
a real `helm install`, after which the service works as the chart's ServiceAccount, the commands
NOTES.txt prints work, the `helm test` check passes against the service, the NetworkPolicy admits
the Prometheus Operator's Prometheus pods, the operator scrapes as the ServiceMonitor's fields say,
and a CRD field added by a newer chart reaches the cluster in the documented order."""

from __future__ import annotations

import base64
import copy
import gzip
import hashlib
import importlib.util
import json
import shlex
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from alerts.rules import Thresholds, alerts, rules_file
from demo.workloads import kwok_node
from deploy import chart_values
from localkube.build import COMPAT_MINORS, HELM, KUBERNETES_CONTROLLERS, KWOK, PROMETHEUS_OPERATOR, ensure_binaries
from localkube.cluster import LocalCluster, Options, free_port
from localkube.prometheus import start_operator
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
CHART_META = yaml.safe_load((CHART / "Chart.yaml").read_text())
VERSION = CHART_META["version"]
# deploy/'s image until a user sets their own: a name no registry serves (deploy/kustomization.yaml).
[KUSTOMIZE_IMAGE] = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())["images"]

# The first test here may build helm (about 3 minutes cold on 2 idle cores, far longer under load):
# more room than the suite's 600 s; every command below has its own timeout.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800),
              pytest.mark.needs(HELM, PROMETHEUS_OPERATOR, KUBERNETES_CONTROLLERS, KWOK)]

Key = tuple[str, str, str]  # kind, namespace ("" for cluster-scoped), name
Objects = dict[Key, dict[str, Any]]
Change = Callable[[dict[str, Any]], None]  # what a value does to the default Deployment (or test Pod)

MONITORING = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}
# What only a Helm release carries: these labels on what the chart templates, and its hooks.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/managed-by")
DEPLOYMENT = ("Deployment", NS, RELEASE)
TEST_POD = ("Pod", NS, f"{RELEASE}-test")
TEST_ACCOUNT = ("ServiceAccount", NS, f"{RELEASE}-test")
TEST_BINDING = ("ClusterRoleBinding", "", f"{RELEASE}-test")
TEST_OBJECTS = (TEST_ACCOUNT, TEST_BINDING, TEST_POD)
RBAC_KINDS = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


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
SM_RELABELINGS = [{"action": "replace", "targetLabel": "cluster", "replacement": "prod-eu"}]
SM_METRIC_RELABELINGS = [{"action": "drop", "sourceLabels": ["__name__"], "regex": "nws_pods_owner_chain_broken"}]
SM_FIELDS = {"scrapeTimeout": "10s", "sampleLimit": 50000, "relabelings": SM_RELABELINGS,
             "metricRelabelings": SM_METRIC_RELABELINGS}
DASHBOARDS = {"label": "my_dashboard", "labelValue": "yes", "namespace": "monitoring",
              "annotations": {"grafana_folder": "Kubernetes"}}
COMMON_LABELS = {"team": "platform", "cost-center": "k8s-42"}
POD_ANNOTATIONS = {"example.com/scrape-note": "via ServiceMonitor"}
PULL_SECRETS = [{"name": "my-registry"}]
SPREAD = [{"maxSkew": 2, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule"},
          {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
           "labelSelector": {"matchLabels": {"team": "platform"}}}]
ENV_FROM = [{"configMapRef": {"name": "nws-settings"}}]
EXTRA_VOLUMES = [{"name": "scratch", "emptyDir": {"sizeLimit": "64Mi"}}]
EXTRA_MOUNTS = [{"name": "scratch", "mountPath": "/scratch"}]
# OpenShift's restricted-v2 picks the UID: the IDs removed, the rest kept (Helm deletes null keys).
OPENSHIFT = {"runAsUser": None, "runAsGroup": None}

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
# Every value away from its default at once (lint and the server-side dry run), but for those in
# NOT_FLIPPED, which would render less and are checked on their own.
ALL_FLIPPED: dict[str, Any] = {
    "image": {"repository": "registry.example.com/nws", "tag": "9.9.9", "pullPolicy": "Always"},
    "replicas": 3, "resources": RESOURCES, "extraArgs": ["--max-owner-depth=12"], "extraEnv": EXTRA_ENV,
    "logFormat": "text",
    "nodeSelector": {"kubernetes.io/os": "linux"}, "tolerations": TOLERATIONS, "affinity": AFFINITY,
    "priorityClassName": "system-cluster-critical",
    **_summarizer_values(),
    "rbac": {"create": True, "extraOwnerKinds": EXTRA_OWNERS},
    "metrics": {"secure": True, "certSecret": CERT_SECRET},
    "networkPolicy": {"enabled": True, "metricsNamespaceLabels": {"team": "observability"},
                      "prometheusOperator": False},
    # The ServiceMonitor in a namespace the dry run finds, away from the Service's.
    "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus-stack"},
                       "bearerTokenFile": "/var/run/secrets/prometheus/token", "authorization": SM_AUTHORIZATION,
                       "tlsConfig": SM_TLS, "namespace": "monitoring", "scrapeClass": "sa-token", **SM_FIELDS},
    "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}, **RULE_VALUES},
    "dashboards": DASHBOARDS,
    "quota": {"actuation": True},
    "karpenter": {"events": True},
    # The Secrets' namespace: one the dry run finds (the release's).
    "fleet": {"hub": True, "namespace": NS, "memberGrace": 120, "hubReaders": [FLEET_READER]},
    "commonLabels": COMMON_LABELS, "podAnnotations": POD_ANNOTATIONS, "podLabels": {"tier": "ml"},
    "imagePullSecrets": PULL_SECRETS, "revisionHistoryLimit": 3, "topologySpreadConstraints": SPREAD,
    "podDisruptionBudget": {"enabled": True, "maxUnavailable": "50%"},
    "serviceAccount": {"create": True, "name": "nws", "annotations": {"iam.gke.io/gcp-service-account": "x@y"}},
    "securityContext": OPENSHIFT, "containerSecurityContext": {"readOnlyRootFilesystem": False},
    "livenessProbe": {"periodSeconds": 20}, "readinessProbe": {"timeoutSeconds": 3},
    "startupProbe": {"failureThreshold": 120},
    "envFrom": ENV_FROM, "extraVolumes": EXTRA_VOLUMES, "extraVolumeMounts": EXTRA_MOUNTS,
    "tests": {"enabled": True},
}
# value: the test that changes it (each must exist below).
NOT_FLIPPED = {
    "metrics.secure": "test_metrics_secure_off",
    "networkPolicy.enabled": "test_network_policy_toggle_and_labels",
    "rbac.create": "test_rbac_create_off_renders_no_rbac",
    "serviceAccount.create": "test_service_account_values",
    "podDisruptionBudget.enabled": "test_pod_disruption_budget_values",
    # One or the other: kubectl apply over the installed budget would keep both (the API server
    # refuses that), so minAvailable has a dry run of its own.
    "podDisruptionBudget.minAvailable": "test_min_available_budget_passes_a_server_side_dry_run",
    "tests.enabled": "test_helm_test_hook",
    "dashboards.enabled": "test_dashboards_toggle",
}
QUOTA = {"quota": {"actuation": True}}
KARPENTER_EVENTS = {"karpenter": {"events": True}}


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


def _template_text(helm: list[str], tmp_path: Path, values: dict[str, Any] | None = None,
                   chart: Path = CHART) -> str:
    args = ["-f", _values_file(tmp_path, values)] if values else []
    return _run([*helm, "template", RELEASE, str(chart), "--namespace", NS, "--include-crds", *args]).stdout


def _template(helm: list[str], tmp_path: Path, values: dict[str, Any] | None = None) -> Objects:
    return _objects(_template_text(helm, tmp_path, values))


def _kustomize(binaries: dict[str, Path], path: Path) -> Objects:
    return _objects(_run([str(binaries["kubectl"]), "kustomize", str(path)]).stdout)


def _is_hook(doc: dict[str, Any]) -> bool:
    return "helm.sh/hook" in (doc["metadata"].get("annotations") or {})


def _label_maps(doc: dict[str, Any]) -> list[dict[str, str]]:
    """The object's labels and its pod template's."""
    maps = [doc["metadata"].get("labels") or {}]
    template = doc.get("spec", {}).get("template") if isinstance(doc.get("spec"), dict) else None
    if template:
        maps.append(template["metadata"]["labels"])
    return maps


def _without_helm_metadata(objects: Objects) -> Objects:
    """The objects as kustomize renders them: no hooks, no Helm-only labels."""
    out: Objects = {}
    for key, doc in objects.items():
        if _is_hook(doc):
            continue
        doc = copy.deepcopy(doc)
        for labels in _label_maps(doc):
            for name in HELM_ONLY_LABELS:
                labels.pop(name, None)
        out[key] = doc
    return out


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
                                         (QUOTA, DEPLOY / "with-quota-actuation"),
                                         (KARPENTER_EVENTS, DEPLOY / "with-karpenter-events")],
                         ids=["default=deploy", "monitoring=deploy/with-monitoring",
                              "quota=deploy/with-quota-actuation", "karpenter=deploy/with-karpenter-events"])
def test_template_equals_kustomize(helm: list[str], binaries: dict[str, Path], tmp_path: Path,
                                   values: dict[str, Any], path: Path) -> None:
    kustomized = _kustomize(binaries, path)
    assert kustomized.pop(NAMESPACE_KEY)
    # Each names the image a user must build and push: the chart image.repository, kustomize images:.
    rendered = _template(helm, tmp_path, {**values, "image": {"repository": KUSTOMIZE_IMAGE["newName"]}})
    # Only metadata is ignored: the hooks and the Helm-only labels are checked below, one by one.
    assert {k for k, v in rendered.items() if _is_hook(v)} == set(TEST_OBJECTS)
    assert all(set(HELM_ONLY_LABELS) <= labels.keys() for k, v in rendered.items() if k[0] != "CustomResourceDefinition"
               for labels in _label_maps(v))
    rendered = _without_helm_metadata(rendered)
    assert rendered == kustomized, _diff(kustomized, rendered)


def _standard(component: str, helm_only: bool = True, name: str = RELEASE) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": name, "app.kubernetes.io/component": component,
              "app.kubernetes.io/part-of": RELEASE, "app.kubernetes.io/version": CHART_META["appVersion"]}
    if helm_only:
        labels |= {"helm.sh/chart": f"{RELEASE}-{VERSION}", "app.kubernetes.io/instance": RELEASE,
                   "app.kubernetes.io/managed-by": "Helm"}
    return labels


def _component(key: Key) -> str:
    kind, _, name = key
    if kind == "CustomResourceDefinition":
        return "crds"
    if key in TEST_OBJECTS:
        return "test"
    if kind == "ConfigMap" and "-dashboard-" in name:
        return "dashboards"
    if kind == "PrometheusRule":
        return "alert-rules"
    if kind in ("NodeSummarizer", "WorkloadSummarizer"):
        return "summarizers"
    return "controller"


def test_every_object_carries_the_standard_labels_and_common_labels(helm: list[str], tmp_path: Path) -> None:
    # commonLabels add to the standard labels and never replace one (the name selects the pods).
    common = {**COMMON_LABELS, "app.kubernetes.io/name": "not-ours"}
    rendered = _template(helm, tmp_path, {**ALL_FLIPPED, "commonLabels": common})
    assert {"CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "Deployment", "Service", "NetworkPolicy", "PodDisruptionBudget", "ConfigMap", "ServiceMonitor",
            "PrometheusRule", "NodeSummarizer", "WorkloadSummarizer", "Pod"} <= {k[0] for k in rendered}
    for key, doc in rendered.items():
        if key[0] == "CustomResourceDefinition":  # installed from crds/ as they are: no release labels
            assert doc["metadata"]["labels"] == _standard("crds", helm_only=False), key
            continue
        name = f"{RELEASE}-test" if key in TEST_OBJECTS else RELEASE
        expected = _standard(_component(key), name=name) | COMMON_LABELS
        for labels in _label_maps(doc):
            assert labels.items() >= expected.items(), (key, labels)
            assert labels["app.kubernetes.io/name"] == name, key
    # The pods' selector is the name alone, as in every version before (a Deployment's selector is
    # immutable), and the test pod is not one of them.
    deployment = rendered[("Deployment", NS, RELEASE)]
    assert deployment["spec"]["selector"] == {"matchLabels": {"app.kubernetes.io/name": RELEASE}}
    assert rendered[("Service", NS, RELEASE)]["spec"]["selector"] == {"app.kubernetes.io/name": RELEASE}


def test_chart_crds_are_the_projects_with_the_standard_labels() -> None:
    # Rendered by deploy/render.py (its stale check runs in tests/cluster/test_deploy.py); this says why.
    def crds(directory: Path, labels: dict[str, str] | None) -> dict[str, list[dict[str, Any]]]:
        out = {}
        for path in directory.glob("*.yaml"):
            docs = list(yaml.safe_load_all(path.read_text()))
            for doc in docs:
                assert doc["metadata"].pop("labels", None) == labels, path
            out[path.name] = docs
        return out

    assert crds(CHART / "crds", _standard("crds", helm_only=False)) == crds(CRDS, None)


def _without_labels(objects: Objects) -> Objects:
    out = copy.deepcopy(objects)
    for doc in out.values():
        doc["metadata"].pop("labels", None)
    return out


def test_summarizers_equal_the_samples(helm: list[str], tmp_path: Path) -> None:
    rendered = _template(helm, tmp_path, _summarizer_values())
    default = _template(helm, tmp_path)
    samples = _objects((DEPLOY / "summarizers.yaml").read_text())
    assert _without_labels({k: v for k, v in rendered.items() if k not in default}) == samples
    assert {k: v for k, v in rendered.items() if k in default} == default


def _deployment(objects: Objects, key: Key = DEPLOYMENT) -> dict[str, Any]:
    return copy.deepcopy(objects[key])


def _pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """A Deployment's pod spec, or a Pod's."""
    return obj["spec"]["template"]["spec"] if obj["kind"] == "Deployment" else obj["spec"]


def _container(obj: dict[str, Any]) -> dict[str, Any]:
    return _pod_spec(obj)["containers"][0]


def _pod_value(key: str, value: Any) -> Change:
    def change(d: dict[str, Any]) -> None:
        _pod_spec(d)[key] = value
    return change


def _container_value(key: str, value: Any) -> Change:
    def change(d: dict[str, Any]) -> None:
        _container(d)[key] = value
    return change


def _container_merge(key: str, value: dict[str, Any]) -> Change:
    def change(d: dict[str, Any]) -> None:
        _container(d)[key] = {**_container(d)[key], **value}
    return change


def _container_list(key: str, extra: list[Any]) -> Change:
    def change(d: dict[str, Any]) -> None:
        _container(d)[key] = _container(d).get(key, []) + extra
    return change


def _log_format(log_format: str) -> Change:
    def change(d: dict[str, Any]) -> None:
        args = _container(d)["args"]
        args[args.index("--log-format=json")] = f"--log-format={log_format}"
    return change


def _template_metadata(key: str, value: dict[str, str]) -> Change:
    def change(d: dict[str, Any]) -> None:
        metadata = d["spec"]["template"]["metadata"]
        metadata[key] = {**metadata.get(key, {}), **value}
    return change


def _security_context_without_ids(d: dict[str, Any]) -> None:
    context = _pod_spec(d)["securityContext"]
    del context["runAsUser"], context["runAsGroup"]


def _cert_secret(d: dict[str, Any]) -> None:
    tls = "/etc/node-workload-summary/tls"
    _container(d)["args"] += [f"--metrics-cert-file={tls}/tls.crt", f"--metrics-key-file={tls}/tls.key"]
    _container(d)["volumeMounts"] = [{"name": "metrics-tls", "mountPath": tls, "readOnly": True}]
    d["spec"]["template"]["spec"]["volumes"] = [{"name": "metrics-tls", "secret": {"secretName": CERT_SECRET}}]


def _spread(d: dict[str, Any]) -> None:
    # The first constraint has no labelSelector: the chart's pods are what it spreads.
    first, second = copy.deepcopy(SPREAD)
    first["labelSelector"] = {"matchLabels": {"app.kubernetes.io/name": RELEASE}}
    _pod_spec(d)["topologySpreadConstraints"] = [first, second]


# (values, how the default Deployment must change, how the default test Pod must change): nothing
# else may change.
DEPLOYMENT_VALUES: dict[str, tuple[dict[str, Any], list[Change], list[Change]]] = {
    "metrics.certSecret": ({"metrics": {"secure": True, "certSecret": CERT_SECRET}}, [_cert_secret], []),
    "image": ({"image": {"repository": "registry.example.com/nws", "tag": "9.9.9", "pullPolicy": "Always"}},
              [_container_value("image", "registry.example.com/nws:9.9.9"),
               _container_value("imagePullPolicy", "Always")],
              [_container_value("image", "registry.example.com/nws:9.9.9"),
               _container_value("imagePullPolicy", "Always")]),
    "replicas": ({"replicas": 3}, [lambda d: d["spec"].update(replicas=3)], []),
    "resources": ({"resources": RESOURCES}, [_container_value("resources", RESOURCES)], []),
    "extraArgs": ({"extraArgs": ["--max-owner-depth=12", "--no-exporter"]},
                  [_container_list("args", ["--max-owner-depth=12", "--no-exporter"])], []),
    "extraEnv": ({"extraEnv": EXTRA_ENV}, [_container_list("env", EXTRA_ENV)], []),
    "logFormat": ({"logFormat": "text"}, [_log_format("text")], []),
    "nodeSelector": ({"nodeSelector": {"kubernetes.io/os": "linux"}},
                     [_pod_value("nodeSelector", {"kubernetes.io/os": "linux"})],
                     [_pod_value("nodeSelector", {"kubernetes.io/os": "linux"})]),
    "tolerations": ({"tolerations": TOLERATIONS}, [_pod_value("tolerations", TOLERATIONS)],
                    [_pod_value("tolerations", TOLERATIONS)]),
    "affinity": ({"affinity": AFFINITY}, [_pod_value("affinity", AFFINITY)], []),
    "priorityClassName": ({"priorityClassName": "system-cluster-critical"},
                          [_pod_value("priorityClassName", "system-cluster-critical")], []),
    "podAnnotations": ({"podAnnotations": POD_ANNOTATIONS}, [_template_metadata("annotations", POD_ANNOTATIONS)], []),
    # Added to the pods' labels; the name that selects them stays.
    "podLabels": ({"podLabels": {"team": "ml", "app.kubernetes.io/name": "other"}},
                  [_template_metadata("labels", {"team": "ml"})], []),
    "imagePullSecrets": ({"imagePullSecrets": PULL_SECRETS}, [_pod_value("imagePullSecrets", PULL_SECRETS)],
                         [_pod_value("imagePullSecrets", PULL_SECRETS)]),
    "revisionHistoryLimit": ({"revisionHistoryLimit": 3}, [lambda d: d["spec"].update(revisionHistoryLimit=3)], []),
    "topologySpreadConstraints": ({"topologySpreadConstraints": SPREAD}, [_spread], []),
    "topologySpreadConstraints=[]": ({"topologySpreadConstraints": []},
                                     [lambda d: _pod_spec(d).pop("topologySpreadConstraints")], []),
    "securityContext": ({"securityContext": OPENSHIFT}, [_security_context_without_ids],
                        [_security_context_without_ids]),
    "containerSecurityContext": ({"containerSecurityContext": {"readOnlyRootFilesystem": False}},
                                 [_container_merge("securityContext", {"readOnlyRootFilesystem": False})],
                                 [_container_merge("securityContext", {"readOnlyRootFilesystem": False})]),
    "probes": ({"livenessProbe": {"periodSeconds": 20}, "readinessProbe": {"timeoutSeconds": 3},
                "startupProbe": {"failureThreshold": 120}},
               [_container_merge("livenessProbe", {"periodSeconds": 20}),
                _container_merge("readinessProbe", {"timeoutSeconds": 3}),
                _container_merge("startupProbe", {"failureThreshold": 120})], []),
    "envFrom": ({"envFrom": ENV_FROM}, [_container_value("envFrom", ENV_FROM)], []),
    "extraVolumes": ({"extraVolumes": EXTRA_VOLUMES, "extraVolumeMounts": EXTRA_MOUNTS},
                     [_pod_value("volumes", EXTRA_VOLUMES), _container_value("volumeMounts", EXTRA_MOUNTS)], []),
    "extraVolumes+certSecret": ({"extraVolumes": EXTRA_VOLUMES, "extraVolumeMounts": EXTRA_MOUNTS,
                                 "metrics": {"secure": True, "certSecret": CERT_SECRET}},
                                [_cert_secret, lambda d: _pod_spec(d)["volumes"].extend(EXTRA_VOLUMES),
                                 _container_list("volumeMounts", EXTRA_MOUNTS)], []),
}


@pytest.mark.parametrize("name", DEPLOYMENT_VALUES)
def test_deployment_values_change_only_the_deployment(helm: list[str], tmp_path: Path, name: str) -> None:
    values, changes, test_pod_changes = DEPLOYMENT_VALUES[name]
    default, rendered = _template(helm, tmp_path), _template(helm, tmp_path, values)
    for key, key_changes in ((DEPLOYMENT, changes), (TEST_POD, test_pod_changes)):
        expected = _deployment(default, key)
        for change in key_changes:
            change(expected)
        assert _deployment(rendered, key) == expected, key
        del default[key], rendered[key]
    assert rendered == default


def _added(helm: list[str], tmp_path: Path, values: dict[str, Any], base: dict[str, Any] | None = None) -> Objects:
    """What ``values`` adds to the render of ``base``, asserting it removes and changes nothing."""
    before, after = _template(helm, tmp_path, base), _template(helm, tmp_path, {**(base or {}), **values})
    assert before.keys() <= after.keys() and all(after[k] == v for k, v in before.items()), _diff(before, after)
    return {k: v for k, v in after.items() if k not in before}


def _removed(helm: list[str], tmp_path: Path, values: dict[str, Any]) -> set[Key]:
    """What ``values`` removes from the default render, asserting it adds and changes nothing else."""
    before, after = _template(helm, tmp_path), _template(helm, tmp_path, values)
    assert after.keys() <= before.keys() and all(before[k] == v for k, v in after.items()), _diff(before, after)
    return before.keys() - after.keys()


def test_service_monitor_toggle(helm: list[str], tmp_path: Path) -> None:
    added = _added(helm, tmp_path, {"serviceMonitor": {"enabled": True}})
    assert list(added) == [("ServiceMonitor", NS, RELEASE)]
    service = _template(helm, tmp_path)[("Service", NS, RELEASE)]
    spec = added[("ServiceMonitor", NS, RELEASE)]["spec"]
    # The ServiceMonitor finds the Service by its labels and scrapes its metrics port by name.
    assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in spec["endpoints"]] == ["metrics"]
    assert "metrics" in [p["name"] for p in service["spec"]["ports"]]
    assert "namespaceSelector" not in spec and "scrapeClass" not in spec


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


def test_service_monitor_fields_namespace_and_scrape_class(helm: list[str], tmp_path: Path) -> None:
    on = {"serviceMonitor": {"enabled": True}}
    default = _template(helm, tmp_path, on)
    key = ("ServiceMonitor", NS, RELEASE)
    rendered = _template(helm, tmp_path, {"serviceMonitor": {
        "enabled": True, "namespace": "monitoring", "scrapeClass": "sa-token", **SM_FIELDS}})
    moved = rendered.pop(("ServiceMonitor", "monitoring", RELEASE))
    expected = copy.deepcopy(default.pop(key))
    expected["metadata"]["namespace"] = "monitoring"
    # From another namespace it selects the Service in the release's; the scrape class brings the
    # token (no bearerTokenFile), the certificate check stays.
    expected["spec"] |= {"namespaceSelector": {"matchNames": [NS]}, "scrapeClass": "sa-token", "sampleLimit": 50000}
    [endpoint] = expected["spec"]["endpoints"]
    del endpoint["bearerTokenFile"]
    endpoint |= {"scrapeTimeout": "10s", "relabelings": SM_RELABELINGS, "metricRelabelings": SM_METRIC_RELABELINGS}
    assert moved == expected
    assert rendered == default
    # The release's own namespace named: as the default.
    same = _template(helm, tmp_path, {"serviceMonitor": {"enabled": True, "namespace": NS}})
    assert same[key] == _template(helm, tmp_path, on)[key]


def test_metrics_secure_off(helm: list[str], tmp_path: Path) -> None:
    """Plain HTTP: no --metrics-secure, no review grants, a plain ServiceMonitor, a test pod without
    a token; the probes stay apart."""
    on = {"serviceMonitor": {"enabled": True}}
    default, rendered = _template(helm, tmp_path, on), _template(helm, tmp_path, {
        **on, "metrics": {"secure": False, "certSecret": CERT_SECRET}})  # no Secret without secure
    role, monitor = ("ClusterRole", "", RELEASE), ("ServiceMonitor", NS, RELEASE)
    expected = _deployment(default)
    _container(expected)["args"].remove("--metrics-secure")
    assert rendered.pop(DEPLOYMENT) == expected
    reviews = [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
               {"apiGroups": ["authorization.k8s.io"], "resources": ["subjectaccessreviews"], "verbs": ["create"]}]
    assert rendered.pop(role)["rules"] == [r for r in default[role]["rules"] if r not in reviews]
    [endpoint] = rendered.pop(monitor)["spec"]["endpoints"]
    [secure] = default[monitor]["spec"]["endpoints"]
    assert endpoint == {k: v for k, v in secure.items() if k not in ("scheme", "bearerTokenFile", "tlsConfig")}
    # The test pod reads /metrics over plain HTTP with no token, so it needs no binding.
    assert TEST_BINDING not in rendered
    test_pod = _deployment(default, TEST_POD)
    env = {e["name"]: e for e in _container(test_pod)["env"]}
    env["SECURE"]["value"] = "false"
    env["METRICS_URL"]["value"] = env["METRICS_URL"]["value"].replace("https://", "http://")
    assert rendered.pop(TEST_POD) == test_pod
    for key in (DEPLOYMENT, role, monitor, TEST_BINDING, TEST_POD):
        del default[key]
    assert rendered == default


def test_service_monitor_authorization_and_tls(helm: list[str], tmp_path: Path) -> None:
    on = {"serviceMonitor": {"enabled": True}}
    default = _template(helm, tmp_path, on)
    # authorization wins over a scrape class too.
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


def _policy_peers(objects: Objects) -> list[dict[str, Any]]:
    return objects[("NetworkPolicy", NS, RELEASE)]["spec"]["ingress"][0]["from"]


OPERATOR_PEER = {"namespaceSelector": {}, "podSelector": {
    "matchLabels": {"app.kubernetes.io/managed-by": "prometheus-operator"},
    "matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                          "values": ["prometheus", "prometheus-agent"]}]}}
TEST_PEER = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": f"{RELEASE}-test"}}}


def test_network_policy_toggle_and_labels(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    key = ("NetworkPolicy", NS, RELEASE)
    assert _policy_peers(default) == [OPERATOR_PEER, {"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}},
                                      TEST_PEER]
    assert default[key]["spec"]["ingress"][1] == {"ports": [{"port": "probes", "protocol": "TCP"}]}  # anyone
    assert _removed(helm, tmp_path, {"networkPolicy": {"enabled": False}}) == {key}
    for values, peers in (({"metricsNamespaceLabels": {"team": "observability"}},
                           [OPERATOR_PEER, {"namespaceSelector": {"matchLabels": {"team": "observability"}}},
                            TEST_PEER]),
                          ({"prometheusOperator": False},
                           [{"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}}, TEST_PEER])):
        changed = _template(helm, tmp_path, {"networkPolicy": values})
        expected = copy.deepcopy(default[key])
        expected["spec"]["ingress"][0]["from"] = peers
        assert changed.pop(key) == expected
        assert changed == {k: v for k, v in default.items() if k != key}


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
    """The chart's copy is alerts/rules.py's rules with the default values: no drift. No
    runbookBaseUrl by default: no runbook_url, each rule's runbook annotation names its section."""
    spec = _template(helm, tmp_path, ON)[RULE]["spec"]
    assert spec == rules_file()
    assert all(set(r["annotations"]) == {"summary", "description", "runbook"} for r in spec["groups"][0]["rules"])
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
], ids=["disabled", "overrides-alert", "overrides-setting", "labels-severity"])
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
    assert _removed(helm, tmp_path, {"dashboards": {"enabled": False}}) == dashboards.keys()


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


def test_rbac_create_off_renders_no_rbac(helm: list[str], tmp_path: Path) -> None:
    for values in ({}, {"fleet": {"hub": True, "hubReaders": [FLEET_READER]}}):
        default = _template(helm, tmp_path, values)
        off = _template(helm, tmp_path, {**values, "rbac": {"create": False}})
        rbac = {k for k, v in default.items() if k[0] in RBAC_KINDS and not _is_hook(v)}
        assert len(rbac) >= (5 if not values else 9)
        assert off == {k: v for k, v in default.items() if k not in rbac}


def test_service_account_values(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    account = ("ServiceAccount", NS, RELEASE)
    assert _removed(helm, tmp_path, {"serviceAccount": {"create": False}}) == {account}
    annotations = {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/nws"}
    annotated = _template(helm, tmp_path, {"serviceAccount": {"annotations": annotations}})
    assert annotated.pop(account)["metadata"]["annotations"] == annotations
    assert annotated == {k: v for k, v in default.items() if k != account}
    # Another name: the ServiceAccount, the pods and every binding's subject follow.
    renamed = _template(helm, tmp_path, {"serviceAccount": {"name": "nws"}})
    expected = copy.deepcopy(default)
    sa = expected.pop(account)
    sa["metadata"]["name"] = "nws"
    expected[("ServiceAccount", NS, "nws")] = sa
    _pod_spec(expected[DEPLOYMENT])["serviceAccountName"] = "nws"
    bindings = [k for k in expected if k[0] in ("ClusterRoleBinding", "RoleBinding") and k != TEST_BINDING]
    assert len(bindings) == 2
    for key in bindings:
        [subject] = expected[key]["subjects"]
        subject["name"] = "nws"
    assert renamed == expected
    # Not created, under another name: the pods run as that existing account.
    existing = _template(helm, tmp_path, {"serviceAccount": {"create": False, "name": "nws"}})
    assert existing == {k: v for k, v in renamed.items() if k != ("ServiceAccount", NS, "nws")}


def test_pod_disruption_budget_values(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path)
    key = ("PodDisruptionBudget", NS, RELEASE)
    assert default[key]["spec"] == {"maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
                                    "selector": {"matchLabels": {"app.kubernetes.io/name": RELEASE}}}
    assert default[key]["spec"]["selector"]["matchLabels"] == default[DEPLOYMENT]["spec"]["selector"]["matchLabels"]
    assert _removed(helm, tmp_path, {"podDisruptionBudget": {"enabled": False}}) == {key}
    for values, spec in (({"maxUnavailable": "50%"}, {"maxUnavailable": "50%"}),
                         ({"minAvailable": 1}, {"minAvailable": 1})):  # minAvailable replaces maxUnavailable
        changed = _template(helm, tmp_path, {"podDisruptionBudget": values})
        expected = copy.deepcopy(default[key])
        del expected["spec"]["maxUnavailable"]
        expected["spec"] |= spec
        assert changed.pop(key) == expected
        assert changed == {k: v for k, v in default.items() if k != key}


def test_common_labels_go_on_every_templated_object_and_the_pods(helm: list[str], tmp_path: Path) -> None:
    default = _template(helm, tmp_path, MONITORING | _summarizer_values())
    labelled = _template(helm, tmp_path, MONITORING | _summarizer_values() | {"commonLabels": COMMON_LABELS})
    expected = copy.deepcopy(default)
    for key, doc in expected.items():
        if key[0] != "CustomResourceDefinition":
            for labels in _label_maps(doc):
                labels |= COMMON_LABELS
    assert labelled == expected


def test_quota_actuation_sets_the_flag_and_grants_patch_on_clusterqueues(helm: list[str], tmp_path: Path) -> None:
    default, rendered = _template(helm, tmp_path), _template(helm, tmp_path, QUOTA)
    key = ("ClusterRole", "", RELEASE)
    old, new = default.pop(key)["rules"], rendered.pop(key)["rules"]
    assert new == [*old, {"apiGroups": ["kueue.x-k8s.io"], "resources": ["clusterqueues"], "verbs": ["patch"]}]
    assert not [r for r in old if "clusterqueues" in r["resources"] and "patch" in r["verbs"]]
    # The writes' Events, on the (cluster-scoped) claims: in `default`, where client-go records them.
    role = rendered.pop(("Role", "default", f"{RELEASE}-events"))
    assert role["rules"] == [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    binding = rendered.pop(("RoleBinding", "default", f"{RELEASE}-events"))
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"{RELEASE}-events"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NS}]
    assert not [k for k, v in default.items() if k[0] in RBAC_KINDS and "events" in json.dumps(v.get("rules", []))]
    expected = _deployment(default)
    _container_list("args", ["--quota-actuation=on"])(expected)
    assert _deployment(rendered) == expected
    del default[DEPLOYMENT], rendered[DEPLOYMENT]
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
    del default[DEPLOYMENT], rendered[DEPLOYMENT]
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


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_helm_test_hook(helm: list[str], tmp_path: Path) -> None:
    """The `helm test` objects: hooks that run files/helm-test.py in the service's image with a
    ServiceAccount allowed to get /metrics, against the Service's ports, admitted by the
    NetworkPolicy and picked by no selector of the service's; tests.enabled: false removes them."""
    rendered = _template(helm, tmp_path)
    for key in TEST_OBJECTS:
        annotations = rendered[key]["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "test", key
        assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded", key
    # The ServiceAccount and its binding first (a lower weight), then the pod.
    assert int(rendered[TEST_ACCOUNT]["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    assert int(rendered[TEST_BINDING]["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    assert "helm.sh/hook-weight" not in rendered[TEST_POD]["metadata"]["annotations"]
    binding = rendered[TEST_BINDING]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": f"{RELEASE}-metrics-reader"}
    assert ("ClusterRole", "", f"{RELEASE}-metrics-reader") in rendered
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-test", "namespace": NS}]
    pod = rendered[TEST_POD]
    assert pod["spec"]["serviceAccountName"] == f"{RELEASE}-test" and pod["spec"]["restartPolicy"] == "Never"
    container = _container(pod)
    deployment = _container(rendered[DEPLOYMENT])
    assert container["image"] == deployment["image"]
    assert container["command"] == ["python", "-c", (CHART / "files" / "helm-test.py").read_text()]
    assert container["securityContext"] == deployment["securityContext"]
    assert pod["spec"]["securityContext"] == _pod_spec(rendered[DEPLOYMENT])["securityContext"]
    env = {e["name"]: e["value"] for e in container["env"]}
    service = rendered[("Service", NS, RELEASE)]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    # The kubelet's service variables (expanded in `env`), named as it names them: the Service's
    # name and its ports' names, upper case, `-` as `_`.
    assert set(ports) == {"probes", "metrics"}
    svc = RELEASE.upper().replace("-", "_")
    host = f"$({svc}_SERVICE_HOST)"
    assert pod["spec"]["enableServiceLinks"] is True
    assert env == {"READYZ_URL": f"http://{host}:$({svc}_SERVICE_PORT_PROBES)/readyz",
                   "METRICS_URL": f"https://{host}:$({svc}_SERVICE_PORT_METRICS)/metrics", "SECURE": "true",
                   "TOKEN_FILE": "/var/run/secrets/kubernetes.io/serviceaccount/token"}
    # The Service's probes port is the pods' (so /readyz through it is theirs).
    target = {p["name"]: p["targetPort"] for p in service["spec"]["ports"]}
    assert target == {"metrics": "metrics", "probes": "probes"}
    labels = pod["metadata"]["labels"]
    assert not _selects(service["spec"]["selector"], labels)  # never one of the Service's endpoints
    assert not _selects(rendered[("PodDisruptionBudget", NS, RELEASE)]["spec"]["selector"]["matchLabels"], labels)
    policy = rendered[("NetworkPolicy", NS, RELEASE)]["spec"]
    assert not _selects(policy["podSelector"]["matchLabels"], labels)
    assert any(set(peer) == {"podSelector"} and _selects(peer["podSelector"]["matchLabels"], labels)
               for peer in _policy_peers(rendered))  # admitted to the metrics port, from its own namespace
    assert _removed(helm, tmp_path, {"tests": {"enabled": False}}) == set(TEST_OBJECTS)


# -- values.schema.json, README.md, Chart.yaml -----------------------------------------------------


@pytest.mark.parametrize("args,error", [
    (["--set", "serviceMonitor.enable=true"], "additional properties 'enable' not allowed"),
    (["--set", "replica=3"], "additional properties 'replica' not allowed"),
    (["--set", "replicas=two"], "replicas"),
    (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
    (["--set", "podDisruptionBudget.maxUnavailable=true"], "maxUnavailable"),
], ids=["misspelt-nested-key", "misspelt-top-level-key", "wrong-type", "not-in-enum", "int-or-string"])
def test_schema_rejects_a_typo(helm: list[str], args: list[str], error: str) -> None:
    for command in (["template", RELEASE], ["install", RELEASE, "--dry-run=client"], ["lint", "--strict"]):
        proc = subprocess.run([*helm, *command, str(CHART), "--namespace", NS, *args], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode != 0 and error in proc.stdout + proc.stderr, (command, proc.stdout, proc.stderr)


def test_schema_takes_an_umbrella_charts_global_values(helm: list[str], tmp_path: Path) -> None:
    assert _template(helm, tmp_path, {"global": {"team": "platform"}}) == _template(helm, tmp_path)


def test_readme_and_schema_are_current_and_every_value_is_described() -> None:
    from deploy.render import chart_docs

    for name, text in chart_docs((CHART / "Chart.yaml").read_text()).items():
        assert (ROOT / name).read_text() == text, f"{name} is stale: run `make generate`"
    values, _ = chart_values.parse((CHART / "values.yaml").read_text())
    assert chart_values.undocumented(values) == [], "describe each value with a `# --` comment above it"
    readme = (CHART / "README.md").read_text()
    for value in values:
        assert f"| `{value.path}` |" in readme, value.path


def test_values_comment_parser() -> None:
    text = """# A file comment.

# A section's comment, not a value's.
section:
  # @schema {"minimum": 1}
  # -- How many.
  # Said on two lines.
  count: 2
  # Only a plain comment: undocumented.
  other: x
  # -- (object) Free-form.
  # @default -- none
  free:
    a: [1]
# -- (int or string) Either.
either: 1
# -- A list of maps.
items:
  - name: a
    nested: b
last: true
"""
    values, sections = chart_values.parse(text)
    assert sections == {"section"}
    by_path = {v.path: v for v in values}
    assert list(by_path) == ["section.count", "section.other", "section.free", "either", "items", "last"]
    assert by_path["section.count"].description == "How many. Said on two lines."
    assert by_path["section.count"].schema == {"minimum": 1} and by_path["section.count"].type == "int"
    assert by_path["section.free"].type == "object" and by_path["section.free"].default_text == "none"
    assert by_path["either"].schema_type == ["integer", "string"]
    assert chart_values.undocumented(values) == ["section.other", "last"]
    schema = chart_values.schema(text)
    assert schema["additionalProperties"] is False
    assert schema["properties"]["section"]["additionalProperties"] is False
    assert schema["properties"]["section"]["properties"]["count"]["minimum"] == 1
    assert schema["properties"]["section"]["properties"]["free"] == {"type": "object", "description": "Free-form."}
    assert schema["properties"]["items"]["type"] == "array"


def test_chart_metadata(helm: list[str], tmp_path: Path) -> None:
    # The oldest minor make compat tests (docs/compatibility.md); Helm refuses an older cluster.
    oldest = min(COMPAT_MINORS, key=lambda minor: int(minor.split(".")[1]))
    assert CHART_META["kubeVersion"] == f">={oldest}.0-0"
    older = f"1.{int(oldest.split('.')[1]) - 1}.9"
    proc = subprocess.run([*helm, "template", RELEASE, str(CHART), "--kube-version", older],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "kubeVersion" in proc.stderr, proc.stderr
    _run([*helm, "template", RELEASE, str(CHART), "--kube-version", f"{oldest}.0"])
    for url in (CHART_META["home"], *CHART_META["sources"], CHART_META["icon"]):
        assert url.startswith("https://"), url
    annotations = CHART_META["annotations"]
    assert annotations["artifacthub.io/license"] == "Apache-2.0"
    [image] = yaml.safe_load(annotations["artifacthub.io/images"])
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert image["image"] == f"{values['image']['repository']}:{CHART_META['appVersion']}"
    crds = {c["kind"]: c for c in yaml.safe_load(annotations["artifacthub.io/crds"])}
    assert set(crds) == {yaml.safe_load(p.read_text())["spec"]["names"]["kind"] for p in CRDS.glob("*.yaml")}
    assert all(c["description"] and c["version"] == "v1alpha1" for c in crds.values())
    examples = yaml.safe_load(annotations["artifacthub.io/crdsExamples"])
    assert examples == list(_objects((DEPLOY / "summarizers.yaml").read_text()).values())
    # The icon is the repository's, an SVG.
    assert ET.parse(ROOT / "docs" / "icon.svg").getroot().tag == "{http://www.w3.org/2000/svg}svg"
    # The lines the release workflow rewrites: tests/unit/test_release.py.


def test_notes_say_what_to_set_when_the_image_names_no_registry(helm: list[str], tmp_path: Path) -> None:
    def notes(values: dict[str, Any] | None = None) -> str:
        args = ["-f", _values_file(tmp_path, values)] if values else []
        return _run([*helm, "install", RELEASE, str(CHART), "--namespace", NS, "--dry-run=client", *args]).stdout

    assert 'WARNING: image.repository is "node-workload-summary", a name no registry serves' in notes()
    assert "set image.repository" in notes()
    assert "WARNING" not in notes({"image": {"repository": "registry.example.com/nws"}})


def test_every_value_is_tested() -> None:
    """Each value of values.yaml is away from its default in ALL_FLIPPED, or changed by the test
    NOT_FLIPPED names."""
    values, _ = chart_values.parse((CHART / "values.yaml").read_text())
    assert {v.path.split(".")[0] for v in values} == set(ALL_FLIPPED)
    for value in values:
        if value.path in NOT_FLIPPED:
            assert NOT_FLIPPED[value.path] in globals(), value.path
            continue
        flipped: Any = ALL_FLIPPED
        for key in value.path.split("."):
            assert key in flipped, f"{value.path}: not in ALL_FLIPPED"
            flipped = flipped[key]
        assert flipped != value.default, f"{value.path}: at its default in ALL_FLIPPED"


# -- on the local control plane ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """A fresh cluster: no CRDs, as a user's cluster before `helm install`."""
    with LocalCluster(Options(controller_manager=True, scheduler=True, kwok=True), binaries) as c:
        yield c


@pytest.fixture(scope="module")
def installed(helm: list[str], kube: LocalCluster, tmp_path_factory: pytest.TempPathFactory) -> str:
    """`helm install` with the sample summarizers; returns its output (NOTES.txt included)."""
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
    for (kind, namespace, name), doc in _template(helm, tmp_path, _summarizer_values()).items():
        scope = ["-n", namespace] if namespace else []
        found = kube.kubectl("get", kind, name, *scope, "-o", "name", check=False).returncode == 0
        # The `helm test` objects exist only while `helm test` runs.
        assert found != _is_hook(doc), (kind, namespace, name)


def test_a_misspelt_value_fails_the_install_before_it_touches_the_cluster(kube: LocalCluster, installed: str,
                                                                          helm: list[str]) -> None:
    proc = subprocess.run([*helm, "install", "typo", str(CHART), "--namespace", "typo", "--create-namespace",
                           "--set", "serviceMonitor.enable=true", f"--kubeconfig={kube.kubeconfig}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "additional properties 'enable' not allowed" in proc.stderr, proc.stderr
    releases = _run([*helm, "list", "-A", "--failed", "--pending", "--deployed", "-o", "json",
                     f"--kubeconfig={kube.kubeconfig}"]).stdout
    assert [r["name"] for r in json.loads(releases)] == [RELEASE]
    assert kube.kubectl("get", "namespace", "typo", check=False).returncode != 0


@pytest.fixture(scope="module")
def sa_kubeconfig(kube: LocalCluster, installed: str) -> Path:
    return token_kubeconfig(kube, RELEASE, NS, "chart-sa")


@pytest.fixture(scope="module")
def as_service_account(kube: LocalCluster, sa_kubeconfig: Path) -> Iterator[Service]:
    """The real service process, started locally with a token of the chart's ServiceAccount, as the
    chart runs it: /metrics over HTTPS for tokens allowed to get it, the probes on a port of their own."""
    for pool in ("cpu", "gpu"):
        for i in range(2):
            kwok_node(kube, f"{pool}-{i}", pool, {"cpu": "8", "memory": "32Gi", "pods": "110"})
    kube.kubectl("create", "deployment", "web", "--image=nginx", "--replicas=2")
    svc = Service(kube, (f"--kubeconfig={sa_kubeconfig}", f"--lease-namespace={NS}"), secure=True)
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


def _notes_block(notes: str, heading: str) -> list[str]:
    """The commands NOTES.txt prints (indented lines) after the line that says ``heading``."""
    lines = notes.splitlines()
    start = next(i for i, line in enumerate(lines) if heading in line)
    block: list[str] = []
    for line in lines[start + 1:]:
        if line.startswith("  ") and line.strip():
            block.append(line.strip())
        elif block or (line.strip() and not line.startswith("  ")):
            break
    assert block, notes
    return block


def _bash(kube: LocalCluster, script: str) -> subprocess.CompletedProcess[str]:
    """``script`` in bash, its `kubectl` this cluster's."""
    prelude = f'set -eo pipefail\nkubectl() {{ {shlex.join(kube.kubectl_argv())} "$@"; }}\n'
    return subprocess.run(["bash", "-c", prelude + script], capture_output=True, text=True, timeout=120)


def _without_port_forward(commands: list[str], port: int) -> str:
    """The commands as printed, but the port-forward, which needs a kubelet: curl reaches the
    service process's port where the forwarded one would be."""
    assert sum(" port-forward " in c for c in commands) == 1, commands
    return "\n".join(c.replace("localhost:8080", f"127.0.0.1:{port}") for c in commands if " port-forward " not in c)


def _reads_node_groups(proc: subprocess.CompletedProcess[str]) -> bool:
    lines = proc.stdout.splitlines()
    return proc.returncode == 0 and bool(lines) and all(line.startswith("nws_nodegroup_nodes") for line in lines)


def test_notes_commands_read_the_metrics_with_a_readers_token(kube: LocalCluster, installed: str,
                                                              as_service_account: Service) -> None:
    commands = _notes_block(installed, "The metrics")
    assert commands[0] == f"kubectl -n {NS} create serviceaccount {RELEASE}-reader"
    assert commands[-1] == ('curl -sk -H "Authorization: Bearer $TOKEN" https://localhost:8080/metrics'
                            " | grep ^nws_nodegroup_nodes")
    script = _without_port_forward(commands, as_service_account.port)
    # Run once (the ServiceAccount and its binding are created once), then read until the summaries
    # are there; a decision is cached, so the first read may come before the binding counts.
    first = _bash(kube, script)
    assert first.returncode in (0, 1), first.stderr  # 1: grep found no line yet
    read = "\n".join(c for c in script.splitlines()
                     if "create serviceaccount" not in c and "clusterrolebinding" not in c)
    wait_for(lambda: _reads_node_groups(_bash(kube, read)), timeout=90)
    # Without the token, the same read gets nothing: the token is what let it in.
    anonymous = _bash(kube, read.replace('-H "Authorization: Bearer $TOKEN" ', "")
                      .replace(" | grep ^nws_nodegroup_nodes", " -w ' %{http_code}'"))
    assert anonymous.stdout.endswith(" 401"), anonymous.stdout


def test_notes_port_forward_names_the_service_and_its_port(kube: LocalCluster, installed: str) -> None:
    """What the printed port-forward names (namespace, Service, port) exists: kubectl checks them
    before it reaches a pod, which needs a kubelet this cluster does not have."""
    [command] = [c for c in _notes_block(installed, "The metrics") if " port-forward " in c]
    argv = shlex.split(command.split(" & ")[0])
    assert argv[:5] == ["kubectl", "-n", NS, "port-forward", f"svc/{RELEASE}"] and argv[5:] == ["8080"], argv

    def forward(port: str) -> str:
        try:
            proc = subprocess.run(kube.kubectl_argv(*argv[1:5], f"{free_port()}:{port}"), capture_output=True,
                                  text=True, timeout=15)
            return proc.stderr
        except subprocess.TimeoutExpired as err:  # forwarding: it got as far as a pod
            raw = err.stderr
            return raw.decode() if isinstance(raw, bytes) else str(raw or "")

    assert "does not have a service port" in forward("9999")  # what a wrong port gets
    stderr = forward(argv[5])
    assert "does not have a service port" not in stderr and "not found" not in stderr.lower(), stderr


def test_notes_commands_read_plain_metrics_when_not_secure(kube: LocalCluster, helm: list[str], installed: str,
                                                           sa_kubeconfig: Path) -> None:
    notes = _run([*helm, "install", RELEASE, str(CHART), "--namespace", NS, "--dry-run=client",
                  "--set", "metrics.secure=false"]).stdout
    commands = _notes_block(notes, "The metrics")
    assert commands == [f"kubectl -n {NS} port-forward svc/{RELEASE} 8080 & sleep 2",
                        "curl -s http://localhost:8080/metrics | grep ^nws_nodegroup_nodes"]
    plain = Service(kube, (f"--kubeconfig={sa_kubeconfig}", f"--lease-namespace={NS}")).start()
    try:
        wait_for(lambda: _reads_node_groups(_bash(kube, _without_port_forward(commands, plain.port))), timeout=60)
    finally:
        plain.stop()


def _selector_args(selector: dict[str, Any]) -> list[str]:
    """A LabelSelector as kubectl's -l (nothing for the empty selector: everything)."""
    terms = [f"{k}={v}" for k, v in selector.get("matchLabels", {}).items()]
    for e in selector.get("matchExpressions", []):
        op = e["operator"]
        terms.append({"In": f"{e['key']} in ({','.join(e.get('values', []))})",
                      "NotIn": f"{e['key']} notin ({','.join(e.get('values', []))})",
                      "Exists": e["key"], "DoesNotExist": f"!{e['key']}"}[op])
    return ["-l", ",".join(terms)] if terms else []


def _admitted(kube: LocalCluster, policy: dict[str, Any], namespace: str, pod: str) -> bool:
    """Whether the NetworkPolicy's first rule (the metrics port) admits ``pod`` of ``namespace``,
    its selectors evaluated by the API server."""
    def names(*args: str) -> set[str]:
        return set(kube.kubectl("get", *args, "-o", "jsonpath={.items[*].metadata.name}").stdout.split())

    for peer in policy["spec"]["ingress"][0]["from"]:
        if "namespaceSelector" in peer:
            namespaces = names("namespaces", *_selector_args(peer["namespaceSelector"]))
        else:
            namespaces = {policy["metadata"]["namespace"]}
        pods = names("pods", "-n", namespace, *_selector_args(peer.get("podSelector", {})))
        if namespace in namespaces and pod in pods:
            return True
    return False


def _live_policy(kube: LocalCluster) -> dict[str, Any]:
    return json.loads(kube.kubectl("get", "networkpolicy", RELEASE, "-n", NS, "-o", "json").stdout)


@pytest.fixture(scope="module")
def monitoring_crds(kube: LocalCluster, installed: str) -> None:
    kube.install_crds(ensure_binaries((PROMETHEUS_OPERATOR,))["monitoring-crds.yaml"])  # as test_deploy.py does
    kube.kubectl("create", "namespace", "monitoring")


def test_notes_label_command_admits_another_scrapers_namespace(kube: LocalCluster, installed: str,
                                                               monitoring_crds: None) -> None:
    [command] = _notes_block(installed, "another scraper")
    assert command == "kubectl label namespace <its namespace> metrics=enabled", command
    kube.kubectl("create", "namespace", "scraper")
    kube.kubectl("run", "scraper", "-n", "scraper", "--image=example.com/scraper:v1")
    policy = _live_policy(kube)
    assert not _admitted(kube, policy, "scraper", "scraper")
    proc = _bash(kube, command.replace("<its namespace>", "scraper"))
    assert proc.returncode == 0, proc.stderr
    assert _admitted(kube, policy, "scraper", "scraper")


@pytest.mark.parametrize("values", [{}, MONITORING, ALL_FLIPPED], ids=["default", "monitoring", "all-flipped"])
def test_server_side_dry_run(kube: LocalCluster, helm: list[str], tmp_path: Path, monitoring_crds: None,
                             values: dict[str, Any]) -> None:
    rendered = _template_text(helm, tmp_path, values)
    proc = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == len(_objects(rendered)), proc.stdout


def test_min_available_budget_passes_a_server_side_dry_run(kube: LocalCluster, helm: list[str], tmp_path: Path,
                                                          monitoring_crds: None) -> None:
    budget = _template(helm, tmp_path, {"podDisruptionBudget": {"minAvailable": 1}})[
        ("PodDisruptionBudget", NS, RELEASE)]
    budget["metadata"]["namespace"] = "monitoring"  # beside the installed one, not over it
    proc = kube.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(budget), check=False)
    assert proc.returncode == 0 and "created (server dry run)" in proc.stdout, proc.stderr


def test_helm_upgrade_turns_monitoring_on(kube: LocalCluster, helm: list[str], monitoring_crds: None) -> None:
    _run([*helm, "upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values",
          "--set", "serviceMonitor.enabled=true,prometheusRule.enabled=true", f"--kubeconfig={kube.kubeconfig}"])
    names = kube.kubectl("get", "servicemonitor,prometheusrule", "-n", NS, "-o", "name").stdout.split()
    assert sorted(names) == ["prometheusrule.monitoring.coreos.com/node-workload-summary",
                             "servicemonitor.monitoring.coreos.com/node-workload-summary"], names


def test_helm_test_check_brackets_an_ipv6_service_address() -> None:
    """SERVICE_HOST is a bare address: an IPv6 one goes in brackets before the port."""
    spec = importlib.util.spec_from_file_location("helm_test", CHART / "files" / "helm-test.py")
    assert spec is not None and spec.loader is not None
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    assert check.bracketed("http://fd00::10:8081/readyz") == "http://[fd00::10]:8081/readyz"
    assert check.bracketed("https://10.0.0.7:8080/metrics") == "https://10.0.0.7:8080/metrics"
    assert check.bracketed("https://[fd00::10]:8080/metrics") == "https://[fd00::10]:8080/metrics"
    assert urlsplit(check.bracketed("http://fd00::10:8081/readyz")).port == 8081


def test_helm_test_check_names_service_variables_it_was_not_given(helm: list[str], tmp_path: Path) -> None:
    """Without the kubelet's service variables (the Service elsewhere, or enableServiceLinks off)
    the check says so at once instead of timing out on a host named `$(...)`."""
    container = _container(_template(helm, tmp_path)[TEST_POD])
    env = {e["name"]: e["value"] for e in container["env"]}
    proc = subprocess.run([sys.executable, "-c", container["command"][2]], capture_output=True, text=True,
                          timeout=30, env={**env, "TIMEOUT": "60"})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "READYZ_URL=http://$(NODE_WORKLOAD_SUMMARY_SERVICE_HOST)" in proc.stderr
    assert "enableServiceLinks" in proc.stderr and "METRICS_URL" in proc.stderr


def test_helm_test_check_passes_against_the_service(kube: LocalCluster, helm: list[str], tmp_path: Path,
                                                    installed: str, as_service_account: Service) -> None:
    """The `helm test` pod's check (files/helm-test.py, as rendered into the pod) run here against
    the service process, with a token of the hook's ServiceAccount bound as the hook binds it: the
    pod itself needs a kubelet (make test-node has one)."""
    rendered = _template(helm, tmp_path)
    for key in (TEST_ACCOUNT, TEST_BINDING):
        kube.kubectl("apply", "-f", "-", input=json.dumps(rendered[key]))
    kube.kubectl("create", "serviceaccount", "not-a-reader", "-n", NS)
    container = _container(rendered[TEST_POD])
    assert container["command"][:2] == ["python", "-c"]
    env = {e["name"]: e["value"] for e in container["env"]}
    svc = as_service_account
    here = {"READYZ_URL": f"127.0.0.1:{svc.probe_port}", "METRICS_URL": f"127.0.0.1:{svc.port}"}
    # The rendered URLs' schemes and paths, on this machine's ports.
    local = {**env, **{name: urlsplit(env[name])._replace(netloc=netloc).geturl() for name, netloc in here.items()}}

    def check(account: str, timeout: str) -> subprocess.CompletedProcess[str]:
        token = tmp_path / account
        token.write_text(kube.kubectl("create", "token", account, "-n", NS).stdout.strip())
        return subprocess.run([sys.executable, "-c", container["command"][2]], capture_output=True, text=True,
                              timeout=120, env={**local, "TOKEN_FILE": str(token), "TIMEOUT": timeout})

    try:
        passed = check(f"{RELEASE}-test", "60")
        assert passed.returncode == 0 and passed.stdout.startswith("ok: "), passed.stdout + passed.stderr
        refused = check("not-a-reader", "3")  # the binding is what lets it read
        assert refused.returncode == 1 and "403" in refused.stderr, refused.stdout + refused.stderr
    finally:
        kube.kubectl("delete", "serviceaccount", "not-a-reader", f"{RELEASE}-test", "-n", NS)
        kube.kubectl("delete", "clusterrolebinding", f"{RELEASE}-test")


# The Prometheus of kube-prometheus-stack, as its chart sets it up by default: ServiceMonitors of any
# namespace, selected by its release label; a scrape class with Prometheus' own token here.
KPS_PROMETHEUS: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
    "metadata": {"name": "kube-prometheus-stack-prometheus", "namespace": "monitoring"},
    "spec": {"serviceMonitorSelector": {"matchLabels": {"release": "kube-prometheus-stack"}},
             "serviceMonitorNamespaceSelector": {},
             "scrapeClasses": [{"name": "sa-token", "authorization": {
                 "credentialsFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}}]},
}
# Three ServiceMonitors the chart renders into namespaces of their own: the token file (the default),
# the scrape class, a Secret's token.
SM_VARIANTS: dict[str, dict[str, Any]] = {"sm-token-file": {}, "sm-scrape-class": {"scrapeClass": "sa-token"},
               "sm-secret": {"authorization": SM_AUTHORIZATION}}


@pytest.fixture(scope="module")
def operator_config(kube: LocalCluster, helm: list[str], installed: str, monitoring_crds: None,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The scrape configuration the real Prometheus Operator generates for KPS_PROMETHEUS from
    the chart's ServiceMonitors (SM_VARIANTS); the operator stays up while the module's tests run."""
    operator = ensure_binaries((PROMETHEUS_OPERATOR,))
    kube.install_crds(operator["prometheus-operator-crds.yaml"])
    tmp = tmp_path_factory.mktemp("servicemonitors")
    for namespace, extra in SM_VARIANTS.items():
        kube.kubectl("create", "namespace", namespace)
        values = {"serviceMonitor": {"enabled": True, "namespace": namespace,
                                     "labels": {"release": "kube-prometheus-stack"}, **SM_FIELDS, **extra}}
        monitor = _objects(_template_text(helm, tmp, values))[("ServiceMonitor", namespace, RELEASE)]
        kube.kubectl("apply", "-f", "-", input=json.dumps(monitor))
    kube.kubectl("create", "secret", "generic", "prometheus-token", "-n", "sm-secret", "--from-literal=token=t0ken")
    kube.kubectl("apply", "-f", "-", input=json.dumps(KPS_PROMETHEUS))
    proc = start_operator(kube)
    name = KPS_PROMETHEUS["metadata"]["name"]

    def config() -> dict[str, Any] | None:
        out = kube.kubectl("get", "secret", f"prometheus-{name}", "-n", "monitoring", "-o",
                           "jsonpath={.data.prometheus\\.yaml\\.gz}", check=False)
        if out.returncode != 0 or not out.stdout:
            return None
        loaded: dict[str, Any] = yaml.safe_load(gzip.decompress(base64.b64decode(out.stdout)))
        jobs = {job["job_name"] for job in loaded.get("scrape_configs") or []}
        return loaded if all(f"serviceMonitor/{ns}/{RELEASE}/0" in jobs for ns in SM_VARIANTS) else None

    try:
        try:
            wait_for(lambda: config() is not None, timeout=90)
        except AssertionError as err:
            raise AssertionError(f"{err}\n{proc.log_tail(40)}") from None
        found = config()
        assert found is not None
        yield found
    finally:
        proc.stop()


def test_operator_scrapes_as_the_service_monitor_fields_say(operator_config: dict[str, Any]) -> None:
    jobs = {job["job_name"]: job for job in operator_config["scrape_configs"]}
    for namespace in SM_VARIANTS:
        job = jobs[f"serviceMonitor/{namespace}/{RELEASE}/0"]
        # From its own namespace, the ServiceMonitor finds the Service in the release's.
        [sd] = job["kubernetes_sd_configs"]
        assert sd["namespaces"]["names"] == [NS], job
        assert job["scheme"] == "https" and job["honor_labels"] is True
        assert job["scrape_timeout"] == "10s" and job["sample_limit"] == 50000
        assert {"target_label": "cluster", "replacement": "prod-eu", "action": "replace"}.items() <= \
            next(r for r in job["relabel_configs"] if r.get("target_label") == "cluster").items()
        [drop] = [r for r in job.get("metric_relabel_configs", []) if r.get("action") == "drop"]
        assert drop["source_labels"] == ["__name__"] and drop["regex"] == "nws_pods_owner_chain_broken"
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    by_file = jobs[f"serviceMonitor/sm-token-file/{RELEASE}/0"]
    assert by_file["bearer_token_file"] == token and "authorization" not in by_file
    by_class = jobs[f"serviceMonitor/sm-scrape-class/{RELEASE}/0"]
    assert by_class["authorization"]["credentials_file"] == token and "bearer_token_file" not in by_class
    by_secret = jobs[f"serviceMonitor/sm-secret/{RELEASE}/0"]
    assert "bearer_token_file" not in by_secret and by_secret["authorization"].get("type", "Bearer") == "Bearer"
    assert "credentials_file" not in by_secret["authorization"], by_secret["authorization"]


def test_network_policy_admits_the_prometheus_the_operator_runs(kube: LocalCluster,
                                                                operator_config: dict[str, Any]) -> None:
    """Out of the box beside kube-prometheus-stack: its Prometheus pod, as the operator's StatefulSet
    makes it, in a namespace nobody labelled, may reach the metrics port; another pod there may not."""
    selector = f"operator.prometheus.io/name={KPS_PROMETHEUS['metadata']['name']}"

    def prometheus_pods() -> list[str]:
        return kube.kubectl("get", "pods", "-n", "monitoring", "-l", selector, "-o",
                            "jsonpath={.items[*].metadata.name}").stdout.split()

    wait_for(lambda: bool(prometheus_pods()), timeout=90)
    [pod] = prometheus_pods()
    assert "metrics" not in json.loads(kube.kubectl("get", "namespace", "monitoring", "-o", "json").stdout)[
        "metadata"].get("labels", {})
    policy = _live_policy(kube)
    assert _admitted(kube, policy, "monitoring", pod)
    kube.kubectl("run", "other", "-n", "monitoring", "--image=example.com/other:v1")
    assert not _admitted(kube, policy, "monitoring", "other")


# -- CRDs on upgrade ---------------------------------------------------------------------------------


@pytest.fixture
def fresh(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    """etcd and kube-apiserver, nothing installed."""
    with LocalCluster(Options(), binaries) as c:
        yield c


def _helm(helm: list[str], kube: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*helm, *args, f"--kubeconfig={kube.kubeconfig}"], capture_output=True, text=True,
                          timeout=300)


def test_templated_crds_cannot_come_with_the_summarizers_in_one_release(fresh: LocalCluster, helm: list[str],
                                                                        tmp_path: Path) -> None:
    """Why the CRDs stay in crds/: Helm maps every object of a release before it creates any, so
    with the CRDs among the templates (Kueue's way) the summarizers of the same install fail on a
    fresh cluster. crds/ is installed, and waited for, first."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    for path in (chart / "crds").glob("*.yaml"):
        path.rename(chart / "templates" / f"crd-{path.name}")
    (chart / "crds").rmdir()
    values = _values_file(tmp_path, _summarizer_values())
    proc = _helm(helm, fresh, "install", RELEASE, str(chart), "--namespace", NS, "--create-namespace", "-f", values)
    assert proc.returncode != 0 and "ensure CRDs are installed first" in proc.stderr, proc.stderr
    assert fresh.kubectl("get", "crd", "-o", "name").stdout == ""
    installed = _helm(helm, fresh, "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace",
                      "-f", values)
    assert installed.returncode == 0, installed.stderr


def _next_chart(tmp_path: Path) -> Path:
    """The chart as a next version would be: 0.2.0, whose NodeSummarizer has one more field."""
    chart = tmp_path / "next"
    shutil.copytree(CHART, chart)
    for path in (chart / "crds").glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        crd["metadata"]["labels"]["app.kubernetes.io/version"] = "0.2.0"
        if crd["spec"]["names"]["kind"] == "NodeSummarizer":
            [version] = crd["spec"]["versions"]
            version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["displayName"] = {
                "type": "string", "description": "What dashboards call these node groups."}
        path.write_text(yaml.safe_dump(crd))
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    (chart / "Chart.yaml").write_text(yaml.safe_dump({**meta, "version": "0.2.0", "appVersion": "0.2.0"}))
    return chart


def test_an_upgrade_that_adds_a_crd_field_in_the_documented_order(fresh: LocalCluster, helm: list[str],
                                                                   tmp_path: Path) -> None:
    """Helm never upgrades crds/: `helm upgrade` alone leaves the old schema, and the new field does
    not reach the cluster. The CRDs first (kubectl apply --server-side --force-conflicts, as
    docs/deploy.md says), then `helm upgrade`: it does."""
    values = {"nodeSummarizers": {"pools": {"labelKey": "pool"}}}
    newer_values = {"nodeSummarizers": {"pools": {"labelKey": "pool", "displayName": "Node pools"}}}
    installed = _helm(helm, fresh, "install", RELEASE, str(CHART), "--namespace", NS, "--create-namespace",
                      "-f", _values_file(tmp_path, values))
    assert installed.returncode == 0, installed.stderr
    chart = _next_chart(tmp_path)

    def crd() -> dict[str, Any]:
        out = json.loads(fresh.kubectl("get", "crd", "nodesummarizers.ux.sean.example.com", "-o", "json").stdout)
        assert isinstance(out, dict)
        return out

    def spec_fields() -> set[str]:
        [version] = crd()["spec"]["versions"]
        return set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])

    def stored() -> dict[str, Any]:
        spec: dict[str, Any] = json.loads(fresh.kubectl("get", "nodesummarizer", "pools", "-o", "json").stdout)["spec"]
        return spec

    upgrade = ["upgrade", RELEASE, str(chart), "--namespace", NS, "-f", _values_file(tmp_path, newer_values)]
    alone = _helm(helm, fresh, *upgrade)
    assert "displayName" not in spec_fields()
    # Helm's server-side apply names the field the old schema lacks, and the upgrade fails.
    assert alone.returncode != 0 and ".spec.displayName: field not declared in schema" in alone.stderr, alone.stderr
    assert stored() == {"labelKey": "pool"}
    # The CRDs belong to Helm's field manager (it created them): kubectl's apply must take them over.
    crds = str(chart / "crds")
    conflict = fresh.kubectl("apply", "--server-side", "-f", crds, check=False)
    assert conflict.returncode != 0 and "conflict" in conflict.stderr.lower(), conflict.stdout + conflict.stderr
    fresh.kubectl("apply", "--server-side", "--force-conflicts", "-f", crds)
    fresh.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    assert "displayName" in spec_fields()
    assert crd()["metadata"]["labels"]["app.kubernetes.io/version"] == "0.2.0"
    then = _helm(helm, fresh, *upgrade)
    assert then.returncode == 0, then.stderr
    assert stored() == {"labelKey": "pool", "displayName": "Node pools"}
    # The CRDs are still Helm's to keep: uninstall leaves them (and what they hold).
    assert _helm(helm, fresh, "uninstall", RELEASE, "--namespace", NS).returncode == 0
    assert "displayName" in spec_fields()
