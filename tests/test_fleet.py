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

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from demo import kueue
from demo.kueue import cluster_queue, install_kueue, resource_flavor
from kubeindex.client.api import NotFound
from kubeindex.model.index import ClusterIndex
from kubeindex.model.objects import (
    API_VERSION,
    KUEUE_GROUP,
    ClaimMeta,
    ClusterResourceClaim,
    KubeConfigLocation,
    LabelSelector,
    MemberNodeSummary,
    MultiKueueCluster,
    MultiKueueClusterSpec,
    NodeSummaryCapacity,
    NodeSummarySpec,
    ObjectMeta,
    ResourceFlavor,
    ResourceFlavorSpec,
)
from kubeindex.model.quantity import NANO
from kubeindex.model.resources import CLAIMS, Resource
from kubeindex.watch.fleet import RECHECK, Fleet
from kubeindex.watch.fleet import Member as FleetMember
from kubeindex.watch.reflector import Reflector
from localkube.build import HELM
from localkube.cluster import LocalCluster, Options
from localkube.proxy import StallingProxy
from localkube.service import Service, select, value, wait_for
from reconciler.claims import ClaimController, Claims, ClaimSettings, member_claim_name
from reconciler.writer import Writer
from tests.clock import FakeClock, settle
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


# -- without a cluster ---------------------------------------------------------------------------

