"""ClusterResourceClaims against a real kube-apiserver with Kueue's real CRDs (no Kueue controller):
the real service, a flavor's nodes failing and coming back, the ClusterQueues' quota following
after the settle time; an edit of a claim changing exactly the named queue fields; a dry run
writing nothing; two replicas, only the leader writing, and a leader killed in mid-settle; a pool
at zero showing 0; each quota write logged and an Event on its claim, a burst of them rate-limited."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from demo.kueue import cell, cluster_queue_spec, install_kueue, resource_flavor
from kubeindex.model.objects import API_VERSION
from localkube.cluster import LocalCluster
from localkube.service import Service, select, wait_for
from tests.kube import create_node, is_leader, set_node_status, settled, writes

pytestmark = pytest.mark.kueue  # and in make test-kueue-matrix, on every Kueue cell

FAST_LEASE = ("--lease-duration=4", "--renew-deadline=3", "--retry-period=1", "--write-debounce=0.2")
NODE = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}
SETTLE = 3.0


def _apply(kube: LocalCluster, obj: dict[str, Any], manager: str = "admin") -> None:
    kube.kubectl("apply", "--server-side", "--force-conflicts", f"--field-manager={manager}", "-f", "-",
                 input=json.dumps(obj))


def queue(kube: LocalCluster, name: str) -> None:
    """A ClusterQueue in a cohort: flavor a100 (cpu, nvidia.com/gpu at 0, a borrowingLimit another
    manager owns) and flavor spare (cpu 3), which no claim names."""
    _apply(kube, {"apiVersion": cell().api, "kind": "ClusterQueue", "metadata": {"name": name},
                  "spec": cluster_queue_spec({"a100": {"cpu": {"nominalQuota": "0", "borrowingLimit": "5"},
                                                       "nvidia.com/gpu": "0"},
                                              "spare": {"cpu": "3", "nvidia.com/gpu": "1"}}, cohort="all")})


def claim(kube: LocalCluster, name: str, assignments: list[dict[str, Any]], **spec: Any) -> None:
    _apply(kube, {"apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": name},
                  "spec": {"flavor": "a100", "resourceAssignments": assignments, **spec}})


def get(kube: LocalCluster, kind: str, name: str) -> dict[str, Any]:
    return json.loads(kube.kubectl("get", kind, name, "-o", "json").stdout)


def quota(kube: LocalCluster, name: str) -> dict[tuple[str, str], str]:
    """(flavor, resource) -> nominalQuota of a ClusterQueue."""
    spec = get(kube, "clusterqueues.kueue.x-k8s.io", name)["spec"]
    return {(f["name"], r["name"]): str(r["nominalQuota"])
            for g in spec["resourceGroups"] for f in g["flavors"] for r in f["resources"]}


def condition(kube: LocalCluster, name: str, type_: str) -> dict[str, Any]:
    status = get(kube, "clusterresourceclaims", name).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == type_), {})


def applied(svc: Service) -> float:
    return sum(v for k, v in select(svc.scrape(), "nws_quota_writes_total").items()
               if ("result", "applied") in k)


@pytest.fixture(scope="module")
def kueue(cluster: LocalCluster) -> Iterator[LocalCluster]:
    install_kueue(cluster)
    resource_flavor(cluster, "a100", {"pool": "a100"})
    resource_flavor(cluster, "spare", {"pool": "spare"})
    yield cluster


@pytest.fixture
def pool(kueue: LocalCluster, request: pytest.FixtureRequest) -> Iterator[tuple[LocalCluster, str]]:
    """Two Ready nodes of flavor a100 (16 cpu, 8 GPUs) and the queues research and prod, named
    after the test; deleted after it."""
    tag = request.node.name.removeprefix("test_")[:20].replace("_", "-").strip("-")
    for n in (1, 2):
        create_node(kueue, f"{tag}-{n}", {"pool": "a100"}, allocatable=NODE)
    for name in ("research", "prod"):
        queue(kueue, f"{tag}-{name}")
    yield kueue, tag
    kueue.kubectl("delete", "clusterresourceclaims", "--all", "--wait=false")
    for name in ("research", "prod"):
        kueue.kubectl("delete", "clusterqueues.kueue.x-k8s.io", f"{tag}-{name}", "--wait=false")
    for n in (1, 2):
        kueue.kubectl("delete", "node", f"{tag}-{n}", "--wait=false")


def assignments(tag: str, research_gpu: str = "4") -> list[dict[str, Any]]:
    return [{"clusterQueueName": f"{tag}-research", "resources": {"nvidia.com/gpu": research_gpu}},
            {"clusterQueueName": f"{tag}-prod", "shares": {"cpu": "50%", "nvidia.com/gpu": "50%"}}]


def test_dry_run_reports_and_writes_nothing(pool: tuple[LocalCluster, str]) -> None:
    kube, tag = pool
    versions = {q: get(kube, "clusterqueues.kueue.x-k8s.io", f"{tag}-{q}")["metadata"]["resourceVersion"]
                for q in ("research", "prod")}
    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}")).start()
    try:
        claim(kube, tag, assignments(tag))
        wait_for(lambda: condition(kube, tag, "Ready").get("status") == "True", timeout=20)
        status = get(kube, "clusterresourceclaims", tag)["status"]
        assert status["nominalResources"]["nvidia.com/gpu"] == "8" and status["assignedPercent"] == "100%"
        assert {q["name"]: q["resources"] for q in status["queues"]} == {
            f"{tag}-research": {"nvidia.com/gpu": "4"}, f"{tag}-prod": {"cpu": "8", "nvidia.com/gpu": "4"}}
        wait_for(lambda: select(svc.scrape(), "nws_queue_desired_quota", cluster_queue=f"{tag}-prod"), timeout=10)
        quiet = settled(svc)  # the claim's status, written once, is not written again and again
        time.sleep(2)
        assert writes(svc) == quiet
        assert {q: get(kube, "clusterqueues.kueue.x-k8s.io", f"{tag}-{q}")["metadata"]["resourceVersion"]
                for q in ("research", "prod")} == versions
        assert applied(svc) == 0
    finally:
        svc.stop()


def test_quota_follows_a_shrinking_and_regrowing_pool(pool: tuple[LocalCluster, str]) -> None:
    kube, tag = pool
    research, prod = f"{tag}-research", f"{tag}-prod"
    before = {q: quota(kube, q) for q in (research, prod)}
    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}", "--quota-actuation=on")).start()
    try:
        claim(kube, tag, assignments(tag))
        wait_for(lambda: quota(kube, prod)[("a100", "nvidia.com/gpu")] == "4", timeout=20)
        assert quota(kube, prod)[("a100", "cpu")] == "8" and quota(kube, research)[("a100", "nvidia.com/gpu")] == "4"

        set_node_status(kube, f"{tag}-2", "False")  # half the pool is lost
        lost = time.monotonic()
        wait_for(lambda: get(kube, "clusterresourceclaims", tag)["status"].get("pendingSince"), timeout=10)
        assert quota(kube, prod)[("a100", "nvidia.com/gpu")] == "4"  # not before the settle time
        wait_for(lambda: quota(kube, prod)[("a100", "nvidia.com/gpu")] == "0", timeout=20)
        assert time.monotonic() - lost >= SETTLE - 0.5
        assert quota(kube, prod)[("a100", "cpu")] == "4"  # 50% of 8
        assert quota(kube, research)[("a100", "nvidia.com/gpu")] == "4"  # the absolute amount is held
        over = condition(kube, tag, "OverAllocated")
        assert over["status"] == "True" and "nvidia.com/gpu short by 2" in over["message"], over
        status = get(kube, "clusterresourceclaims", tag)["status"]
        assert status["shortfall"] == {"nvidia.com/gpu": "2"} and status["settledResources"]["nvidia.com/gpu"] == "4"

        set_node_status(kube, f"{tag}-2", "True")  # and comes back
        wait_for(lambda: quota(kube, prod)[("a100", "nvidia.com/gpu")] == "4", timeout=20)
        assert quota(kube, prod)[("a100", "cpu")] == "8"
        wait_for(lambda: condition(kube, tag, "OverAllocated").get("status") == "False", timeout=10)
        for q in (research, prod):  # the unnamed flavor never changed
            assert {k: v for k, v in quota(kube, q).items() if k[0] == "spare"} == \
                   {k: v for k, v in before[q].items() if k[0] == "spare"}
        assert applied(svc) == 4  # research and prod set, prod shrunk, prod regrown: one patch each
    finally:
        svc.stop()


def test_an_edit_of_an_assignment_changes_exactly_the_named_fields(pool: tuple[LocalCluster, str]) -> None:
    kube, tag = pool
    research = f"{tag}-research"
    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}", "--quota-actuation=on")).start()
    try:
        claim(kube, tag, assignments(tag))
        wait_for(lambda: quota(kube, research)[("a100", "nvidia.com/gpu")] == "4", timeout=20)
        before = get(kube, "clusterqueues.kueue.x-k8s.io", research)["spec"]
        kube.kubectl("patch", "clusterresourceclaims", tag, "--type=merge", "-p", json.dumps(
            {"spec": {"resourceAssignments": assignments(tag, research_gpu="3")}}))
        wait_for(lambda: quota(kube, research)[("a100", "nvidia.com/gpu")] == "3", timeout=20)
        after = get(kube, "clusterqueues.kueue.x-k8s.io", research)["spec"]
        before["resourceGroups"][0]["flavors"][0]["resources"][1]["nominalQuota"] = "3"
        assert after == before  # the borrowingLimit, the other flavor, every other field as they were
        assert after["resourceGroups"][0]["flavors"][0]["resources"][0]["borrowingLimit"] == "5"
        managed = json.loads(kube.kubectl("get", "clusterqueues.kueue.x-k8s.io", research, "-o", "json",
                                          "--show-managed-fields").stdout)["metadata"]["managedFields"]
        assert "node-workload-summary" in {m["manager"] for m in managed}
    finally:
        svc.stop()


def test_a_claim_on_another_cluster_is_not_ready(pool: tuple[LocalCluster, str]) -> None:
    kube, tag = pool
    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}")).start()
    try:
        claim(kube, tag, assignments(tag), clusterName="member-1")
        wait_for(lambda: condition(kube, tag, "Ready").get("reason") == "ClusterUnknown", timeout=20)
        assert condition(kube, tag, "Ready")["status"] == "False"
    finally:
        svc.stop()


def test_only_the_leader_writes_and_a_leader_killed_in_mid_settle_applies_the_change_once(
        pool: tuple[LocalCluster, str]) -> None:
    kube, tag = pool
    prod = f"{tag}-prod"
    settle = 8.0
    args = (*FAST_LEASE, f"--quota-settle={settle}", "--quota-actuation=on")
    a = Service(kube, ("--identity=a", *args)).start()
    b = Service(kube, ("--identity=b", *args)).start()
    try:
        claim(kube, tag, assignments(tag))
        wait_for(lambda: quota(kube, prod)[("a100", "nvidia.com/gpu")] == "4", timeout=20)
        leader, standby = (a, b) if is_leader(a) else (b, a)
        assert not is_leader(standby) and applied(standby) == 0 and applied(leader) == 2
        generation = get(kube, "clusterqueues.kueue.x-k8s.io", prod)["metadata"]["generation"]

        set_node_status(kube, f"{tag}-2", "False")
        wait_for(lambda: get(kube, "clusterresourceclaims", tag)["status"].get("pendingSince"), timeout=10)
        lost = time.monotonic()
        leader.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]  # in mid-settle, no release
        wait_for(lambda: quota(kube, prod)[("a100", "nvidia.com/gpu")] == "0", timeout=30)
        assert time.monotonic() - lost >= settle - 2  # the new leader kept the timer, did not restart or skip it
        time.sleep(2)
        assert get(kube, "clusterqueues.kueue.x-k8s.io", prod)["metadata"]["generation"] == generation + 1
        assert is_leader(standby) and applied(standby) == 1
    finally:
        a.stop()
        b.stop()


def test_a_pool_at_zero_shows_zero_cpu_and_gpu(pool: tuple[LocalCluster, str]) -> None:
    """Every node of the flavor NotReady: the claim's CPU and GPU columns print 0, not nothing."""
    kube, tag = pool
    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}")).start()
    try:
        claim(kube, tag, assignments(tag))
        wait_for(lambda: condition(kube, tag, "Ready").get("status") == "True", timeout=20)
        for n in (1, 2):
            set_node_status(kube, f"{tag}-{n}", "False")

        def columns() -> dict[str, str]:
            header, row = kube.kubectl("get", "clusterresourceclaims", tag, "-o", "wide").stdout.splitlines()
            return dict(zip(re.split(r"\s{2,}", header.strip()), re.split(r"\s{2,}", row.strip()), strict=True))

        wait_for(lambda: (columns()["CPU"], columns()["GPU"]) == ("0", "0"), timeout=10)
        wait_for(lambda: get(kube, "clusterresourceclaims", tag)["status"].get("settledResources") ==
                 {"cpu": "0", "nvidia.com/gpu": "0"}, timeout=20)
        assert get(kube, "clusterresourceclaims", tag)["status"]["nominalResources"] == {"cpu": "0",
                                                                                        "nvidia.com/gpu": "0"}
        assert "pendingSince" not in get(kube, "clusterresourceclaims", tag)["status"]  # the zeros are settled
    finally:
        svc.stop()


