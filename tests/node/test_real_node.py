"""The image as users run it: built from the Dockerfile (`make image`), installed with the chart,
started by a real kubelet on a real node (containerd, runc, a CNI bridge, kube-proxy) beside KWOK
nodes. In-cluster configuration, the kubelet's probes, the securityContext, leader election between
two real pods and SIGTERM within the grace period are exercised here and nowhere else.

`make test-node` runs this module (root, Debian's runc, CNI plugins and podman: `make node-tools`).
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import re
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.image import revision, version
from localkube.build import PROMETHEUS, PROMETHEUS_OPERATOR, ensure_binaries, prometheus_release
from localkube.cluster import LocalCluster, Options
from localkube.node import NODE_ADDRESS, POD_PLACEMENT, RealNode
from localkube.prometheus import start_operator
from localkube.service import wait_for
from tests import realnode
from tests.paths import CRDS, ROOT
from tests.realnode import IMAGE, TAG, build_image, helm_process, ready, run_helm

pytestmark = pytest.mark.node

NS = "nws"
POOL = "example.com/pool"
SA = f"system:serviceaccount:{NS}:node-workload-summary"
GRACE = 15  # the chart's terminationGracePeriodSeconds
PROMETHEUS_IMAGE = "localhost/prometheus:debian"
SCRAPE = "2s"
# As kube-prometheus-stack's Prometheus with its selectors left open; its own pods never run here
# (their images are in no registry we reach): the operator's config runs in a pod of ours.
PROMETHEUS_CR: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1", "kind": "Prometheus",
    "metadata": {"name": "k8s", "namespace": "monitoring"},
    "spec": {"serviceMonitorSelector": {}, "serviceMonitorNamespaceSelector": {}, "ruleSelector": {},
             "ruleNamespaceSelector": {}, "nodeSelector": {"localkube.local/no-such-node": "true"}},
}
LEASE_SECONDS = 15  # --lease-duration's default


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The image built as `make image` builds it, saved as an OCI archive for the node."""
    return build_image(tmp_path_factory.mktemp("image"))