def kubeconfig(server: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "m",
                       "clusters": [{"name": "m", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
                       "users": [{"name": "u", "user": {"token": "t"}}],
                       "contexts": [{"name": "m", "context": {"cluster": "m", "user": "u"}}]})


class Secrets:
    """The hub's Secrets in kueue-system, served as the API server would."""

    def __init__(self) -> None:
        self.kubeconfigs = {"member-a": kubeconfig("https://127.0.0.1:9")}

    async def get(self, path: str, params: dict[str, str] | None = None, accept: str = "",
                  timeout: float = 0) -> bytes:
        assert path.startswith("/api/v1/namespaces/kueue-system/secrets/")
        name = path.rsplit("/", 1)[1]
        if name not in self.kubeconfigs:
            raise NotFound(404, "NotFound", f'secrets "{name}" not found')
        return json.dumps({"data": {"kubeconfig": base64.b64encode(self.kubeconfigs[name].encode()).decode()}}).encode()


async def v1beta2(api: object) -> list[Resource]:
    """A member's discovery: ResourceFlavors served at v1beta2 (and v1beta1, less preferred)."""
    return [Resource(KUEUE_GROUP, v, "ResourceFlavor", "resourceflavors", False) for v in ("v1beta2", "v1beta1")]


def multikueue_cluster(name: str, secret: str) -> MultiKueueCluster:
    return MultiKueueCluster(ObjectMeta(name=name), MultiKueueClusterSpec(KubeConfigLocation(secret)))


def feed(member: FleetMember, gpus: str = "8") -> None:
    """The member's watches deliver a flavor a100 (pool=a100), a flavor of every node, and the
    NodeSummary of pool=a100 (16 cpu and ``gpus`` GPUs on its Ready nodes); then they are listed
    and in contact."""
    summaries, flavors = member.reflectors
    flavors.handler.upsert(ResourceFlavor(ObjectMeta(name="a100"), ResourceFlavorSpec({"pool": "a100"})))
    flavors.handler.upsert(ResourceFlavor(ObjectMeta(name="any")))
    summaries.handler.upsert(MemberNodeSummary(ObjectMeta(name="pool-a100"), NodeSummarySpec(
        LabelSelector({"pool": "a100"})), NodeSummaryCapacity({"cpu": "24", GPU[1]: "12"},
                                                              {"cpu": "8", GPU[1]: str(12 - int(gpus))})))
    for reflector in member.reflectors:
        reflector.synced.set()
        reflector.connected = True


def test_a_members_capacity_through_its_life() -> None:
    async def scenario() -> None:
        clock, listed = FakeClock(), [False]
        watches: dict[str, Reflector] = {}
        secrets = Secrets()
        fleet = Fleet(secrets, lambda r: watches.__setitem__(r.name, r), lambda name: watches.__delitem__(name),
                      grace=10, listed=lambda: listed[0], clock=clock, discover=v1beta2)
        # Before the MultiKueueClusters are listed nothing is known; after, a name without one is gone.
        assert fleet.capacity("a", "a100") is None and _reason(fleet, "a") == "MemberConnecting"
        listed[0] = True
        assert fleet.capacity("a", "a100") == {} and _reason(fleet, "a") == "MemberUnreachable"

        fleet.upsert(multikueue_cluster("a", "member-a"))
        await settle()
        assert sorted(watches) == ["member-a-nodesummaries", "member-a-resourceflavors"]
        assert fleet.capacity("a", "a100") is None and _reason(fleet, "a") == "MemberConnecting"
        member = fleet.members["a"]
        feed(member)
        assert fleet.problem("a") is None
        assert fleet.capacity("a", "a100") == {"cpu": 16 * NANO, GPU[1]: 8 * NANO}
        assert fleet.capacity("a", "any") is None and "has no nodeLabels" in fleet.why_unknown("a", "any")
        assert fleet.capacity("a", "h100") is None and "has no ResourceFlavor h100" in fleet.why_unknown("a", "h100")
        assert fleet.wanted_claims() == [("a", "a100")]
        version = fleet.version
        feed(member, gpus="4")
        assert fleet.version > version and fleet.capacity("a", "a100") == {"cpu": 16 * NANO, GPU[1]: 4 * NANO}

        # Out of contact: the last capacity stands for the grace, then counts as gone.
        for reflector in member.reflectors:
            reflector.connected, reflector.lost_at = False, clock.now
        await clock.advance(9.5)
        assert fleet.problem("a") is None and fleet.capacity("a", "a100") == {"cpu": 16 * NANO, GPU[1]: 4 * NANO}
        await clock.advance(1)
        assert fleet.capacity("a", "a100") == {} and _reason(fleet, "a") == "MemberUnreachable"
        assert "past the 10s grace" in str(fleet.problem("a"))

        # A rotated kubeconfig: read again after RECHECK, and the member reconnected with it.
        secrets.kubeconfigs["member-a"] = kubeconfig("https://127.0.0.1:10")
        await clock.advance(RECHECK)
        assert fleet.members["a"] is not member and fleet.members["a"].api.connection.host == "https://127.0.0.1:10"
        assert sorted(watches) == ["member-a-nodesummaries", "member-a-resourceflavors"]
        assert watches["member-a-nodesummaries"] is fleet.members["a"].reflectors[0]

        # A Secret that cannot be read: said, and retried.
        fleet.upsert(multikueue_cluster("b", "member-b"))
        await settle()
        assert "b" not in fleet.members and 'secrets "member-b" not found' in fleet.errors["b"]
        assert _reason(fleet, "b") == "MemberConnecting" and "member-b" in str(fleet.problem("b"))

        # Gone: its watches stop, its capacity is zero at once (the settle time and policy follow).
        fleet.delete("a")
        assert sorted(watches) == [] and fleet.capacity("a", "a100") == {}
        await fleet.stop()

    asyncio.run(scenario())


def _reason(fleet: Fleet, name: str) -> str:
    problem = fleet.problem(name)
    return problem.reason if problem is not None else ""


def test_a_members_flavor_gets_a_claim_named_after_both() -> None:
    assert member_claim_name("a", "a100", set()) == "a-a100"
    taken = member_claim_name("a", "a100", {"a-a100"})
    assert taken != "a-a100" and taken.startswith("a-a100-")
    long = member_claim_name("m" * 200, "f" * 100, set())
    assert len(long) <= 63 and long.startswith("m")


class Requests:
    """The API server as the writer meets it: each request recorded (method, path, body)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    async def request(self, method: str, path: str, body: object = None, *, params: dict[str, str] | None = None,
                      content_type: str = "", timeout: float = 30) -> bytes:
        self.calls.append((method, path, body))
        return b"{}"


async def reconcile(claims: Claims, name: str, requests: Requests) -> None:
    await ClaimController(claims, Writer(requests)).reconcile((CLAIMS.plural, name))


def queued(claims: Claims) -> list[tuple[str, str]]:
    """The claim keys a pass queues: all of them after a change, else none."""
    return claims.claim_keys() if claims.changed("test") else []


def seen(name: str, spec: dict[str, Any], status: dict[str, Any] | None = None) -> ClusterResourceClaim:
    """A claim as the hub's watch hands it over."""
    return ClusterResourceClaim(ClaimMeta(name=name, generation=1, creationTimestamp="2026-01-01T00:00:00Z"), spec,
                                status or {})


def test_a_hub_makes_a_claim_per_member_flavor_and_its_ready_says_what_the_member_is() -> None:
    async def scenario() -> None:
        clock, index, requests = FakeClock(), ClusterIndex(), Requests()
        fleet = Fleet(Secrets(), lambda r: None, lambda name: None, grace=10, clock=clock, discover=v1beta2)
        claims = Claims(index.kueue, ClaimSettings(), clock=lambda: 1_800_000_000.0 + clock.now, fleet=fleet)
        fleet.upsert(multikueue_cluster("a", "member-a"))
        await settle()
        assert (CLAIMS.plural, "a-a100") not in queued(claims)  # not synced yet: no capacity, no claim
        feed(fleet.members["a"])
        assert (CLAIMS.plural, "a-a100") in queued(claims)
        await reconcile(claims, "a-a100", requests)
        method, path, body = requests.calls[-1]
        assert (method, path) == ("POST", CLAIMS.path())
        assert body["metadata"] == {"name": "a-a100", "labels": {"ux.sean.example.com/member": "a"}}
        assert body["spec"] == {"clusterName": "a", "flavor": "a100", "resourceAssignments": []}

        index.kueue.upsert_claim(seen("a-a100", body["spec"]))
        assert (CLAIMS.plural, "a-a100") in queued(claims) and claims.wanted == {}
        await reconcile(claims, "a-a100", requests)
        status = requests.calls[-1][2]["status"]
        assert status["nominalResources"] == {"cpu": "16", GPU[1]: "8"}
        ready = next(c for c in status["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "AssignmentsFit")

        # A hub that just started, member a still connecting: the claim keeps its status (no write).
        index.kueue.upsert_claim(seen("a-a100", body["spec"], status))
        restarted = Fleet(Secrets(), lambda r: None, lambda name: None, grace=10, clock=clock, discover=v1beta2)
        restarted.upsert(multikueue_cluster("a", "member-a"))
        await settle()
        assert _reason(restarted, "a") == "MemberConnecting"
        writes = len(requests.calls)
        await reconcile(Claims(index.kueue, ClaimSettings(), clock=lambda: 1_800_000_000.0 + clock.now,
                               fleet=restarted), "a-a100", requests)
        assert len(requests.calls) == writes
        await restarted.stop()

        # Past the grace out of contact: Ready names the member and the grace.
        for reflector in fleet.members["a"].reflectors:
            reflector.connected, reflector.lost_at = False, clock.now
        await clock.advance(11)
        await reconcile(claims, "a-a100", requests)
        ready = next(c for c in requests.calls[-1][2]["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "MemberUnreachable") and "member a" in ready["message"]

        # A claim on a member whose kubeconfig cannot be read: no capacity ever known, and why.
        fleet.upsert(multikueue_cluster("b", "member-b"))
        await settle()
        index.kueue.upsert_claim(seen("b", {"clusterName": "b", "flavor": "a100"}))
        await reconcile(claims, "b", requests)
        ready = next(c for c in requests.calls[-1][2]["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "CapacityUnknown")
        assert 'secrets "member-b" not found' in ready["message"] and ready["message"].endswith("is kept")
        await fleet.stop()

    asyncio.run(scenario())


# -- a hub and two members ------------------------------------------------------------------------

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