def quota_events(kube: LocalCluster, claim_name: str) -> list[dict[str, Any]]:
    """The QuotaWritten Events on a claim (cluster-scoped: in namespace default)."""
    items = json.loads(kube.kubectl("get", "events.events.k8s.io", "-n", "default", "-o", "json").stdout)["items"]
    return [e for e in items if e.get("regarding", {}).get("name") == claim_name and e["reason"] == "QuotaWritten"]


def test_a_quota_write_is_logged_and_recorded_as_an_event_on_the_claim(pool: tuple[LocalCluster, str]) -> None:
    kube, tag = pool
    research, prod = f"{tag}-research", f"{tag}-prod"
    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}", "--quota-actuation=on")).start()
    try:
        claim(kube, tag, assignments(tag))
        wait_for(lambda: quota(kube, prod)[("a100", "nvidia.com/gpu")] == "4", timeout=20)
        wait_for(lambda: len(quota_events(kube, tag)) == 2, timeout=10)
        log = svc.log_text()
        assert (f"ClusterQueue {prod} nominalQuota written: flavor a100 cpu 0 -> 8, nvidia.com/gpu 0 -> 4"
                f" (claim {tag})") in log, log
        assert f"ClusterQueue {research} nominalQuota written: flavor a100 nvidia.com/gpu 0 -> 4 (claim {tag})" in log
        events = {e["related"]["name"]: e for e in quota_events(kube, tag)}
        assert events[prod]["note"] == (f"ClusterQueue {prod} nominalQuota written: flavor a100 cpu 0 -> 8,"
                                        " nvidia.com/gpu 0 -> 4")
        assert events[research]["note"] == (f"ClusterQueue {research} nominalQuota written:"
                                            " flavor a100 nvidia.com/gpu 0 -> 4")
        uid = get(kube, "clusterresourceclaims", tag)["metadata"]["uid"]
        for event in events.values():
            assert event["regarding"] == {"apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "name": tag,
                                          "uid": uid}
            assert (event["type"], event["action"], event["reportingController"], event["reportingInstance"]) == (
                "Normal", "WriteQuota", "node-workload-summary", "a")
            assert event["related"]["kind"] == "ClusterQueue" and "series" not in event

        def described() -> bool:  # core v1's view of them
            text = kube.kubectl("describe", "clusterresourceclaims", tag).stdout
            return all(re.search(rf"Normal\s+QuotaWritten\s+.*ClusterQueue {q} nominalQuota written", text)
                       for q in (prod, research))

        wait_for(described, timeout=10)
    finally:
        svc.stop()


