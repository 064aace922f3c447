"""Workloads named by a pod label (WorkloadSummarizer spec.podLabelWorkloads) on a real control
plane: their WorkloadSummaries appear, follow their pods, go with the last pod or the key, keep
valid and stable names through a failover, and another writer's edits are taken back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubeindex.model.objects import API_VERSION
from kubeindex.model.resources import PODS, WORKLOAD_SUMMARIES, WORKLOAD_SUMMARIZERS
from localkube.cluster import LocalCluster
from localkube.service import ScrapeFailed, Service, select, wait_for
from reconciler.names import is_dns1123_subdomain
from tests.kube import (
    create_node,
    create_pod,
    delete,
    deployment,
    get_object,
    is_leader,
    settled,
    summarized_cluster,
    writes,
)

pytestmark = pytest.mark.compat  # one of the core scenarios make compat runs on every Kubernetes minor

NS = "gangs"
GANG = "pod-group.scheduling.kubenexus.io/name"
VOLCANO = "volcano.sh/job-name"
FLAG = "flag.example.com/job"  # given to the deprecated --workload-pod-labels only
FAST_LEASE = ("--lease-duration=4", "--renew-deadline=3", "--retry-period=1", "--write-debounce=0.2")


def label_summarizer(kube: LocalCluster, name: str, entries: list[dict]) -> None:
    """Create or replace WorkloadSummarizer ``name`` listing only pod labels."""
    obj = {"apiVersion": API_VERSION, "kind": "WorkloadSummarizer", "metadata": {"name": name},
           "spec": {"podLabelWorkloads": entries}}
    kube.kubectl("apply", "--server-side", "--field-manager=test", "-f", "-", input=json.dumps(obj))


GANGS = [{"labelKey": GANG, "shortType": "pg"}, {"labelKey": VOLCANO}]


@pytest.fixture(scope="module")
def kube(binaries: dict[str, Path]) -> Iterator[LocalCluster]:
    with summarized_cluster(binaries, NS) as c:  # NodeSummarizer pool, WorkloadSummarizer apps (Deployments)
        for i in range(2):
            create_node(c, f"n-{i}", {"pool": "a"})
        label_summarizer(c, "gangs", GANGS)
        yield c


@pytest.fixture(scope="module")
def leader(kube: LocalCluster) -> Iterator[Service]:
    svc = Service(kube, ("--identity=replica-a", f"--workload-pod-labels={FLAG}", *FAST_LEASE)).start()
    yield svc
    svc.stop()


def summaries(kube: LocalCluster) -> dict[str, dict]:
    """The WorkloadSummaries of label workloads in NS, by the label value they summarize."""
    items = json.loads(kube.kubectl("get", "workloadsummaries", "-n", NS, "-o", "json").stdout)["items"]
    return {o["spec"]["workloadRef"]["labelValue"]: o for o in items if "labelKey" in o["spec"]["workloadRef"]}


def summarizer_status(kube: LocalCluster, name: str) -> dict:
    return json.loads(kube.kubectl("get", "workloadsummarizer", name, "-o", "json").stdout).get("status", {})


def pod_count(kube: LocalCluster, value: str) -> int | None:
    return (summaries(kube).get(value) or {}).get("status", {}).get("podCount")


def gang_pod(kube: LocalCluster, name: str, value: str, node: str = "n-0", key: str = GANG,
             owner: dict | None = None) -> None:
    create_pod(kube, NS, name, node=node, labels={key: value}, owner=owner)


def test_label_workloads_appear_change_and_go(kube: LocalCluster, leader: Service) -> None:
    gang_pod(kube, "train-0", "train", "n-0")
    gang_pod(kube, "train-1", "train", "n-1")
    gang_pod(kube, "sim-0", "sim", key=VOLCANO)
    gang_pod(kube, "old-0", "old", key=FLAG)
    wait_for(lambda: pod_count(kube, "train") == 2 and pod_count(kube, "sim") == 1, timeout=15)
    train = summaries(kube)["train"]
    assert train["metadata"]["name"] == "train" and "ownerReferences" not in train["metadata"]
    assert train["spec"]["workloadRef"] == {"labelKey": GANG, "labelValue": "train"}
    assert (train["status"]["shortType"], train["status"]["longType"]) == ("pg", f"label/{GANG}")
    wait_for(lambda: summaries(kube)["train"]["status"].get("placement") == "pool-a=2", timeout=10)
    sim = summaries(kube)["sim"]["status"]
    assert (sim["shortType"], sim["longType"]) == ("label", f"label/{VOLCANO}")  # no shortType listed: `label`

    table = kube.kubectl("get", "workloads", "-n", NS).stdout
    print(f"$ kubectl get workloads -n {NS}\n{table}")
    rows = {line.split()[0]: line.split()[1:4] for line in table.splitlines()[1:]}
    assert rows["train"] == ["2", "pg", f"label/{GANG}"] and rows["sim"] == ["1", "label", f"label/{VOLCANO}"]

    # The deprecated flag's key names a workload in the metrics only, and the flag says so once.
    assert select(leader.scrape(), "nws_workload_pods", workload="old", kind=FLAG, phase="Running")
    assert "old" not in summaries(kube)
    assert leader.log_text().count("--workload-pod-labels is deprecated") == 1
    wait_for(lambda: summarizer_status(kube, "gangs").get("workloadCount") == 2, timeout=5)
    assert "pod labels" in summarizer_status(kube, "gangs")["conditions"][0]["message"]

    gang_pod(kube, "train-2", "train", "n-1")
    wait_for(lambda: pod_count(kube, "train") == 3, timeout=10)
    delete(kube, PODS.path(NS, "train-0"))
    wait_for(lambda: pod_count(kube, "train") == 2, timeout=10)
    for pod in ("train-1", "train-2"):
        delete(kube, PODS.path(NS, pod))
    wait_for(lambda: "train" not in summaries(kube), timeout=10)  # no owner, no GC: the reconciler deletes it
    assert "sim" in summaries(kube)


def test_an_owner_of_a_configured_kind_wins(kube: LocalCluster, leader: Service) -> None:
    web = deployment(kube, NS, "web")
    gang_pod(kube, "web-0", "web-gang", owner=web)
    gang_pod(kube, "loner-0", "web-gang", "n-1")
    wait_for(lambda: pod_count(kube, "web-gang") == 1, timeout=10)
    summary = WORKLOAD_SUMMARIES.path(NS, "web")  # written a debounce after its change
    wait_for(lambda: (get_object(kube, summary) or {}).get("status", {}).get("podCount") == 1, timeout=10)
    delete(kube, PODS.path(NS, "loner-0"))
    wait_for(lambda: "web-gang" not in summaries(kube), timeout=10)


def test_label_values_that_need_the_naming_rules(kube: LocalCluster, leader: Service) -> None:
    odd = ["Gang_A.v2", "X" * 63, "web"]  # upper case, underscore, dot; 63 characters; the Deployment's name
    for i, v in enumerate(odd):
        gang_pod(kube, f"odd-{i}", v)
    wait_for(lambda: all(pod_count(kube, v) == 1 for v in odd), timeout=15)
    names = {v: summaries(kube)[v]["metadata"]["name"] for v in odd}
    assert all(is_dns1123_subdomain(n) and n != v for v, n in names.items()), names
    assert names["web"].startswith("web-")  # the Deployment `web` holds `web`
    assert len(set(names.values())) == 3


def test_a_summarizer_edit_takes_summaries_away_and_back(kube: LocalCluster, leader: Service) -> None:
    gang_pod(kube, "edit-0", "edited")
    wait_for(lambda: pod_count(kube, "edited") == 1, timeout=10)
    label_summarizer(kube, "gangs", [{"labelKey": VOLCANO}])
    wait_for(lambda: "edited" not in summaries(kube), timeout=10)
    assert "sim" in summaries(kube)
    # ... and from the metrics of every replica (the index itself, not only the summaries).
    wait_for(lambda: not select(leader.scrape(), "nws_workload_pods", workload="edited"), timeout=5, retry=ScrapeFailed)
    label_summarizer(kube, "gangs", GANGS)  # the pods exist already: they are read again
    wait_for(lambda: pod_count(kube, "edited") == 1, timeout=15)
    assert select(leader.scrape(), "nws_workload_pods", workload="edited", kind=GANG, phase="Running")
    assert "relisting pods" in leader.log_text()
    wait_for(lambda: summarizer_status(kube, "gangs")["workloadCount"] == len(summaries(kube)), timeout=5)


def test_overlapping_summarizers_share_a_key(kube: LocalCluster, leader: Service) -> None:
    """Like overlapping kinds: one summary per workload, from the summarizer first by name; both
    count it and say so."""
    label_summarizer(kube, "a-gangs", [{"labelKey": GANG, "shortType": "gang"}])

    def message(name: str) -> str:
        return summarizer_status(kube, name).get("conditions", [{}])[0].get("message", "")

    wait_for(lambda: f"also listed by gangs ({GANG})" in message("a-gangs"), timeout=10)
    wait_for(lambda: summaries(kube)["edited"]["status"]["shortType"] == "gang", timeout=10)
    assert f"also listed by a-gangs ({GANG})" in message("gangs")
    assert summarizer_status(kube, "a-gangs")["workloadCount"] > 0
    delete(kube, WORKLOAD_SUMMARIZERS.path(name="a-gangs"))
    wait_for(lambda: summaries(kube)["edited"]["status"]["shortType"] == "pg", timeout=10)


def test_another_writer_is_taken_back_and_labels_cost_nothing(kube: LocalCluster, leader: Service) -> None:
    name = summaries(kube)["edited"]["metadata"]["name"]
    before = settled(leader)
    kube.kubectl("label", "workloadsummary", name, "-n", NS, "team=ml")
    time.sleep(2)
    assert writes(leader) == before  # another manager's label is no reason to write
    patch = json.dumps({"spec": {"workloadRef": {"labelValue": "hijacked"}}})
    kube.kubectl("patch", "workloadsummary", name, "-n", NS, "--type=merge", "-p", patch)
    wait_for(lambda: summaries(kube).get("edited", {}).get("metadata", {}).get("name") == name, timeout=10)
    delete(kube, WORKLOAD_SUMMARIES.path(NS, name))
    wait_for(lambda: pod_count(kube, "edited") == 1, timeout=10)
    assert summaries(kube)["edited"]["metadata"]["name"] == name and "hijacked" not in summaries(kube)


def test_two_replicas_failover_keeps_names_and_deletes(kube: LocalCluster, leader: Service) -> None:
    """A standby watched everything and wrote nothing; after the leader's death it leads, reads
    the hashed names back from the objects (no delete and create again), and deletes a label
    workload's summary when its last pod goes."""
    # The Deployment `web` goes: the label workload `web` keeps its hashed name, and so must a new
    # leader, which can only learn it from the object.
    delete(kube, PODS.path(NS, "web-0"))
    delete(kube, f"/apis/apps/v1/namespaces/{NS}/deployments/web")
    wait_for(lambda: kube.request(WORKLOAD_SUMMARIES.path(NS, "web"))[0] == 404, timeout=10)
    standby = Service(kube, ("--identity=replica-b", *FAST_LEASE)).start()
    try:
        settled(leader)
        before = {v: (o["metadata"]["name"], o["metadata"]["uid"]) for v, o in summaries(kube).items()}
        assert is_leader(leader) and not is_leader(standby) and writes(standby) == 0
        leader.kill()
        wait_for(lambda: is_leader(standby), timeout=20)
        settled(standby)
        after = {v: (o["metadata"]["name"], o["metadata"]["uid"]) for v, o in summaries(kube).items()}
        assert after == before and after["web"][0] != "web"
        delete(kube, PODS.path(NS, "odd-0"))  # the last pod of Gang_A.v2
        wait_for(lambda: "Gang_A.v2" not in summaries(kube), timeout=10)
        gang_pod(kube, "late-0", "late")
        wait_for(lambda: pod_count(kube, "late") == 1, timeout=10)
    finally:
        standby.stop()
        leader.stop()
        leader.start()
