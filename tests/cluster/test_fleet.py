"""The fleet (kubeindex/watch/fleet.py): a hub reading its members' capacity.

Without a cluster: the capacity a member gives the claims while not listed, connecting, synced, out
of contact within and past the grace, and gone; its kubeconfig re-read and the member reconnected
when the Secret changes; which flavors get a claim.

With real control planes: a hub and two member clusters, each with Kueue's real CRDs, each member
running the service (its NodeSummaries), the hub run with --fleet and reading the members through
MultiKueueClusters and their kubeconfig Secrets, as the chart's hubReaders identity (list and
watch on NodeSummaries and ResourceFlavors, nothing more). Member b is reached through a stalling
proxy. The flow of docs/kueue.md#fleet: members join -> a claim each, with their live capacity and
no assignments; assignments made -> the hub's ClusterQueue gets their sum; a member loses nodes ->
the hub's quota follows after the settle time; a member stalls within the grace -> nothing moves
(no status write, no quota write); past the grace -> MemberUnreachable, and its Hold policy keeps
the quota; back -> Ready again."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from demo import kueue
from demo.kueue import cluster_queue, install_kueue, resource_flavor
from kubeindex.model.objects import (
    API_VERSION,
)
from localkube.build import HELM
from localkube.cluster import LocalCluster, Options
from localkube.proxy import StallingProxy
from localkube.service import Service, select, value, wait_for
from tests.fleetkit import (
    GPU,
    READER,
    RELEASE,
    assign,
    chart_rbac,
    claims,
    gpu_quota,
    hub_readers_rbac,
    join,
    member_secret,
    ready,
)
from tests.kube import create_node, set_node_status, summarized_cluster, token_kubeconfig
from tests.paths import CRDS

pytestmark = [pytest.mark.needs(HELM), pytest.mark.kueue]  # kueue: and in make test-kueue-matrix


NODE = {"cpu": "8", "memory": "32Gi", "pods": "110", "nvidia.com/gpu": "4"}


# A stall of STALL seconds, then the reconnection's backoff (at most kubeindex.runtime.backoff.BACKOFF_CAP) and a
# read timeout, stay well inside GRACE even on a loaded machine.
GRACE, STALL, SETTLE, READ_TIMEOUT = 30.0, 8.0, 2.0, 3.0


@dataclass
class Member:
    kube: LocalCluster
    service: Service
    proxy: StallingProxy | None = None


@pytest.fixture(scope="module")
def members(binaries: dict[str, Path], helm: list[str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Member]]:
    rbac = hub_readers_rbac(helm, tmp_path_factory.mktemp("fleet"))
    with contextlib.ExitStack() as stack:
        out = {}
        for name in ("a", "b"):
            kube = stack.enter_context(summarized_cluster(binaries, "fleet"))  # NodeSummarizer `pool`
            install_kueue(kube)
            resource_flavor(kube, "a100", {"pool": "a100"})
            kube.kubectl("create", "namespace", READER["namespace"])
            kube.kubectl("create", "serviceaccount", READER["name"], "-n", READER["namespace"])
            kube.kubectl("apply", "-f", "-", input=rbac)
            for n in (1, 2):
                create_node(kube, f"{name}-{n}", {"pool": "a100"}, allocatable=NODE)
            service = Service(kube, ("--identity=member",)).start()
            stack.callback(service.stop)
            proxy = StallingProxy("127.0.0.1", int(kube.server.rsplit(":", 1)[1])) if name == "b" else None
            if proxy is not None:
                stack.callback(proxy.close)
            out[name] = Member(kube, service, proxy)
        yield out


@pytest.fixture(scope="module")
def hub(binaries: dict[str, Path], members: dict[str, Member], helm: list[str],
        tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Service]]:
    """The hub: the service as the chart's ServiceAccount with fleet.hub and quota.actuation (so
    the test fails on a permission the chart lacks), reading member b through its proxy. A control
    plane of its own: Kueue's CRDs made and deleted module after module on the session's plane
    have had their deletion stall for minutes ("storage is (re)initializing")."""
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(LocalCluster(Options(), binaries))
        cluster.install_crds(CRDS)
        yield from _hub(cluster, members, helm, tmp_path_factory)


def _hub(cluster: LocalCluster, members: dict[str, Member], helm: list[str],
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Service]]:
    install_kueue(cluster)
    for namespace in ("kueue-system", RELEASE):
        cluster.kubectl("create", "namespace", namespace)
    rbac = chart_rbac(helm, tmp_path_factory.mktemp("hub"), {"fleet": {"hub": True}, "quota": {"actuation": True}})
    cluster.kubectl("apply", "-f", "-", input="\n---\n".join(json.dumps(d) for d in rbac))
    cluster_queue(cluster, "research", {"a100": {"cpu": "0", "nvidia.com/gpu": "0"}})
    for name, member in members.items():
        member_secret(cluster, member.kube, name, member.proxy.url if member.proxy is not None else member.kube.server)
    account = token_kubeconfig(cluster, RELEASE, RELEASE, "fleet-hub")
    svc = Service(cluster, (f"--kubeconfig={account}", f"--lease-namespace={RELEASE}", "--identity=hub", "--fleet",
                            "--fleet-namespace=kueue-system", f"--member-grace={GRACE}",
                            f"--read-timeout={READ_TIMEOUT}", f"--quota-settle={SETTLE}",
                            "--quota-actuation=on")).start()
    try:
        yield cluster, svc
        assert " 403" not in svc.log_text() and "Forbidden" not in svc.log_text(), svc.log_text()
    finally:
        svc.stop()


def applied(svc: Service) -> float:
    return sum(v for k, v in select(svc.scrape(), "nws_quota_writes_total").items() if ("result", "applied") in k)


def test_members_join_get_claims_and_the_hub_quota_follows_them_without_flapping(
        hub: tuple[LocalCluster, Service], members: dict[str, Member]) -> None:
    kube, svc = hub
    for name in members:
        join(kube, name)
    # Each member's flavor gets a claim, with its live capacity (two Ready nodes of 4 GPUs), no assignments.
    wait_for(lambda: {n: c.get("status", {}).get("nominalResources", {}).get(GPU[1]) for n, c in claims(kube).items()}
             == {"a-a100": "8", "b-a100": "8"}, timeout=60)
    made = claims(kube)
    assert {n: (c["spec"]["clusterName"], c["spec"]["flavor"], c["spec"].get("resourceAssignments"))
            for n, c in made.items()} == {"a-a100": ("a", "a100", []), "b-a100": ("b", "a100", [])}
    assert ready(kube, "a-a100")["status"] == "True"
    assert select(svc.scrape(), "nws_fleet_member_up") == {frozenset({("member", "a")}): 1.0,
                                                           frozenset({("member", "b")}): 1.0}

    # The administrator assigns: half of a's GPUs, 4 of b's (b held if it goes away): 4 + 4.
    assign(kube, "a-a100", {"shares": {GPU[1]: "50%"}})
    assign(kube, "b-a100", {"resources": {GPU[1]: "4"}}, overAllocation="Hold")
    wait_for(lambda: gpu_quota(kube) == "8", timeout=30)

    # Member a loses a node: after the settle time, half of a's 4 GPUs + 4 = 6.
    set_node_status(members["a"].kube, "a-2", "False")
    lost = time.monotonic()
    wait_for(lambda: gpu_quota(kube) == "6", timeout=30)
    assert time.monotonic() - lost >= SETTLE - 0.5
    assert claims(kube)["a-a100"]["status"]["nominalResources"][GPU[1]] == "4"

    # Member b stalls for less than the grace: nothing moves, not even b's claim status.
    proxy = members["b"].proxy
    assert proxy is not None
    version, writes = claims(kube)["b-a100"]["metadata"]["resourceVersion"], applied(svc)
    proxy.stall_all()
    stalled = time.monotonic()
    restarts = sum(select(svc.scrape(), "nws_watch_restarts_total", resource="member-b-nodesummaries").values())
    wait_for(lambda: sum(select(svc.scrape(), "nws_watch_restarts_total",
                                resource="member-b-nodesummaries").values()) > restarts, timeout=20)
    while time.monotonic() - stalled < STALL:
        assert value(svc.scrape(), "nws_fleet_member_up", member="b") == 1
        time.sleep(0.5)
    proxy.resume()
    time.sleep(SETTLE + 1)
    assert claims(kube)["b-a100"]["metadata"]["resourceVersion"] == version
    assert applied(svc) == writes and gpu_quota(kube) == "6"

    # Past the grace: MemberUnreachable; its capacity counts as gone, and Hold keeps its quota.
    proxy.stall_all()
    wait_for(lambda: ready(kube, "b-a100").get("reason") == "MemberUnreachable", timeout=GRACE + 40)
    assert f"past the {GRACE:.0f}s grace" in ready(kube, "b-a100")["message"]
    wait_for(lambda: claims(kube)["b-a100"]["status"].get("shortfall", {}).get(GPU[1]) == "4", timeout=SETTLE + 10)
    assert value(svc.scrape(), "nws_fleet_member_up", member="b") == 0
    assert gpu_quota(kube) == "6"  # held

    # Back: Ready again, the quota never moved.
    proxy.resume()
    wait_for(lambda: ready(kube, "b-a100").get("status") == "True", timeout=60)
    assert gpu_quota(kube) == "6" and applied(svc) == writes


def test_a_claim_names_a_cluster_that_is_no_member(hub: tuple[LocalCluster, Service]) -> None:
    """Not a member (no MultiKueueCluster): MemberUnreachable, with the reason in the message."""
    kube, _ = hub
    kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": "nowhere"},
        "spec": {"clusterName": "nowhere", "flavor": "a100"}}))
    wait_for(lambda: ready(kube, "nowhere").get("reason") == "MemberUnreachable", timeout=20)
    assert "no MultiKueueCluster nowhere" in ready(kube, "nowhere")["message"]


def test_a_member_named_by_cluster_profile_is_said_with_what_to_set(hub: tuple[LocalCluster, Service]) -> None:
    """v1beta2's clusterProfileRef: its credentials would come from an exec plugin; the claim's Ready
    (MemberUnsupported) and the log say to set clusterSource.kubeConfig instead."""
    if kueue.cell().version == "v1beta1":
        pytest.skip("MultiKueueCluster has no clusterProfileRef in v1beta1")
    kube, svc = hub
    kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": kueue.cell().api, "kind": "MultiKueueCluster", "metadata": {"name": "east"},
        "spec": {"clusterSource": {"clusterProfileRef": {"name": "east-profile"}}}}))
    kube.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": API_VERSION, "kind": "ClusterResourceClaim", "metadata": {"name": "east-a100"},
        "spec": {"clusterName": "east", "flavor": "a100"}}))
    wait_for(lambda: ready(kube, "east-a100").get("reason") == "MemberUnsupported", timeout=20)
    message = ready(kube, "east-a100")["message"]
    assert "clusterProfileRef (ClusterProfile east-profile)" in message and \
        "set spec.clusterSource.kubeConfig instead" in message, message
    assert value(svc.scrape(), "nws_fleet_member_up", member="east") == 0
    said = [line for line in svc.log_text().splitlines() if "member east:" in line and "clusterProfileRef" in line]
    assert len(said) == 1 and " WARNING " in said[0], said