def test_a_burst_of_quota_writes_is_logged_in_full_and_rate_limited_in_events(pool: tuple[LocalCluster, str]) -> None:
    """32 writes on one claim, the same two changes of research's GPUs again and again: every write
    logged; its Events are 4 (identical ones counted on one series), and what they count stops at
    client-go's spam burst of 25 (one more every 5 minutes)."""
    kube, tag = pool
    research = f"{tag}-research"
    svc = Service(kube, ("--identity=a", f"--quota-settle={SETTLE}", "--quota-actuation=on")).start()
    try:
        claim(kube, tag, assignments(tag))
        wait_for(lambda: quota(kube, research)[("a100", "nvidia.com/gpu")] == "4", timeout=20)

        def research_has(gpus: str) -> Callable[[], bool]:
            return lambda: quota(kube, research)[("a100", "nvidia.com/gpu")] == gpus

        started = time.monotonic()
        for gpus in ("3", "4") * 15:
            kube.kubectl("patch", "clusterresourceclaims", tag, "--type=merge", "-p", json.dumps(
                {"spec": {"resourceAssignments": assignments(tag, research_gpu=gpus)}}))
            wait_for(research_has(gpus), timeout=20)
        wait_for(lambda: applied(svc) == 32, timeout=10)  # research 31, prod 1
        log = svc.log_text()
        assert log.count(f"ClusterQueue {research} nominalQuota written") == 31, log
        assert log.count(f"flavor a100 nvidia.com/gpu 4 -> 3 (claim {tag})") == 15

        def counted() -> int:
            return sum(e.get("series", {}).get("count", 1) for e in quota_events(kube, tag))

        refilled = int((time.monotonic() - started) // 300)  # the spam filter's token every 5 minutes
        wait_for(lambda: counted() >= 25, timeout=10)
        time.sleep(1)
        assert 25 <= counted() <= 25 + refilled
        assert sorted(e["note"].rsplit(": ", 1)[1] for e in quota_events(kube, tag)) == [
            "flavor a100 cpu 0 -> 8, nvidia.com/gpu 0 -> 4", "flavor a100 nvidia.com/gpu 0 -> 4",
            "flavor a100 nvidia.com/gpu 3 -> 4", "flavor a100 nvidia.com/gpu 4 -> 3"]
        samples = svc.scrape()
        made = {verb: select(samples, "nws_reconciler_writes_total", verb=verb) for verb in ("create_event",
                                                                                               "patch_event")}
        assert [sum(made["create_event"].values()), sum(made["patch_event"].values())] == [4, 21 + refilled]
    finally:
        svc.stop()