@pytest.fixture(scope="module")
def audit_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audit") / "audit.log"


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path], audit_log: Path) -> Iterator[LocalCluster]:
    # The API server's audit log of every request the service's ServiceAccount makes.
    policy = audit_log.with_name("policy.yaml")
    policy.write_text(json.dumps({"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                                  "rules": [{"level": "Metadata", "users": [SA]}, {"level": "None"}]}))
    options = Options(node_address=NODE_ADDRESS, controller_manager=True, scheduler=True, kwok=True,
                      extra_apiserver_args=[f"--audit-policy-file={policy}", f"--audit-log-path={audit_log}"])
    operator = ensure_binaries((PROMETHEUS_OPERATOR,))
    with LocalCluster(options, binaries) as c:
        c.install_crds(CRDS)
        c.install_crds(operator["monitoring-crds.yaml"])
        c.install_crds(operator["prometheus-operator-crds.yaml"])
        yield c


@pytest.fixture(scope="module")
def node(kube: LocalCluster, image: Path) -> Iterator[RealNode]:
    started = time.monotonic()
    real = RealNode(kube).start()
    try:
        print(f"real node Ready in {time.monotonic() - started:.1f}s")
        real.load_image(image)
        yield real
    finally:
        left = real.stop()
    assert left == [], f"the node left something behind: {left}"


@pytest.fixture(scope="module")
def release(kube: LocalCluster, node: RealNode, helm: list[str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """`helm install` with the image just built, on the real node; two KWOK nodes in pool "sim"."""
    for name in ("sim-1", "sim-2"):
        kube.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {POOL: "sim"}, "annotations": {"kwok.x-k8s.io/node": "fake"}}}))
    wait_for(lambda: kube.kubectl("get", "node", "sim-1", "sim-2", "-o",
                                  "jsonpath={.items[*].status.conditions[?(@.type=='Ready')].status}").stdout
             == "True True", timeout=60)
    values = tmp_path_factory.mktemp("values") / "values.yaml"
    values.write_text(json.dumps({
        "image": {"repository": IMAGE, "tag": TAG, "pullPolicy": "Never"},
        **POD_PLACEMENT,
        "nodeSummarizers": {"pool": {"labelKey": POOL}},
        # The shipped sample WorkloadSummarizer, gangs and all (deploy/summarizers.yaml).
        "workloadSummarizers": {d["metadata"]["name"]: d["spec"] for d in yaml.safe_load_all(
            (ROOT / "deploy/summarizers.yaml").read_text()) if d and d["kind"] == "WorkloadSummarizer"},
        "serviceMonitor": {"enabled": True, "interval": SCRAPE},
        "prometheusRule": {"enabled": True},
        # Prometheus' namespace: what NOTES.txt tells a user to label.
        "networkPolicy": {"metricsNamespaceLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    }))
    started = time.monotonic()
    run_helm(kube, helm, "install", "nws", str(ROOT / "charts/node-workload-summary"), "--namespace", NS,
             "--create-namespace", "-f", str(values), "--wait", "--timeout", "180s")
    print(f"helm install --wait: {time.monotonic() - started:.1f}s")
    return "nws"


def pods(kube: LocalCluster) -> list[dict]:
    return realnode.pods(kube, NS)


def holder(kube: LocalCluster) -> str:
    return realnode.holder(kube, NS)


def test_two_pods_ready_through_the_kubelets_probes_and_one_holds_the_lease(kube: LocalCluster, release: str) -> None:
    running = pods(kube)
    assert len(running) == 2 and all(ready(p) for p in running), [p["status"] for p in running]
    assert {p["spec"]["nodeName"] for p in running} == {"node-real"}
    assert all(p["status"]["podIP"].startswith("10.88.") for p in running)
    names = {p["metadata"]["name"] for p in running}
    wait_for(lambda: holder(kube) in names, timeout=LEASE_SECONDS * 2)
    # The kubelet itself decided Ready: its probes reached the probe port at the pod's address.
    probe = running[0]["spec"]["containers"][0]["readinessProbe"]["httpGet"]
    assert probe["path"] == "/readyz"


def test_helm_test_passes_from_a_pod_on_the_node(kube: LocalCluster, node: RealNode, release: str,
                                                helm: list[str]) -> None:
    """`helm test`: the chart's test pod, in the image, with a ServiceAccount of its own, reads
    /readyz and an authorized /metrics through the Service (the kubelet's service variables,
    kube-proxy's rules; this node has no cluster DNS), then is deleted."""
    proc = helm_process(kube, helm, "test", release, "--namespace", NS, "--timeout", "120s")
    assert proc.returncode == 0, proc.stdout + proc.stderr + container_log(node, NS, "node-workload-summary-test")
    print(proc.stdout)
    suite = proc.stdout.split("TEST SUITE:", 1)[-1]
    assert "node-workload-summary-test" in suite and re.search(r"Phase:\s+Succeeded", suite), proc.stdout
    leftovers = kube.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/component=test", "-o", "name").stdout
    assert leftovers == "", leftovers  # hook-delete-policy: hook-succeeded


def test_the_pods_run_this_checkouts_build(kube: LocalCluster, release: str) -> None:
    """The image's labels and the running service name the commit it was built from (a cached
    layer must not keep an older one)."""
    labels = json.loads(subprocess.run(["podman", "image", "inspect", f"{IMAGE}:{TAG}", "--format",
                                        "{{json .Labels}}"], capture_output=True, text=True, check=True).stdout)
    assert labels["org.opencontainers.image.revision"] == revision() and revision() != "unknown"
    assert labels["org.opencontainers.image.version"] == version()
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    out = kube.kubectl("exec", "-n", NS, pods(kube)[0]["metadata"]["name"], "--", "node-workload-summary",
                       "--version").stdout
    assert out.startswith(f"node-workload-summary {version()} (revision {revision()}, Python 3."), out
    # The code itself, not only the labels: a module of the running wheel is the checkout's, byte for byte.
    script = ("import hashlib, node_workload_summary.settings as m; "
              "print(hashlib.sha256(open(m.__file__, 'rb').read()).hexdigest())")
    running = kube.kubectl("exec", "-n", NS, pods(kube)[0]["metadata"]["name"], "--", "python", "-c", script).stdout
    assert running.strip() == hashlib.sha256((ROOT / "node_workload_summary/settings.py").read_bytes()).hexdigest()


def test_summaries_are_written_by_the_pod_with_its_service_account(kube: LocalCluster, release: str,
                                                                  audit_log: Path) -> None:
    def summary() -> dict:
        proc = kube.kubectl("get", "nodesummary", "pool-sim", "-o", "json", "--show-managed-fields", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {}

    wait_for(lambda: summary().get("status", {}).get("nodeCount") == 2, timeout=60)
    managers = {f["manager"] for f in summary()["metadata"]["managedFields"]}
    assert managers == {"node-workload-summary"}, managers
    # The in-cluster configuration: the pod reached the API server through the `kubernetes`
    # Service (kube-proxy) with its mounted token; its log says where it went.
    log = kube.kubectl("logs", "-n", NS, holder(kube)).stdout
    assert "https://10.0.0.1:443" in log, log[-2000:]
    # The ServiceAccount's grants suffice: the audit log shows its requests, from the pods'
    # addresses, and not one was refused.
    events = [json.loads(line) for line in audit_log.read_text().splitlines()]
    assert {ip for e in events for ip in e["sourceIPs"]} <= {p["status"]["podIP"] for p in pods(kube)}
    writes = [e for e in events if e["verb"] == "patch" and e["objectRef"]["resource"] == "nodesummaries"]
    assert writes, "no NodeSummary write by the ServiceAccount in the audit log"
    # The sample WorkloadSummarizer (gangs asked for) was taken as shipped, and is read.
    sample = json.loads(kube.kubectl("get", "workloadsummarizer", "workloads", "-o", "json").stdout)
    assert sample["spec"]["gangs"]["kinds"] == ["PodGroup", "JobSet", "LeaderWorkerSet"], sample["spec"]
    wait_for(lambda: "observedGeneration" in json.loads(kube.kubectl(
        "get", "workloadsummarizer", "workloads", "-o", "json").stdout).get("status", {}), timeout=60)
    denied = [(e["verb"], e["requestURI"]) for e in events if e["responseStatus"]["code"] in (401, 403)]
    assert not denied, denied[:5]


def test_container_runs_as_65532_read_only_without_capabilities(kube: LocalCluster, release: str) -> None:
    pod = pods(kube)[0]["metadata"]["name"]
    script = """
import os
status = dict(line.split(":", 1) for line in open("/proc/1/status"))
try:
    open("/written", "w")
    writable = "yes"
except OSError as err:
    writable = err.strerror
print(status["Uid"].split()[0], status["Gid"].split()[0], status["CapEff"].strip(), status["CapBnd"].strip(),
      status["NoNewPrivs"].strip(), writable, sep="|")
"""
    out = kube.kubectl("exec", "-n", NS, pod, "--", "python", "-c", script).stdout.strip()
    uid, gid, effective, bounding, no_new_privs, writable = out.split("|")
    assert (uid, gid) == ("65532", "65532")
    assert int(effective, 16) == 0 and int(bounding, 16) == 0, out  # every capability dropped
    assert no_new_privs == "1"
    assert writable == "Read-only file system", out


def test_deleted_leader_ends_within_its_grace_and_the_other_pod_leads(kube: LocalCluster, release: str) -> None:
    leader = holder(kube)
    count = len(json.loads(kube.kubectl("get", "nodesummaries", "-o", "json").stdout)["items"])
    started = time.monotonic()
    kube.kubectl("delete", "pod", "-n", NS, leader, "--wait=true", f"--timeout={GRACE + 30}s")
    ended = time.monotonic() - started
    assert ended < GRACE, f"the container took {ended:.1f}s to end after SIGTERM (grace {GRACE}s)"
    # It released the lease on the way out, so the other replica leads at once, not a lease later.
    took = wait_for(lambda: holder(kube) not in ("", leader), timeout=LEASE_SECONDS)
    print(f"SIGTERM to gone: {ended:.1f}s; the other pod led {took:.1f}s later")
    wait_for(lambda: len(pods(kube)) == 2 and all(ready(p) for p in pods(kube)), timeout=120)
    items = json.loads(kube.kubectl("get", "nodesummaries", "-o", "json").stdout)["items"]
    assert len(items) == count and {i["metadata"]["name"] for i in items} >= {"pool-sim"}


def _operator_config(kube: LocalCluster) -> bytes:
    """The Prometheus Operator, built from its pinned module, reconciles the chart's ServiceMonitor
    and PrometheusRule for PROMETHEUS_CR; returns the prometheus.yaml it generated."""
    kube.kubectl("create", "namespace", "monitoring")
    # The operator writes the configuration that this version of Prometheus reads.
    spec = {**PROMETHEUS_CR["spec"], "version": prometheus_release(PROMETHEUS.version)}
    kube.kubectl("apply", "-f", "-", input=json.dumps({**PROMETHEUS_CR, "spec": spec}))
    proc = start_operator(kube)
    try:
        def generated() -> str:
            out = kube.kubectl("get", "secret", "prometheus-k8s", "-n", "monitoring", "-o",
                               "jsonpath={.data.prometheus\\.yaml\\.gz}", check=False).stdout
            rules = kube.kubectl("get", "configmap", "prometheus-k8s-rulefiles-0", "-n", "monitoring", check=False)
            return out if out and rules.returncode == 0 else ""

        wait_for(generated, timeout=90)
        text = gzip.decompress(base64.b64decode(generated())).decode()
        # What the operator's config-reloader sidecar does before Prometheus reads it: expand
        # $(SHARD) (one shard: 0) and $(POD_NAME).
        return text.replace("$(SHARD)", "0").replace("$(POD_NAME)", "prometheus").encode()
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def prometheus(kube: LocalCluster, node: RealNode, release: str) -> str:
    """Prometheus (built from its Go module with its Kubernetes discovery) as a pod on the real node, with the
    configuration and rule files the operator generated: it discovers the service's endpoints and
    scrapes each pod over HTTPS with its own ServiceAccount token. Returns its URL."""
    config = yaml.safe_load(_operator_config(kube))
    # The rule file the operator wrote from the chart's PrometheusRule, with NodeGroupNotReady's
    # `for` shortened from 10m: the expression on live scrapes is what is tested here.
    rules = json.loads(kube.kubectl("get", "configmap", "prometheus-k8s-rulefiles-0", "-n", "monitoring",
                                    "-o", "json").stdout)
    for name, text in rules["data"].items():
        spec = yaml.safe_load(text)
        for group in spec["groups"]:
            for r in group["rules"]:
                if r.get("alert") == "NodeGroupNotReady":
                    r["for"] = "4s"
        rules["data"][name] = yaml.safe_dump(spec)
    kube.kubectl("replace", "-f", "-", input=json.dumps(rules))
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copy(ensure_binaries((PROMETHEUS,))["prometheus"], tmp)
        Path(tmp, "Containerfile").write_text(f"FROM {IMAGE}:{TAG}\nCOPY prometheus /usr/local/bin/prometheus\n"
                                              "USER 65534:65534\nENTRYPOINT [\"/usr/local/bin/prometheus\"]\n")
        subprocess.run(["podman", "build", "--isolation=chroot", "--pull=never", "-q", "-t", PROMETHEUS_IMAGE, tmp],
                       check=True, capture_output=True)
        subprocess.run(["podman", "save", "--format", "oci-archive", "-o", f"{tmp}/p.tar", PROMETHEUS_IMAGE],
                       check=True, capture_output=True)
        node.load_image(Path(tmp, "p.tar"))
    manifests = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "prometheus", "namespace": "monitoring"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "prometheus"},
         "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                    "verbs": ["get", "list", "watch"]}]},
        *({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
           "metadata": {"name": f"prometheus-{role}"},
           "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
           "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "monitoring"}]}
          for role in ("prometheus", "node-workload-summary-metrics-reader")),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "prometheus-config", "namespace": "monitoring"},
         "data": {"prometheus.yaml": yaml.safe_dump(config)}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "prometheus", "namespace": "monitoring"},
         "spec": {"serviceAccountName": "prometheus", **POD_PLACEMENT,
                  "containers": [{
                      "name": "prometheus", "image": PROMETHEUS_IMAGE, "imagePullPolicy": "Never",
                      "args": ["--config.file=/etc/prometheus/config/prometheus.yaml",
                               "--storage.tsdb.path=/prometheus", "--web.listen-address=:9090",
                               "--web.enable-lifecycle"],
                      "readinessProbe": {"httpGet": {"path": "/-/ready", "port": 9090}},
                      "volumeMounts": [
                          {"name": "config", "mountPath": "/etc/prometheus/config"},
                          {"name": "rules", "mountPath": "/etc/prometheus/rules/prometheus-k8s-rulefiles-0"},
                          {"name": "data", "mountPath": "/prometheus"}]}],
                  "volumes": [{"name": "config", "configMap": {"name": "prometheus-config"}},
                              {"name": "rules", "configMap": {"name": "prometheus-k8s-rulefiles-0"}},
                              {"name": "data", "emptyDir": {}}]}},
    ]
    kube.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests}))
    ready = kube.kubectl("wait", "-n", "monitoring", "pod/prometheus", "--for=condition=Ready", "--timeout=90s",
                         check=False)
    if ready.returncode != 0:
        raise AssertionError(f"Prometheus not Ready: {ready.stderr}\n{container_log(node, 'monitoring', 'prometheus')}")
    ip = kube.kubectl("get", "pod", "-n", "monitoring", "prometheus", "-o", "jsonpath={.status.podIP}").stdout
    return f"http://{ip}:9090"


