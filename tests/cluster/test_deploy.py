"""deploy/ on the local control plane: the base applies to a cluster without the Prometheus
Operator and deploy/with-monitoring/ to one with it; the service works as its ServiceAccount; and the
ClusterRole grants exactly what the service uses (checked against the API server's audit log)."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from demo.kueue import cluster_queue, install_kueue, resource_flavor
from demo.workloads import kwok_node
from deploy.image import version as package_version
from kubeindex.model import resources
from kubeindex.model.resources import (
    ACCESS_REVIEWS,
    CLAIMS,
    CLUSTER_QUEUES,
    EVENTS,
    LEASES,
    MULTIKUEUE_CLUSTERS,
    NODECLAIMS,
    RESOURCE_FLAVORS,
    SECRETS,
    TOKEN_REVIEWS,
    WORKLOAD_SUMMARIES,
)
from localkube.build import KUBERNETES_CONTROLLERS, KWOK, PROMETHEUS_OPERATOR, ensure_binaries
from localkube.cluster import LocalCluster, Options
from localkube.service import Service, wait_for
from tests.kube import AuditedCluster, nodeclaim_crd, token_kubeconfig
from tests.paths import ROOT

pytestmark = pytest.mark.needs(PROMETHEUS_OPERATOR, KUBERNETES_CONTROLLERS, KWOK)


DEPLOY = ROOT / "deploy"


WITH_MONITORING = DEPLOY / "with-monitoring"


SUMMARIZERS = DEPLOY / "summarizers.yaml"


NS = "node-workload-summary"


SA = f"system:serviceaccount:{NS}:node-workload-summary"


MONITORING = {"ServiceMonitor/node-workload-summary", "PrometheusRule/node-workload-summary"}


READER_ROLE = "node-workload-summary-metrics-reader"  # for Prometheus, not the service


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuditedCluster]:
    """A fresh cluster: no CRDs at all, as a user's cluster before the first apply."""
    audit = tmp_path_factory.mktemp("audit")
    (audit / "policy.yaml").write_text(yaml.safe_dump({
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "users": [SA]}, {"level": "None"}]}))
    options = Options(controller_manager=True, scheduler=True, kwok=True, extra_apiserver_args=[
        f"--audit-policy-file={audit / 'policy.yaml'}", f"--audit-log-path={audit / 'audit.log'}"])
    with AuditedCluster(options, binaries, audit / "audit.log") as c:
        yield c


def _rendered(kube: LocalCluster, path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(kube.kubectl("kustomize", str(path)).stdout) if d]


def _objects(kube: LocalCluster, path: Path) -> set[str]:
    return {f"{d['kind']}/{d['metadata']['name']}" for d in _rendered(kube, path)}