def container_log(node: RealNode, namespace: str, pod: str) -> str:
    """The end of a pod's container logs as the kubelet wrote them (also once the container is gone)."""
    return "".join(f.read_text()[-3000:] for f in node.dir.glob(f"var/log/pods/{namespace}_{pod}_*/*/*.log"))


def query(prometheus: str, path: str, **params: str) -> dict:
    url = f"{prometheus}{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())["data"]


def test_prometheus_scrapes_both_pods_over_https_at_their_addresses(kube: LocalCluster, node: RealNode,
                                                                    prometheus: str) -> None:
    pod_ips = {p["status"]["podIP"] for p in pods(kube)}

    def targets() -> list[dict]:
        return query(prometheus, "/api/v1/targets", state="active")["activeTargets"]

    def up_at_pod_ips() -> bool:
        up = {t["scrapeUrl"].split("//")[1].split(":")[0] for t in targets() if t["health"] == "up"}
        return up == pod_ips

    try:
        wait_for(up_at_pod_ips, timeout=60, interval=1)
    except AssertionError:
        found = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets()]
        dropped = query(prometheus, "/api/v1/targets", state="dropped")["droppedTargets"]
        endpoints = kube.kubectl("get", "endpoints,svc", "-n", NS, "-o", "wide").stdout
        seen = [{k: v for k, v in t["discoveredLabels"].items() if "service" in k or "port_name" in k} for t in dropped]
        raise AssertionError(f"{found}\ndropped: {seen[:2]}\n{endpoints}\n"
                             f"{container_log(node, 'monitoring', 'prometheus')[-1500:]}") from None
    assert all(t["scrapeUrl"].startswith("https://") and t["scrapeUrl"].endswith(":8080/metrics") for t in targets())


def test_node_group_not_ready_fires_for_a_kwok_pool(kube: LocalCluster, prometheus: str) -> None:
    # KWOK's own chaos stage plays the kubelets going away.
    kube.kubectl("label", "nodes", "sim-1", "sim-2", "node-not-ready.stage.kwok.x-k8s.io=true")

    def firing() -> list[dict]:
        return [a for a in query(prometheus, "/api/v1/alerts")["alerts"]
                if a["labels"]["alertname"] == "NodeGroupNotReady" and a["state"] == "firing"]

    wait_for(firing, timeout=120, interval=1)  # rules are evaluated every 30 s
    [alert] = firing()
    assert alert["labels"]["group"] == "sim", alert


def _dashboard_query(title: str) -> str:
    """A panel's query from the generated dashboard, with the variables as Grafana fills them here."""
    dashboard = json.loads((ROOT / "dashboards/generated/node-groups.json").read_text())
    [expr] = [t["expr"] for p in dashboard["panels"] if p["title"] == title for t in p["targets"]]
    return expr.replace("$cluster", "").replace("$summarizer", ".*")


def test_rollout_and_upgrade_leave_no_stale_or_doubled_series(kube: LocalCluster, release: str, helm: list[str],
                                                              prometheus: str) -> None:
    """kubectl rollout restart, then helm upgrade with a changed value: every pod is replaced twice
    (new `pod` and `instance` labels), and the dashboards' queries read the same throughout."""
    started = time.time()
    kube.kubectl("rollout", "restart", "deployment/node-workload-summary", "-n", NS)
    kube.kubectl("rollout", "status", "deployment/node-workload-summary", "-n", NS, "--timeout=120s")
    run_helm(kube, helm, "upgrade", release, str(ROOT / "charts/node-workload-summary"), "--namespace", NS,
             "--reuse-values", "--set", "extraArgs={--log-level=debug}", "--wait", "--timeout", "180s")
    wait_for(lambda: len(pods(kube)) == 2 and all(ready(p) for p in pods(kube)), timeout=GRACE * 2)  # old ones gone
    current = pods(kube)
    assert all(s["restartCount"] == 0 for p in current for s in p["status"]["containerStatuses"]), "restart loop"
    assert all("--log-level=debug" in p["spec"]["containers"][0]["args"] for p in current)
    names = {p["metadata"]["name"] for p in current}

    def scraped_by_current_pods_only() -> bool:
        series = query(prometheus, "/api/v1/query", query='nws_nodegroup_nodes{group="sim"}')["result"]
        return {s["metric"].get("pod") for s in series} == names

    wait_for(scraped_by_current_pods_only, timeout=60, interval=1)  # the old pods' series went stale
    # "Nodes per group" at every step since before the rollout: 2 in pool sim, never 4, never absent.
    time.sleep(4)
    result = query(prometheus, "/api/v1/query_range", query=_dashboard_query("Nodes per group"),
                   start=str(started), end=str(time.time()), step="1")["result"]
    [sim] = [r for r in result if r["metric"].get("group") == "sim"]
    values = [float(v) for _, v in sim["values"]]
    assert values and set(values) == {2.0}, values
    print(f"'Nodes per group' over the rollout and the upgrade: {len(values)} steps, all {values[0]:g}")