@pytest.fixture(scope="module")
def base(kube: LocalCluster) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -k deploy/` on a cluster without the Prometheus Operator."""
    assert kube.kubectl("get", "crd", "servicemonitors.monitoring.coreos.com", check=False).returncode != 0
    return kube.kubectl("apply", "-k", str(DEPLOY), check=False)


def test_base_applies_without_the_prometheus_operator(kube: LocalCluster,
                                                      base: subprocess.CompletedProcess[str]) -> None:
    assert base.returncode == 0, base.stderr
    out = base.stdout.splitlines()
    assert len(out) == len(_objects(kube, DEPLOY)) and all(line.endswith(" created") for line in out), out
    for kind in ("customresourcedefinition.apiextensions.k8s.io", "clusterrole.rbac.authorization.k8s.io",
                 "deployment.apps", "service", "configmap"):
        assert any(line.startswith(f"{kind}/") for line in out), (kind, out)


def test_base_names_an_image_that_says_where_to_set_the_real_one(kube: LocalCluster) -> None:
    """No release has pushed the image: until `images:` names the one a user pushed, the pods' pull
    error names the file to edit, on a host that never resolves (RFC 2606's .invalid), and the
    kustomization applied says first how to build, push and set it."""
    for path in (DEPLOY, WITH_MONITORING, DEPLOY / "with-quota-actuation"):
        [deployment] = [d for d in _rendered(kube, path) if d["kind"] == "Deployment"]
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        host, _, rest = container["image"].partition("/")
        assert host == "set-your-registry-in-deploy-base-kustomization.invalid", container["image"]
        assert rest == f"node-workload-summary:{package_version()}", container["image"]
    head = (DEPLOY / "kustomization.yaml").read_text().split("\napiVersion:")[0]
    assert head.startswith("# First: the image.") and "make image" in head and "base/kustomization.yaml" in head
    # What a user does then: their registry's name in images:, the tag kept.
    base = yaml.safe_load((DEPLOY / "base" / "kustomization.yaml").read_text())
    assert base["images"] == [{"name": "node-workload-summary", "newName": host + "/node-workload-summary",
                               "newTag": package_version()}]


@pytest.fixture(scope="module")
def with_monitoring(kube: LocalCluster, base: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """`kubectl apply -k deploy/with-monitoring/` once the Prometheus Operator's CRDs are there (the
    real ones, from its pinned Go module: the apply validates our objects against their schemas)."""
    kube.install_crds(ensure_binaries((PROMETHEUS_OPERATOR,))["monitoring-crds.yaml"])
    return kube.kubectl("apply", "-k", str(WITH_MONITORING), check=False)


def test_with_monitoring_applies_with_the_prometheus_operator(
        kube: LocalCluster, with_monitoring: subprocess.CompletedProcess[str]) -> None:
    assert with_monitoring.returncode == 0, with_monitoring.stderr
    assert _objects(kube, WITH_MONITORING) == _objects(kube, DEPLOY) | MONITORING
    names = kube.kubectl("get", "servicemonitor,prometheusrule", "-n", NS, "-o", "name").stdout.split()
    assert sorted(names) == ["prometheusrule.monitoring.coreos.com/node-workload-summary",
                             "servicemonitor.monitoring.coreos.com/node-workload-summary"], names


def test_service_monitor_selects_our_service_and_its_port(
        kube: LocalCluster, with_monitoring: subprocess.CompletedProcess[str]) -> None:
    docs = {d["kind"]: d for d in _rendered(kube, WITH_MONITORING) if d["kind"] in ("ServiceMonitor", "Service")}
    monitor, service = docs["ServiceMonitor"], docs["Service"]
    # No namespaceSelector: the operator looks in the ServiceMonitor's own namespace only.
    assert "namespaceSelector" not in monitor["spec"]
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"] == NS
    # It selects Services by their own labels (not the pods'): ask the API server which ones match.
    selector = monitor["spec"]["selector"]
    assert set(selector) == {"matchLabels"}, selector
    terms = ",".join(f"{k}={v}" for k, v in selector["matchLabels"].items())
    selected = kube.kubectl("get", "services", "-n", NS, "-l", terms, "-o", "name").stdout.split()
    assert selected == ["service/node-workload-summary"], selected
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports, ports


@pytest.mark.parametrize("patch,error", [
    ({"endpoints": [{"port": "metrics", "honorLabel": True}]}, 'unknown field "spec.endpoints[0].honorLabel"'),
    ({"endpoints": [{"port": "metrics", "interval": "30"}]}, "spec.endpoints[0].interval"),
    ({"endpoints": [{"port": "metrics", "scheme": "tcp"}]}, "spec.endpoints[0].scheme"),
    ({"endpoints": [{"port": "metrics", "tlsConfig": {"insecureSkipVerfy": True}}]},
     'unknown field "spec.endpoints[0].tlsConfig.insecureSkipVerfy"'),
], ids=["misspelt-field", "interval-without-unit", "unknown-scheme", "misspelt-tls-field"])
def test_real_schema_rejects_a_broken_service_monitor(
        kube: LocalCluster, with_monitoring: subprocess.CompletedProcess[str], patch: dict, error: str) -> None:
    # The stand-in CRDs took any object: these mistakes show the real schema is what validates.
    [monitor] = [d for d in _rendered(kube, WITH_MONITORING) if d["kind"] == "ServiceMonitor"]
    monitor["spec"].update(patch)
    proc = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(monitor), check=False)
    assert proc.returncode != 0 and error in proc.stderr, proc.stderr


def test_service_monitor_scrapes_https_with_prometheus_token(
        kube: LocalCluster, with_monitoring: subprocess.CompletedProcess[str]) -> None:
    [monitor] = [d for d in _rendered(kube, WITH_MONITORING) if d["kind"] == "ServiceMonitor"]
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and endpoint["honorLabels"] is True
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"
    assert endpoint["tlsConfig"] == {"insecureSkipVerify": True}  # self-signed at start: nothing to verify with


def _deployment_container(kube: LocalCluster) -> dict:
    [deployment] = [d for d in _rendered(kube, DEPLOY) if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]["containers"][0]


def test_deployment_serves_metrics_secure_and_probes_plain(kube: LocalCluster) -> None:
    from node_workload_summary.settings import load

    container = _deployment_container(kube)
    settings = load(container["args"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.metrics_secure and ports == {"metrics": settings.port, "probes": settings.probe_port}
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert container[probe]["httpGet"]["port"] == "probes", probe  # no token needed


def test_network_policy_admits_metrics_from_prometheus_and_labelled_namespaces_and_probes_from_anywhere(
        kube: LocalCluster, base: subprocess.CompletedProcess[str]) -> None:
    # Checked as an object here (tests/cluster/test_chart.py has the API server select the pods it admits):
    # this control plane has no network plugin to enforce it.
    [policy] = [d for d in _rendered(kube, DEPLOY) if d["kind"] == "NetworkPolicy"]
    [deployment] = [d for d in _rendered(kube, DEPLOY) if d["kind"] == "Deployment"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    assert spec["podSelector"]["matchLabels"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert spec["policyTypes"] == ["Ingress"]
    metrics, probes = spec["ingress"]
    # The Prometheus Operator's Prometheus (and PrometheusAgent) pods of any namespace, namespaces
    # labelled metrics=enabled, and the chart's `helm test` pod in this one.
    assert metrics == {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [
        {"namespaceSelector": {}, "podSelector": {
            "matchLabels": {"app.kubernetes.io/managed-by": "prometheus-operator"},
            "matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                  "values": ["prometheus", "prometheus-agent"]}]}},
        {"namespaceSelector": {"matchLabels": {"metrics": "enabled"}}},
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "node-workload-summary-test"}}}]}
    assert probes == {"ports": [{"port": "probes", "protocol": "TCP"}]}  # no `from`: anyone
    live = json.loads(kube.kubectl("get", "networkpolicy", "node-workload-summary", "-n", NS, "-o", "json").stdout)
    assert live["spec"] == spec
    policy["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"] = {"team": "observability"}
    kube.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(policy))


def test_pod_disruption_budget_takes_one_replica_at_a_time(kube: LocalCluster,
                                                           base: subprocess.CompletedProcess[str]) -> None:
    [deployment] = [d for d in _rendered(kube, DEPLOY) if d["kind"] == "Deployment"]
    live = json.loads(kube.kubectl("get", "poddisruptionbudget", "node-workload-summary", "-n", NS, "-o",
                                   "json").stdout)
    assert live["spec"]["selector"] == deployment["spec"]["selector"]
    assert live["spec"]["maxUnavailable"] == 1 and live["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert deployment["spec"]["replicas"] == 2


@pytest.mark.parametrize("path", [DEPLOY, WITH_MONITORING], ids=["base", "with-monitoring"])
def test_one_apply_needs_no_crd_it_creates(kube: LocalCluster, path: Path) -> None:
    # kubectl maps every object before it creates any: an object of a kind whose CRD is in the same
    # apply fails ("ensure CRDs are installed first") on a fresh cluster. The sample summarizers
    # are applied on their own, after editing.
    docs = _rendered(kube, path)
    defined = {d["spec"]["names"]["kind"] for d in docs if d["kind"] == "CustomResourceDefinition"}
    assert defined and not [d["kind"] for d in docs if d["kind"] in defined]


@pytest.fixture(scope="module")
def as_service_account(kube: LocalCluster, base: subprocess.CompletedProcess[str]) -> Iterator[Service]:
    kube.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s")
    kube.kubectl("apply", "-f", str(SUMMARIZERS))
    sa_kubeconfig = token_kubeconfig(kube, "node-workload-summary", NS, "sa")
    for pool in ("cpu", "gpu"):
        for i in range(2):
            kwok_node(kube, f"{pool}-{i}", pool, {"cpu": "8", "memory": "32Gi", "pods": "110"})
    kube.kubectl("create", "deployment", "web", "--image=nginx", "--replicas=2")
    # Kueue (its real CRDs), so that the service uses its grants on ResourceFlavors and ClusterQueues.
    install_kueue(kube)
    resource_flavor(kube, "gpu", {"cloud.google.com/gke-nodepool": "gpu"})
    cluster_queue(kube, "team", {"gpu": {"cpu": "16"}})
    # A ClusterResourceClaim, so that the service uses its grants on claims (a dry run: deploy/base
    # grants no patch on clusterqueues).
    kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "ux.sean.example.com/v1alpha1", "kind": "ClusterResourceClaim", "metadata": {"name": "gpu"},
        "spec": {"flavor": "gpu", "resourceAssignments": [{"clusterQueueName": "team", "shares": {"cpu": "50%"}}]}}))
    # Karpenter's NodeClaim kind (no Karpenter), so that the service uses its grant on NodeClaims.
    nodeclaim_crd(kube)
    svc = Service(kube, (f"--kubeconfig={sa_kubeconfig}", f"--lease-namespace={NS}"), secure=True)
    svc.start()
    # A scraper bound to the reader role: the service reviews its token (as its ServiceAccount).
    kube.kubectl("create", "serviceaccount", "scraper", "-n", "default")
    kube.kubectl("create", "clusterrolebinding", "scraper", f"--clusterrole={READER_ROLE}",
                 "--serviceaccount=default:scraper")
    scraper = kube.kubectl("create", "token", "scraper", "-n", "default").stdout.strip()
    code, text = svc.get("/metrics", token=scraper)
    assert code == 200, text
    # A second replica that lists (the fallback for a server without WatchList): the grants cover
    # both ways of the initial list, and the audit log shows each verb used.
    lister = Service(kube, (f"--kubeconfig={sa_kubeconfig}", f"--lease-namespace={NS}", "--initial-list=list"))
    lister.start()
    yield svc
    lister.stop()
    svc.stop()


def test_everything_works_as_the_service_account(kube: LocalCluster, as_service_account: Service) -> None:
    def names(plural: str) -> set[str]:
        out = kube.kubectl("get", plural, "-A", "-o", "jsonpath={.items[*].metadata.name}").stdout
        return set(out.split())

    try:
        wait_for(lambda: {"nodepool-cpu", "nodepool-gpu"} <= names("nodesummaries"), timeout=30)
        wait_for(lambda: "web" in names("workloadsummaries"), timeout=30)
        # JobSet and LeaderWorkerSet are configured but not installed here: a warning of its own
        # (KindsServed), while Ready says the summarizer works for the Deployments it summarized.
        wait_for(lambda: _condition(kube, "workloads", "KindsServed").get("reason") == "KindNotServed", timeout=30)
        message = _condition(kube, "workloads", "KindsServed")["message"]
        assert "JobSet" in message and "jobset.x-k8s.io" in message and "LeaderWorkerSet" in message, message
        assert "Workload (scheduling.k8s.io) is not served by the API server (the in-tree Workload API" in message, \
            message  # not served by the pinned minor
        ready = _condition(kube, "workloads", "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "Summarizing"), ready
        header, row = kube.kubectl("get", "workloadsummarizer", "workloads").stdout.splitlines()
        columns = dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip()), strict=True))
        assert (columns["READY"], columns["KINDS SERVED"]) == ("True", "False"), columns
    except AssertionError as err:
        raise AssertionError(f"{err}\n{as_service_account.log_text()[-3000:]}") from None
    # Stale summaries are deleted by the service itself (no ownerReference GC applies here): a
    # label value that vanishes, and a kind that is no longer configured.
    for node in ("cpu-0", "cpu-1"):
        kube.kubectl("delete", "node", node)
    wait_for(lambda: "nodepool-cpu" not in names("nodesummaries"), timeout=30)
    kube.kubectl("patch", "workloadsummarizer", "workloads", "--type=json",
                 "-p", '[{"op": "remove", "path": "/spec/workloadTypes/0"}]')  # no more Deployments
    wait_for(lambda: "web" not in names("workloadsummaries"), timeout=30)
    holder = kube.kubectl("get", "lease", "node-workload-summary", "-n", NS, "-o",
                          "jsonpath={.spec.holderIdentity}").stdout
    assert holder
    log = as_service_account.log_text()
    assert " 403" not in log and "Forbidden" not in log, log


def _condition(kube: LocalCluster, summarizer: str, type_: str) -> dict[str, str]:
    status = json.loads(kube.kubectl("get", "workloadsummarizer", summarizer, "-o", "json").stdout).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def _granted(docs: list[dict] | None = None) -> set[tuple[str, str, str]]:
    """(group, resource, verb) of the service's roles: deploy/base/rbac.yaml's, or those of ``docs``."""
    granted = set()
    for doc in docs if docs is not None else yaml.safe_load_all((DEPLOY / "base" / "rbac.yaml").read_text()):
        if doc["kind"] in ("ClusterRole", "Role") and doc["metadata"]["name"] != READER_ROLE:
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            granted.add((group, resource, verb))
    return granted


def _audit_lines(kube: AuditedCluster) -> int:
    return len(kube.audit_log.read_text().splitlines())


def _used(kube: AuditedCluster, since: int = 0) -> set[tuple[str, str, str]]:
    """What the service's requests used, from the ``since``-th line of the audit log on."""
    used = set()
    for line in kube.audit_log.read_text().splitlines()[since:]:
        event = json.loads(line)
        ref = event.get("objectRef")
        if ref is None or event["responseStatus"]["code"] >= 400:
            continue
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
        if event["verb"] == "patch" and event["responseStatus"]["code"] == 201:
            used.add((ref.get("apiGroup", ""), resource, "create"))  # server-side apply that created it
    return used


def test_role_grants_exactly_what_the_service_uses(kube: AuditedCluster, as_service_account: Service) -> None:
    expected = {(WORKLOAD_SUMMARIES.group, WORKLOAD_SUMMARIES.plural, "delete"),
                (LEASES.group, LEASES.plural, "update"),
                (TOKEN_REVIEWS.group, TOKEN_REVIEWS.plural, "create"),
                (ACCESS_REVIEWS.group, ACCESS_REVIEWS.plural, "create"),
                (RESOURCE_FLAVORS.group, RESOURCE_FLAVORS.plural, "watch"),
                (CLUSTER_QUEUES.group, CLUSTER_QUEUES.plural, "watch"),
                (CLAIMS.group, CLAIMS.plural, "watch"), (CLAIMS.group, f"{CLAIMS.plural}/status", "patch"),
                (NODECLAIMS.group, NODECLAIMS.plural, "watch")}
    # Every resource the service declares it reads or writes is granted something.
    declared = {(r.group, r.plural) for r in vars(resources).values() if isinstance(r, resources.Resource)}
    assert declared - {(g, r) for g, r, _ in _granted()} == {
        (EVENTS.group, EVENTS.plural),  # deploy/with-quota-actuation/ grants them
        (SECRETS.group, SECRETS.plural), (MULTIKUEUE_CLUSTERS.group, MULTIKUEUE_CLUSTERS.plural)}  # a fleet hub's
    try:
        wait_for(lambda: expected <= _used(kube), timeout=30)
    except AssertionError:
        raise AssertionError(f"not used within 30 s: {sorted(expected - _used(kube))}") from None
    granted, used = _granted(), _used(kube)
    assert used <= granted, f"used without a grant: {sorted(used - granted)}"
    denied = [line for line in kube.audit_log.read_text().splitlines()
              if json.loads(line)["responseStatus"]["code"] == 403]
    assert not denied, denied[:3]
    # Every grant is used, except owner kinds this cluster has no objects or API for.
    not_exercised = {(g, r, v) for g, r, v in granted
                     if (g, r) in {("apps", "daemonsets"), ("batch", "cronjobs"), ("jobset.x-k8s.io", "jobsets"),
                                   ("leaderworkerset.x-k8s.io", "leaderworkersets"), ("ray.io", "rayclusters"),
                                   ("ray.io", "rayjobs"), ("ray.io", "rayservices"), ("apps", "statefulsets"),
                                   ("batch", "jobs"),
                                   # not served by the pinned minor: test_workload_api runs the service as
                                   # its ServiceAccount where they are
                                   ("scheduling.k8s.io", "workloads"), ("scheduling.k8s.io", "podgroups")}}
    assert granted - not_exercised - used == set(), f"granted but never used: {sorted(granted - not_exercised - used)}"
    assert {v for g, r, v in not_exercised} == {"list", "watch"}


@pytest.mark.parametrize("verb,resource", [
    ("get", "secrets"), ("list", "secrets"), ("patch", "nodes"), ("delete", "pods"), ("create", "pods"),
    ("update", "nodes"), ("create", "pods/eviction"), ("delete", "nodesummarizers.ux.sean.example.com"),
    ("patch", "clusterqueues.kueue.x-k8s.io"),  # only with deploy/with-quota-actuation/
])
def test_role_denies_what_the_service_must_not_do(kube: LocalCluster, as_service_account: Service,
                                                   verb: str, resource: str) -> None:
    proc = kube.kubectl("auth", "can-i", verb, resource, f"--as={SA}", "-A", check=False)
    assert proc.stdout.strip() == "no", (verb, resource, proc.stdout, proc.stderr)


def _quota_events(kube: LocalCluster, claim: str) -> list[dict]:
    events = json.loads(kube.kubectl("get", "events.events.k8s.io", "-n", "default", "-o", "json").stdout)["items"]
    return [e for e in events if e.get("regarding", {}).get("name") == claim and e["reason"] == "QuotaWritten"]


def test_quota_actuation_grants_exactly_what_its_writes_and_their_events_use(
        kube: AuditedCluster, as_service_account: Service) -> None:
    """deploy/with-quota-actuation/ adds to the base exactly what a quota write uses: patch on
    clusterqueues, and create and patch on Events in `default` (each write's Event, on its
    cluster-scoped ClusterResourceClaim; patch counts an identical one again). As the
    ServiceAccount, a replica with --quota-actuation=on writes claim gpu's quota twice (the second
    after an administrator resets the queue: the same change, so the same Event counted again), and
    the audit log shows each added grant used and nothing used without a grant. It runs after the
    base's checks, and leaves the base's grants as they were."""
    overlay = _rendered(kube, DEPLOY / "with-quota-actuation")
    added = {("kueue.x-k8s.io", "clusterqueues", "patch"), ("events.k8s.io", "events", "create"),
             ("events.k8s.io", "events", "patch")}
    assert _granted(overlay) - _granted() == added
    kube.kubectl("apply", "-k", str(DEPLOY / "with-quota-actuation"))
    sa_kubeconfig = token_kubeconfig(kube, "node-workload-summary", NS, "sa-actuation")
    # Beside the leader (a dry run, as deploy/base runs), a replica that writes without the Lease.
    writer = Service(kube, (f"--kubeconfig={sa_kubeconfig}", "--no-leader-election", "--quota-actuation=on"))
    writer.start()
    path = "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota"

    def team_cpu() -> str:
        return kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", "team", "-o",
                            "jsonpath={.spec.resourceGroups[0].flavors[0].resources[0].nominalQuota}").stdout

    try:
        wait_for(lambda: team_cpu() == "8", timeout=30)  # 50% of the gpu pool's 16 cpu
        wait_for(lambda: _quota_events(kube, "gpu"), timeout=30)
        kube.kubectl("patch", "clusterqueues.kueue.x-k8s.io", "team", "--type=json",
                     "-p", json.dumps([{"op": "replace", "path": path, "value": "16"}]))
        wait_for(lambda: [e.get("series", {}).get("count") for e in _quota_events(kube, "gpu")] == [2], timeout=30)
        [event] = _quota_events(kube, "gpu")
        assert event["note"] == "ClusterQueue team nominalQuota written: flavor gpu cpu 16 -> 8", event
        assert event["regarding"]["kind"] == "ClusterResourceClaim" and event["related"]["name"] == "team"
        assert "ClusterQueue team nominalQuota written: flavor gpu cpu 16 -> 8 (claim gpu)" in writer.log_text()
        try:
            wait_for(lambda: added <= _used(kube), timeout=30)
        except AssertionError:
            raise AssertionError(f"not used within 30 s: {sorted(added - _used(kube))}") from None
        used = _used(kube)
        assert used <= _granted(overlay), f"used without a grant: {sorted(used - _granted(overlay))}"
        denied = [line for line in kube.audit_log.read_text().splitlines()
                  if json.loads(line)["responseStatus"]["code"] == 403]
        assert not denied, denied[:3]
        # Events in `default` only (where those of cluster-scoped objects go), and only through events.k8s.io.
        for verb, resource, namespace, answer in (("create", "events.events.k8s.io", "default", "yes"),
                                                  ("patch", "events.events.k8s.io", "default", "yes"),
                                                  ("create", "events.events.k8s.io", NS, "no"),
                                                  ("create", "events.events.k8s.io", "kube-system", "no"),
                                                  ("delete", "events.events.k8s.io", "default", "no"),
                                                  ("create", "events", "default", "no")):
            proc = kube.kubectl("auth", "can-i", verb, resource, f"--as={SA}", "-n", namespace, check=False)
            assert proc.stdout.strip() == answer, (verb, resource, namespace, proc.stdout, proc.stderr)
    finally:
        writer.stop()
        kube.kubectl("apply", "-k", str(DEPLOY))  # the base's ClusterRole and Deployment again
        kube.kubectl("delete", "role,rolebinding", "node-workload-summary-events", "-n", "default")


def _disruption_events(kube: LocalCluster) -> list[dict]:
    events = json.loads(kube.kubectl("get", "events.events.k8s.io", "-n", "shop", "-o", "json").stdout)["items"]
    return [e for e in events if e["reason"] == "DisruptionStarted"]


def test_karpenter_events_grant_exactly_what_their_watch_and_writes_use(
        kube: AuditedCluster, as_service_account: Service) -> None:
    """deploy/with-karpenter-events/ adds to the base exactly what --karpenter-events=on uses: list
    and watch Events in `default` (Karpenter's DisruptionBlocked on Nodes), create and patch Events
    in every namespace (on WorkloadSummaries). As the ServiceAccount, a replica with the flag
    watches, and records a DisruptionStarted Event on WorkloadSummary shop/app (a StatefulSet) when the node of its
    pod gets Karpenter's disruption taint, counted again (patched) when it gets it a second time;
    the audit log shows each added grant used and nothing used without a grant."""
    overlay = _rendered(kube, DEPLOY / "with-karpenter-events")
    added = {("events.k8s.io", "events", verb) for verb in ("list", "watch", "create", "patch")}
    assert _granted(overlay) - _granted() == added
    since = _audit_lines(kube)  # what earlier tests' replicas did (quota actuation's writes) is theirs
    kube.kubectl("apply", "-k", str(DEPLOY / "with-karpenter-events"))
    kube.kubectl("create", "namespace", "shop")
    # A StatefulSet: the summarizer no longer lists Deployments (test_everything_works_as_the_service_account).
    labels = {"app": "app"}
    kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "app", "namespace": "shop"},
        "spec": {"replicas": 1, "serviceName": "app", "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}}))
    sa_kubeconfig = token_kubeconfig(kube, "node-workload-summary", NS, "sa-karpenter")
    writer = Service(kube, (f"--kubeconfig={sa_kubeconfig}", "--no-leader-election", "--karpenter-events=on"))
    writer.start()

    def node_of_app() -> str:
        return kube.kubectl("get", "pods", "-n", "shop", "-o", "jsonpath={.items[*].spec.nodeName}").stdout

    try:
        wait_for(lambda: node_of_app() and "app" in kube.kubectl("get", "workloadsummaries.ux", "-n", "shop").stdout,
                 timeout=30)
        node = node_of_app()
        for count in (None, 2):  # created, then counted again on its series (a patch)
            kube.kubectl("taint", "node", node, "karpenter.sh/disrupted:NoSchedule")

            def counted(want: int | None = count) -> bool:
                return [e.get("series", {}).get("count") for e in _disruption_events(kube)] == [want]

            wait_for(counted, timeout=30)
            kube.kubectl("taint", "node", node, "karpenter.sh/disrupted:NoSchedule-")
        [event] = _disruption_events(kube)
        assert event["regarding"]["kind"] == "WorkloadSummary" and event["regarding"]["name"] == "app", event
        try:
            wait_for(lambda: added <= _used(kube, since), timeout=30)
        except AssertionError:
            raise AssertionError(f"not used within 30 s: {sorted(added - _used(kube, since))}") from None
        used = _used(kube, since)
        assert used <= _granted(overlay), f"used without a grant: {sorted(used - _granted(overlay))}"
        denied = [line for line in kube.audit_log.read_text().splitlines()[since:]
                  if json.loads(line)["responseStatus"]["code"] == 403]
        assert not denied, denied[:3]
        for verb, resource, namespace, answer in (("list", "events.events.k8s.io", "default", "yes"),
                                                  ("watch", "events.events.k8s.io", "default", "yes"),
                                                  ("create", "events.events.k8s.io", "shop", "yes"),
                                                  ("patch", "events.events.k8s.io", "shop", "yes"),
                                                  ("list", "events.events.k8s.io", "shop", "no"),
                                                  ("get", "events.events.k8s.io", "default", "no"),
                                                  ("delete", "events.events.k8s.io", "shop", "no"),
                                                  ("create", "events", "shop", "no")):
            proc = kube.kubectl("auth", "can-i", verb, resource, f"--as={SA}", "-n", namespace, check=False)
            assert proc.stdout.strip() == answer, (verb, resource, namespace, proc.stdout, proc.stderr)
    finally:
        writer.stop()
        kube.kubectl("apply", "-k", str(DEPLOY))  # the base's Deployment again
        kube.kubectl("delete", "role,rolebinding", "node-workload-summary-karpenter-events", "-n", "default")
        kube.kubectl("delete", "clusterrole,clusterrolebinding", "node-workload-summary-workload-events")
        kube.kubectl("delete", "namespace", "shop", "--wait=false")


def test_reader_role_allows_get_metrics_and_nothing_else(kube: LocalCluster, as_service_account: Service) -> None:
    scraper = "system:serviceaccount:default:scraper"
    assert kube.kubectl("auth", "can-i", "get", "/metrics", f"--as={scraper}").stdout.strip() == "yes"
    for verb, what in (("get", "/healthz/x"), ("list", "pods"), ("get", "secrets")):
        assert kube.kubectl("auth", "can-i", verb, what, f"--as={scraper}", check=False).stdout.strip() == "no"
